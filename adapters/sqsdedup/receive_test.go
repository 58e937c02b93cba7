package sqsdedup_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
)

// callCounter counts the store calls that claim and complete, on a real
// store.
type callCounter struct {
	dedup.Store
	claims, claimBatches, completes, completeBatches atomic.Int32
}

func (s *callCounter) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, req)
}

func (s *callCounter) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.claimBatches.Add(1)
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *callCounter) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *callCounter) CompleteBatch(ctx context.Context, cs []dedup.Completion) ([]error, error) {
	s.completeBatches.Add(1)
	return s.Store.(dedup.BatchCompleter).CompleteBatch(ctx, cs)
}

// The messages of one receive from a standard queue are claimed in one store
// call, their handlers run at the same time, and their successes are
// completed in one write: ten messages whose handlers each wait for all ten
// to have started are processed once each, with two store calls.
func TestReceiveClaimedAndCompletedTogether(t *testing.T) {
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			url := queue(t, c)
			const n = 10
			for i := range n {
				send(t, c, url, "r-"+strconv.Itoa(i), "x", nil)
			}
			store := &callCounter{Store: sc.open(t)}
			rec := newRecorder()
			var started sync.WaitGroup
			started.Add(n)
			allStarted := make(chan struct{})
			go func() {
				started.Wait()
				close(allStarted)
			}()
			w := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error {
				started.Done()
				select {
				case <-allStarted: // every handler of the receive runs at once
				case <-time.After(20 * time.Second):
				}
				rec.effect(eventID(m))
				return nil
			})
			stop := start(t, c, url, w)
			waitFor(t, 30*time.Second, "every message processed", func() bool { return rec.outcomes(dedup.OutcomeProcessed) == n })
			stop()
			select {
			case <-allStarted:
			default:
				t.Fatal("the handlers of one receive did not run at the same time")
			}
			for i := range n {
				if got := rec.effectsOf("r-" + strconv.Itoa(i)); got != 1 {
					t.Errorf("r-%d applied %d times, want 1", i, got)
				}
			}
			if got := store.claimBatches.Load(); got != 1 || store.claims.Load() != 0 {
				t.Errorf("%d batch claims and %d single claims, want 1 and 0", got, store.claims.Load())
			}
			if got := store.completeBatches.Load(); got != 1 || store.completes.Load() != 0 {
				t.Errorf("%d batch completions and %d single ones, want 1 and 0", got, store.completes.Load())
			}
			assertDrained(t, c, url)
		})
	}
}
