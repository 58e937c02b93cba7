// Command quickstart shows dedup on Kafka in a few seconds, with nothing to
// install: it starts an in-process Kafka cluster (kfake), produces orders of
// which about 20% are re-sent duplicates and a few are poison, consumes them
// through the dedup wrapper, and checks that every good order had exactly one
// effect and every poison order reached the dead-letter topic.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -postgres postgres://postgres@127.0.0.1:5432/test
//	go run ./examples/quickstart -redis 127.0.0.1:6379
//
// Dedup records live in memory, in PostgreSQL when -postgres or
// DEDUP_POSTGRES_DSN is set, or in Redis when -redis is set (host:port or a
// redis:// URL). The exit status is 0 only when the check holds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	topic = "orders"
	group = "quickstart"
)

type order struct {
	ID       int  `json:"id"`
	Customer int  `json:"customer"`
	Cents    int  `json:"cents"`
	Poison   bool `json:"poison,omitempty"`
}

func main() {
	total := flag.Int("events", 10000, "records to produce, re-sent duplicates included")
	dupShare := flag.Float64("duplicates", 0.2, "share of the records that re-send an earlier event")
	poison := flag.Int("poison", 10, "events whose handler always fails")
	partitions := flag.Int("partitions", 8, "partitions of the topic")
	dsn := flag.String("postgres", os.Getenv("DEDUP_POSTGRES_DSN"), "keep dedup records in this PostgreSQL database instead of memory")
	redisAddr := flag.String("redis", "", "keep dedup records in the Redis at this host:port or redis:// URL instead")
	verbose := flag.Bool("v", false, "log the wrapper's and consumer's warnings")
	metricsAddr := flag.String("metrics", "", "serve the run's OpenTelemetry metrics in Prometheus format at this host:port, until Ctrl-C")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var mp metric.MeterProvider
	if *metricsAddr != "" {
		provider, url, stopMetrics, err := serveMetrics(*metricsAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(1)
		}
		defer stopMetrics()
		fmt.Println("metrics:", url)
		mp = provider
	}
	if err := run(ctx, *total, *dupShare, *poison, int32(*partitions), *dsn, *redisAddr, *verbose, mp); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
	if mp != nil {
		fmt.Println("\nserving the metrics until Ctrl-C")
		<-ctx.Done()
	}
}

// run runs the quickstart; mp, when not nil, records its metrics.
func run(ctx context.Context, total int, dupShare float64, nPoison int, partitions int32, dsn, redisAddr string, verbose bool, mp metric.MeterProvider) error {
	unique := int(float64(total) * (1 - dupShare))
	if unique < nPoison || unique < 1 || total < unique {
		return fmt.Errorf("-events %d with -duplicates %.2f leaves %d unique events for %d poison", total, dupShare, unique, nPoison)
	}
	logger := slog.New(slog.DiscardHandler)
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, topic+".dlq", chainTopic, chainTopic+".dlq"))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()

	store, scope, closeStore, err := openStore(ctx, dsn, redisAddr)
	if err != nil {
		return err
	}
	defer closeStore()

	fmt.Printf("producing %d records: %d events (%d poison) + %d re-sent duplicates, over %d partitions\n",
		total, unique, nPoison, total-unique, partitions)
	end, err := produce(ctx, producer, total, unique, nPoison)
	if err != nil {
		return err
	}

	var st stats
	effects := &ledger{applied: make(map[string]int)}
	sink, err := kafkadedup.NewSink(producer)
	if err != nil {
		return err
	}
	w, err := dedup.Wrap(store, kafkadedup.Messages(), effects.handle,
		dedup.WithScope(scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(3),
		dedup.WithBackoff(dedup.ExponentialBackoff(5*time.Millisecond, 50*time.Millisecond)),
		dedup.WithObserver(st.observe),
		dedup.WithLogger(logger),
		dedup.WithMeterProvider(mp),
	)
	if err != nil {
		return err
	}
	consumer, err := kafkadedup.NewConsumer(w, kafkadedup.WithLogger(logger), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.AutoCommitInterval(200*time.Millisecond),
	))
	if err != nil {
		return err
	}

	began := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	waitErr := waitCommitted(ctx, producer, end, &st, total)
	cancel()
	if err := <-done; err != nil {
		return err
	}
	if waitErr != nil {
		return waitErr
	}
	elapsed := time.Since(began)

	letters, err := readDLQ(ctx, brokers, int(st.deadLettered.Load()))
	if err != nil {
		return err
	}
	if err := report(&st, effects, letters, unique, nPoison, elapsed); err != nil {
		return err
	}
	pool, closeChain, err := chainDatabase(ctx, dsn)
	if err != nil || pool == nil {
		return err
	}
	defer closeChain()
	return runChain(ctx, pool, brokers, logger, mp)
}

