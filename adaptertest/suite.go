package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// backoff is the wait between attempts: short, since no case judges it.
const backoff = 10 * time.Millisecond

// lease is the wrapper's lease: long enough for any handler of the suite,
// short enough that an attempt left unsettled by a stopped consumer is
// taken over well within Deadline.
const lease = 5 * time.Second

var (
	errPoison  = errors.New("adaptertest: this event can never succeed")
	errRefused = errors.New("adaptertest: this event is refused for good")
)

// config returns the Config of a consumer over store in scope, running h
// and observed by fx, with extra wrapper options after the suite's.
func config(t *testing.T, store dedup.Store, scope string, fx *Effects, h Handler, extra ...dedup.Opt) Config {
	opts := append([]dedup.Opt{
		dedup.WithScope(scope),
		dedup.WithMaxAttempts(MaxAttempts),
		dedup.WithBackoff(func(int) time.Duration { return backoff }),
		dedup.WithLease(lease),
		dedup.WithObserver(fx.Observe),
		dedup.WithLogger(Logger(t)),
	}, extra...)
	return Config{Store: store, Handler: h, Options: opts, ShutdownTimeout: ShutdownTimeout}
}

// applying returns a handler that records each call and applies its
// event, after pause (to have handlers overlap).
func applying(fx *Effects, pause time.Duration) Handler {
	return func(ctx context.Context, m Message) error {
		fx.Call(m.ID)
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		fx.Apply(m.ID)
		return nil
	}
}

// messages returns n messages with IDs prefix-00.. and distinct payloads.
func messages(prefix string, n int) ([]Message, []string) {
	msgs := make([]Message, n)
	ids := make([]string, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-%02d", prefix, i)
		msgs[i] = Message{ID: ids[i], Payload: fmt.Appendf(nil, `{"event":%q}`, ids[i])}
	}
	return msgs, ids
}

// waitSettled waits until the broker holds nothing unacknowledged; the
// consumers must be stopped.
func waitSettled(t *testing.T, h Harness) {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	for n := h.Unsettled(t); n != 0; n = h.Unsettled(t) {
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still unacknowledged %v after the consumers stopped", n, Deadline)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assertRecords fails t unless every id has a record in status in scope.
func assertRecords(t *testing.T, store dedup.Store, scope string, ids []string, status dedup.Status) {
	t.Helper()
	for _, id := range ids {
		rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: id})
		if err != nil {
			t.Errorf("record of %s: %v", id, err)
			continue
		}
		if rec.Status != status {
			t.Errorf("record of %s: %s, want %s", id, rec.Status, status)
		}
	}
}

// record returns the record of id in scope.
func record(t *testing.T, store dedup.Store, scope, id string) dedup.Record {
	t.Helper()
	rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: id})
	if err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	return rec
}

// lettersOf returns the letters of event id.
func lettersOf(ls []Letter, id string) []Letter {
	var out []Letter
	for _, l := range ls {
		if l.EventID == id {
			out = append(out, l)
		}
	}
	return out
}

// assertOneLetter fails t unless the harness's dead-letter destination
// holds exactly one letter, of id, for reason, after attempts, with
// payload and the scope.
func assertOneLetter(t *testing.T, h Harness, scope, id string, reason dedup.Reason, attempts int, payload []byte) {
	t.Helper()
	ls := h.DeadLetters(t)
	if len(ls) != 1 {
		t.Fatalf("%d dead letters, want 1 (of %s): %+v", len(ls), id, ls)
	}
	l := ls[0]
	if l.EventID != id || l.Reason != reason || l.Attempts != attempts {
		t.Errorf("dead letter of %s, reason %q, %d attempts; want %s, %q, %d", l.EventID, l.Reason, l.Attempts, id, reason, attempts)
	}
	if string(l.Payload) != string(payload) {
		t.Errorf("dead letter's payload %q, want the original %q", l.Payload, payload)
	}
	if got := l.Metadata["dedup-scope"]; got != scope {
		t.Errorf("dead letter's dedup-scope %q, want %q", got, scope)
	}
}
