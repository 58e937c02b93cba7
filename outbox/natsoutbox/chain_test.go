package natsoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/natsoutbox"
)

// The chain end to end: events written in the transactions of their
// business rows (one rolled back), relayed to JetStream by natsoutbox, and
// consumed by natsdedup: each committed event has one effect, the rolled
// back one none.
func TestOutboxChainEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{})
	ctx := context.Background()
	pool := testenv.Postgres(t)
	orders, table := "natsoutbox_orders_"+e.token, "natsoutbox_outbox_"+e.token
	if _, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+orders+", "+table); err != nil {
			t.Errorf("drop tables: %v", err)
		}
	})
	ob, err := outbox.New(outbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	subject := e.token + ".orders"
	write := func(id string, commit bool) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES ($1)", id); err != nil {
				return err
			}
			if _, err := ob.Add(ctx, tx, outbox.Event{ID: id, Destination: subject, Key: []byte("customer-1"), Payload: []byte(id)}); err != nil {
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if err != nil && (commit || !errors.Is(err, errRollback)) {
			t.Fatal(err)
		}
	}
	var ids []string
	for i := range 20 {
		id := fmt.Sprintf("order-%d", i)
		ids = append(ids, id)
		write(id, true)
	}
	write("order-rolled-back", false)

	relay, err := outbox.NewRelay(ob, pool.Config(), e.pub, outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := e.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	effects := map[string]int{}
	keys := map[string]string{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), natsdedup.Messages(), func(ctx context.Context, m jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		effects[string(m.Data())]++
		keys[string(m.Data())] = m.Headers().Get(natsoutbox.KeyHeader)
		return nil
	}, dedup.WithScope(dedup.Scope("orders", "ship")), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithFetchWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = relay.Run(runCtx) })
	wg.Go(func() { _ = c.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()

	until := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(effects)
		mu.Unlock()
		if n >= len(ids) {
			break
		}
		if time.Now().After(until) {
			t.Fatalf("%d of %d events applied within a minute", n, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if effects[id] != 1 {
			t.Errorf("%s: %d effects, want 1", id, effects[id])
		}
		if keys[id] != "customer-1" {
			t.Errorf("%s: the consumer saw key %q in %s, want the outbox's key customer-1", id, keys[id], natsoutbox.KeyHeader)
		}
	}
	if n := effects["order-rolled-back"]; n != 0 {
		t.Errorf("the rolled-back event had %d effects", n)
	}
}

var errRollback = errors.New("roll back")
