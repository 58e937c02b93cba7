package dedup_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/dedupkit/dedup"
)

// BenchmarkWrapper measures the wrapper's own cost per event on the memory
// store: a new event (claim, run, complete) and a duplicate (claim only).
func BenchmarkWrapper(b *testing.B) {
	// A transport's message hands out its payload without copying it.
	type benchEvent struct {
		ID   string
		Body []byte
	}
	msgs := dedup.Messages[benchEvent]{
		EventID:    func(e benchEvent) (string, error) { return e.ID, nil },
		Payload:    func(e benchEvent) []byte { return e.Body },
		DeadLetter: func(e benchEvent) dedup.DeadLetter { return dedup.DeadLetter{Payload: e.Body} },
	}
	body := []byte(`{"amount":10}`)
	newWrapper := func(b *testing.B) *dedup.Wrapper[benchEvent] {
		w, err := dedup.Wrap(dedup.NewMemoryStore(), msgs,
			func(ctx context.Context, e benchEvent) error { return nil },
			dedup.WithScope("bench"), dedup.WithSink(dedup.NewMemorySink()))
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	ctx := context.Background()
	b.Run("new", func(b *testing.B) {
		// Every key is new within a window, and the store starts afresh each
		// window, as in BenchmarkMemoryStoreClaimComplete: otherwise the cost
		// of a map growing with b.N would be counted as the wrapper's.
		const window = 1 << 16
		ids := make([]string, window)
		for i := range ids {
			ids[i] = "evt-" + strconv.Itoa(i)
		}
		w := newWrapper(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if i%window == 0 && i > 0 {
				b.StopTimer()
				w = newWrapper(b)
				b.StartTimer()
			}
			if res, err := w.Handle(ctx, benchEvent{ID: ids[i%window], Body: body}); err != nil || res.Outcome != dedup.OutcomeProcessed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		w := newWrapper(b)
		msg := benchEvent{ID: "dup", Body: body}
		if _, err := w.Handle(ctx, msg); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if res, err := w.Handle(ctx, msg); err != nil || res.Outcome != dedup.OutcomeDuplicate {
				b.Fatal(res, err)
			}
		}
	})
}
