package lambdastreamdedup

import (
	"context"
	"fmt"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/group"
)

// run processes recs through w with stream semantics and returns the
// sequence number of each shard's first record that did not settle: the
// records of a shard run in order, and a shard stops at the first one that
// does not settle, leaving those after it unrun for Lambda to retry.
func run[M any](ctx context.Context, w *dedup.Wrapper[M], recs []M, shard, sequence func(M) string) []string {
	var failed []string
	for _, g := range group.By(recs, shard) {
		next, stopped := 0, false
		// An error here (the batch claim failed) ran nothing: next stays 0.
		_ = w.HandleBatch(ctx, g, func(i int, res dedup.Result, err error) bool {
			if stopped {
				return false
			}
			if err != nil || !res.Settled() {
				next, stopped = i, true
				return false
			}
			next = i + 1
			return true
		})
		if next < len(g) {
			failed = append(failed, sequence(g[next]))
		}
	}
	return failed
}

// nilWrapper is the error of an invocation of a handler given no wrapper.
func nilWrapper(name string) error {
	return fmt.Errorf("%w: lambdastreamdedup.%s: nil wrapper", dedup.ErrConfig, name)
}
