package natsdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// While the store keeps failing, Health reports an outage once the
// wrapper's threshold is passed, and with WithMaxOutage Run stops by itself
// with an error matching ErrOutage; nothing is acknowledged.
func TestOutageStopsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 5*time.Second)
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	store.SetDown(true)
	rec := adaptertest.NewEffects()
	w := wrap(t, store, rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}, dedup.WithOutageThreshold(500*time.Millisecond))
	e.publish(t, "a", "a", nil)
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithFetchWait(time.Second), natsdedup.WithLogger(adaptertest.Logger(t)),
		natsdedup.WithMaxOutage(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, natsdedup.ErrOutage) {
			t.Errorf("Run: %v, want ErrOutage", err)
		}
	case <-time.After(deadline):
		t.Fatal("Run did not stop on the outage")
	}
	if err := c.Health(); !errors.Is(err, natsdedup.ErrOutage) {
		t.Errorf("Health: %v, want ErrOutage", err)
	}
	if c.Stats().FailingSince.IsZero() {
		t.Error("Stats: not failing")
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 || rec.Applied() != 0 {
		t.Errorf("ack floor %d, %d applied; want nothing", info.AckFloor.Stream, rec.Applied())
	}
}
