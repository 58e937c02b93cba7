package lambdastreamdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/group"
)

// InPlaceReserve is the time an invocation keeps for the rest of its batch
// and its response: a record that will be retried (its RetryAfter, the
// wrapper's backoff) or whose event another invocation holds is waited for
// in place, and run again, only while the invocation has more than its
// RetryAfter plus this left before its deadline.
const InPlaceReserve = time.Second

// newPolicy returns the policy deciding the records' actions
// (adapterkit's one mapping of the wrapper's answers): a record answered
// OutcomeRetry or OutcomeInFlight is redelivered after the wrapper's
// RetryAfter, unbounded, which is waited in place; one that could not be
// made durable (the store or the sink failing) lapses, with no backoff of
// the adapter's own: it is reported, and Lambda's retry of the batch
// from it is its redelivery. No Run gives up on an outage: Lambda's
// invocations are what the function's own retries bound.
func newPolicy() *adapterkit.Policy {
	return &adapterkit.Policy{InFlightDelay: adapterkit.Unbounded}
}

// run processes recs through w with stream semantics and returns the
// sequence number of each shard's first record that did not settle.
func run[M any](ctx context.Context, w *dedup.Wrapper[M], p *adapterkit.Policy, recs []M, shard, sequence func(M) string) []string {
	var failed []string
	for _, g := range group.By(recs, shard) {
		if i := runShard(ctx, w, p, g); i < len(g) {
			failed = append(failed, sequence(g[i]))
		}
	}
	return failed
}

// runShard runs the records of one shard in order and returns the index of
// the first that did not settle, len(g) when all did. A record p decides
// to redeliver (one that will be retried, or is held elsewhere) is waited
// for in place (as a Kafka partition waits) while the invocation's
// deadline allows, so that Lambda's retries, which come at once and are
// counted by the event source mapping, are spent only when the invocation
// runs out of time; the records after it never run before it settles.
func runShard[M any](ctx context.Context, w *dedup.Wrapper[M], p *adapterkit.Policy, g []M) int {
	for from := 0; ; {
		next, held := from, false
		var d adapterkit.Decision
		adapterkit.InOrder(p.Batch(nil), g[from:], func(ms []M, yield func(int, dedup.Result, error) bool) error {
			return w.HandleBatch(ctx, ms, yield)
		}, func(i int, _ dedup.Result, rd adapterkit.Decision) {
			switch {
			case held: // behind the first not settled: not run
			case !rd.Settled():
				held, d = true, rd
			default:
				next = from + i + 1
			}
		})
		if next == len(g) || d.Action != adapterkit.Redeliver || !waitInPlace(ctx, d.Delay) {
			return next
		}
		from = next
	}
}

// waitInPlace waits d and reports true when ctx has a deadline more than d
// plus InPlaceReserve away; it reports false at once otherwise, or when ctx
// ends while it waits.
func waitInPlace(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	if !ok || time.Until(deadline) <= d+InPlaceReserve {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// nilWrapper is the error of an invocation of a handler given no wrapper.
func nilWrapper(name string) error {
	return fmt.Errorf("%w: lambdastreamdedup.%s: nil wrapper", dedup.ErrConfig, name)
}
