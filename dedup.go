// Package dedup makes event consumers safe under at-least-once delivery.
//
// A [Wrapper] sits between a transport (Kafka, SQS, ...) and a handler. For
// every delivery it claims the event's key in a [Store] with one atomic
// operation, runs the handler only when the claim was won, and records the
// outcome, so that one logical event has one business effect however often it
// arrives. A message that keeps failing is parked in a dead-letter [Sink]
// after a bounded number of attempts instead of looping forever.
package dedup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxIDLen is the longest event ID or scope, in bytes, that a key may hold.
const MaxIDLen = 255

// Sentinel errors returned by stores and the wrapper; test with errors.Is.
// They come wrapped in an error that names the package, the operation and
// the key, so their own text has no prefix.
var (
	// ErrLeaseLost means the caller's claim was taken over by another owner
	// (its lease expired) or the record changed, so the write was refused.
	ErrLeaseLost = errors.New("lease lost")
	// ErrInvalidKey means a scope or event ID is empty, too long or contains
	// control characters. Nothing was written.
	ErrInvalidKey = errors.New("invalid key")
	// ErrFingerprintConflict means the key is already recorded with another
	// fingerprint: the producer reused an event ID for a different event.
	ErrFingerprintConflict = errors.New("fingerprint conflict")
	// ErrNotFound means the store holds no live record for the key.
	ErrNotFound = errors.New("record not found")
	// ErrMalformedRecord means the store returned a record it cannot decode.
	ErrMalformedRecord = errors.New("malformed record")
)

// Status is the state of a record; see the state machine in the README.
type Status string

// The statuses a record moves through.
const (
	StatusProcessing      Status = "PROCESSING"
	StatusSucceeded       Status = "SUCCEEDED"
	StatusFailedRetryable Status = "FAILED_RETRYABLE"
	StatusFailedFinal     Status = "FAILED_FINAL"
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusProcessing, StatusSucceeded, StatusFailedRetryable, StatusFailedFinal:
		return true
	}
	return false
}

// Key identifies one logical event within a scope (normally a consumer and
// handler name, optionally a tenant).
type Key struct {
	Scope   string
	EventID string
}

// String returns the key for logs and errors as scope/eventID, the scope
// quoted when it contains a '/' or starts with a quote, so that every key
// reads back one way: "billing/charge"/e1. The zero Key is "".
func (k Key) String() string {
	switch {
	case k == Key{}:
		return ""
	case strings.Contains(k.Scope, "/") || strings.HasPrefix(k.Scope, `"`):
		return strconv.Quote(k.Scope) + "/" + k.EventID
	}
	return k.Scope + "/" + k.EventID
}

// KeyError describes why a key was rejected. It matches [ErrInvalidKey].
type KeyError struct {
	Key    Key
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("invalid key (scope %q, event ID %q): %s", e.Key.Scope, e.Key.EventID, e.Reason)
}

// Unwrap returns [ErrInvalidKey].
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// Validate returns a *KeyError when the scope or event ID is empty, longer
// than [MaxIDLen] bytes, not valid UTF-8, or contains control characters.
func (k Key) Validate() error {
	if reason := checkID(k.Scope); reason != "" {
		return &KeyError{Key: k, Reason: "scope " + reason}
	}
	if reason := checkID(k.EventID); reason != "" {
		return &KeyError{Key: k, Reason: "event ID " + reason}
	}
	return nil
}

func checkID(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxIDLen:
		return fmt.Sprintf("is %d bytes, over %d", len(s), MaxIDLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Sprintf("contains control character %U", r)
		}
	}
	return ""
}

// Record is what a store keeps per key.
type Record struct {
	Key         Key
	Status      Status
	Fingerprint string
	// Attempts counts handler starts for this key, crash loops included.
	Attempts int
	// Owner is the token of the claim that holds or last held the lease.
	Owner      string
	LeaseUntil time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
	// LastError is the error text of the latest failed attempt.
	LastError    string
	FirstFailure time.Time
	LastFailure  time.Time
	// Result is what the handler stored on success, if anything.
	Result []byte
}

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

func (s ClaimStatus) String() string {
	if s < 0 || int(s) >= len(claimStatusNames) {
		return fmt.Sprintf("ClaimStatus(%d)", int(s))
	}
	return claimStatusNames[s]
}

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

// NewOwnerToken returns a random token identifying one claim, for Store
// implementations.
func NewOwnerToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error.
	var buf [32]byte
	hex.Encode(buf[:], b[:])
	return string(buf[:])
}
