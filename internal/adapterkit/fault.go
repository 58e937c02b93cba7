package adapterkit

import (
	"log/slog"
	"sync/atomic"
)

// Fault is a set-up fault a running consumer found (a dead-letter queue or
// stream missing, a queue named twice differently), which its Health
// reports until it is fixed: logged at ERROR when found, at INFO when
// fixed, once each however often it is checked. Its zero value is no
// fault. It is safe for concurrent use.
type Fault struct{ err atomic.Pointer[error] }

// Found records err, logging it at ERROR unless a fault was recorded
// already.
func (f *Fault) Found(log *slog.Logger, err error, attrs ...any) {
	if f.err.Swap(&err) == nil {
		log.Error(err.Error(), attrs...)
	}
}

// Fixed clears the fault, logging msg at INFO if there was one.
func (f *Fault) Fixed(log *slog.Logger, msg string, attrs ...any) {
	if f.err.Swap(nil) != nil {
		log.Info(msg, attrs...)
	}
}

// Forget clears the fault without a word: its consumer stopped.
func (f *Fault) Forget() { f.err.Store(nil) }

// Err returns the fault recorded, or nil.
func (f *Fault) Err() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}
