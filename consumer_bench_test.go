package dedup_test

import (
	"context"
	"strconv"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dedupkit/dedup"
)

// benchEvent is the benchmarks' message. A transport's message hands out
// its payload without copying it.
type benchEvent struct {
	ID   string
	Body []byte
}

var benchEvents = dedup.Messages[benchEvent]{
	EventID:    func(e benchEvent) (string, error) { return e.ID, nil },
	Payload:    func(e benchEvent) []byte { return e.Body },
	DeadLetter: func(e benchEvent) dedup.DeadLetter { return dedup.DeadLetter{Payload: e.Body} },
}

var benchBody = []byte(`{"amount":10}`)

// BenchmarkWrapper measures the wrapper's own cost per event on the memory
// store: a new event (claim, run, complete) and a duplicate (claim only);
// then the same with the OpenTelemetry SDK recording every span and metric,
// what tracing and metrics cost once a user turns them on.
func BenchmarkWrapper(b *testing.B) {
	b.Run("new", func(b *testing.B) { benchNew(b) })
	b.Run("new/batch64", func(b *testing.B) { benchNewBatch(b) })
	b.Run("new/concurrent64", func(b *testing.B) { benchNewConcurrent(b) })
	b.Run("duplicate", func(b *testing.B) { benchDuplicate(b) })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}()
	otel := []dedup.Opt{dedup.WithTracerProvider(tp), dedup.WithMeterProvider(mp)}
	b.Run("new/otel", func(b *testing.B) { benchNew(b, otel...) })
	b.Run("duplicate/otel", func(b *testing.B) { benchDuplicate(b, otel...) })
}

func newBenchWrapper(b *testing.B, opts ...dedup.Opt) *dedup.Wrapper[benchEvent] {
	w, err := dedup.Wrap(dedup.NewMemoryStore(), benchEvents,
		func(ctx context.Context, e benchEvent) error { return nil },
		append([]dedup.Opt{dedup.WithScope("bench"), dedup.WithSink(dedup.NewMemorySink())}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

func benchNew(b *testing.B, opts ...dedup.Opt) {
	// Every key is new within a window, and the store starts afresh each
	// window, as in BenchmarkMemoryStoreClaimComplete: otherwise the cost
	// of a map growing with b.N would be counted as the wrapper's.
	const window = 1 << 16
	ids := make([]string, window)
	for i := range ids {
		ids[i] = "evt-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	w := newBenchWrapper(b, opts...)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%window == 0 && i > 0 {
			b.StopTimer()
			w = newBenchWrapper(b, opts...)
			b.StartTimer()
		}
		if res, err := w.Handle(ctx, benchEvent{ID: ids[i%window], Body: benchBody}); err != nil || res.Outcome != dedup.OutcomeProcessed {
			b.Fatal(res, err)
		}
	}
}

// benchNewBatch is benchNew through HandleBatch, 64 events a call, as the
// Kafka consumer hands a fetched batch over; an op is one event.
func benchNewBatch(b *testing.B, opts ...dedup.Opt) {
	const window, batch = 1 << 16, 64
	msgs := make([]benchEvent, window)
	for i := range msgs {
		msgs[i] = benchEvent{ID: "evt-" + strconv.Itoa(i), Body: benchBody}
	}
	ctx := context.Background()
	w := newBenchWrapper(b, opts...)
	yield := func(_ int, res dedup.Result, err error) bool {
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			b.Fatal(res, err)
		}
		return true
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		lo := i % window
		if lo == 0 && i > 0 {
			b.StopTimer()
			w = newBenchWrapper(b, opts...)
			b.StartTimer()
		}
		if err := w.HandleBatch(ctx, msgs[lo:lo+min(batch, b.N-i)], yield); err != nil {
			b.Fatal(err)
		}
	}
}

// benchNewConcurrent is benchNew through HandleConcurrent, 64 events a
// call, as the SQS consumer hands a receive over; an op is one event.
func benchNewConcurrent(b *testing.B, opts ...dedup.Opt) {
	const window, batch = 1 << 16, 64
	msgs := make([]benchEvent, window)
	for i := range msgs {
		msgs[i] = benchEvent{ID: "evt-" + strconv.Itoa(i), Body: benchBody}
	}
	ctx := context.Background()
	w := newBenchWrapper(b, opts...)
	yield := func(_ int, res dedup.Result, err error) {
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			b.Fatal(res, err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		lo := i % window
		if lo == 0 && i > 0 {
			b.StopTimer()
			w = newBenchWrapper(b, opts...)
			b.StartTimer()
		}
		if err := w.HandleConcurrent(ctx, msgs[lo:lo+min(batch, b.N-i)], yield); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDuplicate(b *testing.B, opts ...dedup.Opt) {
	ctx := context.Background()
	w := newBenchWrapper(b, opts...)
	msg := benchEvent{ID: "dup", Body: benchBody}
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
}
