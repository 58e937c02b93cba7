package dedup

import (
	"context"
	"time"
)

// Completion is one record for [BatchCompleter.CompleteBatch] to mark
// succeeded: the arguments of one [Store.Complete] call.
type Completion struct {
	Key    Key
	Owner  string
	Result []byte
	TTL    time.Duration
}

// BatchCompleter is implemented by a [Store] that can complete several
// records in one write. A [Wrapper] made with [WithBatchCompletion] uses it
// in HandleBatch.
type BatchCompleter interface {
	// CompleteBatch does what Complete does for each completion, fenced on
	// each one's owner. It returns one error per completion, nil when the
	// record was completed and matching ErrLeaseLost when its owner no
	// longer held it. A non-nil second result means the write failed: none
	// of the completions may be taken as done. Any invalid key fails the
	// whole batch before anything is written.
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
