package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
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
// of N committed events on 1,000 keys (16 in one row) to kfake with one and
// three relays, beside the floor
// (the same rows taken with SKIP LOCKED and deleted, nothing published) and
// a relay whose publisher discards; then commit-to-publish latency with
// writers committing one event per transaction at a steady rate, and as fast
// as they can.

// outboxResult is one outbox row.
type outboxResult struct {
	Title        string  `json:"title"`
	Events       int     `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	WriteRate    float64 `json:"write_rate,omitempty"` // committed events/s, latency rows
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
}

func runOutboxBench(ctx context.Context, w io.Writer, dsn string, n int, steady time.Duration) error {
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
		{"relay to kfake, 3 relays", b.drain(3, true, 1000)},
		{"relay to kfake, 3 relays, 16 keys", b.drain(3, true, 16)},
		{"relay to kfake, 1 relay, WithDeleteSent", b.drain(1, true, 1000, outbox.WithDeleteSent())},
		{"relay to kfake, 3 relays, WithDeleteSent", b.drain(3, true, 1000, outbox.WithDeleteSent())},
		{"latency at 1,000 events/s, 1 relay", b.latency(1, 1000, true)},
		{"latency at 1,000 events/s, 3 relays", b.latency(3, 1000, true)},
		{"latency at saturation (20 events/tx), 3 relays", b.latency(3, 0, true)},
		{"latency at 1,000 events/s, 3 relays, no NOTIFY, poll 20 ms", b.latency(3, 1000, false)},
		{"latency at saturation (20 events/tx), 3 relays, no NOTIFY, poll 20 ms", b.latency(3, 0, false)},
	} {
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
	fmt.Fprintln(tw, "outbox row\tevents\tevents/s\tvs floor\tcommitted/s\tp50 commit→ack\tp99 commit→ack\t")
	floor := results[0].EventsPerSec
	for _, r := range results {
		rate, p50, p99 := "-", "-", "-"
		if r.P99Micros > 0 {
			rate, p50, p99 = thousands(r.WriteRate), micros(r.P50Micros), micros(r.P99Micros)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2fx\t%s\t%s\t%s\t\n", r.Title, r.Events, thousands(r.EventsPerSec), r.EventsPerSec/floor, rate, p50, p99)
	}
	return tw.Flush()
}

// fresh gives the next row a new, empty outbox table, vacuumed and
// checkpointed so that no row pays for an earlier one's dead tuples.
func (b *outboxBench) fresh(ctx context.Context) error {
	if b.table != "" {
		if _, err := b.pool.Exec(ctx, "DROP TABLE IF EXISTS "+b.table); err != nil {
			return err
		}
	}
	b.table = fmt.Sprintf("outbox_bench_%d", time.Now().UnixNano())
	ob, err := outbox.New(outbox.WithTable(b.table))
	if err != nil {
		return err
	}
	b.ob = ob
	if err := ob.Migrate(ctx, b.pool); err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, "CHECKPOINT")
	return err
}

// fill commits n events in transactions of 1,000, spread over keys.
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
	_, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+b.table)
	return err
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

// latency measures commit-to-acknowledgement with 16 writers committing one
// event per transaction at rate events/s in all (0: 20 events per
// transaction, as fast as they can),
// for b.steady. Without notify, the writers do not NOTIFY and the relays
// poll every 20 ms.
func (b *outboxBench) latency(relays, rate int, notify bool) func(context.Context) (outboxResult, error) {
	return func(ctx context.Context) (outboxResult, error) {
		var opts []outbox.RelayOpt
		if !notify {
			ob, err := outbox.New(outbox.WithTable(b.table), outbox.WithNotify(false))
			if err != nil {
				return outboxResult{}, err
			}
			b.ob = ob
			opts = append(opts, outbox.WithPollInterval(20*time.Millisecond))
		}
		cl, err := b.producer()
		if err != nil {
			return outboxResult{}, err
		}
		defer cl.Close()
		kpub, err := kafkaoutbox.NewPublisher(cl)
		if err != nil {
			return outboxResult{}, err
		}
		pub := &counting{next: kpub, committed: &sync.Map{}, lat: &histogram{}}
		stop, err := b.relays(ctx, relays, pub, opts...)
		if err != nil {
			return outboxResult{}, err
		}
		writers, interval, perTx := 16, time.Duration(0), 20
		if rate > 0 {
			perTx = 1
			interval = time.Second * time.Duration(writers) / time.Duration(rate)
		}
		var written atomic.Int64
		start := time.Now()
		end := start.Add(b.steady)
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		payload := make([]byte, 200)
		for w := range writers {
			wg.Go(func() {
				next := start.Add(interval * time.Duration(w) / time.Duration(writers))
				for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
					if interval > 0 {
						time.Sleep(time.Until(next))
						next = next.Add(interval)
					}
					if err := b.write(ctx, pub.committed, perTx, fmt.Appendf(nil, "key-%d-%d", w, i%4), payload); err != nil {
						errs <- err
						return
					}
					written.Add(int64(perTx))
				}
			})
		}
		wg.Wait()
		writeRate := float64(written.Load()) / time.Since(start).Seconds()
		close(errs)
		for err := range errs {
			return outboxResult{}, err
		}
		for pub.acked.Load() < written.Load() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(start)
		if err := stop(); err != nil {
			return outboxResult{}, err
		}
		return outboxResult{
			Events: int(written.Load()), EventsPerSec: float64(written.Load()) / elapsed.Seconds(), WriteRate: writeRate,
			P50Micros: float64(pub.lat.quantile(0.5).Microseconds()), P99Micros: float64(pub.lat.quantile(0.99).Microseconds()),
		}, ctx.Err()
	}
}

// write commits n events of one key in one transaction, noting the time
// just before the commit: the relay may publish them before Commit returns.
func (b *outboxBench) write(ctx context.Context, committed *sync.Map, n int, key, payload []byte) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{Destination: b.topic, Key: key, Payload: payload}
	}
	ids, err := b.ob.Add(ctx, tx, events...)
	if err != nil {
		return err
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
