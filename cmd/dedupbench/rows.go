package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/deduptype"
)

// row is one line of the table: a way of consuming the same events.
type row struct {
	name  string
	title string
	// small rows run at the smaller N (DynamoDB Local and SQS are slow).
	small bool
	// sqs rows read from an SQS queue instead of the Kafka topic.
	sqs bool
	// broker rows read from a RabbitMQ queue or a NATS stream of their own
	// instead of the Kafka topic.
	broker bool
	run    rowRun
}

// rowRun consumes the row's events, metering them in m.
type rowRun func(ctx context.Context, cfg config, m *meter) error

var rows = []*row{
	{name: "none", title: "Kafka, no dedup", run: runNone},
	{name: "naive", title: "naive: Handle per record (claim, complete)", run: runNaive},
	{name: "complete-each", title: "HandleBatch, WithBatchCompletion(0): complete each", run: runAdapter("complete-each")},
	{name: "batch-claim", title: "kafkadedup.Consumer defaults (batched claim and completion)", run: runAdapter("batch-claim")},
	{name: "batched", title: "HandleBatch + WithBatchCompletion(-batch-wait)", run: runAdapter("batched")},
	{name: "redis-batch-claim", title: "Redis: kafkadedup.Consumer defaults", run: runRedis(false)},
	{name: "redis-batched", title: "Redis: HandleBatch + WithBatchCompletion(-batch-wait)", run: runRedis(true)},
	{name: "memory", title: "memory store: kafkadedup.Consumer defaults", run: runMemory},
	{name: "memory-each", title: "memory store: Handle per record", run: runMemoryEach},
	{name: "inbox", title: "transactional inbox (WrapTx)", run: runInbox},
	{name: "floor", title: "floor: INSERT unnest ON CONFLICT DO NOTHING", run: runFloor},
	{name: "dynamodb", title: "DynamoDB Local: HandleBatch + batch completion", small: true, run: runDynamoDB},
	{name: "dynamodb-floor", title: "DynamoDB Local floor: conditional PutItem, 16 at once", small: true, run: runDynamoDBFloor},
	{name: "sqs-none", title: "SQS (fauxqs): receive and delete, no dedup", small: true, sqs: true, run: runSQSNone},
	{name: "sqs", title: "SQS (fauxqs): sqsdedup.Consumer defaults, PostgreSQL", small: true, sqs: true, run: runSQS("postgres")},
	{name: "sqs-dynamodb", title: "SQS (fauxqs): sqsdedup.Consumer defaults, DynamoDB", small: true, sqs: true, run: runSQS("dynamodb")},
	{name: "amqp-none", title: "RabbitMQ: consume and ack, no dedup", broker: true, run: runAMQPNone("classic")},
	{name: "amqp", title: "RabbitMQ: amqpdedup.Consumer defaults, PostgreSQL", broker: true, run: runAMQP("amqp", "classic")},
	{name: "amqp-quorum-none", title: "RabbitMQ quorum queue: consume and ack, no dedup", broker: true, run: runAMQPNone("quorum")},
	{name: "amqp-quorum", title: "RabbitMQ quorum queue: amqpdedup.Consumer defaults, PostgreSQL", broker: true, run: runAMQP("amqp-quorum", "quorum")},
	{name: "nats-none", title: "NATS JetStream: fetch and ack, no dedup", broker: true, run: runNATSNone},
	{name: "nats", title: "NATS JetStream: natsdedup.Consumer defaults, PostgreSQL", broker: true, run: runNATS},
	{name: "lambdastream-none", title: "Lambda Kinesis invocations, no dedup", sqs: true, run: runLambdaStreamNone},
	{name: "lambdastream", title: "Lambda Kinesis: lambdastreamdedup.KinesisHandler, PostgreSQL", sqs: true, run: runLambdaStream},
	{name: "pubsub-none", title: "Pub/Sub (pstest): Receive and ack, no dedup", small: true, run: runPubSubNone},
	{name: "pubsub", title: "Pub/Sub (pstest): pubsubdedup.Consumer defaults, PostgreSQL", small: true, run: runPubSub},
	{name: "redisstreams-none", title: "Redis Streams: XREADGROUP and XACK, no dedup", broker: true, run: runRedisStreamsNone},
	{name: "redisstreams", title: "Redis Streams: redisstreamdedup.Consumer defaults, Redis store", broker: true, run: runRedisStreams},
}

func rowNames() []string {
	var names []string
	for _, r := range rows {
		names = append(names, r.name)
	}
	return names
}

func rowByName(name string) *row {
	for _, r := range rows {
		if r.name == name {
			return r
		}
	}
	return nil
}

