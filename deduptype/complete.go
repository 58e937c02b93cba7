package deduptype

import (
	"context"
	"time"
)

// Completion is one record for [BatchCompleter.CompleteBatch] to mark
// succeeded: the arguments of one call of a store's Complete.
type Completion struct {
	Key    Key
	Owner  string
	Result []byte
	TTL    time.Duration
	// Locator is the acquired [Claim]'s, or 0.
	Locator uint64
}

// BatchCompleter is implemented by a store that can complete several
// records in one write. A dedup.Wrapper uses it in HandleBatch and
// HandleConcurrent, as dedup.WithBatchCompletion says.
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

// ValidateCompletions validates every key of a batch completion and returns
// the first error.
func ValidateCompletions(cs []Completion) error {
	for i := range cs {
		if err := cs[i].Key.Validate(); err != nil {
			return err
		}
	}
	return nil
}
