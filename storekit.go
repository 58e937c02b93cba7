package dedup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// This file is the store author's kit: the [Store] contract and what its
// implementations share. A user of the package needs none of it beyond the
// name Store; see "Writing a store" in the package documentation.

// ClaimRequest asks a store to claim one key.
type ClaimRequest struct {
	Key         Key
	Fingerprint string
	// Lease is how long the claim stays exclusive unless extended.
	Lease time.Duration
	// TTL is how long the record is retained after this write.
	TTL time.Duration
}

// ClaimStatus is a store's answer to a claim.
type ClaimStatus int

// The answers a claim can get, one per row of the state machine.
const (
	// ClaimAcquired: the caller owns the lease and should run the handler.
	// Claim.Record.Attempts is the number of this attempt.
	ClaimAcquired ClaimStatus = iota + 1
	// ClaimDuplicate: the event already succeeded with the same fingerprint.
	ClaimDuplicate
	// ClaimInFlight: another owner holds a live lease.
	ClaimInFlight
	// ClaimConflict: the key is recorded with another fingerprint.
	ClaimConflict
	// ClaimFinal: the event already failed for good (it was dead-lettered).
	ClaimFinal
)

var claimStatusNames = [...]string{"", "acquired", "duplicate", "in-flight", "conflict", "final"}

func (s ClaimStatus) String() string { return enumName(claimStatusNames[:], int(s), "ClaimStatus") }

// Claim is the result of claiming one key.
type Claim struct {
	Status ClaimStatus
	// Record is the record after the claim: the caller's own when acquired,
	// the existing one otherwise.
	Record Record
	// Previous is the status the key had before an acquired claim took it
	// over; empty when the key was absent or expired. A takeover from
	// StatusProcessing means the previous owner died mid-attempt.
	Previous Status
	// Locator is where the store wrote an acquired record, in a form only
	// the store reads (the PostgreSQL store: the row's ctid), or 0. The
	// wrapper hands it back in the claim's [Completion], so that a store
	// can find the record without a lookup by key; the owner check must
	// still guard the write, since the record may have moved since.
	Locator uint64
}

// Failure describes a failed attempt for [Store.Fail].
type Failure struct {
	// Final moves the record to StatusFailedFinal instead of
	// StatusFailedRetryable.
	Final bool
	// Error is the failure's text, kept as Record.LastError.
	Error string
	// TTL is the retention from now.
	TTL time.Duration
}

// Store keeps dedup records. Implementations must make Claim atomic (one
// conditional write, never check-then-insert) and fence Complete, Fail and
// Extend on the owner token. The deduptest package checks a Store against
// this contract.
type Store interface {
	// Claim atomically creates or takes over the record for req.Key, or
	// reports why it cannot. An invalid key returns an error matching
	// ErrInvalidKey and writes nothing.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	// ClaimBatch claims several distinct keys, answering exactly as the
	// same claims made one by one would; results are in request order. Any
	// invalid or repeated key fails the whole batch before anything is
	// written (ValidateBatch checks both): the wrapper sends each key of a
	// batch once and answers its later copies itself.
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error)
	// Complete marks the record succeeded, keeping result, if owner still
	// holds it; otherwise it returns ErrLeaseLost and changes nothing.
	Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error
	// Fail records a failed attempt if owner still holds the record;
	// otherwise it returns ErrLeaseLost and changes nothing.
	Fail(ctx context.Context, key Key, owner string, f Failure) error
	// Extend pushes the lease of a held record to lease from now, or returns
	// ErrLeaseLost.
	Extend(ctx context.Context, key Key, owner string, lease time.Duration) error
	// Release gives back a claim whose handler never started, so the key can
	// be claimed again at once and the attempt is not counted. It returns
	// ErrLeaseLost if owner no longer holds the record.
	Release(ctx context.Context, key Key, owner string) error
	// Get returns the live record for key, or ErrNotFound (expired records
	// count as absent).
	Get(ctx context.Context, key Key) (Record, error)
	// Purge deletes expired records and returns how many it removed.
	Purge(ctx context.Context) (int, error)
}