// localPostgres is where the chain looks for PostgreSQL when none is given.
const localPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=1"

// chainDatabase connects to the chain's PostgreSQL: dsn, else a local server
// if one answers. The outbox needs one: an event is a row written in the
// order's own transaction, and nothing else can stand in for that. With no
// PostgreSQL it says so and returns a nil pool. The chain's tables live in a
// schema of the run's own, which closing drops: two runs side by side do
// not share them, and none is left behind.
func chainDatabase(ctx context.Context, dsn string) (*pgxpool.Pool, func(), error) {
	given := dsn != ""
	if !given {
		dsn = localPostgres
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	schema := "quickstart_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err == nil {
		if _, err = pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			pool.Close()
		}
	}
	switch {
	case err == nil:
		c := cfg.ConnConfig
		fmt.Printf("\nthe chain's tables: PostgreSQL database %q at %s:%d, schema %s (dropped at exit)\n", c.Database, c.Host, c.Port, schema)
		return pool, func() {
			_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
			pool.Close()
		}, nil
	case given:
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	fmt.Println("\nthe whole chain (retried request -> outbox -> consumer) needs PostgreSQL for the outbox, and none answers at")
	fmt.Println("127.0.0.1:5432: start one (make services) or pass -postgres to see it.")
	return nil, nil, nil
}

// openStore returns the dedup store: Redis when redisAddr is set, PostgreSQL
// when dsn is, else memory.
func openStore(ctx context.Context, dsn, redisAddr string) (dedup.Store, string, func(), error) {
	scope := dedup.Scope(group, "apply-order")
	// A fresh scope per run: the cluster is new each time, so are its events.
	fresh := scope + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if redisAddr != "" {
		opts := &redis.Options{Addr: redisAddr}
		if strings.Contains(redisAddr, "://") {
			var err error
			if opts, err = redis.ParseURL(redisAddr); err != nil {
				return nil, "", nil, fmt.Errorf("-redis: %w", err)
			}
		}
		client := redis.NewClient(opts)
		store, err := redisstore.New(client)
		if err == nil {
			err = client.Ping(ctx).Err()
		}
		if err != nil {
			client.Close()
			return nil, "", nil, fmt.Errorf("redis: %w", err)
		}
		fmt.Printf("dedup records: Redis at %s, scope %s\n", opts.Addr, fresh)
		return store, fresh, func() { client.Close() }, nil
	}
	if dsn == "" {
		fmt.Println("dedup records: in memory (set -postgres or DEDUP_POSTGRES_DSN for PostgreSQL, -redis for Redis)")
		return dedup.NewMemoryStore(), scope, func() {}, nil
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, "", nil, fmt.Errorf("postgres: %w", err)
	}
	store, err := dedup.NewPostgresStore(pool)
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, "", nil, fmt.Errorf("postgres: %w", err)
	}
	fmt.Printf("dedup records: PostgreSQL, scope %s\n", fresh)
	return store, fresh, pool.Close, nil
}

// produce writes unique events, poison ones among them, then re-sends random
// earlier events until total records are written, shuffled so that copies
// arrive interleaved. It returns each partition's end offset.
func produce(ctx context.Context, cl *kgo.Client, total, unique, nPoison int) (map[int32]int64, error) {
	recs := make([]*kgo.Record, 0, total)
	for i := range unique {
		o := order{ID: i, Customer: rand.IntN(500), Cents: 100 + rand.IntN(10000), Poison: i < nPoison}
		v, _ := json.Marshal(o)
		recs = append(recs, &kgo.Record{
			Topic:   topic,
			Key:     []byte("customer-" + strconv.Itoa(o.Customer)),
			Value:   v,
			Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte("order-" + strconv.Itoa(i))}},
		})
	}
	for len(recs) < total {
		orig := recs[rand.IntN(unique)]
		recs = append(recs, &kgo.Record{Topic: topic, Key: orig.Key, Value: orig.Value, Headers: orig.Headers})
	}
	rand.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return nil, fmt.Errorf("produce: %w", err)
	}
	end := make(map[int32]int64)
	for _, r := range recs {
		end[r.Partition] = max(end[r.Partition], r.Offset+1)
	}
	return end, nil
}

