package dedup

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/blob"
)

// MemoryStore is a [Store] held in process memory, for tests and the
// quickstart. Records live until [MemoryStore.Purge] removes expired ones.
type MemoryStore struct {
	mu      sync.Mutex
	records memTable
	// owners holds owner tokens made together, for the claims to come:
	// one random read and one allocation for a batch of them.
	owners      deduptype.OwnerTokens
	ownersTaken int
}

// ownerBatch is how many owner tokens the store makes at a time.
const ownerBatch = 32

// nextOwner returns a new owner token, a substring of a batch that a
// record copies (memRecord.write). s.mu must be held.
func (s *MemoryStore) nextOwner() string {
	if s.owners == "" || s.ownersTaken == ownerBatch {
		s.owners, s.ownersTaken = deduptype.NewOwnerTokens(ownerBatch, ' '), 0
	}
	s.ownersTaken++
	return s.owners.At(s.ownersTaken - 1)
}

// memRecord is a Record as the store holds it: its key, fingerprint,
// owner, last error and result cut from one byte slice (see memTable), its
// times in Unix nanoseconds (0: unset).
type memRecord struct {
	parts        blob.Blob // its key, fingerprint, owner, last error and result, in the order of memScope and the rest
	next         int32     // the slot of the next record of the same hash, 0 for none
	status       Status
	attempts     int
	leaseUntil   int64
	createdAt    int64
	updatedAt    int64
	expiresAt    int64
	firstFailure int64
	lastFailure  int64
}

// record returns rec as the Record of key. Its Result is the stored one:
// what a caller keeps is detached.
func (rec *memRecord) record(key Key) Record {
	return Record{Key: key, Status: rec.status, Fingerprint: rec.fingerprint(), Attempts: rec.attempts,
		Owner: rec.owner(), LeaseUntil: unixTime(rec.leaseUntil), CreatedAt: unixTime(rec.createdAt),
		UpdatedAt: unixTime(rec.updatedAt), ExpiresAt: unixTime(rec.expiresAt), LastError: rec.lastError(),
		FirstFailure: unixTime(rec.firstFailure), LastFailure: unixTime(rec.lastFailure), Result: rec.result()}
}

// detached returns rec as the Record of key with a Result of its own, for a
// caller to keep.
func (rec *memRecord) detached(key Key) Record {
	r := rec.record(key)
	r.Result = bytes.Clone(r.Result)
	return r
}

// unixTime is the time of Unix nanoseconds ns, the zero time for 0.
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// later returns now plus d in Unix nanoseconds, or the latest time there is
// when that overflows (a TTL of centuries).
func later(now int64, d time.Duration) int64 {
	if d > 0 && now > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return now + int64(d)
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: newMemTable()}
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
	return s.claim(req, time.Now().UnixNano(), s.nextOwner), nil
}

// ClaimBatch claims several distinct keys under one lock.
func (s *MemoryStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory claim batch: %w", err)
	}
	if err := deduptype.ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: memory claim batch: %w", err)
	}
	claims := make([]Claim, len(reqs))
	owners := deduptype.NewOwnerTokens(len(reqs), 0) // one random read for the batch, before the lock
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	for i := range reqs {
		claims[i] = s.claim(reqs[i], now, func() string { return owners.At(i) })
	}
	return claims, nil
}

// claim applies the state machine to one request at now (Unix
// nanoseconds); owner makes the token of a claim it acquires, so that a
// refused claim costs none. s.mu must be held.
func (s *MemoryStore) claim(req ClaimRequest, now int64, owner func() string) Claim {
	i, h := s.records.lookup(req.Key)
	var rec *memRecord
	if i != 0 {
		rec = s.records.at(i)
	}
	if rec == nil || now >= rec.expiresAt {
		// Expired counts as absent whatever its fingerprint: start afresh
		// in its slot.
		if rec == nil {
			rec = s.records.insertHashed(h)
		}
		*rec = memRecord{next: rec.next, createdAt: now}
		acquire(rec, req.Key, req.Fingerprint, "", req, now, owner)
		return Claim{Status: ClaimAcquired, Record: rec.record(req.Key)}
	}
	r := rec.record(req.Key)
	if deduptype.MayTakeOver(r, req.Fingerprint, unixTime(now)) {
		acquire(rec, req.Key, r.Fingerprint, r.LastError, req, now, owner)
		return Claim{Status: ClaimAcquired, Record: rec.record(req.Key), Previous: r.Status}
	}
	r.Result = bytes.Clone(r.Result)
	return Claim{Status: deduptype.Classify(r, req.Fingerprint), Record: r}
}

