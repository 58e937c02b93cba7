package kafkadedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Only a settled record ends a run of failures: a retry in place between
// two records not settled does not, so the second waits for the second step
// of WithErrorBackoff; after a record is marked, the next failure is the
// first again.
func TestOnlyASettledRecordEndsAFailureRun(t *testing.T) {
	c := newCluster(t, 1)
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	var mu sync.Mutex
	var steps []int
	backoff := func(n int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, n)
		return 20 * time.Millisecond
	}
	var calls atomic.Int32
	applied := make(chan string, 2)
	w := wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"), func(_ context.Context, r *kgo.Record) error {
		if eventID(r) == "a" && calls.Add(1) == 1 {
			store.RefuseNext(1) // the retry's claim fails
			return errors.New("transient")
		}
		applied <- eventID(r)
		return nil
	})
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...), kafkadedup.WithErrorBackoff(backoff)))
	for _, id := range []string{"a", "b"} {
		store.RefuseNext(1) // the first claim fails
		c.produce(event{id: id, key: "k", value: "{}"})
		select {
		case got := <-applied:
			if got != id {
				t.Fatalf("applied %s, want %s", got, id)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s not applied within a minute", id)
		}
	}
	run.Stop(t)
	mu.Lock()
	defer mu.Unlock()
	// a: refused (1), retried, refused (2), applied; b: refused (1), applied.
	if want := []int{1, 2, 1}; !slices.Equal(steps, want) {
		t.Errorf("backoff steps %v, want %v", steps, want)
	}
}
