package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/dedupkit/dedup/internal/hexsha"
)

// readBody reads the request body once, bounded by the configured limit, and
// puts an identical reader back for the handler: into, which the caller
// keeps.
func (c *config) readBody(r *http.Request, into *bodyCopy) ([]byte, *keyProblem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := readAll(r.Body, min(r.ContentLength, c.maxBody, maxPresized), c.maxBody)
	if err != nil {
		return nil, c.bodyProblem(err)
	}
	into.Reset(body)
	r.Body, r.ContentLength = into, int64(len(body))
	return body, nil
}

// maxPresized is the most readAll sets aside on a request's word: a larger
// body grows its buffer as it arrives, so that a client cannot make the
// server hold memory it has not sent.
const maxPresized = 64 << 10

// readAll reads r to its end, as io.ReadAll does, into a buffer sized for
// the length the request declares, when it declares one: a body of that
// length then costs one allocation of its size rather than 512 bytes. A
// body over limit bytes is an *http.MaxBytesError, as http.MaxBytesReader
// reports it, without a reader of its own to allocate.
func readAll(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared <= 0 {
		declared = 512 // unknown: io.ReadAll's first size
	}
	b := make([]byte, 0, declared+1) // +1: the read that finds the end needs room
	for {
		end := cap(b)
		if int64(end) > limit {
			end = int(limit) + 1 // one past the limit tells a body over it
		}
		n, err := r.Read(b[len(b):end])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return b, &http.MaxBytesError{Limit: limit}
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// bodyProblem says why a body could not be read. Kept out of readBody so
// that the target of errors.As escapes only when a read failed.
func (c *config) bodyProblem(err error) *keyProblem {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return &keyProblem{ProblemBodyTooLarge, fmt.Sprintf("the body is over %d bytes", c.maxBody)}
	}
	return &keyProblem{ProblemBodyUnreadable, err.Error()}
}

// bodyCopy is a body already read, given back to the handler.
type bodyCopy struct{ bytes.Reader }

func (*bodyCopy) Close() error { return nil }

// isJSON reports whether a Content-Type names JSON (application/json or a
// +json suffix).
func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true // the usual case, without parsing (and allocating)
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// requestShape is what a request's fingerprint is made of, as sent: its
// method, route, raw query, whether its body counts as JSON, and its body.
// Two requests of one shape have one fingerprint, so a replay whose shape is
// that of a request the cached answer is known to fit is answered without
// fingerprinting it (the canonical JSON and two SHA-256 sums): a client's
// retry resends its request byte for byte. A request of another shape may
// still have the same fingerprint (keys in another order) and is
// fingerprinted.
type requestShape struct {
	method, route, query string
	json                 bool
	body                 []byte
}

// shapeOf returns r's shape, with body, the body read from it.
func (c *config) shapeOf(r *http.Request, body []byte) requestShape {
	return requestShape{method: r.Method, route: c.route(r), query: r.URL.RawQuery,
		json: isJSON(contentType(r.Header)), body: body}
}

// contentType returns h's Content-Type, as Header.Get does for a header set
// under its canonical name, without canonicalizing the name each time.
func contentType(h http.Header) string {
	if v := h["Content-Type"]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// fingerprint returns the request's fingerprint: a hash of the policy
// version, method, route, query and body. A JSON body counts by its
// canonical form (dedup.JSONFingerprint), so key order and whitespace do not
// matter; a JSON content type with a body that is not JSON is refused. The
// query counts with its parameters sorted by name (the order of one name's
// values kept); a request without one hashes as it did before queries
// counted, so keys stored then still replay.
//
// The fingerprint is written into into, which must never be written again:
// the string returned shares it, so that the request's own struct holds it
// without an allocation of its own.
func (c *config) fingerprint(r *http.Request, body []byte, into *[hexsha.Size]byte) (string, *keyProblem) {
	var raw [hexsha.Size]byte
	kind, bodyFP := "raw", ""
	if len(body) > 0 && isJSON(contentType(r.Header)) {
		fp, err := c.jsonFP(body)
		if err != nil {
			return "", &keyProblem{ProblemInvalidJSON, strings.TrimPrefix(err.Error(), "dedup: ")}
		}
		kind, bodyFP = "json", fp
	} else {
		bodyFP = hexsha.Into(body, &raw)
	}
	var buf [256]byte
	parts := buf[:0]
	for _, part := range []string{"idemhttp/1", c.policy, r.Method, c.route(r), kind, bodyFP} {
		parts = append(append(parts, part...), 0)
	}
	if r.URL.RawQuery != "" {
		parts = append(append(append(parts, '?'), canonicalQuery(r.URL.RawQuery)...), 0)
	}
	return hexsha.Into(parts, into), nil
}

// canonicalQuery returns raw with its parameters sorted by name and encoded
// alike, so ?b=2&a=1 and ?a=1&b=%32 are one query. A query that does not
// parse counts as it is written.
func canonicalQuery(raw string) string {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	return q.Encode()
}
