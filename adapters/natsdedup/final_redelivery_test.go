package natsdedup_test

import (
	"context"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its stream by hand (its data and every
// header copied, its own Nats-Msg-Id included, as republishing it from the
// dead-letter stream does) while its event is FAILED_FINAL is dead-lettered
// again with reason redelivered-after-final, without running and with the
// record left alone, and a WARN names the key and the release command; a
// plain copy of the event is acked with a WARN and no letter. Once
// released, the letter moved back runs.
func TestFinalRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 100*time.Millisecond)
	cons := e.consumer(t, 5*time.Second)
	sink, err := natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, adaptertest.NewEffects()
	var mended atomic.Bool
	w := wrap(t, store, fx, func(_ context.Context, m jetstream.Msg) error {
		fx.Call(eventID(m))
		if string(m.Data()) == "poison" && !mended.Load() {
			return dedup.Permanent(errBoom)
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithSink(sink), dedup.WithLogger(slog.New(logs)))
	start(t, cons, w)
	key := dedup.Key{Scope: w.Scope(), EventID: "bad-1"}

	e.publish(t, "bad-1", "poison", map[string]string{"trace-id": "t-1"})
	adaptertest.WaitFor(t, deadline, "the poison message dead-lettered", func() bool { return fx.Settled("bad-1") == 1 })
	letters := e.letters(t)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	final := adaptertest.WaitFinal(t, store, key)

	// A plain copy, then the letter moved back.
	e.publishAgain(t, "bad-1", "poison")
	e.moveBack(t, letters[0])
	adaptertest.WaitFor(t, deadline, "the copy and the letter moved back settled", func() bool { return fx.Settled("bad-1") == 3 })
	assertAllAcked(t, cons)
	letters = e.letters(t)
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want the first and the one moved back", len(letters))
	}
	again := letters[1]
	for k, v := range map[string]string{
		"dedup-reason":            string(dedup.ReasonRedeliveredAfterFinal),
		"dedup-event-id":          "bad-1",
		"dedup-scope":             w.Scope(),
		"dedup-attempts":          "1",
		"dedup-cause":             errBoom.Error(),
		"dedup-origin-topic":      e.subject,
		"dedup-origin-message-id": "bad-1",
		"trace-id":                "t-1",
	} {
		if got := again.Header.Get(k); got != v {
			t.Errorf("second letter's %s = %q, want %q", k, got, v)
		}
	}
	if n := len(again.Header.Values("dedup-reason")); n != 1 || string(again.Data) != "poison" {
		t.Errorf("second letter: %d dedup-reason headers, data %q; want one, the original's", n, again.Data)
	}
	if n := fx.Calls("bad-1"); n != 1 {
		t.Errorf("the handler ran %d times for bad-1, want its original attempt only", n)
	}
	if rec, err := store.Get(context.Background(), key); err != nil || !reflect.DeepEqual(rec, final) {
		t.Errorf("record after the letter came back: %+v (%v), want it unchanged: %+v", rec, err, final)
	}
	requireFinalWarnings(t, logs, key)

	// Released, the letter moved back once more runs.
	mended.Store(true)
	if done, err := store.Forget(context.Background(), key, final.Owner); err != nil || !done {
		t.Fatalf("release: %v, %v", done, err)
	}
	e.moveBack(t, again)
	adaptertest.WaitFor(t, deadline, "the released event applied", func() bool { return fx.Count("bad-1") == 1 })
}

// moveBack publishes m, a letter of the dead-letter stream, to the env's
// subject as it is: its data and every header.
func (e *env) moveBack(t *testing.T, m *jetstream.RawStreamMsg) {
	t.Helper()
	msg := &nats.Msg{Subject: e.subject, Data: m.Data, Header: nats.Header{}}
	for k, vs := range m.Header {
		msg.Header[k] = append([]string(nil), vs...)
	}
	if ack, err := e.js.PublishMsg(context.Background(), msg); err != nil || ack.Duplicate {
		t.Fatalf("move %s back: %v (dropped as a duplicate: %t)", m.Header.Get(jetstream.MsgIDHeader), err, err == nil && ack.Duplicate)
	}
}

// requireFinalWarnings checks the two WARNs of key's deliveries after it
// failed for good: one for the plain copy, one for the letter moved back,
// each naming the key and the release command.
func requireFinalWarnings(t *testing.T, logs *testenv.Logs, key dedup.Key) {
	t.Helper()
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
}
