package dedup

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Stuck implements [Admin].
func (s *MemoryStore) Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory stuck: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []Record
	for key, rec := range s.records.all() {
		if r := rec.record(key); (scope == "" || key.Scope == scope) && r.ExpiresAt.After(now) && isStuck(&r, olderThan, now) {
			out = append(out, rec.detached(key))
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return a.UpdatedAt.Compare(b.UpdatedAt) })
	return out[:min(len(out), limit)], nil
}

// Forget implements [Admin].
func (s *MemoryStore) Forget(ctx context.Context, key Key, owner string) (bool, error) {
	if err := key.Validate(); err != nil {
		return false, fmt.Errorf("dedup: memory forget: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("dedup: memory forget %s: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records.get(key)
	if rec == nil || rec.owner() != owner || rec.status == StatusSucceeded {
		return false, nil
	}
	s.records.remove(key)
	return true, nil
}
