package dedup

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// Summary implements [Browser] by reading every record: the store is a
// test's or a quickstart's, small by nature.
func (s *MemoryStore) Summary(ctx context.Context, q SummaryQuery) (Summary, error) {
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("dedup: memory summary: %w", err)
	}
	now := time.Now()
	since := now.Add(-q.Window)
	sum := Summary{Now: now}
	scopes := map[string]*ScopeCounts{}
	failures := map[ReasonCount]int64{}
	written := map[time.Time]int64{}
	s.mu.Lock()
	for key, m := range s.records.all() {
		rec := m.record(key)
		if q.Scope != "" && key.Scope != q.Scope || !rec.ExpiresAt.After(now) {
			continue
		}
		if rec.CreatedAt.After(since) {
			written[rec.CreatedAt.Truncate(time.Minute)]++
		}
		if rec.Status == StatusSucceeded {
			sum.Succeeded++
			continue
		}
		c := scopes[key.Scope]
		if c == nil {
			c = &ScopeCounts{Scope: key.Scope}
			scopes[key.Scope] = c
		}
		switch rec.Status {
		case StatusProcessing:
			c.Processing++
			if sum.OldestInFlight == nil || rec.UpdatedAt.Before(sum.OldestInFlight.UpdatedAt) {
				sum.OldestInFlight = &rec
			}
		case StatusFailedRetryable:
			c.Retryable++
		case StatusFailedFinal:
			c.Final++
		}
		if isStuck(&rec, q.OlderThan, now) {
			c.Stuck++
		}
		if rec.Status != StatusProcessing && rec.UpdatedAt.After(since) {
			failures[ReasonCount{Minute: rec.UpdatedAt.Truncate(time.Minute), Reason: FailureReason(rec.LastError)}]++
		}
	}
	s.mu.Unlock()
	if sum.OldestInFlight != nil {
		sum.OldestInFlight.Result = slices.Clone(sum.OldestInFlight.Result)
	}
	for _, c := range scopes {
		sum.Scopes = append(sum.Scopes, *c)
	}
	slices.SortFunc(sum.Scopes, func(a, b ScopeCounts) int { return cmp.Compare(a.Scope, b.Scope) })
	for rc, n := range failures {
		rc.Count = n
		sum.Failures = append(sum.Failures, rc)
	}
	slices.SortFunc(sum.Failures, func(a, b ReasonCount) int {
		return cmp.Or(a.Minute.Compare(b.Minute), cmp.Compare(a.Reason, b.Reason))
	})
	for m, n := range written {
		sum.Written = append(sum.Written, MinuteCount{Minute: m, Count: n})
	}
	slices.SortFunc(sum.Written, func(a, b MinuteCount) int { return a.Minute.Compare(b.Minute) })
	return sum, nil
}

// Browse implements [Browser] by reading every record.
func (s *MemoryStore) Browse(ctx context.Context, q BrowseQuery) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory browse: %w", err)
	}
	if err := q.validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	var out []Record
	s.mu.Lock()
	for key, m := range s.records.all() {
		rec := m.record(key)
		if rec.ExpiresAt.After(now) && q.matches(&rec, now) && q.After.after(&rec) {
			out = append(out, m.detached(key))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Record) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), cmp.Compare(a.Key.Scope, b.Key.Scope), cmp.Compare(a.Key.EventID, b.Key.EventID))
	})
	return out[:min(len(out), q.Limit)], nil
}

var _ Browser = (*MemoryStore)(nil)
