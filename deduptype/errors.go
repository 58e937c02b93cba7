package deduptype

import (
	"errors"
	"fmt"
)

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

// ErrConfig is matched by every error a constructor of this module (dedup's
// Wrap, a store's, an adapter's) returns for a bad option.
var ErrConfig = errors.New("dedup: invalid configuration")

// ErrOutage is matched by a wrapper's Health error while deliveries have
// kept failing to be made durable (the store or the dead-letter sink
// unreachable) for its outage threshold or longer; the transport adapters'
// Health and Run report outages with it too.
var ErrOutage = errors.New("dedup: store or dead-letter sink failing")

// PanicError is a panic recovered from a handler, counted as a failed attempt.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("dedup: handler panicked: %v", e.Value) }
