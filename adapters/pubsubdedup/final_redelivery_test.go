package pubsubdedup_test

import (
	"context"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its topic by hand (its data and every
// attribute copied, as republishing it from the dead-letter topic does)
// while its event is FAILED_FINAL is dead-lettered again with reason
// redelivered-after-final, without running and with the record left
// alone, and a WARN names the key and the release command; a plain copy
// of the event is acked with a WARN and no letter. Once released, the
// letter moved back runs.
func TestFinalRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{})
	store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, adaptertest.NewEffects()
	var mended atomic.Bool
	w := wrap(t, store, fx, func(_ context.Context, m *pubsub.Message) error {
		fx.Call(eventID(m))
		if string(m.Data) == "poison" && !mended.Load() {
			return dedup.Permanent(errBoom)
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithSink(e.sink(t)), dedup.WithLogger(slog.New(logs)))
	e.start(t, w)

	const id = "bad-1"
	msgID := e.publish(t, id, "poison", "", map[string]string{"trace-id": "t-1"})
	key := dedup.Key{Scope: w.Scope(), EventID: id}
	adaptertest.WaitFor(t, deadline, "the poison message dead-lettered", func() bool { return fx.Settled(id) == 1 })
	letters := e.letters()
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	final := adaptertest.WaitFinal(t, store, key)

	// A plain copy, then the letter moved back.
	e.publish(t, id, "poison", "", nil)
	e.moveBack(letters[0])
	adaptertest.WaitFor(t, deadline, "the copy and the letter moved back settled", func() bool {
		return fx.Settled(id) == 3 && e.unacked() == 0
	})
	letters = e.letters()
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want the first and the one moved back", len(letters))
	}
	again := letters[1]
	for k, v := range map[string]string{
		"dedup-reason":                          string(dedup.ReasonRedeliveredAfterFinal),
		"dedup-event-id":                        id,
		"dedup-scope":                           w.Scope(),
		"dedup-attempts":                        "1",
		"dedup-cause":                           errBoom.Error(),
		pubsubdedup.OriginMessageIDAttribute:    msgID,
		pubsubdedup.OriginSubscriptionAttribute: e.sub,
		"trace-id":                              "t-1",
	} {
		if got := again.Attributes[k]; got != v {
			t.Errorf("second letter's %s = %q, want %q", k, got, v)
		}
	}
	if string(again.Data) != "poison" {
		t.Errorf("second letter's data %q, want the original's", again.Data)
	}
	if n := fx.Calls(id); n != 1 {
		t.Errorf("the handler ran %d times, want its original attempt only", n)
	}
	if rec, err := store.Get(context.Background(), key); err != nil || !reflect.DeepEqual(rec, final) {
		t.Errorf("record after the letter came back: %+v (%v), want it unchanged: %+v", rec, err, final)
	}
	release := "dedup release -scope " + key.Scope + " -id " + key.EventID + " -yes"
	for _, msg := range []string{
		"dedup: event already dead-lettered; this copy is acknowledged without running",
		"dedup: a dead letter came back to its origin while its event is failed for good; dead-lettered again without running",
	} {
		warned := logs.Attrs(slog.LevelWarn, msg)
		if len(warned) != 1 || warned[0]["key"] != key.String() || warned[0]["release"] != release {
			t.Errorf("WARN %q logged as %v, want once with key %s and release %q", msg, warned, key, release)
		}
	}

	// Released, the letter moved back once more runs.
	mended.Store(true)
	if done, err := store.Forget(context.Background(), key, final.Owner); err != nil || !done {
		t.Fatalf("release: %v, %v", done, err)
	}
	e.moveBack(again)
	adaptertest.WaitFor(t, deadline, "the released event applied", func() bool { return fx.Count(id) == 1 })
}

// moveBack publishes l, a letter, to the env's topic as it is: its data
// and every attribute.
func (e *env) moveBack(l *pstest.Message) { e.srv.Publish(e.topic, l.Data, l.Attributes) }
