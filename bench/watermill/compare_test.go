// Package watermill sets dedup's memory-store deduplication beside
// Watermill's Deduplicator middleware, by event ID, in one process: what
// each costs per event, with no transport. It is a module of its own so
// that Watermill is never a dependency of dedup.
//
//	cd bench/watermill && go test -bench . -count 5
//
// The two do different work. Watermill's middleware records an ID before
// the handler runs, in a map with a one-minute window: a handler that fails
// leaves its event marked, so the redelivery is dropped and the effect never
// happens. dedup claims the event with a lease, runs the handler, and
// records its outcome: a failure is tried again, a crash is taken over.
package watermill_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/dedupkit/dedup"
)

// batchSize is how many events a HandleBatch call hands over, as the Kafka
// consumer does with a fetched partition batch.
const batchSize = 64

type event struct {
	ID   string
	Body []byte
}

var events = dedup.Messages[event]{
	EventID:    func(e event) (string, error) { return e.ID, nil },
	Payload:    func(e event) []byte { return e.Body },
	DeadLetter: func(e event) dedup.DeadLetter { return dedup.DeadLetter{Payload: e.Body} },
}

var body = []byte(`{"amount":10}`)

// ids returns n event IDs of which one in five re-sends an earlier one, as
// dedupbench's rows do.
func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		if i%5 == 4 {
			out[i] = out[i-3]
		} else {
			out[i] = "evt-" + strconv.Itoa(i)
		}
	}
	return out
}

func BenchmarkWatermillDeduplicator(b *testing.B) {
	repo, err := middleware.NewMapExpiringKeyRepository(time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	d := &middleware.Deduplicator{
		KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
		Repository: repo,
	}
	handler := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msgs := make([]*message.Message, b.N)
	for i, id := range ids(b.N) {
		msgs[i] = message.NewMessage(id, body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range msgs {
		if _, err := handler(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDedupHandle(b *testing.B) {
	w := wrapper(b)
	evs := eventsOf(b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for _, e := range evs {
		if res, err := w.Handle(ctx, e); err != nil || !res.Settled() {
			b.Fatal(res, err)
		}
	}
}

func BenchmarkDedupHandleBatch(b *testing.B) {
	w := wrapper(b)
	evs := eventsOf(b.N)
	ctx := context.Background()
	yield := func(_ int, res dedup.Result, err error) bool {
		if err != nil || !res.Settled() {
			b.Fatal(res, err)
		}
		return true
	}
	b.ReportAllocs()
	b.ResetTimer()
	for lo := 0; lo < len(evs); lo += batchSize {
		if err := w.HandleBatch(ctx, evs[lo:min(lo+batchSize, len(evs))], yield); err != nil {
			b.Fatal(err)
		}
	}
}

func wrapper(b *testing.B) *dedup.Wrapper[event] {
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error { return nil },
		dedup.WithScope("bench"), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		b.Fatal(err)
	}
	return w
}

func eventsOf(n int) []event {
	evs := make([]event, n)
	for i, id := range ids(n) {
		evs[i] = event{ID: id, Body: body}
	}
	return evs
}
