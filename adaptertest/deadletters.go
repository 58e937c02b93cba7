package adaptertest

import (
	"context"
	"strings"
	"testing"

	"github.com/dedupkit/dedup"
)

// A handler that always fails is attempted exactly MaxAttempts times, then
// its message is dead-lettered with reason handler-error and the attempt
// count, the record is FAILED_FINAL, and the message is acknowledged;
// another event beside it is applied meanwhile.
func testPoison(t *testing.T, _ Features, h Harness) {
	poison := Message{ID: "poison", Payload: []byte(`{"poison":true}`)}
	h.Publish(t, poison, Message{ID: "fine", Payload: []byte(`{"fine":true}`)})
	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()
	run := Start(t, h.NewConsumer(t, config(t, store, scope, fx, func(_ context.Context, m Message) error {
		fx.Call(m.ID)
		if m.ID == poison.ID {
			return errPoison
		}
		fx.Apply(m.ID)
		return nil
	})).Run)
	WaitFor(t, Deadline, "the poison message dead-lettered and the other applied", func() bool {
		return len(lettersOf(h.DeadLetters(t), poison.ID)) > 0 && fx.Count("fine") == 1
	})
	run.StopClean(t)
	waitSettled(t, h)

	assertOneLetter(t, h, scope, poison.ID, dedup.ReasonHandlerError, MaxAttempts, poison.Payload)
	if l := lettersOf(h.DeadLetters(t), poison.ID); len(l) == 1 && !strings.Contains(l[0].Metadata["dedup-error"], errPoison.Error()) {
		t.Errorf("dead letter's dedup-error %q, want the handler's error %q", l[0].Metadata["dedup-error"], errPoison)
	}
	if n := fx.Calls(poison.ID); n != MaxAttempts {
		t.Errorf("the poison handler ran %d times, want MaxAttempts (%d)", n, MaxAttempts)
	}
	if rec := record(t, store, scope, poison.ID); rec.Status != dedup.StatusFailedFinal || rec.Attempts != MaxAttempts {
		t.Errorf("record of the poison event: %s after %d attempts, want %s after %d", rec.Status, rec.Attempts, dedup.StatusFailedFinal, MaxAttempts)
	}
	fx.AssertOnce(t, []string{"fine"})
	assertRecords(t, store, scope, []string{"fine"}, dedup.StatusSucceeded)
}

// A handler error marked dedup.Permanent dead-letters the message at once,
// after one attempt, with reason permanent.
func testPermanent(t *testing.T, _ Features, h Harness) {
	refused := Message{ID: "refused", Payload: []byte(`{"refused":true}`)}
	h.Publish(t, refused)
	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()
	run := Start(t, h.NewConsumer(t, config(t, store, scope, fx, func(_ context.Context, m Message) error {
		fx.Call(m.ID)
		return dedup.Permanent(errRefused)
	})).Run)
	WaitFor(t, Deadline, "the refused message dead-lettered", func() bool {
		return len(h.DeadLetters(t)) > 0
	})
	run.StopClean(t)
	waitSettled(t, h)

	assertOneLetter(t, h, scope, refused.ID, dedup.ReasonPermanent, 1, refused.Payload)
	if n := fx.Calls(refused.ID); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	if rec := record(t, store, scope, refused.ID); rec.Status != dedup.StatusFailedFinal {
		t.Errorf("record: %s, want %s", rec.Status, dedup.StatusFailedFinal)
	}
}

// A second event with an ID already applied but another payload is not
// run: it is dead-lettered with reason fingerprint-conflict and
// acknowledged, and the first event's record is left as it was.
func testConflict(t *testing.T, _ Features, h Harness) {
	first := Message{ID: "order-1", Payload: []byte(`{"amount":10}`)}
	other := Message{ID: "order-1", Payload: []byte(`{"amount":99}`)}
	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()
	run := Start(t, h.NewConsumer(t, config(t, store, scope, fx, func(_ context.Context, m Message) error {
		fx.Call(m.ID + " " + string(m.Payload))
		fx.Apply(m.ID)
		return nil
	})).Run)
	h.Publish(t, first)
	WaitFor(t, Deadline, "the first event applied and settled", func() bool {
		return fx.Count(first.ID) == 1 && fx.Settled(first.ID) == 1
	})
	before := record(t, store, scope, first.ID)
	h.Publish(t, other)
	WaitFor(t, Deadline, "the conflicting event dead-lettered", func() bool {
		return len(h.DeadLetters(t)) > 0
	})
	run.StopClean(t)
	waitSettled(t, h)

	// The letter counts the attempts of the event holding the ID.
	assertOneLetter(t, h, scope, other.ID, dedup.ReasonConflict, before.Attempts, other.Payload)
	if n := fx.Calls(other.ID + " " + string(other.Payload)); n != 0 {
		t.Errorf("the handler ran %d times for the conflicting payload, want 0", n)
	}
	fx.AssertOnce(t, []string{first.ID})
	if n := fx.Outcomes(dedup.OutcomeConflict); n != 1 {
		t.Errorf("%d conflicts observed, want 1", n)
	}
	after := record(t, store, scope, first.ID)
	if after.Status != dedup.StatusSucceeded || after.Fingerprint != before.Fingerprint {
		t.Errorf("record after the conflict: %s, fingerprint %q; want %s, %q as before", after.Status, after.Fingerprint, dedup.StatusSucceeded, before.Fingerprint)
	}
}
