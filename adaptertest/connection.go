package adaptertest

import (
	"errors"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// outageHold is how long a broken connection stays broken once the break
// reached the consumer, when nothing else tells that the consumer noticed:
// not a verdict, only a chance for the consumer to notice.
const outageHold = 2 * time.Second

// The consumer's connection to the broker breaks mid-stream and comes
// back: the consumer keeps going, and every event, those published before
// the break and those after, takes effect once and is acknowledged. When
// Health covers the broker, it reports the outage, then nil again.
func testConnectionLoss(t *testing.T, f Features, h Harness) {
	const events = 40
	msgs, ids := messages("conn", events)
	h.Publish(t, msgs[:events/2]...)
	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()
	c := h.NewConsumer(t, config(t, store, scope, fx, applying(fx, 20*time.Millisecond)))
	run := Start(t, c.Run)
	WaitFor(t, Deadline, "events applied before the break", func() bool { return fx.Applied() >= 5 })

	restore := h.BreakConnection(t)
	if f.HealthCoversBroker {
		WaitFor(t, Deadline, "Health reporting the broken connection", func() bool { return c.Health() != nil })
		t.Logf("Health during the break: %v", c.Health())
	} else {
		time.Sleep(outageHold)
	}
	restore()
	h.Publish(t, msgs[events/2:]...)

	WaitFor(t, Deadline, "every event applied after the break", func() bool { return fx.Applied() == events })
	if f.HealthCoversBroker {
		WaitFor(t, Deadline, "Health nil again", func() bool { return c.Health() == nil })
	}
	run.StopClean(t)
	waitSettled(t, h)
	fx.AssertOnce(t, ids)
	assertRecords(t, store, scope, ids, dedup.StatusSucceeded)
}

// healthThreshold is the wrapper's outage threshold in the Health case.
const healthThreshold = 300 * time.Millisecond

// Health is nil while the consumer works, reports an outage matching
// dedup.ErrOutage while the store is down (and nothing runs), and is nil
// again once the store is back and the event held meanwhile is applied.
func testHealth(t *testing.T, _ Features, h Harness) {
	store, scope, fx := NewFaultyStore(dedup.NewMemoryStore()), newScope(t), NewEffects()
	c := h.NewConsumer(t, config(t, store, scope, fx, applying(fx, 0), dedup.WithOutageThreshold(healthThreshold)))
	if err := c.Health(); err != nil {
		t.Errorf("Health before Run: %v, want nil", err)
	}
	run := Start(t, c.Run)
	h.Publish(t, Message{ID: "before", Payload: []byte(`{"n":1}`)})
	WaitFor(t, Deadline, "the first event applied", func() bool { return fx.Settled("before") > 0 })
	if err := c.Health(); err != nil {
		t.Errorf("Health while working: %v, want nil", err)
	}

	store.SetDown(true)
	h.Publish(t, Message{ID: "during", Payload: []byte(`{"n":2}`)})
	var herr error
	WaitFor(t, Deadline, "Health reporting the store's outage", func() bool {
		herr = c.Health()
		return herr != nil
	})
	if !errors.Is(herr, dedup.ErrOutage) || !errors.Is(herr, ErrStoreDown) {
		t.Errorf("Health during the outage: %v, want dedup.ErrOutage wrapping the store's error", herr)
	}
	if n := fx.Count("during"); n != 0 {
		t.Errorf("the event ran %d times with the store down", n)
	}

	store.SetDown(false)
	WaitFor(t, Deadline, "the event held by the outage applied", func() bool { return fx.Count("during") == 1 })
	WaitFor(t, Deadline, "Health nil after the outage", func() bool { return c.Health() == nil })
	run.StopClean(t)
	waitSettled(t, h)
	fx.AssertOnce(t, []string{"before", "during"})
	assertRecords(t, store, scope, []string{"before", "during"}, dedup.StatusSucceeded)
	if store.Refused() == 0 {
		t.Error("no claim reached the store while it was down")
	}
}
