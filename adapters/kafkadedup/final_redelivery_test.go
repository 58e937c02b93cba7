package kafkadedup_test

import (
	"context"
	"log/slog"
	"maps"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its topic by hand (its value, key and every
// header copied, as a mirroring tool would) while its event is FAILED_FINAL
// is dead-lettered again with reason redelivered-after-final, without
// running and with the record left alone, and a WARN names the key and the
// release command; a plain copy of the event is acknowledged with a WARN
// and no letter. Once released, the letter moved back runs.
func TestFinalRedelivery(t *testing.T) {
	c := newCluster(t, 1)
	recs := c.produce(event{id: "bad-1", key: "a", value: "poison", hdrs: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("t-1")}}},
		event{id: "a-0", key: "a", value: "ok"})

	store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, newEffects()
	var mended atomic.Bool
	scope := dedup.Scope(c.group, "apply")
	w := wrap(t, store, c.sink(), scope, func(_ context.Context, r *kgo.Record) error {
		fx.call(r)
		if string(r.Value) == "poison" && !mended.Load() {
			return errPoison
		}
		fx.apply(r)
		return nil
	}, dedup.WithLogger(slog.New(logs)))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	committedTo := func(recs []*kgo.Record) {
		t.Helper()
		want := endOffsets(recs)
		adaptertest.WaitFor(t, adaptertest.Deadline, "the group's offsets at the end of the topic", func() bool {
			return maps.Equal(c.committed(c.group), want)
		})
	}
	committedTo(recs)
	letter := c.readAll(c.topic+".dlq", 1)[0]
	key := dedup.Key{Scope: scope, EventID: "bad-1"}
	final := adaptertest.WaitFinal(t, store, key)

	// A plain copy, then the letter moved back, then an event behind them.
	plain := c.produce(event{id: "bad-1", key: "a", value: "poison"})[0]
	back := &kgo.Record{Topic: c.topic, Key: letter.Key, Value: letter.Value, Headers: letter.Headers}
	if err := c.admin.ProduceSync(context.Background(), back).FirstErr(); err != nil {
		t.Fatal(err)
	}
	committedTo(append([]*kgo.Record{plain, back}, c.produce(event{id: "a-1", key: "a", value: "ok"})...))

	letters := c.readAll(c.topic+".dlq", 2)
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want the first and the one moved back", len(letters))
	}
	again := letters[1]
	for k, v := range map[string]string{
		"dedup-reason":           string(dedup.ReasonRedeliveredAfterFinal),
		"dedup-event-id":         "bad-1",
		"dedup-scope":            scope,
		"dedup-attempts":         "3",
		"dedup-cause":            errPoison.Error(),
		"dedup-origin-offset":    strconv.FormatInt(back.Offset, 10),
		"trace-id":               "t-1",
		"event-id":               "bad-1",
		"dedup-origin-partition": "0",
	} {
		if got, _ := header(again, k); got != v {
			t.Errorf("second letter's %s = %q, want %q", k, got, v)
		}
	}
	if n := headerCount(again, "dedup-reason"); n != 1 {
		t.Errorf("second letter has %d dedup-reason headers, want 1", n)
	}
	if string(again.Value) != "poison" || string(again.Key) != "a" {
		t.Errorf("second letter %q/%q, want the original a/poison", again.Key, again.Value)
	}
	fx.mu.Lock()
	calls := fx.calls["bad-1"]
	fx.mu.Unlock()
	if n := calls; n != 3 {
		t.Errorf("the handler ran %d times for bad-1, want its 3 original attempts only", n)
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
	back = &kgo.Record{Topic: c.topic, Key: again.Key, Value: again.Value, Headers: again.Headers}
	if err := c.admin.ProduceSync(context.Background(), back).FirstErr(); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, adaptertest.Deadline, "the released event applied", func() bool {
		count, _ := fx.snapshot()
		return count["bad-1"] == 1
	})
	run.StopClean(t)
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
