package redisstreamdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Invalid options and arguments are refused by NewConsumer with
// dedup.ErrConfig naming them; a group that does not exist is refused by
// Run, which names the command creating it.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w := wrap(t, dedup.NewMemoryStore(), adaptertest.NewEffects(), func(context.Context, *redisstreamdedup.Message) error { return nil })
	for name, opts := range map[string][]redisstreamdedup.Opt{
		"WithClaimIdle":     {redisstreamdedup.WithClaimIdle(500 * time.Millisecond)},
		"WithBlock":         {redisstreamdedup.WithBlock(time.Millisecond)},
		"WithWorkers":       {redisstreamdedup.WithWorkers(0)},
		"WithBatchSize":     {redisstreamdedup.WithBatchSize(0)},
		"WithConsumerName":  {redisstreamdedup.WithConsumerName("")},
		"WithInFlightDelay": {redisstreamdedup.WithInFlightDelay(-time.Second)},
	} {
		if _, err := redisstreamdedup.NewConsumer(e.rdb, e.stream, e.group, w, opts...); !errors.Is(err, dedup.ErrConfig) {
			t.Errorf("%s: %v, want dedup.ErrConfig", name, err)
		}
	}
	if _, err := redisstreamdedup.NewConsumer(e.rdb, e.stream, "", w); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("no group: %v, want dedup.ErrConfig", err)
	}
	for _, stream := range []string{e.stream, e.stream + ":none"} {
		c, err := redisstreamdedup.NewConsumer(e.rdb, stream, "no-such-group", w)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Run(context.Background()); !errors.Is(err, dedup.ErrConfig) {
			t.Errorf("Run on %s without its group: %v, want dedup.ErrConfig", stream, err)
		}
	}
}

// A handler running three times the claim idle time keeps its entry: the
// heartbeat resets the entry's idle time, so another consumer of the group
// never takes it over; it runs once, delivered once.
func TestHeartbeatKeepsALongHandlersEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fx := adaptertest.NewEffects()
	deliveries := make(chan int64, 4)
	w := wrap(t, dedup.NewMemoryStore(), fx, func(ctx context.Context, m *redisstreamdedup.Message) error {
		deliveries <- m.DeliveredCount
		fx.Call(eventID(m))
		select {
		case <-time.After(6 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithLease(2*time.Second))
	e.start(t, w, redisstreamdedup.WithConsumerName("one"))
	e.start(t, w, redisstreamdedup.WithConsumerName("two"))
	e.publish(t, "id", "long", "payload", "p")
	adaptertest.WaitFor(t, deadline, "the long handler done", func() bool { return fx.Count("long") == 1 })
	e.assertAllAcked(t)
	if n := fx.Calls("long"); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	if n := fx.Outcomes(dedup.OutcomeInFlight); n != 0 {
		t.Errorf("the entry was taken over %d times while held", n)
	}
	if d := <-deliveries; d != 1 {
		t.Errorf("delivery count %d, want 1", d)
	}
}