// kafkaOpts are the client options every Kafka row consumes with.
func kafkaOpts(cfg config, m *meter, group string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(strings.Split(cfg.Brokers, ",")...),
		// A group of its own: a repeated row reads the topic from the start.
		kgo.ConsumerGroup(group + "-" + deduptype.NewOwnerToken()[:8]),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		// A fetch brings at most this much of a partition: about as many
		// records as the Kafka adapter queues per partition (2,000). With
		// kgo's default of 1 MiB, a fetch brings ~25,000 records of a
		// partition, of which the adapter takes a few thousand, pauses the
		// partition (dropping the rest) and fetches them again later.
		kgo.FetchMaxPartitionBytes(cfg.FetchPartitionBytes),
		// The clock starts when the group assigns the partitions: fetching
		// them is part of consuming.
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { m.started() }),
	}
}

// runTable names a row's table for this process: two runs side by side (a
// make test beside another) must not drop each other's tables.
func runTable(name string) string { return fmt.Sprintf("%s_%d", name, os.Getpid()) }

// rowTable names row's PostgreSQL table: a fresh one for this process, or,
// when the row runs on a kept table (-records, -purge), the table the parent
// filled, which outlives the row (see fill.go).
func rowTable(cfg config, row string) string {
	if cfg.Kept {
		return keptTable(cfg.Prefix, row, cfg.Purge > 0)
	}
	return runTable(cfg.Prefix + "_" + strings.ReplaceAll(row, "-", "_"))
}

// openPostgres returns a pool whose round trips m counts, on row's table:
// a fresh one, dropped when the row ends, or the kept one, rid of an earlier
// row's events (resetKept).
func openPostgres(ctx context.Context, cfg config, m *meter, row string) (*pgxpool.Pool, string, func(), error) {
	table := rowTable(cfg, row)
	pc, err := pgxpool.ParseConfig(cfg.Postgres)
	if err != nil {
		return nil, "", nil, fmt.Errorf("postgres DSN: %w", err)
	}
	pc.ConnConfig.Tracer = &m.pg
	m.app = "dedupbench " + table
	pc.ConnConfig.RuntimeParams["application_name"] = m.app
	// One connection per partition worker, and a few for heartbeats.
	pc.MaxConns = int32(cfg.Partitions + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, "", nil, fmt.Errorf("postgres: %w", err)
	}
	m.pool, m.table = pool, table
	if cfg.Kept {
		if err := resetKept(ctx, pool, table, scopeOf(row), cfg.Unique); err != nil {
			pool.Close()
			return nil, "", nil, err
		}
		return pool, table, pool.Close, nil
	}
	drop := func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	}
	drop()
	return pool, table, func() { drop(); pool.Close() }, nil
}

// quiesce flushes PostgreSQL's dirty buffers so that a checkpoint left over
// from an earlier row does not land in this one. It needs superuser rights;
// without them the row runs anyway.
func quiesce(ctx context.Context, cfg config, pool *pgxpool.Pool) {
	if cfg.Checkpoint {
		_, _ = pool.Exec(ctx, "CHECKPOINT")
	}
}

// openPostgresStore returns a store on row's table (see openPostgres),
// migrated, and the table's name.
func openPostgresStore(ctx context.Context, cfg config, m *meter, row string) (*dedup.PostgresStore, string, func(), error) {
	pool, table, closePool, err := openPostgres(ctx, cfg, m, row)
	if err != nil {
		return nil, "", nil, err
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		closePool()
		return nil, "", nil, fmt.Errorf("postgres store: %w", err)
	}
	quiesce(ctx, cfg, pool)
	return store, table, closePool, nil
}

// messages is kafkadedup.Messages, noting when the wrapper reads each ID.
func messages(m *meter) dedup.Messages[*kgo.Record] { return metered(m, kafkadedup.Messages()) }

// metered is msgs noting in m when the wrapper reads each event's ID, where
// the event's added latency starts.
func metered[M any](m *meter, msgs dedup.Messages[M]) dedup.Messages[M] {
	id := msgs.EventID
	msgs.EventID = func(msg M) (string, error) {
		s, err := id(msg)
		if err == nil {
			m.entries.enter(s, now())
		}
		return s, err
	}
	return msgs
}

// scopeOf is the scope of row's events.
func scopeOf(row string) string { return "dedupbench/" + row }

func wrapperOpts(name string, m *meter, extra ...dedup.Opt) []dedup.Opt {
	return append([]dedup.Opt{
		dedup.WithScope(scopeOf(name)),
		dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithObserver(m.observe),
	}, extra...)
}

func noop(context.Context, *kgo.Record) error { return nil }

