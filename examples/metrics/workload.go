package main

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// order is a consumed message.
type order struct{ ID, Body string }

var orders = dedup.Messages[order]{
	EventID:    func(o order) (string, error) { return o.ID, nil },
	Payload:    func(o order) []byte { return []byte(o.Body) },
	DeadLetter: func(o order) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(o.Body)} },
}

// outageSink is a dead-letter sink that refuses letters while down is set.
type outageSink struct {
	*dedup.MemorySink
	down atomic.Bool
}

var errSinkDown = errors.New("dead-letter queue unreachable")

func (s *outageSink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	if s.down.Load() {
		return errSinkDown
	}
	return s.MemorySink.Send(ctx, dl)
}

// workload is a consumer and an Idempotency-Key middleware, metered.
type workload struct {
	consumer *dedup.Wrapper[order]
	sink     *outageSink
	payments http.Handler

	mu     sync.Mutex
	failed map[string]bool // flaky events that failed once
}

// Rounds of a cycle: an event fails once every 5 rounds, one is poison
// every 10, and the sink is down for outageRounds of every cycleRounds.
const (
	cycleRounds  = 60
	outageRounds = 10
)

// newWorkload returns a workload recording through mp, whose consumer
// reports an outage once its deliveries have failed for outage.
func newWorkload(mp metric.MeterProvider, log *slog.Logger, outage time.Duration) (*workload, error) {
	wl := &workload{sink: &outageSink{MemorySink: dedup.NewMemorySink()}, failed: map[string]bool{}}
	var err error
	wl.consumer, err = dedup.Wrap(dedup.NewMemoryStore(), orders, wl.handle,
		dedup.WithScope(dedup.Scope("metrics-example", "apply-order")), dedup.WithSink(wl.sink),
		dedup.WithMeterProvider(mp), dedup.WithLogger(log), dedup.WithOutageThreshold(outage),
		dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 10*time.Millisecond)))
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope(dedup.Scope("metrics-example", "payments")),
		idemhttp.WithMeterProvider(mp), idemhttp.WithLogger(log))
	if err != nil {
		return nil, err
	}
	wl.payments = mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // the payment's work
		w.WriteHeader(http.StatusCreated)
	}))
	return wl, nil
}

// handle is the consumer's handler: poison events fail for good, flaky
// ones fail once.
func (wl *workload) handle(_ context.Context, o order) error {
	switch {
	case strings.HasPrefix(o.ID, "poison"):
		return dedup.Permanent(errors.New("unsupported order"))
	case strings.HasPrefix(o.ID, "flaky"):
		wl.mu.Lock()
		defer wl.mu.Unlock()
		if !wl.failed[o.ID] {
			wl.failed[o.ID] = true
			return errors.New("downstream busy")
		}
	}
	time.Sleep(time.Millisecond) // the order's work
	return nil
}

// round delivers round i's events, each until it settles, and makes its
// requests. It returns ctx's error once ctx ends.
func (wl *workload) round(ctx context.Context, i int) error {
	n := strconv.Itoa(i)
	wl.sink.down.Store(i%cycleRounds >= cycleRounds-outageRounds)
	msgs := []order{{ID: "order-" + n, Body: "new"}}
	if i > 0 {
		msgs = append(msgs, order{ID: "order-" + strconv.Itoa(i-1), Body: "new"}) // a redelivery
	}
	if i%5 == 0 {
		msgs = append(msgs, order{ID: "flaky-" + n, Body: "new"})
	}
	if i%10 == 0 || wl.sink.down.Load() {
		msgs = append(msgs, order{ID: "poison-" + n, Body: "new"})
	}
	for _, m := range msgs {
		if err := wl.deliver(ctx, m); err != nil {
			return err
		}
	}
	key := rand.Text()
	wl.pay(key, `{"amount":10}`)
	if i%3 == 0 {
		wl.pay(key, `{"amount":10}`) // a client's retry: replayed
	}
	if i%7 == 0 {
		wl.pay(key, `{"amount":99}`) // the key reused with another body: a conflict
	}
	return nil
}

// deliver hands m to the consumer as a transport retrying in place would,
// a few times at most: during an outage a poison event stays unsettled
// (the transport would redeliver it later).
func (wl *workload) deliver(ctx context.Context, m order) error {
	for range 5 {
		res, err := wl.consumer.Handle(ctx, m)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && res.Settled() {
			return nil
		}
		time.Sleep(res.RetryAfter)
	}
	return nil
}

// pay makes one request with key.
func (wl *workload) pay(key, body string) {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idemhttp.DefaultHeader, key)
	wl.payments.ServeHTTP(httptest.NewRecorder(), r)
}
