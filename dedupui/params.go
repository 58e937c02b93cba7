package dedupui

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/dedupkit/dedup"
)

// badRequest is a query the console refuses with 400 Bad Request, saying
// why.
type badRequest struct{ reason string }

func (e *badRequest) Error() string { return e.reason }

// badf returns a badRequest.
func badf(format string, args ...any) error { return &badRequest{reason: fmt.Sprintf(format, args...)} }

// maxOlderThan bounds older_than: a longer one is a typo.
const maxOlderThan = 365 * 24 * time.Hour

// known checks that q holds only the parameters named, each at most once,
// so that a misspelt filter is refused rather than ignored.
func known(q url.Values, names ...string) error {
next:
	for k, v := range q {
		for _, n := range names {
			if k == n {
				if len(v) > 1 && n != "id" {
					return badf("parameter %q given %d times", k, len(v))
				}
				continue next
			}
		}
		return badf("unknown parameter %q", k)
	}
	return nil
}

// scopeParam returns the scope filter, "" for every scope.
func scopeParam(q url.Values) (string, error) {
	s := q.Get("scope")
	if s == "" {
		return "", nil
	}
	if err := (dedup.Key{Scope: s, EventID: "x"}).Validate(); err != nil {
		return "", badf("scope: %v", err)
	}
	return s, nil
}

// keyParam returns the key named by scope and id.
func keyParam(q url.Values) (dedup.Key, error) {
	k := dedup.Key{Scope: q.Get("scope"), EventID: q.Get("id")}
	if err := k.Validate(); err != nil {
		return dedup.Key{}, badf("key: %v", err)
	}
	return k, nil
}

// DefaultOlderThan is how long a retryable failure must have been left to
// count as stuck unless a page's older_than parameter says otherwise: the
// default of `dedup stuck -older-than`.
const DefaultOlderThan = 10 * time.Minute

// olderThanParam returns how long a retryable failure must have been left
// to be stuck: the older_than parameter (a Go duration), DefaultOlderThan
// when absent.
func olderThanParam(q url.Values) (time.Duration, error) {
	s := q.Get("older_than")
	if s == "" {
		return DefaultOlderThan, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > maxOlderThan {
		return 0, badf("older_than %q: want a duration from 0s to %s", s, maxOlderThan)
	}
	return d, nil
}

// reasonParam returns the reason filter.
func reasonParam(q url.Values) (string, error) {
	r := q.Get("reason")
	if r != dedup.FailureReason(r) {
		return "", badf("reason longer than %d characters", dedup.ReasonLen)
	}
	return r, nil
}

// cursor is a BrowseCursor as a link carries it.
type cursor struct {
	At    time.Time `json:"t"`
	Scope string    `json:"s"`
	ID    string    `json:"i"`
}

// encodeCursor returns the after parameter of the page following c.
func encodeCursor(c dedup.BrowseCursor) string {
	b, _ := json.Marshal(cursor{At: c.UpdatedAt, Scope: c.Key.Scope, ID: c.Key.EventID})
	return base64.RawURLEncoding.EncodeToString(b)
}

// afterParam returns the cursor of the after parameter, nil when absent.
func afterParam(q url.Values) (*dedup.BrowseCursor, error) {
	s := q.Get("after")
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	var c cursor
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		err = (dedup.Key{Scope: c.Scope, EventID: c.ID}).Validate()
	}
	if err != nil || c.At.IsZero() {
		return nil, badf("after: not a cursor of this console")
	}
	return &dedup.BrowseCursor{UpdatedAt: c.At, Key: dedup.Key{Scope: c.Scope, EventID: c.ID}}, nil
}

// status is the HTTP status of a page's error: 400 for a bad query, 404
// for an absent record, 500 for the rest.
func status(err error) int {
	var bad *badRequest
	var cf *conflict
	switch {
	case errors.As(err, &bad):
		return http.StatusBadRequest
	case errors.As(err, &cf):
		return http.StatusConflict
	case errors.Is(err, dedup.ErrNotFound):
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}
