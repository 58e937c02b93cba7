package redisstreamdedup_test

import (
	"context"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its stream by hand (every field of the
// letter copied to a new entry) while its event is FAILED_FINAL is
// dead-lettered again with reason redelivered-after-final, without running
// and with the record left alone, and a WARN names the key and the release
// command; a plain copy of the event is acknowledged with a WARN and no
// letter. Once released, the letter moved back runs.
func TestFinalRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sink := e.sink(t)
	store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, adaptertest.NewEffects()
	var mended atomic.Bool
	w := wrap(t, store, fx, func(_ context.Context, m *redisstreamdedup.Message) error {
		fx.Call(eventID(m))
		if field(m, "payload") == "poison" && !mended.Load() {
			return dedup.Permanent(errBoom)
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithSink(sink), dedup.WithLogger(slog.New(logs)))
	e.start(t, w)
	key := dedup.Key{Scope: w.Scope(), EventID: "bad-1"}

	first := e.publish(t, "id", "bad-1", "payload", "poison", "trace-id", "t-1")
	adaptertest.WaitFor(t, deadline, "the poison entry dead-lettered", func() bool { return fx.Settled("bad-1") == 1 })
	letters := e.letters(t)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	final := adaptertest.WaitFinal(t, store, key)

	// A plain copy, then the letter moved back.
	e.publish(t, "id", "bad-1", "payload", "poison")
	moved := e.moveBack(t, letters[0])
	adaptertest.WaitFor(t, deadline, "the copy and the letter moved back settled", func() bool { return fx.Settled("bad-1") == 3 })
	e.assertAllAcked(t)
	letters = e.letters(t)
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want the first and the one moved back", len(letters))
	}
	again := letters[1].Values
	for k, v := range map[string]string{
		"dedup-reason":            string(dedup.ReasonRedeliveredAfterFinal),
		"dedup-event-id":          "bad-1",
		"dedup-scope":             w.Scope(),
		"dedup-attempts":          "1",
		"dedup-cause":             errBoom.Error(),
		"dedup-origin-stream":     e.stream,
		"dedup-origin-message-id": moved,
		"trace-id":                "t-1",
		"payload":                 "poison",
	} {
		if got := again[k]; got != v {
			t.Errorf("second letter's %s = %q, want %q", k, got, v)
		}
	}
	if first == moved {
		t.Errorf("the letter moved back has the original's entry ID %s", first)
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
	e.moveBack(t, letters[1])
	adaptertest.WaitFor(t, deadline, "the released event applied", func() bool { return fx.Count("bad-1") == 1 })
}

// moveBack adds l, a letter of the dead-letter stream, to the env's stream
// as it is: every field. It returns the new entry's ID.
func (e *env) moveBack(t *testing.T, l redis.XMessage) string {
	t.Helper()
	values := make([]any, 0, 2*len(l.Values))
	for k, v := range l.Values {
		values = append(values, k, v)
	}
	id, err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: values}).Result()
	if err != nil {
		t.Fatalf("move %s back: %v", l.ID, err)
	}
	return id
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
