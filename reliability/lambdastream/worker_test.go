package lambdastreamreliability_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
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

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a Lambda function process of the campaign: the Kinesis
// handler over the transactional inbox (dedup.WrapTx), started by
// lambda.Start as in a real function, whose handler writes its effect in the
// record's transaction. It runs until SIGTERM (a graceful stop) or SIGKILL
// (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.WorkerMain(raw, runWorker) }

func runWorker(ctx context.Context, cfg workerConfig, log *slog.Logger) int {
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	starts, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	defer starts.Close()
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
		effectHandler(starts, cfg.EffectsTable, cfg.Name),
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

// effectHandler records a start row outside the transaction, works a
// little, then (unless the event is poison) writes the effect in the
// record's transaction and works a little more, so that a kill lands
// before the effect, between effect and commit, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.TxHandler[events.KinesisEventRecord] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, r events.KinesisEventRecord) error {
		var data struct{ Event string }
		if err := json.Unmarshal(r.Kinesis.Data, &data); err != nil {
			return dedup.Permanent(err)
		}
		if _, err := pool.Exec(ctx, insert, data.Event, worker, "start"); err != nil {
			return err
		}
		if err := crashtest.Pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if strings.Contains(string(r.Kinesis.Data), `"poison":true`) {
			return errPoison
		}
		if _, err := tx.Exec(ctx, insert, data.Event, worker, "effect"); err != nil {
			return err
		}
		return crashtest.Pause(ctx, 10*time.Millisecond)
	}
}
