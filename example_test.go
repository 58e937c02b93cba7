package dedup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/dedupkit/dedup"
)

// Order is a transport's native message type in this example.
type Order struct {
	ID      string // the producer-assigned event ID
	Payload string
}

func ExampleWrap() {
	charged := 0
	w, err := dedup.Wrap(dedup.NewMemoryStore(), orderMessages,
		func(ctx context.Context, o Order) error {
			charged++ // the business effect
			return nil
		},
		dedup.WithScope("billing/charge-card"),
		dedup.WithSink(dedup.NewMemorySink()),
	)
	if err != nil {
		panic(err)
	}
	// The broker delivers the same event three times.
	for i := 0; i < 3; i++ {
		res, err := w.Handle(context.Background(), Order{ID: "order-42", Payload: `{"amount":10}`})
		if err != nil {
			panic(err) // store unreachable: do not ack, it comes back
		}
		fmt.Println(res.Outcome, "ack:", res.Settled())
	}
	fmt.Println("charged", charged, "time")
	// Output:
	// processed ack: true
	// duplicate ack: true
	// duplicate ack: true
	// charged 1 time
}

func ExampleJSONFingerprint() {
	fp := dedup.JSONFingerprint("v1", "amount", "account")
	a, _ := fp([]byte(`{"amount": 10, "account": "A-1", "sent_at": "10:00"}`))
	b, _ := fp([]byte(`{"account":"A-1","amount":10.0,"sent_at":"10:05"}`))
	fmt.Println(a == b)
	// Output: true
}

func ExamplePermanent() {
	handler := func(ctx context.Context, o Order) error {
		if o.Payload == "" {
			// No retry can fix this: dead-letter at once.
			return dedup.Permanent(fmt.Errorf("order %s has no payload", o.ID))
		}
		return nil
	}
	fmt.Println(dedup.IsPermanent(handler(context.Background(), Order{ID: "o-1"})))
	// Output: true
}

func ExampleWithMeterProvider() {
	// In a service: the provider an exporter (Prometheus, OTLP) reads.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	w, err := dedup.Wrap(dedup.NewMemoryStore(), orderMessages,
		func(ctx context.Context, o Order) error { return nil },
		dedup.WithScope("billing/charge-card"),
		dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithMeterProvider(mp),
	)
	if err != nil {
		panic(err)
	}
	for range 3 {
		if _, err := w.Handle(context.Background(), Order{ID: "order-42", Payload: `{"amount":10}`}); err != nil {
			panic(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "dedup.deliveries" {
				for _, p := range sum.DataPoints {
					outcome, _ := p.Attributes.Value("dedup.outcome")
					fmt.Println(m.Name, outcome.AsString(), p.Value)
				}
			}
		}
	}
	// Unordered output:
	// dedup.deliveries processed 1
	// dedup.deliveries duplicate 2
}

// orderMessages reads the example's Order messages.
var orderMessages = dedup.Messages[Order]{
	EventID:    func(o Order) (string, error) { return o.ID, nil },
	Payload:    func(o Order) []byte { return []byte(o.Payload) },
	DeadLetter: func(o Order) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(o.Payload)} },
}

func ExampleWrapper_HandleBatch() {
	var shipped []string
	w, err := dedup.Wrap(dedup.NewMemoryStore(), orderMessages,
		func(ctx context.Context, o Order) error {
			shipped = append(shipped, o.ID)
			return nil
		},
		dedup.WithScope("shipping/ship"),
		dedup.WithSink(dedup.NewMemorySink()),
	)
	if err != nil {
		panic(err)
	}
	// One fetch from a partition, holding a redelivered event: the keys are
	// claimed in one store call and the successes completed in another.
	fetch := []Order{{ID: "o-1", Payload: "a"}, {ID: "o-2", Payload: "b"}, {ID: "o-1", Payload: "a"}}
	err = w.HandleBatch(context.Background(), fetch, func(i int, res dedup.Result, err error) bool {
		if err != nil || !res.Settled() {
			return false // commit nothing from here on: it comes back
		}
		fmt.Println(fetch[i].ID, res.Outcome) // mark the offset for commit
		return true
	})
	if err != nil {
		panic(err) // the batch claim failed: nothing ran, nothing to commit
	}
	fmt.Println("shipped", shipped)
	// Output:
	// o-1 processed
	// o-2 processed
	// o-1 duplicate
	// shipped [o-1 o-2]
}

func ExampleWrapper_HandleConcurrent() {
	var mu sync.Mutex
	emailed := map[string]int{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), orderMessages,
		func(ctx context.Context, o Order) error {
			mu.Lock() // the handlers of a batch run at the same time
			defer mu.Unlock()
			emailed[o.ID]++
			return nil
		},
		dedup.WithScope("mail/receipt"),
		dedup.WithSink(dedup.NewMemorySink()),
	)
	if err != nil {
		panic(err)
	}
	// One receive from an SQS standard queue: order does not matter.
	receive := []Order{{ID: "o-1", Payload: "a"}, {ID: "o-2", Payload: "b"}, {ID: "o-3", Payload: "c"}}
	for range 2 { // the same messages delivered twice
		err = w.HandleConcurrent(context.Background(), receive, func(i int, res dedup.Result, err error) {
			if err == nil && res.Settled() {
				fmt.Println(receive[i].ID, res.Outcome) // delete the message
			}
		})
		if err != nil {
			panic(err)
		}
	}
	fmt.Println(emailed)
	// Output:
	// o-1 processed
	// o-2 processed
	// o-3 processed
	// o-1 duplicate
	// o-2 duplicate
	// o-3 duplicate
	// map[o-1:1 o-2:1 o-3:1]
}

// ExampleReadinessHandler serves the readiness of every part of a binary
// (here two fronts; a consumer, an idemhttp middleware and an outbox relay
// are health checkers too) on one path.
func ExampleReadinessHandler() {
	charge := func(context.Context, Order) error { return nil }
	orders, err := dedup.NewFront(dedup.NewMemoryStore(), charge)
	if err != nil {
		panic(err)
	}
	refunds, err := dedup.NewFront(dedup.NewMemoryStore(), charge)
	if err != nil {
		panic(err)
	}
	readyz := dedup.ReadinessHandler(orders, refunds)
	rec := httptest.NewRecorder()
	readyz.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output: 200 ok
}
