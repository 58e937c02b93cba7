package dedup

import (
	"context"
	"fmt"
	"time"
)

// Browser is implemented by a store whose records the operator's console
// (package dedupui) can summarise and page through: [PostgresStore] and
// [MemoryStore]. A console resolves it once, with a type assertion, as pgx
// resolves its optional interfaces; a store without it shows records by key
// only.
type Browser interface {
	// Summary counts the live records of scope ("" for every scope) that
	// are not succeeded, by scope and status, and charts the failures and
	// the records written over the window before now.
	Summary(ctx context.Context, q SummaryQuery) (Summary, error)
	// Browse returns one page of list, in keyset order (UpdatedAt, then
	// key): the records strictly after q.After, at most q.Limit of them.
	Browse(ctx context.Context, q BrowseQuery) ([]Record, error)
}

// BrowseList names a list of records a [Browser] pages through.
type BrowseList int

// The lists of records a console shows.
const (
	// ListStuck holds the records [Admin.Stuck] returns: PROCESSING past
	// their lease, or FAILED_RETRYABLE last updated before OlderThan.
	ListStuck BrowseList = iota + 1
	// ListFailedFinal holds the FAILED_FINAL records: dead-lettered events.
	ListFailedFinal
)

// ReasonLen is how many characters of a record's last error name its
// failure's reason, the unit failures are counted, charted and filtered by.
const ReasonLen = 80

// FailureReason returns the reason a failed record is counted under: the
// first [ReasonLen] characters (runes) of its last error, as PostgreSQL's
// left(last_error, 80) cuts it.
func FailureReason(lastError string) string {
	n := 0
	for i := range lastError {
		if n == ReasonLen {
			return lastError[:i]
		}
		n++
	}
	return lastError
}

// BrowseCursor is a position in a list: the last record of the page before.
type BrowseCursor struct {
	UpdatedAt time.Time
	Key       Key
}

// CursorOf returns the cursor just past rec.
func CursorOf(rec Record) BrowseCursor { return BrowseCursor{UpdatedAt: rec.UpdatedAt, Key: rec.Key} }

// BrowseQuery asks a [Browser] for one page of a list.
type BrowseQuery struct {
	List BrowseList
	// Scope keeps only the records of one scope; "" keeps all.
	Scope string
	// Reason keeps only the records whose [FailureReason] is Reason; ""
	// keeps all.
	Reason string
	// OlderThan is how long a FAILED_RETRYABLE record must have been left
	// to be stuck (ListStuck).
	OlderThan time.Duration
	// After is where the page starts (exclusive); nil starts at the first.
	After *BrowseCursor
	// Limit is the most records returned; it must be positive.
	Limit int
}

// SummaryQuery asks a [Browser] for a summary.
type SummaryQuery struct {
	// Scope keeps only the records of one scope; "" keeps all.
	Scope string
	// OlderThan is how long a FAILED_RETRYABLE record must have been left
	// to count as stuck.
	OlderThan time.Duration
	// Window is how far back the charts go, in minutes.
	Window time.Duration
}

// Summary is what a [Browser] knows of a store's records without reading
// each one.
type Summary struct {
	// Scopes counts the records that are not succeeded, per scope, in
	// scope order.
	Scopes []ScopeCounts
	// Succeeded counts the SUCCEEDED records of the query's scope; it is
	// exact unless SucceededEstimated, in which case it is the table's
	// estimated size less the counted records (a store that cannot count
	// them cheaply).
	Succeeded          int64
	SucceededEstimated bool
	// OldestInFlight is the PROCESSING record claimed longest ago, if any.
	OldestInFlight *Record
	// Failures counts the records that failed in each minute of the window
	// (by their last update), by reason; Written counts the records
	// created in each minute of the window.
	Failures []ReasonCount
	Written  []MinuteCount
	// Now is the store's clock when it answered.
	Now time.Time
}

// ScopeCounts counts one scope's live records that are not succeeded.
type ScopeCounts struct {
	Scope                        string
	Processing, Retryable, Final int64
	// Stuck counts the records [ListStuck] holds.
	Stuck int64
}

// ReasonCount is how many records failed for one reason in one minute.
type ReasonCount struct {
	Minute time.Time
	Reason string
	Count  int64
}

// MinuteCount is how many records something happened to in one minute.
type MinuteCount struct {
	Minute time.Time
	Count  int64
}

// after reports whether rec sorts strictly after c in keyset order.
func (c *BrowseCursor) after(rec *Record) bool {
	if c == nil {
		return true
	}
	if d := rec.UpdatedAt.Compare(c.UpdatedAt); d != 0 {
		return d > 0
	}
	if rec.Key.Scope != c.Key.Scope {
		return rec.Key.Scope > c.Key.Scope
	}
	return rec.Key.EventID > c.Key.EventID
}

// matches reports whether rec belongs on q's list at now.
func (q *BrowseQuery) matches(rec *Record, now time.Time) bool {
	if q.Scope != "" && rec.Key.Scope != q.Scope || q.Reason != "" && FailureReason(rec.LastError) != q.Reason {
		return false
	}
	switch q.List {
	case ListStuck:
		return isStuck(rec, q.OlderThan, now)
	case ListFailedFinal:
		return rec.Status == StatusFailedFinal
	}
	return false
}

// validate checks what a store cannot answer.
func (q *BrowseQuery) validate() error {
	switch {
	case q.List != ListStuck && q.List != ListFailedFinal:
		return fmt.Errorf("%w: browse: unknown list %d", ErrConfig, q.List)
	case q.Limit <= 0:
		return fmt.Errorf("%w: browse: limit %d", ErrConfig, q.Limit)
	}
	return nil
}
