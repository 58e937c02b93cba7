package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// The chain's own tables and topic, apart from the main run's.
const (
	chainTopic     = "order-events"
	chainOrders    = "quickstart_orders"
	chainShipments = "quickstart_shipments"
	chainKeys      = "quickstart_request_keys"
	chainInbox     = "quickstart_shipping_inbox"
	chainOutbox    = "quickstart_outbox"
)

// runChain shows one order through the three places where at-least-once
// delivery repeats work, each with one effect:
//
//  1. a client retries a POST whose answer was lost: the Idempotency-Key
//     middleware runs the handler once and replays its answer;
//  2. the handler writes the order and its "order placed" event in one
//     transaction (the outbox); a relay publishes the event, and publishes
//     it again, as a relay killed before marking it sent would;
//  3. the shipping consumer gets the event twice and ships once.
func runChain(ctx context.Context, pool *pgxpool.Pool, brokers []string, logger *slog.Logger, mp metric.MeterProvider) error {
	fmt.Println("\nthe whole chain: a retried request, its outbox event, a redelivered message")
	ob, err := outbox.New(outbox.WithTable(chainOutbox))
	if err != nil {
		return err
	}
	keys, err := dedup.NewPostgresStore(pool, dedup.WithTable(chainKeys))
	if err != nil {
		return err
	}
	inbox, err := dedup.NewPostgresStore(pool, dedup.WithTable(chainInbox))
	if err != nil {
		return err
	}
	if err := chainSchema(ctx, pool, ob, keys, inbox); err != nil {
		return err
	}

	// 1. The request side: the order and its event commit with the stored answer.
	mw, err := idemhttp.NewTx(keys, pool, idemhttp.WithScope("quickstart/orders"), idemhttp.WithLogger(logger), idemhttp.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		placeOrder(w, r, tx, ob)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown(context.WithoutCancel(ctx))

	first, second, err := retriedRequest(ctx, "http://"+ln.Addr().String()+"/orders")
	if err != nil {
		return err
	}
	var orders int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+chainOrders).Scan(&orders); err != nil {
		return err
	}
	fmt.Printf("  request:  the first answer (%d) was lost on its way back; the retry got %d, replayed: %s, the same bytes: %v; orders written: %d\n",
		first.status, second.status, second.replayed, first.body == second.body, orders)

	// 2 and 3. The relay and the consumer run until both copies are seen.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()
	pub, err := kafkaoutbox.NewPublisher(producer)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(ob, pool.Config(), pub, outbox.WithLogger(logger), outbox.WithPollInterval(100*time.Millisecond), outbox.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	var deliveries, duplicates atomic.Int64
	consumer, err := shippingConsumer(inbox, producer, brokers, logger, mp, &deliveries, &duplicates)
	if err != nil {
		return err
	}
	done := make(chan error, 2)
	go func() { done <- relay.Run(runCtx) }()
	go func() { done <- consumer.Run(runCtx) }()

	waitErr := waitFor(ctx, func() bool { return deliveries.Load() >= 1 })
	if waitErr == nil {
		// As if the relay had died after Kafka's acknowledgement and before
		// marking the event sent: it publishes the event again.
		_, waitErr = pool.Exec(ctx, "UPDATE "+chainOutbox+" SET status = 'pending', sent_at = NULL")
	}
	if waitErr == nil {
		waitErr = waitFor(ctx, func() bool { return deliveries.Load() >= 2 })
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil && waitErr == nil {
			waitErr = err
		}
	}
	if waitErr != nil {
		return fmt.Errorf("chain: %w", waitErr)
	}
	var shipments int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+chainShipments).Scan(&shipments); err != nil {
		return err
	}
	fmt.Printf("  outbox:   1 event written with the order, published %d times by the relay\n", deliveries.Load())
	fmt.Printf("  consumer: %d deliveries, %d duplicate skipped, shipments: %d\n", deliveries.Load(), duplicates.Load(), shipments)
	if orders != 1 || shipments != 1 || first.body != second.body {
		return fmt.Errorf("chain: want one order, one shipment and the same answer twice; got %d orders, %d shipments, answers %q and %q",
			orders, shipments, first.body, second.body)
	}
	fmt.Println("  check: one order, one event, one shipment, the same answer to both sends")
	return nil
}

