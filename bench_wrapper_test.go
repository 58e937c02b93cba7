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
	newWrapper := func(b *testing.B) *dedup.Wrapper[event] {
		w, err := dedup.Wrap(dedup.NewMemoryStore(), events,
			func(ctx context.Context, e event) error { return nil },
			dedup.WithScope("bench"), dedup.WithSink(&dedup.MemorySink{}))
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	ctx := context.Background()
	b.Run("new", func(b *testing.B) {
		w := newWrapper(b)
		ids := make([]string, b.N)
		for i := range ids {
			ids[i] = "evt-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if res, err := w.Handle(ctx, event{ID: ids[i], Body: `{"amount":10}`}); err != nil || res.Outcome != dedup.Processed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		w := newWrapper(b)
		msg := event{ID: "dup", Body: `{"amount":10}`}
		if _, err := w.Handle(ctx, msg); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if res, err := w.Handle(ctx, msg); err != nil || res.Outcome != dedup.Duplicate {
				b.Fatal(res, err)
			}
		}
	})
}
