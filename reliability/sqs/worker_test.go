package sqsreliability_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_SQSREL_WORKER"

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name             string // "w2#5": slot 2, fifth process started; recorded with each row
	SQSEndpoint      string
	QueueURL         string
	DLQURL           string
	DynamoDBEndpoint string
	Table            string // the DynamoDB dedup table
	DSN              string
	EffectsTable     string // PostgreSQL table of handler starts and effects
	Scope            string
	MaxAttempts      int
	Workers          int
}

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a consumer process of the crash campaign: an
// sqsdedup.Consumer over a DynamoDBStore whose handler writes its starts and
// effects to PostgreSQL. It runs until SIGTERM (a graceful stop) or SIGKILL
// (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newWorker) }

func newWorker(ctx context.Context, cfg workerConfig, log *slog.Logger) (*sqsdedup.Consumer, func(), error) {
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	store, err := dedup.NewDynamoDBStore(dynamoDBClient(cfg.DynamoDBEndpoint), dedup.WithTable(cfg.Table))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	client := sqsClient(cfg.SQSEndpoint)
	sink, err := sqsdedup.NewSink(client, cfg.DLQURL)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	w, err := dedup.Wrap(store, sqsdedup.Messages(cfg.QueueURL), effectHandler(pool, cfg.EffectsTable, cfg.Name),
		dedup.WithScope(cfg.Scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.MaxAttempts),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithLogger(log))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// The store lease is the queue's visibility timeout, read by Run.
	consumer, err := sqsdedup.NewConsumer(client, cfg.QueueURL, w,
		sqsdedup.WithWorkers(cfg.Workers),
		sqsdedup.WithWaitTime(time.Second),
		sqsdedup.WithInFlightDelay(time.Second),
		sqsdedup.WithShutdownTimeout(5*time.Second),
		sqsdedup.WithLogger(log))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return consumer, pool.Close, nil
}

// effectHandler records a start row, works a little, then (unless the event
// is poison) records the effect row and works a little more, so that a kill
// lands before the effect, between effect and Complete, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.Handler[types.Message] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, m types.Message) error {
		id := eventIDOf(m)
		if _, err := pool.Exec(ctx, insert, id, worker, "start"); err != nil {
			return err
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if isPoison(aws.ToString(m.Body)) {
			return errPoison
		}
		if _, err := pool.Exec(ctx, insert, id, worker, "effect"); err != nil {
			return err
		}
		// The effect is applied: from here on, success is the only honest
		// answer, cancelled or not.
		time.Sleep(rand.N(10 * time.Millisecond))
		return nil
	}
}

// pause sleeps up to max, at random, or until ctx is done.
func pause(ctx context.Context, max time.Duration) error {
	t := time.NewTimer(rand.N(max))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sqsClient(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
}

func dynamoDBClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint:                    aws.String(endpoint),
		Region:                          "us-east-1",
		Credentials:                     credentials.NewStaticCredentialsProvider("local", "local", ""),
		DisableValidateResponseChecksum: true,
	})
}

// leaseLost returns the keys that workers reported they lost the lease of
// while their handler ran (the wrapper's loud "lease lost" error).
func leaseLost(f *crashtest.Fleet) map[string]bool {
	keys := map[string]bool{}
	for _, path := range f.Logs() {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "dedup: lease lost") {
				continue
			}
			if _, rest, ok := strings.Cut(line, " key="); ok {
				key, _, _ := strings.Cut(rest, " ")
				if k, err := strconv.Unquote(key); err == nil {
					key = k // slog quotes a value holding quotes
				}
				keys[key] = true
			}
		}
	}
	return keys
}
