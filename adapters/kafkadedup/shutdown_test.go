package kafkadedup_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

// Canceling Run while a handler is stuck returns within the drain timeout
// and a few seconds, commits the records settled before the stuck one and
// nothing past it, and leaves no goroutine behind once the cluster is
// closed.
func TestShutdownIsBoundedAndCommitsOnlySettled(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last, after the cluster closed
	c := newCluster(t, 1)
	recs := c.produce(
		event{id: "s-0", key: "a", value: "ok"},
		event{id: "s-1", key: "a", value: "ok"},
		event{id: "stuck", key: "a", value: "stuck"},
		event{id: "s-3", key: "a", value: "ok"},
	)
	stuck := make(chan struct{})
	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(ctx context.Context, r *kgo.Record) error {
			if string(r.Value) == "stuck" {
				close(stuck)
				<-ctx.Done()
				return ctx.Err()
			}
			fx.apply(r)
			return nil
		})
	const drain = 200 * time.Millisecond
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...), kafkadedup.WithDrainTimeout(drain)))

	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck record was never handled")
	}
	began := time.Now()
	run.StopClean(t)
	if took := time.Since(began); took > drain+5*time.Second {
		t.Errorf("shutdown took %v, want about the drain timeout (%v)", took, drain)
	}
	if got, want := c.committed(c.group), map[int32]int64{0: recs[2].Offset}; !maps.Equal(got, want) {
		t.Errorf("committed %v, want %v: up to the stuck record, not past it", got, want)
	}
	if count, _ := fx.snapshot(); count["s-3"] != 0 {
		t.Error("the record behind the stuck one ran")
	}
}
