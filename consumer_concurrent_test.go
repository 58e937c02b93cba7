package dedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// HandleConcurrent claims a batch in one call, runs its handlers at the same
// time and completes their successes in one write; a failure, a later copy
// of a key (a duplicate of its first copy's success; when its payload
// differs, claimed on its own after it, a conflict, as in HandleBatch) and a
// message without an ID each get their own answer.
func TestHandleConcurrent(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			store := &countingStore{Store: newStore(t)}
			sink := dedup.NewMemorySink()
			var mu sync.Mutex
			ran := map[string]int{}
			var started sync.WaitGroup
			started.Add(3) // a, b and c run at the same time
			w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
				started.Done()
				started.Wait()
				mu.Lock()
				ran[e.ID]++
				mu.Unlock()
				if e.ID == "b" {
					return errors.New("b fails")
				}
				return nil
			}, fastOpts(t, sink, dedup.WithLease(time.Minute))...)
			require.NoError(t, err)
			batch := []event{{ID: "a", Body: "1"}, {ID: "b", Body: "1"}, {ID: "a", Body: "1"}, {ID: "c", Body: "1"}, {ID: "", Body: "no id"},
				{ID: "c", Body: "2"}}
			var outcomes []dedup.Outcome
			require.NoError(t, w.HandleConcurrent(context.Background(), batch, func(i int, res dedup.Result, err error) {
				require.NoError(t, err)
				require.Len(t, outcomes, i, "in order")
				outcomes = append(outcomes, res.Outcome)
			}))
			require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeRetry, dedup.OutcomeDuplicate,
				dedup.OutcomeProcessed, dedup.OutcomeDeadLettered, dedup.OutcomeConflict}, outcomes)
			require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, ran)
			require.EqualValues(t, 1, store.batches.Load(), "a and c completed in one write")
			require.Zero(t, store.completes.Load())
			require.Len(t, sink.Letters(), 2, "no ID, and the conflict")

			// The later copy of a comes back as a duplicate; b runs again.
			started.Add(1)
			outcomes = nil
			require.NoError(t, w.HandleConcurrent(context.Background(), batch[1:3], func(i int, res dedup.Result, err error) {
				require.NoError(t, err)
				outcomes = append(outcomes, res.Outcome)
			}))
			require.Equal(t, []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeDuplicate}, outcomes)
		})
	}
}

// A completion written together with others that fails is an error for its
// message, which is not acknowledged and runs again once its lease lapses.
func TestHandleConcurrentCompletionFailure(t *testing.T) {
	store := &flakyCompleter{Store: dedup.NewMemoryStore(), failures: 1000}
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		fastOpts(t, dedup.NewMemorySink(), dedup.WithLease(50*time.Millisecond))...)
	require.NoError(t, err)
	var errs []error
	require.NoError(t, w.HandleConcurrent(context.Background(), []event{{ID: "x", Body: "1"}, {ID: "y", Body: "1"}},
		func(i int, res dedup.Result, err error) { errs = append(errs, err) }))
	require.Len(t, errs, 2)
	for _, err := range errs {
		require.ErrorIs(t, err, errCompleterDown)
	}
}

// HandleConcurrent gives every message a result: once its context is done,
// a later copy of a key with another payload, which would be claimed after
// the first copy settled, is not claimed and comes back with the context's
// error, while the first segment's messages keep their outcomes.
func TestHandleConcurrentAnswersEveryMessageOnceCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := dedup.NewMemorySink()
	var mu sync.Mutex
	ran := map[string]int{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(_ context.Context, e event) error {
		mu.Lock()
		ran[e.ID+"/"+e.Body]++
		mu.Unlock()
		if e.ID == "b" {
			cancel() // the transport shuts down while the batch runs
		}
		return nil
	}, fastOpts(t, sink, dedup.WithLease(time.Minute))...)
	require.NoError(t, err)
	batch := []event{{ID: "a", Body: "1"}, {ID: "b", Body: "1"}, {ID: "a", Body: "2"}}
	type answer struct {
		res dedup.Result
		err error
	}
	var answers []answer
	require.NoError(t, w.HandleConcurrent(ctx, batch, func(i int, res dedup.Result, err error) {
		require.Len(t, answers, i, "in order")
		answers = append(answers, answer{res, err})
	}))
	require.Len(t, answers, 3, "every message answered")
	for _, a := range answers[:2] {
		require.NoError(t, a.err)
		require.Equal(t, dedup.OutcomeProcessed, a.res.Outcome)
	}
	require.ErrorIs(t, answers[2].err, context.Canceled)
	require.Equal(t, "a", answers[2].res.Key.EventID)
	require.Equal(t, map[string]int{"a/1": 1, "b/1": 1}, ran)
	require.Empty(t, sink.Letters(), "the copy with another payload was not claimed")
}