// ledger is the business effect: one entry per applied order.
type ledger struct {
	mu      sync.Mutex
	applied map[string]int
}

func (l *ledger) handle(_ context.Context, r *kgo.Record) error {
	var o order
	if err := json.Unmarshal(r.Value, &o); err != nil {
		return dedup.Permanent(err)
	}
	if o.Poison {
		return errors.New("order " + strconv.Itoa(o.ID) + " cannot be applied")
	}
	l.mu.Lock()
	l.applied["order-"+strconv.Itoa(o.ID)]++
	l.mu.Unlock()
	return nil
}

// stats counts the wrapper's outcomes.
type stats struct {
	processed, duplicates, retried, deadLettered, other atomic.Int64
}

func (s *stats) observe(_ context.Context, res dedup.Result) {
	switch res.Outcome {
	case dedup.OutcomeProcessed:
		s.processed.Add(1)
	case dedup.OutcomeDuplicate:
		s.duplicates.Add(1)
	case dedup.OutcomeRetry:
		s.retried.Add(1)
	case dedup.OutcomeDeadLettered:
		s.deadLettered.Add(1)
	default:
		s.other.Add(1)
	}
}

// received counts records settled: each one is acknowledged exactly once.
func (s *stats) received() int64 {
	return s.processed.Load() + s.duplicates.Load() + s.deadLettered.Load() + s.other.Load()
}

// waitCommitted shows progress until the group's committed offsets reach
// the end of every partition.
func waitCommitted(ctx context.Context, cl *kgo.Client, end map[int32]int64, st *stats, total int) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errors.New("the consumer did not commit every record within 2 minutes")
		case <-tick.C:
		}
		fmt.Printf("  received %5d/%d  processed %5d  duplicates %5d  retried %3d  dead-lettered %2d\n",
			st.received(), total, st.processed.Load(), st.duplicates.Load(), st.retried.Load(), st.deadLettered.Load())
		committed, err := committedOffsets(ctx, cl)
		if err != nil {
			return err
		}
		done := true
		for p, off := range end {
			done = done && committed[p] >= off
		}
		if done {
			return nil
		}
	}
}

func committedOffsets(ctx context.Context, cl *kgo.Client) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	out := make(map[int32]int64)
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if t.Topic == topic {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out, nil
}

// readDLQ reads the dead-letter topic back from the start: at least the
// letters the consumer reported (each was acknowledged by the broker before
// its message was), then until three polls in a row bring nothing more.
func readDLQ(ctx context.Context, brokers []string, atLeast int) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic+".dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for empty := 0; empty < 3; {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		recs := fs.Records()
		if len(recs) == 0 && len(out) >= atLeast {
			empty++
		}
		out = append(out, recs...)
	}
	return out, nil
}

func report(st *stats, l *ledger, letters []*kgo.Record, unique, nPoison int, elapsed time.Duration) error {
	fmt.Printf("\nin %v:\n", elapsed.Round(time.Millisecond))
	fmt.Printf("  received            %6d records\n", st.received())
	fmt.Printf("  processed           %6d\n", st.processed.Load())
	fmt.Printf("  duplicates skipped  %6d\n", st.duplicates.Load())
	fmt.Printf("  retried             %6d attempts\n", st.retried.Load())
	fmt.Printf("  dead-lettered       %6d (%d records in %s.dlq)\n", st.deadLettered.Load(), len(letters), topic)

	l.mu.Lock()
	defer l.mu.Unlock()
	var problems []string
	twice := 0
	for _, n := range l.applied {
		if n != 1 {
			twice++
		}
	}
	good := unique - nPoison
	if len(l.applied) != good || twice > 0 {
		problems = append(problems, fmt.Sprintf("%d orders applied (%d more than once), want each of the %d good orders once", len(l.applied), twice, good))
	}
	parked := make(map[string]bool)
	for _, r := range letters {
		for _, h := range r.Headers {
			if h.Key == "dedup-event-id" {
				parked[string(h.Value)] = true
			}
		}
	}
	if len(letters) != nPoison || len(parked) != nPoison {
		problems = append(problems, fmt.Sprintf("%d dead letters for %d events, want the %d poison orders once each", len(letters), len(parked), nPoison))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Println("  CHECK FAILED:", p)
		}
		return errors.New("check failed")
	}
	fmt.Printf("\ncheck: OK, effects = %d unique good orders (each applied once), dead letters = %d poison orders\n", good, nPoison)
	return nil
}
