package dedup

import (
	"errors"

	"github.com/dedupkit/dedup/deduptype"
)

// permanentError marks a handler error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that no retry can fix: the message is
// dead-lettered at once with ReasonPermanent. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is a panic recovered from a handler, counted as a failed attempt.
type PanicError = deduptype.PanicError
