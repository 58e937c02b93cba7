package dedup

import (
	"context"
)

// HandleConcurrent processes msgs, whose order does not matter (the
// messages of one SQS receive), claiming their keys in one store call and
// running their handlers concurrently; with batch completion (the default,
// see [WithBatchCompletion]) the successes are then completed together, in
// as few writes as the wait allows. Once every message is settled it calls
// yield with each one's index and result, in order; every message gets
// one. A key held more than once follows HandleBatch's rule (see
// [Wrapper.HandleBatch]): a later copy with the same payload is answered
// from the first copy's outcome, one with another payload is claimed on its
// own once the first copy settled. It returns an error, having processed
// nothing, only when the batch claim itself fails.
//
// It runs on HandleBatch's loop, each segment's handlers at once.
func (w *Wrapper[M]) HandleConcurrent(ctx context.Context, msgs []M, yield func(i int, res Result, err error), opts ...CallOpt) error {
	call := callOptions(opts)
	call.stop = nil // it settles every message it was given
	b := w.newBatch(ctx, msgs, &call, w.runAtOnce)
	defer w.releaseBatch(b)
	if w.tel != nil {
		defer b.endSpans()
	}
	answers := make([]answer, len(msgs))
	b.atOnce = true
	b.yield = func(i int, res Result, err error) bool {
		answers[i] = answer{res, err, true}
		return true
	}
	if err := b.run(ctx); err != nil {
		return err
	}
	for i := range answers {
		if !answers[i].given {
			// The batch stopped here, ctx done: the rest come back.
			b.failFrom(ctx, i, context.Cause(ctx))
			break
		}
	}
	for i, a := range answers {
		yield(i, a.res, a.err)
	}
	return nil
}

// answer is a result HandleConcurrent gives once every message has one.
type answer struct {
	res   Result
	err   error
	given bool
}
