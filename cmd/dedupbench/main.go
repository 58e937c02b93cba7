// Command dedupbench measures the throughput of dedup side by side, in one
// run: Kafka (kfake, in process) through the Kafka adapter and the wrapper
// into PostgreSQL, against consumption with no dedup, a naive per-message
// claim, the transactional inbox and the PostgreSQL floor (a bare multi-row
// insert of the same event IDs), plus Redis, DynamoDB Local, SQS (fauxqs),
// RabbitMQ and NATS JetStream rows, each broker's beside consuming it with
// no dedup.
//
//	go run ./cmd/dedupbench -quick   # 20,000 events, under a minute
//	go run ./cmd/dedupbench          # 200,000 events, and 20,000 for memory flatness
//
// Each row runs in a fresh subprocess (this binary, re-executed), so that its
// allocations and peak RSS are its own. The table goes to stdout, followed by
// the same results as JSON (or to the file named by -json). BENCHMARKS.md
// explains every column.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is what the parent passes to every row.
type config struct {
	Postgres   string
	DynamoDB   string
	SQS        string
	Redis      string // host:port or redis:// URL
	AMQP       string // RabbitMQ's amqp:// URL
	NATS       string // NATS JetStream's nats:// URL
	Partitions int
	Brokers    string
	Topic      string
	Records    int // records in the topic, duplicates included
	Unique     int // distinct events among them
	BatchWait  time.Duration
	// Checkpoint makes each PostgreSQL row start with a CHECKPOINT.
	Checkpoint bool
	// FetchPartitionBytes is kgo.FetchMaxPartitionBytes for every Kafka row.
	FetchPartitionBytes int32
	// Prefix begins the name of every PostgreSQL table of the rows.
	Prefix string
	// Kept makes a PostgreSQL row run on its kept table (fill.go), which
	// holds Fill records besides the run's events, and Purge expired ones
	// that Purge deletes while the row runs.
	Kept        bool
	Fill, Purge int
}