// Classify answers a claim that the store could not acquire, from the record
// that blocked it: a different fingerprint is a conflict whatever the status,
// then the status decides. It is exported for Store implementations.
func Classify(rec Record, fingerprint string) ClaimStatus {
	if rec.Fingerprint != fingerprint {
		return ClaimConflict
	}
	switch rec.Status {
	case StatusSucceeded:
		return ClaimDuplicate
	case StatusFailedFinal:
		return ClaimFinal
	default:
		return ClaimInFlight
	}
}

// MayTakeOver reports whether a claim with fingerprint takes over rec at now:
// the same payload, and a retryable failure or a processing claim whose
// lease has lapsed. It is exported for Store implementations, whose atomic
// claim must apply it in the same step as the write.
func MayTakeOver(rec Record, fingerprint string, now time.Time) bool {
	return rec.Fingerprint == fingerprint &&
		(rec.Status == StatusFailedRetryable || rec.Status == StatusProcessing && !now.Before(rec.LeaseUntil))
}

// ValidateBatch validates every key of a batch claim and checks that none
// is repeated, returning the first error, for Store implementations.
func ValidateBatch(reqs []ClaimRequest) error {
	var seen map[Key]struct{}
	if len(reqs) > 1 {
		seen = make(map[Key]struct{}, len(reqs))
	}
	for i := range reqs {
		if err := reqs[i].Key.Validate(); err != nil {
			return err
		}
		if seen == nil {
			continue
		}
		if _, ok := seen[reqs[i].Key]; ok {
			return fmt.Errorf("key %s repeated in a batch claim", reqs[i].Key)
		}
		seen[reqs[i].Key] = struct{}{}
	}
	return nil
}

// Completion is one record for [BatchCompleter.CompleteBatch] to mark
// succeeded: the arguments of one [Store.Complete] call.
type Completion struct {
	Key    Key
	Owner  string
	Result []byte
	TTL    time.Duration
	// Locator is the acquired [Claim]'s, or 0.
	Locator uint64
}

// BatchCompleter is implemented by a [Store] that can complete several
// records in one write. A [Wrapper] uses it in HandleBatch and
// HandleConcurrent, as [WithBatchCompletion] says.
type BatchCompleter interface {
	// CompleteBatch does what Complete does for each completion, fenced on
	// each one's owner. It returns one error per completion, nil when the
	// record was completed and matching ErrLeaseLost when its owner no
	// longer held it. A non-nil second result means the write failed: none
	// of the completions may be taken as done. Any invalid key fails the
	// whole batch before anything is written. CompleteBatch must not keep
	// cs: the wrapper reuses it.
	CompleteBatch(ctx context.Context, cs []Completion) ([]error, error)
}

// validateCompletions validates every key of a batch completion and returns
// the first error.
func validateCompletions(cs []Completion) error {
	for i := range cs {
		if err := cs[i].Key.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// NewOwnerToken returns a random token identifying one claim, for Store
// implementations.
func NewOwnerToken() string { return ownerTokens(1, 0) }

// ownerTokens returns n new owner tokens of 32 hex digits in one string,
// each followed by sep but the last: token w is tokens[33*w : 33*w+32], a
// substring that costs no allocation.
func ownerTokens(n int, sep byte) string {
	var (
		b      strings.Builder
		random [16 * 32]byte // read for 32 tokens at a time
		digits [32]byte
	)
	b.Grow(max(33*n-1, 0))
	for w := range n {
		if w%32 == 0 {
			_, _ = rand.Read(random[:16*min(32, n-w)]) // crypto/rand.Read never returns an error.
		}
		hex.Encode(digits[:], random[16*(w%32):][:16])
		if w > 0 {
			b.WriteByte(sep)
		}
		b.Write(digits[:])
	}
	return b.String()
}

// ownerToken returns token w of a string made by ownerTokens.
func ownerToken(tokens string, w int) string { return tokens[33*w : 33*w+32] }