// runAdapter runs the Kafka adapter (kafkadedup.Consumer, HandleBatch per
// fetched partition batch) over PostgreSQL as row name: with the defaults
// (batch-claim), one completion per event (complete-each), or completions
// waiting -batch-wait (batched).
func runAdapter(name string) rowRun {
	return func(ctx context.Context, cfg config, m *meter) error {
		var extra []dedup.Opt
		switch name {
		case "complete-each":
			extra = append(extra, dedup.WithBatchCompletion(0))
		case "batched":
			extra = append(extra, dedup.WithBatchCompletion(cfg.BatchWait))
		}
		store, table, closeStore, err := openPostgresStore(ctx, cfg, m, name)
		if err != nil {
			return err
		}
		defer closeStore()
		defer startPurge(ctx, cfg, m, table)()
		return consumeStore(ctx, cfg, m, store, name, extra...)
	}
}

// runMemory runs the Kafka adapter with its defaults over the memory store:
// the wrapper's and the adapter's own cost, with no store round trip.
func runMemory(ctx context.Context, cfg config, m *meter) error {
	return consumeStore(ctx, cfg, m, dedup.NewMemoryStore(), "memory")
}

func runInbox(ctx context.Context, cfg config, m *meter) error {
	store, table, closeStore, err := openPostgresStore(ctx, cfg, m, "inbox")
	if err != nil {
		return err
	}
	defer closeStore()
	defer startPurge(ctx, cfg, m, table)()
	w, err := dedup.WrapTx(store, messages(m), func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
		wrapperOpts("inbox", m)...)
	if err != nil {
		return err
	}
	return consumeAdapter(ctx, cfg, m, w, "inbox")
}

func runDynamoDB(ctx context.Context, cfg config, m *meter) error {
	store, drop, err := openDynamoDBStore(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer drop()
	return consumeStore(ctx, cfg, m, store, "dynamodb", dedup.WithBatchCompletion(cfg.BatchWait))
}

// openDynamoDBStore returns a store on a fresh table of DynamoDB Local, whose
// requests m counts, and a function that deletes the table.
func openDynamoDBStore(ctx context.Context, cfg config, m *meter) (*dedup.DynamoDBStore, func(), error) {
	client, table, drop, err := openDynamoDB(ctx, cfg, m)
	if err != nil {
		return nil, nil, err
	}
	store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		drop()
		return nil, nil, err
	}
	return store, drop, nil
}

// openDynamoDB returns a client of DynamoDB Local, whose requests m counts,
// and a fresh table of the store's layout, with a function that deletes it.
func openDynamoDB(ctx context.Context, cfg config, m *meter) (*dynamodb.Client, string, func(), error) {
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint:                    aws.String(cfg.DynamoDB),
		Region:                          "us-east-1",
		Credentials:                     credentials.NewStaticCredentialsProvider("local", "local", ""),
		DisableValidateResponseChecksum: true,
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConnsPerHost = 128 // ClaimBatch runs 16 requests at once per partition
		}),
		APIOptions: []func(*middleware.Stack) error{m.store.apiOption},
	})
	table := "dedupbench-" + deduptype.NewOwnerToken()[:12]
	if err := dedup.CreateDynamoDBTable(ctx, client, dedup.WithTable(table)); err != nil {
		return nil, "", nil, fmt.Errorf("%w (run `make services`)", err)
	}
	drop := func() {
		_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	}
	return client, table, drop, nil
}

// wrapPostgres returns a wrapper of a no-op handler reading messages with
// msgs, metered, over a PostgreSQL store on row's table, and a function
// that closes the store.
func wrapPostgres[M any](ctx context.Context, cfg config, m *meter, row string, msgs dedup.Messages[M]) (*dedup.Wrapper[M], func(), error) {
	store, _, closeStore, err := openPostgresStore(ctx, cfg, m, row)
	if err != nil {
		return nil, nil, err
	}
	w, err := dedup.Wrap(store, metered(m, msgs), func(context.Context, M) error { return nil }, wrapperOpts(row, m)...)
	if err != nil {
		closeStore()
		return nil, nil, err
	}
	return w, closeStore, nil
}

// consumeStore wraps the no-op handler over store and consumes through
// kafkadedup.Consumer as row name until ctx is done.
func consumeStore(ctx context.Context, cfg config, m *meter, store dedup.Store, name string, extra ...dedup.Opt) error {
	w, err := dedup.Wrap(store, messages(m), noop, wrapperOpts(name, m, extra...)...)
	if err != nil {
		return err
	}
	return consumeAdapter(ctx, cfg, m, w, name)
}

// consumeAdapter consumes through kafkadedup.Consumer until ctx is done.
func consumeAdapter(ctx context.Context, cfg config, m *meter, w *dedup.Wrapper[*kgo.Record], name string) error {
	c, err := kafkadedup.NewConsumer(w, kafkadedup.WithClientOpts(kafkaOpts(cfg, m, "dedupbench-"+name)...))
	if err != nil {
		return err
	}
	m.begin()
	return c.Run(ctx)
}
