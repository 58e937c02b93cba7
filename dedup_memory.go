package dedup

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// MemoryStore is a [Store] held in process memory, for tests and the
// quickstart. Records live until [MemoryStore.Purge] removes expired ones.
type MemoryStore struct {
	mu sync.Mutex
	// Records are held by pointer: a Record is larger than the 128 bytes a Go
	// map stores inline, so by-value storage would allocate per insert anyway,
	// and a pointer lets updates happen in place with one lookup.
	records map[Key]*Record
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: make(map[Key]*Record)}
}

// Claim atomically creates or takes over the record for req.Key, or reports
// why it cannot.
func (s *MemoryStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if err := ctx.Err(); err != nil {
		return Claim{}, fmt.Errorf("dedup: memory claim %s: %w", req.Key, err)
	}
	if err := req.Key.Validate(); err != nil {
		return Claim{}, fmt.Errorf("dedup: memory claim: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claim(req, time.Now(), NewOwnerToken), nil
}

// ClaimBatch claims several distinct keys under one lock.
func (s *MemoryStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory claim batch: %w", err)
	}
	if err := ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: memory claim batch: %w", err)
	}
	claims := make([]Claim, len(reqs))
	owners := ownerTokens(len(reqs), 0) // one random read for the batch, before the lock
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i := range reqs {
		claims[i] = s.claim(reqs[i], now, func() string { return ownerToken(owners, i) })
	}
	return claims, nil
}

// claim applies the state machine to one request; owner makes the token of
// a claim it acquires, so that a refused claim costs none. s.mu must be held.
func (s *MemoryStore) claim(req ClaimRequest, now time.Time, owner func() string) Claim {
	rec, ok := s.records[req.Key]
	if !ok || !now.Before(rec.ExpiresAt) {
		// Expired counts as absent whatever its fingerprint: start afresh,
		// reusing the old allocation when there is one.
		if ok {
			*rec = Record{}
		} else {
			rec = new(Record)
			s.records[req.Key] = rec
		}
		rec.Key = req.Key
		rec.Fingerprint = req.Fingerprint
		rec.CreatedAt = now
		s.acquire(rec, req, now, owner)
		return Claim{Status: ClaimAcquired, Record: *rec}
	}
	if MayTakeOver(*rec, req.Fingerprint, now) {
		previous := rec.Status
		s.acquire(rec, req, now, owner)
		return Claim{Status: ClaimAcquired, Record: copyRecord(rec), Previous: previous}
	}
	return Claim{Status: Classify(*rec, req.Fingerprint), Record: copyRecord(rec)}
}

// acquire gives rec to a new owner for one more attempt.
func (s *MemoryStore) acquire(rec *Record, req ClaimRequest, now time.Time, owner func() string) {
	rec.Status = StatusProcessing
	rec.Attempts++
	rec.Owner = owner()
	rec.LeaseUntil = now.Add(req.Lease)
	rec.UpdatedAt = now
	rec.ExpiresAt = now.Add(req.TTL)
}

// Complete marks the record succeeded with result if owner still holds it.
func (s *MemoryStore) Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error {
	result = bytes.Clone(result)
	return s.update(ctx, "complete", key, owner, func(rec *Record, now time.Time) {
		rec.Status = StatusSucceeded
		rec.Result = result
		rec.UpdatedAt = now
		rec.ExpiresAt = now.Add(ttl)
	})
}

// CompleteBatch completes each record its owner still holds, under one lock.
func (s *MemoryStore) CompleteBatch(ctx context.Context, cs []Completion) ([]error, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory complete batch: %w", err)
	}
	if err := validateCompletions(cs); err != nil {
		return nil, fmt.Errorf("dedup: memory complete batch: %w", err)
	}
	results := make([][]byte, len(cs))
	for i := range cs {
		results[i] = bytes.Clone(cs[i].Result)
	}
	errs := make([]error, len(cs))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, c := range cs {
		rec := s.held(c.Key, c.Owner, now)
		if rec == nil {
			errs[i] = fmt.Errorf("dedup: memory complete %s: %w", c.Key, ErrLeaseLost)
			continue
		}
		rec.Status = StatusSucceeded
		rec.Result = results[i]
		rec.UpdatedAt = now
		rec.ExpiresAt = now.Add(c.TTL)
	}
	return errs, nil
}

// Fail records a failed attempt if owner still holds the record.
func (s *MemoryStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	return s.update(ctx, "fail", key, owner, func(rec *Record, now time.Time) {
		rec.Status = StatusFailedRetryable
		if f.Final {
			rec.Status = StatusFailedFinal
		}
		rec.LastError = f.Error
		if rec.FirstFailure.IsZero() {
			rec.FirstFailure = now
		}
		rec.LastFailure = now
		rec.UpdatedAt = now
		rec.ExpiresAt = now.Add(f.TTL)
	})
}

// Extend pushes the lease of a held record to lease from now.
func (s *MemoryStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	return s.update(ctx, "extend", key, owner, func(rec *Record, now time.Time) {
		rec.LeaseUntil = now.Add(lease)
		rec.UpdatedAt = now
	})
}

// update applies f to the record of key while owner holds it, or returns
// ErrLeaseLost; op names the operation in errors.
func (s *MemoryStore) update(ctx context.Context, op string, key Key, owner string, f func(rec *Record, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dedup: memory %s %s: %w", op, key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	rec := s.held(key, owner, now)
	if rec == nil {
		return fmt.Errorf("dedup: memory %s %s: %w", op, key, ErrLeaseLost)
	}
	f(rec, now)
	return nil
}

// held returns the live PROCESSING record of key owned by owner, or nil.
// The lease deadline is not checked: fencing is on the token, so a lapsed
// lease nobody took over may still be settled by its owner.
func (s *MemoryStore) held(key Key, owner string, now time.Time) *Record {
	rec, ok := s.records[key]
	if !ok || !now.Before(rec.ExpiresAt) || rec.Owner != owner || rec.Status != StatusProcessing {
		return nil
	}
	return rec
}

// Get returns a copy of the live record for key, or ErrNotFound.
func (s *MemoryStore) Get(ctx context.Context, key Key) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("dedup: memory get %s: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[key]
	if !ok || !time.Now().Before(rec.ExpiresAt) {
		return Record{}, fmt.Errorf("dedup: memory get %s: %w", key, ErrNotFound)
	}
	return copyRecord(rec), nil
}

// Purge deletes expired records and returns how many it removed.
func (s *MemoryStore) Purge(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("dedup: memory purge: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	n := 0
	for key, rec := range s.records {
		if !now.Before(rec.ExpiresAt) {
			delete(s.records, key)
			n++
		}
	}
	return n, nil
}

// copyRecord returns *rec with its own Result, so callers cannot change the
// stored one.
func copyRecord(rec *Record) Record {
	out := *rec
	out.Result = bytes.Clone(rec.Result)
	return out
}

var (
	_ Store          = (*MemoryStore)(nil)
	_ BatchCompleter = (*MemoryStore)(nil)
)

// Release gives back a claim whose handler never started: the record becomes
// claimable at once and the attempt is not counted.
func (s *MemoryStore) Release(ctx context.Context, key Key, owner string) error {
	return s.update(ctx, "release", key, owner, func(rec *Record, now time.Time) {
		rec.Status = StatusFailedRetryable
		rec.Attempts--
		rec.LeaseUntil = now
		rec.UpdatedAt = now
	})
}