func chainSchema(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, stores ...*dedup.PostgresStore) error {
	// Each run starts afresh, in a schema of its own (chainDatabase): the
	// Kafka cluster is new, so is the order.
	if _, err := pool.Exec(ctx, "CREATE TABLE "+chainOrders+" (id text PRIMARY KEY, cents bigint NOT NULL)"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+chainShipments+" (order_id text NOT NULL)"); err != nil {
		return err
	}
	for _, s := range stores {
		if err := s.Migrate(ctx); err != nil {
			return err
		}
	}
	return ob.Migrate(ctx, pool)
}

// placeOrder writes the order and its event in the request's transaction.
func placeOrder(w http.ResponseWriter, r *http.Request, tx pgx.Tx, ob *outbox.Outbox) {
	var req struct {
		Cents int64 `json:"cents"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Cents <= 0 {
		http.Error(w, "cents must be a positive integer", http.StatusBadRequest)
		return
	}
	id := "ord_" + outbox.NewID()
	if _, err := tx.Exec(r.Context(), "INSERT INTO "+chainOrders+" (id, cents) VALUES ($1, $2)", id, req.Cents); err != nil {
		http.Error(w, "cannot place the order", http.StatusInternalServerError)
		return
	}
	payload, _ := json.Marshal(map[string]any{"order": id, "cents": req.Cents})
	if _, err := ob.Add(r.Context(), tx, outbox.Event{Destination: chainTopic, Key: []byte(id), Payload: payload}); err != nil {
		http.Error(w, "cannot place the order", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(payload) //nolint:errcheck // the client may have gone
}

type answer struct {
	status   int
	body     string
	replayed string
}

// losingTransport loses the first answer on its way back: the server
// answered, the client sees a reset connection.
type losingTransport struct {
	lost answer // the answer the client never saw
	done bool
}

func (t *losingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || t.done {
		return resp, err
	}
	t.done = true
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.lost = answer{status: resp.StatusCode, body: string(body)}
	return nil, errors.New("connection reset by peer")
}

// retriedRequest sends one POST with an Idempotency-Key whose first answer
// is lost on the way back, and retries it with the same key, as a client
// library would. It returns the lost answer and the one the client got.
func retriedRequest(ctx context.Context, url string) (lost, got answer, err error) {
	const key = `"quickstart-order-7f3c9a61"`
	t := &losingTransport{}
	client := &http.Client{Transport: t, Timeout: 10 * time.Second}
	for try := 1; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(`{"cents":4200}`)))
		if err != nil {
			return lost, got, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultHeader, key)
		resp, err := client.Do(req)
		if err != nil {
			if try < 3 {
				continue // the same key: the server knows this request
			}
			return t.lost, got, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return t.lost, answer{status: resp.StatusCode, body: string(body), replayed: orDefault(resp.Header.Get(idemhttp.ReplayHeader), "false")}, err
	}
}

func shippingConsumer(store *dedup.PostgresStore, producer *kgo.Client, brokers []string, logger *slog.Logger, mp metric.MeterProvider, deliveries, duplicates *atomic.Int64) (*kafkadedup.Consumer, error) {
	sink, err := kafkadedup.NewSink(producer)
	if err != nil {
		return nil, err
	}
	ship := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		var ev struct {
			Order string `json:"order"`
		}
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			return dedup.Permanent(err)
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+chainShipments+" (order_id) VALUES ($1)", ev.Order)
		return err
	}
	w, err := dedup.WrapTx(store, kafkadedup.Messages(), ship,
		dedup.WithScope(dedup.Scope("shipping", "ship-order")),
		dedup.WithSink(sink),
		dedup.WithLogger(logger),
		dedup.WithMeterProvider(mp),
		dedup.WithObserver(func(_ context.Context, res dedup.Result) {
			if res.Settled() {
				deliveries.Add(1)
			}
			if res.Outcome == dedup.OutcomeDuplicate {
				duplicates.Add(1)
			}
		}),
	)
	if err != nil {
		return nil, err
	}
	return kafkadedup.NewConsumer(w, kafkadedup.WithLogger(logger), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("shipping"),
		kgo.ConsumeTopics(chainTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	))
}

// chainWait bounds the wait for the chain's consumer when the caller's
// context has no deadline: long enough for a consumer group to form on a
// loaded machine, short enough to end a run whose chain is broken.
const chainWait = 2 * time.Minute

// waitFor polls cond until it holds, ctx is done, or chainWait has passed.
func waitFor(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, chainWait)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the chain's consumer did not answer: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
