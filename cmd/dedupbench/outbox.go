package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// The outbox rows (-outbox) measure the relay: throughput draining a backlog
// of N committed events on 1,000 keys (16 in one row) to kfake with one to
// four relays, beside the floor (the same rows taken with SKIP LOCKED and
// deleted, nothing published) and a relay whose publisher discards; a
// backlog arriving in a table analyzed in its steady state; what the outbox
// costs the writers' commit rate; then commit-to-publish latency with
// writers committing one event per transaction at a steady rate, and as fast
// as they can.
//
// No row analyzes its table after the backlog arrived, which production's
// autovacuum would not have done in time either: each table is analyzed
// while empty, or, in the steady-state row, while it holds only sent rows.

// outboxResult is one outbox row.
type outboxResult struct {
	Title        string  `json:"title"`
	Events       int     `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	WriteRate    float64 `json:"write_rate,omitempty"` // committed events/s, latency and writer rows
	BaseRate     float64 `json:"base_rate,omitempty"`  // writer rows: commits/s of the same writers without the outbox
	P50Micros    float64 `json:"p50_us,omitempty"`
	P99Micros    float64 `json:"p99_us,omitempty"`
}

// outboxBench holds what every outbox row shares.
type outboxBench struct {
	dsn    string
	pool   *pgxpool.Pool
	kafka  *kfake.Cluster
	topic  string
	n      int
	steady time.Duration // how long the latency rows write
	table  string
	ob     *outbox.Outbox
	orders string // the writers' business table
}

// runOutboxBench runs the outbox rows whose title only matches (nil: all).
func runOutboxBench(ctx context.Context, w io.Writer, dsn string, n int, steady time.Duration, only *regexp.Regexp) error {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 20 // a connection per writer of the latency rows
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	topic := "outbox-bench"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
	if err != nil {
		return err
	}
	defer kc.Close()
	b := &outboxBench{dsn: dsn, pool: pool, kafka: kc, topic: topic, n: n, steady: steady}

	var results []outboxResult
	for _, row := range []struct {
		title string
		run   func(context.Context) (outboxResult, error)
	}{
		{"floor: SKIP LOCKED + DELETE, no publishing", b.floor},
		{"relay, publisher discarding (1 relay)", b.drain(1, false, 1000)},
		{"relay to kfake, 1 relay", b.drain(1, true, 1000)},
		{"relay to kfake, 2 relays", b.drain(2, true, 1000)},
		{"relay to kfake, 3 relays", b.drain(3, true, 1000)},
		{"relay to kfake, 4 relays", b.drain(4, true, 1000)},
		{"relay to kfake, 3 relays, 16 keys", b.drain(3, true, 16)},
		{"relay to kfake, 1 relay, WithDeleteSent", b.drain(1, true, 1000, outbox.WithDeleteSent())},
		{"relay to kfake, 3 relays, WithDeleteSent", b.drain(3, true, 1000, outbox.WithDeleteSent())},
		{"relay to kfake, 1 relay, 50 keys, arriving after a steady-state ANALYZE (100,000 sent)", b.steadyState},
		{"writers at 1,000 tx/s: order + outbox.Add, 3 relays", b.writers(1000, false, 3)},
		{"writers at 1,000 tx/s: order + outbox.Add, 3 relays, WithNotify(true)", b.writers(1000, true, 3)},
		{"writers flat out: order + outbox.Add, 3 relays", b.writers(0, false, 3)},
		{"writers flat out: order + outbox.Add, 3 relays, WithNotify(true)", b.writers(0, true, 3)},
		{"writers flat out: order + outbox.Add, no relay", b.writers(0, false, 0)},
		{"writers flat out: order + outbox.Add, no relay, WithNotify(true)", b.writers(0, true, 0)},
		{"latency at 1,000 events/s, 1 relay", b.latency(1, 1000, false)},
		{"latency at 1,000 events/s, 3 relays", b.latency(3, 1000, false)},
		{"latency at 1,000 events/s, 3 relays, WithNotify(true)", b.latency(3, 1000, true)},
		{"latency at saturation (20 events/tx), 3 relays", b.latency(3, 0, false)},
	} {
		if only != nil && !only.MatchString(row.title) {
			continue
		}
		if err := b.fresh(ctx); err != nil {
			return err
		}
		res, err := row.run(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", row.title, err)
		}
		res.Title = row.title
		results = append(results, res)
		fmt.Fprintf(os.Stderr, "dedupbench: %s: %.0f events/s\n", row.title, res.EventsPerSec)
	}
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+b.table)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "outbox row\tevents\tevents/s\tvs floor\tcommitted/s\tvs no outbox\tp50 commit→ack\tp99 commit→ack\t")
	var floor float64
	for _, r := range results {
		if floor == 0 {
			floor = r.EventsPerSec // the first row run: the floor, unless filtered out
		}
		vsFloor, rate, vsBase, p50, p99 := fmt.Sprintf("%.2fx", r.EventsPerSec/floor), "-", "-", "-", "-"
		if r.WriteRate > 0 {
			rate = thousands(r.WriteRate)
		}
		if r.BaseRate > 0 {
			vsFloor, vsBase = "-", fmt.Sprintf("%.2fx (%s)", r.WriteRate/r.BaseRate, thousands(r.BaseRate))
		}
		if r.P99Micros > 0 {
			p50, p99 = micros(r.P50Micros), micros(r.P99Micros)
		}
		perSec := thousands(r.EventsPerSec)
		if r.BaseRate > 0 {
			perSec = "-" // the writer rows measure commits
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Title, r.Events, perSec, vsFloor, rate, vsBase, p50, p99)
	}
	return tw.Flush()
}

// fresh gives the next row a new outbox table, analyzed while empty, and a
// business table for the writers, checkpointed so that no row pays for an
// earlier one's dirty pages.
func (b *outboxBench) fresh(ctx context.Context) error {
	if b.table != "" {
		if _, err := b.pool.Exec(ctx, "DROP TABLE IF EXISTS "+b.table+", "+b.orders); err != nil {
			return err
		}
	}
	b.table = fmt.Sprintf("outbox_bench_%d", time.Now().UnixNano())
	b.orders = b.table + "_orders"
	ob, err := outbox.New(outbox.WithTable(b.table))
	if err != nil {
		return err
	}
	b.ob = ob
	if err := ob.Migrate(ctx, b.pool); err != nil {
		return err
	}
	for _, q := range []string{
		"ANALYZE " + b.table,
		"CREATE TABLE " + b.orders + " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer bytea NOT NULL, body bytea NOT NULL)",
		"CHECKPOINT",
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// fill commits n events in transactions of 1,000, spread over keys. The
// table is neither vacuumed nor analyzed after.
func (b *outboxBench) fill(ctx context.Context, keys int) error {
	payload := make([]byte, 200)
	for done := 0; done < b.n; {
		batch := make([]outbox.Event, min(1000, b.n-done))
		for i := range batch {
			batch[i] = outbox.Event{Destination: b.topic, Key: fmt.Appendf(nil, "key-%d", (done+i)%keys), Payload: payload}
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.ob.Add(ctx, tx, batch...)
			return err
		}); err != nil {
			return err
		}
		done += len(batch)
	}
	return nil
}

// steadyState drains a backlog of b.n events on 50 keys that arrived after
// the table was analyzed holding 100,000 sent events and nothing pending:
// what autovacuum sees most of the day.
func (b *outboxBench) steadyState(ctx context.Context) (outboxResult, error) {
	for _, q := range []string{
		`INSERT INTO ` + b.table + ` (event_id, destination, key, payload, status, sent_at)
			SELECT 'sent-' || g, '` + b.topic + `', convert_to('old-' || (g % 50), 'UTF8'), '\x00', 'sent', now()
			FROM generate_series(1, 100000) g`,
		"VACUUM ANALYZE " + b.table,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			return outboxResult{}, err
		}
	}
	return b.drain(1, true, 50)(ctx)
}

func (b *outboxBench) floor(ctx context.Context) (outboxResult, error) {
	if err := b.fill(ctx, 1000); err != nil {
		return outboxResult{}, err
	}
	q := `DELETE FROM ` + b.table + ` WHERE seq IN (SELECT seq FROM ` + b.table + `
		WHERE status = 'pending' AND due_at <= now() ORDER BY seq LIMIT 500 FOR UPDATE SKIP LOCKED)
		RETURNING event_id, destination, key, headers, payload`
	start := time.Now()
	var taken int
	for taken < b.n {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, q)
			if err != nil {
				return err
			}
			for rows.Next() {
				taken++
			}
			return rows.Err()
		})
		if err != nil {
			return outboxResult{}, err
		}
	}
	return outboxResult{Events: b.n, EventsPerSec: float64(b.n) / time.Since(start).Seconds()}, nil
}

// counting wraps a publisher, counting acknowledged events and timing each
// event's acknowledgement against its commit time, when it has one.
type counting struct {
	next      outbox.Publisher // nil: discard
	acked     atomic.Int64
	committed *sync.Map // event ID -> time.Time
	lat       *histogram
}

func (c *counting) Publish(ctx context.Context, events []outbox.Event) []error {
	var errs []error
	if c.next != nil {
		errs = c.next.Publish(ctx, events)
	} else {
		errs = make([]error, len(events))
	}
	now := time.Now()
	for i, err := range errs {
		if err != nil {
			continue
		}
		c.acked.Add(1)
		if c.committed != nil {
			if at, ok := c.committed.LoadAndDelete(events[i].ID); ok {
				c.lat.record(now.Sub(at.(time.Time)))
			}
		}
	}
	return errs
}

// relays starts n relays publishing through pub; stop ends them.
func (b *outboxBench) relays(ctx context.Context, n int, pub outbox.Publisher, opts ...outbox.RelayOpt) (stop func() error, err error) {
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		r, err := outbox.NewRelay(b.ob, cfg, pub, append([]outbox.RelayOpt{outbox.WithBatchSize(1000), outbox.WithLogger(quiet),
			outbox.WithBackoff(dedup.ExponentialBackoff(10*time.Millisecond, 100*time.Millisecond))}, opts...)...)
		if err != nil {
			cancel()
			return nil, err
		}
		wg.Go(func() { errs <- r.Run(ctx) })
	}
	return func() error {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func (b *outboxBench) producer() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...), kgo.ProducerLinger(0))
}

// drain measures n relays publishing a backlog of b.n events.
func (b *outboxBench) drain(n int, toKafka bool, keys int, opts ...outbox.RelayOpt) func(context.Context) (outboxResult, error) {
	return func(ctx context.Context) (outboxResult, error) {
		if err := b.fill(ctx, keys); err != nil {
			return outboxResult{}, err
		}
		pub := &counting{}
		if toKafka {
			cl, err := b.producer()
			if err != nil {
				return outboxResult{}, err
			}
			defer cl.Close()
			if pub.next, err = kafkaoutbox.NewPublisher(cl); err != nil {
				return outboxResult{}, err
			}
		}
		start := time.Now()
		stop, err := b.relays(ctx, n, pub, opts...)
		if err != nil {
			return outboxResult{}, err
		}
		for pub.acked.Load() < int64(b.n) && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(start)
		if err := stop(); err != nil {
			return outboxResult{}, err
		}
		return outboxResult{Events: b.n, EventsPerSec: float64(b.n) / elapsed.Seconds()}, ctx.Err()
	}
}

// latency measures commit-to-acknowledgement with 8 writers committing one
// event per transaction at rate events/s in all (0: 20 events per
// transaction, as fast as they can), for b.steady, with the relays' default
// polling; notify has the writers NOTIFY too.
func (b *outboxBench) latency(relays, rate int, notify bool) func(context.Context) (outboxResult, error) {
	return func(ctx context.Context) (outboxResult, error) {
		if err := b.notify(notify); err != nil {
			return outboxResult{}, err
		}
		pub, stop, err := b.kafkaRelays(ctx, relays)
		if err != nil {
			return outboxResult{}, err
		}
		perTx := 1
		if rate == 0 {
			perTx = 20
		}
		written, writeRate, err := b.writeFor(ctx, b.steady, rate, perTx, pub.committed)
		if err != nil {
			return outboxResult{}, err
		}
		for pub.acked.Load() < written && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(pub.start)
		if err := stop(); err != nil {
			return outboxResult{}, err
		}
		return outboxResult{
			Events: int(written), EventsPerSec: float64(written) / elapsed.Seconds(), WriteRate: writeRate,
			P50Micros: float64(pub.lat.quantile(0.5).Microseconds()), P99Micros: float64(pub.lat.quantile(0.99).Microseconds()),
		}, ctx.Err()
	}
}

// writers measures what the outbox costs the application: 8 writers commit
// the same business transaction (an order row, and with the outbox its
// event) at rate transactions/s in all (0: as fast as they can), with relays
// running throughout: without the outbox for half of b.steady, with it for
// b.steady, and without it again for half; the rate without is the mean of
// the two halves. With no relay, nothing is published: the cost of Add
// alone.
func (b *outboxBench) writers(rate int, notify bool, relays int) func(context.Context) (outboxResult, error) {
	return func(ctx context.Context) (outboxResult, error) {
		if err := b.notify(notify); err != nil {
			return outboxResult{}, err
		}
		pub, stop, err := b.kafkaRelays(ctx, relays)
		if err != nil {
			return outboxResult{}, err
		}
		defer func() { _ = stop() }()
		_, before, err := b.writeFor(ctx, b.steady/2, rate, 0, nil)
		if err != nil {
			return outboxResult{}, err
		}
		written, with, err := b.writeFor(ctx, b.steady, rate, 1, pub.committed)
		if err != nil {
			return outboxResult{}, err
		}
		_, after, err := b.writeFor(ctx, b.steady/2, rate, 0, nil)
		if err != nil {
			return outboxResult{}, err
		}
		for relays > 0 && pub.acked.Load() < written && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		return outboxResult{Events: int(written), EventsPerSec: float64(written) / time.Since(pub.start).Seconds(),
			WriteRate: with, BaseRate: (before + after) / 2,
			P50Micros: float64(pub.lat.quantile(0.5).Microseconds()), P99Micros: float64(pub.lat.quantile(0.99).Microseconds()),
		}, stop()
	}
}

// notify makes the writers' outbox notify the relays, or not.
func (b *outboxBench) notify(on bool) error {
	ob, err := outbox.New(outbox.WithTable(b.table), outbox.WithNotify(on))
	b.ob = ob
	return err
}

// timedPublisher is a publisher to kfake counting acknowledgements and
// timing them against commits.
type timedPublisher struct {
	*counting
	start time.Time
}

// kafkaRelays starts relays publishing to kfake through a timed publisher;
// stop, which may be called more than once, ends them.
func (b *outboxBench) kafkaRelays(ctx context.Context, relays int) (*timedPublisher, func() error, error) {
	cl, err := b.producer()
	if err != nil {
		return nil, nil, err
	}
	kpub, err := kafkaoutbox.NewPublisher(cl)
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	pub := &timedPublisher{counting: &counting{next: kpub, committed: &sync.Map{}, lat: &histogram{}}, start: time.Now()}
	stop, err := b.relays(ctx, relays, pub.counting)
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return pub, sync.OnceValue(func() error {
		err := stop()
		cl.Close()
		return err
	}), nil
}

// writeFor has 8 writers commit transactions for d, at rate transactions/s
// in all (0: as fast as they can), each an order row and perTx events of
// one key. It returns the events written and the transactions committed per
// second.
func (b *outboxBench) writeFor(ctx context.Context, d time.Duration, rate, perTx int, committed *sync.Map) (int64, float64, error) {
	const writers = 8
	var interval time.Duration
	if rate > 0 {
		interval = time.Second * writers / time.Duration(rate)
	}
	var txs atomic.Int64
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	payload := make([]byte, 200)
	for w := range writers {
		wg.Go(func() {
			next := start.Add(interval * time.Duration(w) / writers)
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				if interval > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(interval)
				}
				if err := b.write(ctx, committed, perTx, fmt.Appendf(nil, "key-%d-%d", w, i%4), payload); err != nil {
					errs <- err
					return
				}
				txs.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		return 0, 0, err
	}
	return txs.Load() * int64(perTx), float64(txs.Load()) / elapsed.Seconds(), ctx.Err()
}

// write commits an order and n events of its key in one transaction,
// noting the time just before the commit: the relay may publish them before
// Commit returns.
func (b *outboxBench) write(ctx context.Context, committed *sync.Map, n int, key, payload []byte) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "INSERT INTO "+b.orders+" (customer, body) VALUES ($1, $2)", key, payload); err != nil {
		return err
	}
	var ids []string
	if n > 0 {
		events := make([]outbox.Event, n)
		for i := range events {
			events[i] = outbox.Event{Destination: b.topic, Key: key, Payload: payload}
		}
		if ids, err = b.ob.Add(ctx, tx, events...); err != nil {
			return err
		}
	}
	at := time.Now()
	for _, id := range ids {
		committed.Store(id, at)
	}
	if err := tx.Commit(ctx); err != nil {
		for _, id := range ids {
			committed.Delete(id)
		}
		return err
	}
	return nil
}
