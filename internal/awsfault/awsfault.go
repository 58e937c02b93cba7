// Package awsfault injects failures and delays into aws-sdk-go-v2 clients
// through their middleware stack, so that tests can exercise error paths
// against a real service instead of a mock. A [Fault] is added to a client
// with its APIOption and switched on and off while the client is in use:
//
//	f := awsfault.Fail(errors.New("boom"), "DeleteMessageBatch")
//	client := sqs.New(opts, func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, f.APIOption) })
//	f.Times(2) // the next two DeleteMessageBatch calls fail
package awsfault

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/aws/smithy-go/middleware"
)

// Fault fails or delays the calls of chosen operations while it is on. It is
// safe for concurrent use.
type Fault struct {
	ops   map[string]bool
	err   error
	delay time.Duration
	// left is how many more matching calls to affect; negative means all.
	left atomic.Int64
	hits atomic.Int64
}

// Fail returns a fault, off until switched on, that makes the named
// operations (all when none is named) return err without sending anything.
// The SDK reports err wrapped in its *smithy.OperationError.
func Fail(err error, operations ...string) *Fault {
	return newFault(err, 0, operations)
}

// Delay returns a fault, off until switched on, that holds the named
// operations (all when none is named) for d before sending them; a call whose
// context ends first returns the context's error.
func Delay(d time.Duration, operations ...string) *Fault {
	return newFault(nil, d, operations)
}

func newFault(err error, d time.Duration, operations []string) *Fault {
	f := &Fault{err: err, delay: d}
	if len(operations) > 0 {
		f.ops = make(map[string]bool, len(operations))
		for _, op := range operations {
			f.ops[op] = true
		}
	}
	return f
}

// On affects every matching call until Off.
func (f *Fault) On() { f.left.Store(-1) }

// Times affects the next n matching calls, then switches the fault off.
func (f *Fault) Times(n int) { f.left.Store(int64(max(n, 0))) }

// Off stops affecting calls.
func (f *Fault) Off() { f.left.Store(0) }

// Hits returns how many calls the fault has affected so far.
func (f *Fault) Hits() int { return int(f.hits.Load()) }

// take reports whether the current call is to be affected, counting it.
func (f *Fault) take() bool {
	for {
		n := f.left.Load()
		if n == 0 {
			return false
		}
		if n < 0 || f.left.CompareAndSwap(n, n-1) {
			f.hits.Add(1)
			return true
		}
	}
}

// APIOption adds the fault to an operation's middleware stack; append it to
// a client's APIOptions (or to one call's options).
func (f *Fault) APIOption(stack *middleware.Stack) error {
	if f.ops != nil && !f.ops[stack.ID()] {
		return nil
	}
	// Initialize runs once per call, before the SDK's retries: one affected
	// call is one failed or delayed operation as the caller sees it.
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("awsfault",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if !f.take() {
				return next.HandleInitialize(ctx, in)
			}
			if f.delay > 0 {
				t := time.NewTimer(f.delay)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return middleware.InitializeOutput{}, middleware.Metadata{}, ctx.Err()
				}
			}
			if f.err != nil {
				return middleware.InitializeOutput{}, middleware.Metadata{}, f.err
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}
