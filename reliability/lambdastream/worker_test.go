package lambdastreamreliability_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_LAMBDASTREAMREL_WORKER"

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name         string // "w2#5": slot 2, fifth process started; recorded with each row
	RuntimeAPI   string // host:port/path of the Runtime API this process polls
	DSN          string
	Table        string // the dedup table
	EffectsTable string
	Scope        string
	MaxAttempts  int
	SQSEndpoint  string
	DLQURL       string
	// ReportAtOnce hides the invocation's deadline from the handler, which
	// then reports a record to retry at once instead of waiting for it in
	// place: as with a function timeout too short to wait.
	ReportAtOnce bool
}

// workerMain is a Lambda function process of the campaign: the Kinesis
// handler over the transactional inbox (dedup.WrapTx), started by
// lambda.Start as in a real function, whose handler writes its effect in the
// record's transaction. It runs until SIGTERM (a graceful stop) or SIGKILL
// (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.WorkerMain(raw, runWorker) }

func runWorker(ctx context.Context, cfg workerConfig, log *slog.Logger) int {
	pool, starts, closePools, err := crashtest.InboxPools(ctx, cfg.DSN)
	if err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	defer closePools()
	handler, err := newHandler(cfg, pool, starts, log)
	if err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	// lambda.Start polls the Runtime API named by this variable, forever.
	if err := os.Setenv("AWS_LAMBDA_RUNTIME_API", cfg.RuntimeAPI); err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	// Not with ctx: its end would fail the loop's poll, which exits 1.
	go lambda.Start(handler)
	<-ctx.Done()
	return 0
}

func newHandler(cfg workerConfig, pool, starts *pgxpool.Pool, log *slog.Logger) (func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error), error) {
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
	if err != nil {
		return nil, err
	}
	client := sqs.New(sqs.Options{
		BaseEndpoint: aws.String(cfg.SQSEndpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	sink, err := sqsdedup.NewSink(client, cfg.DLQURL)
	if err != nil {
		return nil, err
	}
	w, err := dedup.WrapTx(store, lambdastreamdedup.KinesisMessages(lambdastreamdedup.WithIDField("event")),
		crashtest.InboxHandler(starts, cfg.EffectsTable, cfg.Name, eventOf),
		dedup.WithScope(cfg.Scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.MaxAttempts),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		// A killed invocation's claims are taken over after this long.
		dedup.WithLease(2*time.Second),
		dedup.WithLogger(log))
	if err != nil {
		return nil, err
	}
	h := lambdastreamdedup.KinesisHandler(w)
	if cfg.ReportAtOnce {
		return func(ctx context.Context, ev events.KinesisEvent) (events.KinesisEventResponse, error) {
			return h(context.WithoutCancel(ctx), ev)
		}, nil
	}
	return h, nil
}

// eventOf returns the event ID and payload of a message.
func eventOf(r events.KinesisEventRecord) (string, []byte, error) {
	var data struct{ Event string }
	if err := json.Unmarshal(r.Kinesis.Data, &data); err != nil {
		return "", nil, dedup.Permanent(err)
	}
	return data.Event, r.Kinesis.Data, nil
}
