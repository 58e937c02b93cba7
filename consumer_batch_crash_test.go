package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// dyingStore is the store as seen by a worker process that can die: once
// dead, none of its writes reaches the store, as after a SIGKILL.
type dyingStore struct {
	dedup.Store
	dead   atomic.Bool
	single atomic.Int32 // Claim calls, as opposed to ClaimBatch
}

func (s *dyingStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.single.Add(1)
	return s.Store.Claim(ctx, req)
}

var errDead = errors.New("the worker process is dead")

func (s *dyingStore) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	if s.dead.Load() {
		return nil, errDead
	}
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

func (s *dyingStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *dyingStore) Fail(ctx context.Context, key dedup.Key, owner string, f dedup.Failure) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Fail(ctx, key, owner, f)
}

func (s *dyingStore) Extend(ctx context.Context, key dedup.Key, owner string, lease time.Duration) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Extend(ctx, key, owner, lease)
}

func (s *dyingStore) Release(ctx context.Context, key dedup.Key, owner string) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Release(ctx, key, owner)
}

// A message that kills its worker is dead-lettered as a crash loop once its
// attempts are spent, and the messages fetched with it are processed: a
// worker dying with a batch claimed must not count attempts for messages
// that never ran. They are claimed again in one batch once the crasher is
// settled. (It did: they were parked as a crash loop with it, found
// by the Kafka crash campaign in reliability/.)
func TestBatchCrashLoopSparesTheRestOfTheBatch(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			store, scope := newStore(t), uniqueScope(t)
			batch := []event{{ID: "crasher", Body: "kills its worker"}, {ID: "next-1", Body: "a"}, {ID: "next-2", Body: "b"}}
			sink := dedup.NewMemorySink()
			ran := map[string]int{}
			const maxAttempts = 3
			const lease = 100 * time.Millisecond
			for life := 1; life <= maxAttempts+1; life++ {
				worker := &dyingStore{Store: store}
				w, err := dedup.Wrap(worker, events, func(_ context.Context, e event) error {
					if worker.dead.Load() {
						return errDead // a dead process runs nothing more
					}
					ran[e.ID]++
					if e.ID == "crasher" {
						worker.dead.Store(true) // the process dies here
					}
					return nil
				}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts), dedup.WithLease(lease))
				require.NoError(t, err)
				settled := map[string]dedup.Outcome{}
				require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
					if err != nil {
						return false // not durable: a transport stops here
					}
					settled[batch[i].ID] = res.Outcome
					return true
				}))
				if life <= maxAttempts {
					require.Empty(t, settled, "life %d: the worker died on the crasher", life)
				} else {
					require.Equal(t, map[string]dedup.Outcome{
						"crasher": dedup.OutcomeDeadLettered, "next-1": dedup.OutcomeProcessed, "next-2": dedup.OutcomeProcessed,
					}, settled, "life %d", life)
					require.Zero(t, worker.single.Load(), "the messages behind the crasher were claimed one by one, not again in a batch")
				}
				time.Sleep(lease + 20*time.Millisecond) // the dead worker's claims lapse
			}
			letters := sink.Letters()
			require.Len(t, letters, 1)
			require.Equal(t, "crasher", letters[0].EventID)
			require.Equal(t, dedup.ReasonCrashLoop, letters[0].Reason)
			require.Equal(t, map[string]int{"crasher": maxAttempts, "next-1": 1, "next-2": 1}, ran)
		})
	}
}

// An event whose attempts were all spent by workers that died, with its
// claim given back since, is parked as a crash loop, not as a handler error
// (it was: "attempts exhausted without a recorded error", found by the
// Kafka crash campaign in reliability/).
func TestAttemptsSpentByDeathsAreACrashLoop(t *testing.T) {
	ctx := context.Background()
	store, scope := dedup.NewMemoryStore(), uniqueScope(t)
	fp, err := dedup.SHA256Fingerprint()([]byte("b"))
	require.NoError(t, err)
	req := dedup.ClaimRequest{Key: dedup.Key{Scope: scope, EventID: "e-1"}, Fingerprint: fp, Lease: time.Millisecond, TTL: time.Hour}
	var c dedup.Claim
	for range 3 { // three workers claim it and die
		c, err = store.Claim(ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.ClaimAcquired, c.Status)
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, store.Release(ctx, req.Key, c.Record.Owner)) // the last one gave it back
	sink := dedup.NewMemorySink()
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(2))
	require.NoError(t, err)
	res, err := w.Handle(ctx, event{ID: "e-1", Body: "b"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.Equal(t, dedup.ReasonCrashLoop, res.Reason)
}

// With completions written together (the default), a message that kills its
// worker loses the completions of the successes before it in the batch:
// each of those runs again once, taken over and completed on its own before
// the crasher runs again, and is not parked with it as a crash loop. (Before,
// each death repeated them, until they were parked as a crash loop.)
func TestBatchCompletionCrashLoopRepeatsEachEffectOnce(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			store, scope := newStore(t), uniqueScope(t)
			if _, ok := store.(deduptype.BatchCompleter); !ok {
				t.Skipf("%T completes one event at a time", store)
			}
			batch := []event{{ID: "before", Body: "a"}, {ID: "crasher", Body: "kills its worker"}, {ID: "after", Body: "b"}}
			sink := dedup.NewMemorySink()
			ran := map[string]int{}
			const maxAttempts = 3
			const lease = 100 * time.Millisecond
			var settled map[string]dedup.Outcome
			for life := 1; life <= maxAttempts+2; life++ {
				worker := &dyingStore{Store: store}
				w, err := dedup.Wrap(worker, events, func(_ context.Context, e event) error {
					if worker.dead.Load() {
						return errDead
					}
					ran[e.ID]++
					if e.ID == "crasher" {
						worker.dead.Store(true)
					}
					return nil
				}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts), dedup.WithLease(lease))
				require.NoError(t, err)
				settled = map[string]dedup.Outcome{}
				require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
					if err != nil {
						return false
					}
					settled[batch[i].ID] = res.Outcome
					return true
				}))
				time.Sleep(lease + 20*time.Millisecond)
			}
			require.Equal(t, map[string]dedup.Outcome{
				"before": dedup.OutcomeDuplicate, "crasher": dedup.OutcomeDuplicate, "after": dedup.OutcomeDuplicate,
			}, settled, "the last life")
			letters := sink.Letters()
			require.Len(t, letters, 1)
			require.Equal(t, "crasher", letters[0].EventID)
			require.Equal(t, dedup.ReasonCrashLoop, letters[0].Reason)
			require.Equal(t, map[string]int{"before": 2, "crasher": maxAttempts, "after": 1}, ran)
		})
	}
}
