package dedup_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// TestBatchCompletionWithinTheLease runs a batch whose second handler
// lasts until a copy of the first event, delivered elsewhere meanwhile, is
// settled (or three leases passed): the first's success, queued for batch
// completion, must be written within its lease by the completer's own
// timer, not when the next result settles, so that the copy finds it
// done rather than running it again once the lease lapsed.
func TestBatchCompletionWithinTheLease(t *testing.T) {
	const lease = 2 * time.Second
	run := map[string]func(ctx context.Context, w *dedup.Wrapper[event], batch []event) error{
		"HandleBatch": func(ctx context.Context, w *dedup.Wrapper[event], batch []event) error {
			return w.HandleBatch(ctx, batch, func(int, dedup.Result, error) bool { return true })
		},
		"HandleConcurrent": func(ctx context.Context, w *dedup.Wrapper[event], batch []event) error {
			return w.HandleConcurrent(ctx, batch, func(int, dedup.Result, error) {})
		},
	}
	for storeName, newStore := range stores() {
		for name, handle := range run {
			t.Run(storeName+"/"+name, func(t *testing.T) {
				ctx := context.Background()
				var aRuns atomic.Int32
				aRan, copySettled := make(chan struct{}), make(chan struct{})
				var logs bytes.Buffer
				w, err := dedup.Wrap(newStore(t), events, func(ctx context.Context, e event) error {
					switch e.ID {
					case "a":
						if aRuns.Add(1) == 1 {
							close(aRan)
						}
					case "b":
						select {
						case <-copySettled:
						case <-time.After(3 * lease):
						}
					}
					return nil
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithLease(lease), dedup.WithBatchCompletion(50*time.Millisecond),
					dedup.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))...)
				require.NoError(t, err)

				copyRes := make(chan dedup.Result, 1)
				go func() {
					defer close(copySettled)
					<-aRan
					deadline := time.Now().Add(4 * lease)
					for time.Now().Before(deadline) {
						res, err := w.Handle(ctx, event{ID: "a", Body: "x"})
						if err == nil && res.Settled() {
							copyRes <- res
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
					copyRes <- dedup.Result{}
				}()
				require.NoError(t, handle(ctx, w, []event{{ID: "a", Body: "x"}, {ID: "b", Body: "x"}}))
				res := <-copyRes
				require.Equal(t, dedup.OutcomeDuplicate, res.Outcome, "the copy finds a's success recorded")
				require.EqualValues(t, 1, aRuns.Load(), "a ran once")
				require.NotContains(t, logs.String(), "lease lost")
			})
		}
	}
}
