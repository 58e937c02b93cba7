package dedup

import (
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
// reads back one way: "billing/charge"/e1. The zero Key is "". A part
// longer than [MaxIDLen], which no valid key has, is cut and its length
// said.
func (k Key) String() string {
	scope, id := cutID(k.Scope), cutID(k.EventID)
	switch {
	case k == Key{}:
		return ""
	case strings.Contains(scope, "/") || strings.HasPrefix(scope, `"`):
		return strconv.Quote(scope) + "/" + id
	}
	return scope + "/" + id
}

// cutID returns s, or, when it is longer than any valid ID, its first 64
// bytes and its length: a log line of a refused key
// says what it began with without repeating kilobytes of it.
func cutID(s string) string {
	if len(s) <= MaxIDLen {
		return s
	}
	// A character cut in two is dropped, as invalid UTF-8 is.
	return fmt.Sprintf("%s...(%d bytes)", strings.ToValidUTF8(s[:64], ""), len(s))
}

// KeyError describes why a key was rejected. It matches [ErrInvalidKey].
type KeyError struct {
	Key    Key
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("invalid key (scope %q, event ID %q): %s", cutID(e.Key.Scope), cutID(e.Key.EventID), e.Reason)
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
