package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// runID returns a short identifier unique to this run, for table names and
// topics.
func runID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + deduptype.NewOwnerToken()[:4]
}

// env is a migrated outbox in a fresh table, the application's pool, and an
// in-process Kafka cluster with topic.
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	ob    *outbox.Outbox
	table string
	kafka *kfake.Cluster
	topic string
	addrs []string
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	pool := testenv.Postgres(t)
	table := "outbox_" + runID()
	ob, err := outbox.New(outbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	topic := "orders-" + runID()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return &env{t: t, pool: pool, ob: ob, table: table, kafka: kc, topic: topic, addrs: kc.ListenAddrs()}
}

// producer returns a kgo client producing to the cluster, closed when the
// test ends.
func (e *env) producer(opts ...kgo.Opt) *kgo.Client {
	e.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addrs...), kgo.ProducerLinger(0),
		kgo.UnknownTopicRetries(1)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	return cl
}

// relay returns a relay publishing to the cluster with quick polling and
// backoff, logging only errors.
func (e *env) relay(opts ...outbox.RelayOpt) *outbox.Relay {
	e.t.Helper()
	pub, err := kafkaoutbox.NewPublisher(e.producer())
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := outbox.NewRelay(e.ob, e.pool.Config(), pub, append([]outbox.RelayOpt{
		outbox.WithPollInterval(50 * time.Millisecond),
		outbox.WithBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 100*time.Millisecond)),
		outbox.WithLogger(quietLogger()),
	}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// start runs relays until the test ends.
func (e *env) start(relays ...*outbox.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				e.t.Errorf("relay: %v", err)
			}
		})
	}
	e.t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// add writes events in one transaction, committed or rolled back.
func (e *env) add(commit bool, events ...outbox.Event) []string {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := e.ob.Add(ctx, tx, events...)
	if err != nil {
		e.t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// event returns an event to the topic.
func (e *env) event(key, payload string) outbox.Event {
	ev := outbox.Event{Destination: e.topic, Payload: []byte(payload)}
	if key != "" {
		ev.Key = []byte(key)
	}
	return ev
}

// consume reads the topic from the start until want records arrived or the
// deadline passed, and then a little longer, so that extra records show.
func (e *env) consume(want int, within time.Duration) []*kgo.Record {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.ConsumeTopics(e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(within)
	extra := time.Time{}
	for time.Now().Before(deadline) && (extra.IsZero() || time.Now().Before(extra)) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) >= want && extra.IsZero() {
			extra = time.Now().Add(300 * time.Millisecond)
		}
	}
	return recs
}

// header returns the value of a record's header.
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// statuses counts the table's rows by status.
func (e *env) statuses() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT status, count(*) FROM "+e.table+" GROUP BY status")
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			e.t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// tx begins a transaction on the application's pool, rolled back at the end
// unless committed.
func (e *env) begin() pgx.Tx {
	e.t.Helper()
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}
