package adapterkit

import (
	"github.com/dedupkit/dedup/deduptype"
)

// Concurrent runs msgs through handle (the wrapper's HandleConcurrent with
// the adapter's call options) and calls act with each delivery's index,
// result and decision, in order. When the batch claim fails, none ran: act
// is called for each delivery with the claim's error decided. When Run is
// stopping already, none runs: act gets each with [NotRun].
func Concurrent[M any](b *Batch, msgs []M, handle func([]M, func(int, deduptype.Result, error)) error, act func(int, deduptype.Result, Decision)) {
	if b.Stopping() {
		for i := range msgs {
			act(i, deduptype.Result{}, NotRun())
		}
		return
	}
	err := handle(msgs, func(i int, res deduptype.Result, err error) { act(i, res, b.Decide(res, err)) })
	if err != nil {
		for i := range msgs {
			act(i, deduptype.Result{}, b.Decide(deduptype.Result{}, err))
		}
	}
}

// InOrder runs msgs through handle (the wrapper's HandleBatch with the
// adapter's call options, which should include dedup.CallStop of the
// batch's stop) and calls act once for each delivery, in order: with its
// result and decision while they settle and Run is not stopping; when the
// batch claim fails, none ran, with the claim's error decided; and those
// not run, behind the first not settled or once Run is stopping, with
// [NotRun]. When Run is stopping already, none runs.
func InOrder[M any](b *Batch, msgs []M, handle func([]M, func(int, deduptype.Result, error) bool) error, act func(int, deduptype.Result, Decision)) {
	acted := 0
	if !b.Stopping() {
		err := handle(msgs, func(i int, res deduptype.Result, err error) bool {
			d := b.Decide(res, err)
			act(i, res, d)
			acted = i + 1
			return d.Settled() && !b.Stopping()
		})
		if err != nil {
			for i := acted; i < len(msgs); i++ {
				act(i, deduptype.Result{}, b.Decide(deduptype.Result{}, err))
			}
			return
		}
	}
	for i := acted; i < len(msgs); i++ {
		act(i, deduptype.Result{}, NotRun())
	}
}
