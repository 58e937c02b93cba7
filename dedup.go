package dedup

import (
	"context"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// This file is the vocabulary a user's code names, declared in package
// deduptype so that stores, adapters and front ends share it without
// importing this package, and the [Store] contract. Each name here is an
// alias: dedup.Key and deduptype.Key are one type, and errors.Is matches
// either name of a sentinel error.

// MaxIDLen is the longest event ID or scope, in bytes, that a key may hold.
const MaxIDLen = deduptype.MaxIDLen

// Sentinel errors returned by stores and the wrapper; test with errors.Is.
// They come wrapped in an error that names the package, the operation and
// the key, so their own text has no prefix.
var (
	// ErrLeaseLost means the caller's claim was taken over by another owner
	// (its lease expired) or the record changed, so the write was refused.
	ErrLeaseLost = deduptype.ErrLeaseLost
	// ErrInvalidKey means a scope or event ID is empty, too long or contains
	// control characters. Nothing was written.
	ErrInvalidKey = deduptype.ErrInvalidKey
	// ErrFingerprintConflict means the key is already recorded with another
	// fingerprint: the producer reused an event ID for a different event.
	ErrFingerprintConflict = deduptype.ErrFingerprintConflict
	// ErrNotFound means the store holds no live record for the key.
	ErrNotFound = deduptype.ErrNotFound
	// ErrMalformedRecord means the store returned a record it cannot decode.
	ErrMalformedRecord = deduptype.ErrMalformedRecord
)

// Key identifies one logical event within a scope (normally a consumer and
// handler name, optionally a tenant).
type Key = deduptype.Key

// KeyError describes why a key was rejected. It matches [ErrInvalidKey].
type KeyError = deduptype.KeyError

// Status is the state of a record; see the state machine in the README.
type Status = deduptype.Status

// The statuses a record moves through.
const (
	StatusProcessing      = deduptype.StatusProcessing
	StatusSucceeded       = deduptype.StatusSucceeded
	StatusFailedRetryable = deduptype.StatusFailedRetryable
	StatusFailedFinal     = deduptype.StatusFailedFinal
)

// Record is what a store keeps per key.
type Record = deduptype.Record

// ClaimRequest asks a store to claim one key.
type ClaimRequest = deduptype.ClaimRequest

// ClaimStatus is a store's answer to a claim.
type ClaimStatus = deduptype.ClaimStatus

// The answers a claim can get, one per row of the state machine; see
// [deduptype.ClaimAcquired] and the rest.
const (
	ClaimAcquired  = deduptype.ClaimAcquired
	ClaimDuplicate = deduptype.ClaimDuplicate
	ClaimInFlight  = deduptype.ClaimInFlight
	ClaimConflict  = deduptype.ClaimConflict
	ClaimFinal     = deduptype.ClaimFinal
)

// Claim is the result of claiming one key.
type Claim = deduptype.Claim

// Failure describes a failed attempt for [Store.Fail].
type Failure = deduptype.Failure

// Store keeps dedup records. Implementations must make Claim atomic (one
// conditional write, never check-then-insert) and fence Complete, Fail and
// Extend on the owner token. The deduptest package checks a Store against
// this contract; package deduptype holds the kit its implementations share.
type Store interface {
	// Claim atomically creates or takes over the record for req.Key, or
	// reports why it cannot. An invalid key returns an error matching
	// ErrInvalidKey and writes nothing.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	// ClaimBatch claims several distinct keys, answering exactly as the
	// same claims made one by one would; results are in request order. Any
	// invalid or repeated key fails the whole batch before anything is
	// written (deduptype.ValidateBatch checks both): the wrapper sends each
	// key of a batch once and answers its later copies itself.
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