// acquire gives rec, of key, fingerprint and lastError, to a new owner for
// one more attempt at now.
func acquire(rec *memRecord, key Key, fingerprint, lastError string, req ClaimRequest, now int64, owner func() string) {
	rec.write(key, fingerprint, owner(), lastError, nil)
	rec.status = StatusProcessing
	rec.attempts++
	rec.leaseUntil = later(now, req.Lease)
	rec.updatedAt = now
	rec.expiresAt = later(now, req.TTL)
}

// Complete marks the record succeeded with result if owner still holds it.
func (s *MemoryStore) Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error {
	return s.update(ctx, "complete", key, owner, func(rec *memRecord, now int64) {
		rec.write(key, rec.fingerprint(), owner, rec.lastError(), result)
		rec.status = StatusSucceeded
		rec.updatedAt = now
		rec.expiresAt = later(now, ttl)
	})
}

// CompleteBatch completes each record its owner still holds, under one lock.
func (s *MemoryStore) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dedup: memory complete batch: %w", err)
	}
	if err := deduptype.ValidateCompletions(cs); err != nil {
		return nil, fmt.Errorf("dedup: memory complete batch: %w", err)
	}
	errs := make([]error, len(cs))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	for i, c := range cs {
		rec := s.held(c.Key, c.Owner, now)
		if rec == nil {
			errs[i] = fmt.Errorf("dedup: memory complete %s: %w", c.Key, ErrLeaseLost)
			continue
		}
		rec.write(c.Key, rec.fingerprint(), c.Owner, rec.lastError(), c.Result)
		rec.status = StatusSucceeded
		rec.updatedAt = now
		rec.expiresAt = later(now, c.TTL)
	}
	return errs, nil
}

// Fail records a failed attempt if owner still holds the record.
func (s *MemoryStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	return s.update(ctx, "fail", key, owner, func(rec *memRecord, now int64) {
		rec.status = StatusFailedRetryable
		if f.Final {
			rec.status = StatusFailedFinal
		}
		rec.write(key, rec.fingerprint(), owner, f.Error, rec.result())
		if rec.firstFailure == 0 {
			rec.firstFailure = now
		}
		rec.lastFailure = now
		rec.updatedAt = now
		rec.expiresAt = later(now, f.TTL)
	})
}

// Extend pushes the lease of a held record to lease from now.
func (s *MemoryStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	return s.update(ctx, "extend", key, owner, func(rec *memRecord, now int64) {
		rec.leaseUntil = later(now, lease)
		rec.updatedAt = now
	})
}

// update applies f to the record of key while owner holds it, or returns
// ErrLeaseLost; op names the operation in errors.
func (s *MemoryStore) update(ctx context.Context, op string, key Key, owner string, f func(rec *memRecord, now int64)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dedup: memory %s %s: %w", op, key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	rec := s.held(key, owner, now)
	if rec == nil {
		return fmt.Errorf("dedup: memory %s %s: %w", op, key, ErrLeaseLost)
	}
	f(rec, now)
	return nil
}

// held returns the live PROCESSING record of key owned by owner at now
// (Unix nanoseconds), or nil. The lease deadline is not checked: fencing is
// on the token, so a lapsed lease nobody took over may still be settled by
// its owner.
func (s *MemoryStore) held(key Key, owner string, now int64) *memRecord {
	rec := s.records.get(key)
	if rec == nil || now >= rec.expiresAt || rec.owner() != owner || rec.status != StatusProcessing {
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
	rec := s.records.get(key)
	if rec == nil || time.Now().UnixNano() >= rec.expiresAt {
		return Record{}, fmt.Errorf("dedup: memory get %s: %w", key, ErrNotFound)
	}
	return rec.detached(key), nil
}

// Purge deletes expired records and returns how many it removed.
func (s *MemoryStore) Purge(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("dedup: memory purge: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	n := 0
	for key, rec := range s.records.all() {
		if now >= rec.expiresAt {
			s.records.remove(key)
			n++
		}
	}
	return n, nil
}

var (
	_ Store                    = (*MemoryStore)(nil)
	_ deduptype.BatchCompleter = (*MemoryStore)(nil)
)

// Release gives back a claim whose handler never started: the record becomes
// claimable at once and the attempt is not counted.
func (s *MemoryStore) Release(ctx context.Context, key Key, owner string) error {
	return s.update(ctx, "release", key, owner, func(rec *memRecord, now int64) {
		rec.status = StatusFailedRetryable
		rec.attempts--
		rec.leaseUntil = now
		rec.updatedAt = now
	})
}