func main() {
	if childMain() {
		return
	}
	var (
		cfg      config
		quick    = flag.Bool("quick", false, "quick mode: 20,000 events, small DynamoDB and SQS rows; under a minute")
		n        = flag.Int("n", 0, "events per PostgreSQL row, duplicates included (default 200,000; 20,000 with -quick)")
		dup      = flag.Float64("duplicates", 0.2, "share of the events that re-send an earlier event")
		rows     = flag.String("rows", "", "comma-separated rows to run (default all): "+strings.Join(rowNames(), ","))
		smallN   = flag.Int("small-n", 0, "events for the DynamoDB and SQS rows (default 20,000; 3,000 with -quick)")
		flatN    = flag.Int("flat-n", 0, "also run the none, batched and floor rows at this N, to show memory flat in N (default 20,000; off with -quick)")
		repeat   = flag.Int("repeat", 3, "runs of the no dedup, batched and floor rows, in rounds; the median is reported")
		jsonPath = flag.String("json", "", "write the JSON results to this file instead of stdout")
	)
	outboxRows := flag.Bool("outbox", false, "run the outbox relay rows instead (see BENCHMARKS.md): throughput to kfake and commit-to-publish latency")
	outboxN := flag.Int("outbox-n", 100_000, "events of each outbox throughput row")
	outboxFor := flag.Duration("outbox-for", 10*time.Second, "how long each outbox latency row writes")
	outboxRowsRE := flag.String("outbox-rows", "", "run only the outbox rows whose title matches this regular expression")
	flag.StringVar(&cfg.Postgres, "postgres", env("DEDUP_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	flag.StringVar(&cfg.DynamoDB, "dynamodb", env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"), "DynamoDB Local endpoint")
	flag.StringVar(&cfg.Redis, "redis", env("DEDUP_REDIS_ADDR", "127.0.0.1:6379"), "Redis address (host:port or redis:// URL)")
	flag.StringVar(&cfg.AMQP, "amqp", env("DEDUP_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&cfg.NATS, "nats", env("DEDUP_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL (JetStream enabled)")
	flag.StringVar(&cfg.SQS, "sqs", env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"), "SQS endpoint (fauxqs)")
	flag.IntVar(&cfg.Partitions, "partitions", 8, "partitions of the topic (one worker each)")
	flag.DurationVar(&cfg.BatchWait, "batch-wait", 100*time.Millisecond, "dedup.WithBatchCompletion's maxWait in the batched rows")
	fetchBytes := flag.Int("fetch-partition-bytes", 128<<10, "kgo.FetchMaxPartitionBytes of every Kafka row (kgo's default is 1 MiB; see BENCHMARKS.md)")
	flag.BoolVar(&cfg.Checkpoint, "checkpoint", true, "start each PostgreSQL row with a CHECKPOINT, so none pays for an earlier one's dirty pages")
	records := flag.String("records", "0", "comma-separated sizes of the PostgreSQL tables before each run, e.g. 0,1000000,10000000: the rows "+
		strings.Join(fillable, ",")+" run at each size >0 on a table kept and filled once (at most 1,000,000 with -quick)")
	purge := flag.Bool("purge", false, "also run the rows "+strings.Join(purgeRows, ",")+" while Purge deletes -purge-n expired records, at the first size of -records above 0 (or 0)")
	purgeN := flag.Int("purge-n", 1_000_000, "expired records of the -purge rows")
	flag.StringVar(&cfg.Prefix, "tables", "dedupbench", "prefix of the PostgreSQL tables' names (the kept ones are <prefix>_<row>_kept, and <prefix>_<row>_purge_kept for -purge)")
	flag.Parse()
	cfg.FetchPartitionBytes = int32(*fetchBytes)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if *outboxRows {
		var only *regexp.Regexp
		if *outboxRowsRE != "" {
			var err error
			if only, err = regexp.Compile(*outboxRowsRE); err != nil {
				fmt.Fprintln(os.Stderr, "dedupbench: -outbox-rows:", err)
				os.Exit(2)
			}
		}
		if err := runOutboxBench(ctx, os.Stdout, cfg.Postgres, *outboxN, *outboxFor, only); err != nil {
			fmt.Fprintln(os.Stderr, "dedupbench:", err)
			os.Exit(1)
		}
		return
	}

	plan := plan{cfg: cfg, n: 200_000, smallN: 20_000, flatN: 20_000, dup: *dup, repeat: *repeat}
	if *quick {
		plan.n, plan.smallN, plan.flatN = 20_000, 3_000, 0
	}
	if *n > 0 {
		plan.n = *n
	}
	if *smallN > 0 {
		plan.smallN = *smallN
	}
	if *flatN > 0 {
		plan.flatN = *flatN
	}
	if *rows != "" {
		plan.only = strings.Split(*rows, ",")
	}
	var err error
	if plan.records, err = parseSizes(*records, *quick); err != nil {
		fmt.Fprintln(os.Stderr, "dedupbench: -records:", err)
		os.Exit(2)
	}
	if *purge {
		if *purgeN <= 0 {
			fmt.Fprintln(os.Stderr, "dedupbench: -purge-n: want a number of records above 0")
			os.Exit(2)
		}
		plan.purge = *purgeN
	}
	if !validPrefix.MatchString(cfg.Prefix) {
		fmt.Fprintf(os.Stderr, "dedupbench: -tables %q: want a lower-case SQL identifier\n", cfg.Prefix)
		os.Exit(2)
	}
	if err := plan.run(ctx, *jsonPath, *quick); err != nil {
		fmt.Fprintln(os.Stderr, "dedupbench:", err)
		os.Exit(1)
	}
}

var validPrefix = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// parseSizes reads -records: sizes in ascending order, each once, so that a
// kept table grows from one to the next. With -quick, those above 1,000,000
// are left out.
func parseSizes(s string, quick bool) ([]int, error) {
	var sizes []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(f), "_", ""))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want a number of records", f)
		}
		if quick && n > 1_000_000 {
			fmt.Fprintf(os.Stderr, "dedupbench: -quick leaves out the rows at %d records\n", n)
			continue
		}
		if !slices.Contains(sizes, n) {
			sizes = append(sizes, n)
		}
	}
	slices.Sort(sizes)
	return sizes, nil
}

// childMain runs one row when this process is a row's subprocess, and
// reports whether it was.
func childMain() bool {
	name := os.Getenv(childEnv)
	if name == "" {
		return false
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := runChild(ctx, name, os.Getenv(configEnv)); err != nil {
		fmt.Fprintf(os.Stderr, "dedupbench: row %s: %v\n", name, err)
		stop()
		os.Exit(1)
	}
	return true
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
