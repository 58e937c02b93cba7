package kafkadedup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// unreachableStore returns a PostgreSQL store whose pool points at a port
// nothing listens on: every call fails, as with the database down.
func unreachableStore(t *testing.T) dedup.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + testenv.ClosedPort(t) + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// With PostgreSQL down, Run is not silent: each retry is a warning until the
// failures have lasted the wrapper's WithOutageThreshold, then the outage is
// an ERROR (its start, then reminders each threshold, not one per retry, all
// from the wrapper's one tracker), and the consumer's Health and Stats
// report it; nothing runs and nothing is committed.
func TestOutageIsLoggedAndReported(t *testing.T) {
	c := newCluster(t, 1)
	c.produce(events("down", 3, 1)...)
	fx := newEffects()
	logs := &testenv.Logs{}
	w := wrap(t, unreachableStore(t), c.sink(), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error { fx.apply(r); return nil },
		dedup.WithLogger(slog.New(logs)), dedup.WithOutageThreshold(500*time.Millisecond))
	consumer := newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...),
		kafkadedup.WithLogger(slog.New(logs)),
		kafkadedup.WithErrorBackoff(func(int) time.Duration { return 20 * time.Millisecond }))
	if err := consumer.Health(); err != nil {
		t.Errorf("Health before any record: %v, want nil", err)
	}
	run := start(t, consumer)

	const notSettled = "record not settled"
	failures := func() int { return logs.Count(slog.LevelWarn, notSettled) + logs.Count(slog.LevelDebug, notSettled) }
	eventually(t, 20*time.Second, func() bool {
		return logs.Count(slog.LevelError, "dedup: store or dead-letter sink still failing") >= 1 && failures() >= 20
	}, "no outage reminded at ERROR after many failures; logs:\n%s", logs)
	if n := logs.Count(slog.LevelError, "dedup: the store or dead-letter sink has been failing"); n != 1 {
		t.Errorf("%d ERROR records of the outage's start, want 1", n)
	}
	if errs, n := logs.Count(slog.LevelError, ""), failures(); errs >= n/2 {
		t.Errorf("%d ERROR records for %d failures, want the outage reported, not each retry", errs, n)
	}
	herr := consumer.Health()
	if !errors.Is(herr, kafkadedup.ErrOutage) {
		t.Errorf("Health during the outage: %v, want ErrOutage", herr)
	}
	if st := consumer.Stats(); st.FailingSince.IsZero() || !st.LastSuccess.IsZero() || st.LastError == nil {
		t.Errorf("Stats during the outage: %+v", st)
	}
	if err := run.Stop(t); err != nil {
		t.Errorf("Run: %v, want nil after its context was canceled", err)
	}
	if count, _ := fx.snapshot(); len(count) != 0 {
		t.Errorf("%d effects with the store down", len(count))
	}
	if got := c.committed(c.group); len(got) != 0 {
		t.Errorf("committed %v with the store down", got)
	}
}

// With WithMaxOutage, Run gives up once the store has been failing that
// long: it shuts down by itself and returns an error matching ErrOutage.
func TestMaxOutageStopsRun(t *testing.T) {
	c := newCluster(t, 1)
	c.produce(events("down", 1, 1)...)
	w := wrap(t, unreachableStore(t), c.sink(), dedup.Scope(c.group, "apply"),
		func(context.Context, *kgo.Record) error { return nil })
	consumer := newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...),
		kafkadedup.WithMaxOutage(time.Second),
		kafkadedup.WithErrorBackoff(func(int) time.Duration { return 20 * time.Millisecond }),
		kafkadedup.WithLogger(slog.New(slog.DiscardHandler)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := consumer.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run returned only when its context ended: %v", err)
	}
	if !errors.Is(err, kafkadedup.ErrOutage) {
		t.Errorf("Run: %v, want ErrOutage", err)
	}
	if got := c.committed(c.group); len(got) != 0 {
		t.Errorf("committed %v with the store down", got)
	}
}

// A consumer of a topic that does not exist says so: a warning naming the
// topic, and Health reporting it, until the topic is created.
func TestMissingTopicIsReported(t *testing.T) {
	c := newCluster(t, 1)
	logs := &testenv.Logs{}
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(context.Context, *kgo.Record) error { return nil })
	const missing = "orders-not-created-yet"
	opts := append(c.clientOpts(c.group), kgo.ConsumeTopics(missing))
	consumer := newConsumer(t, w, kafkadedup.WithClientOpts(opts...), kafkadedup.WithLogger(slog.New(logs)),
		kafkadedup.WithTopicCheck(100*time.Millisecond))
	run := start(t, consumer)

	eventually(t, 20*time.Second, func() bool { return consumer.Health() != nil },
		"Health stayed nil while consuming a topic that does not exist")
	herr := consumer.Health()
	if !errors.Is(herr, kerr.UnknownTopicOrPartition) || !strings.Contains(herr.Error(), missing) {
		t.Errorf("Health: %v, want UnknownTopicOrPartition naming %s", herr, missing)
	}
	if logs.Count(slog.LevelWarn, "consumed topics do not exist") != 1 || !strings.Contains(logs.String(), missing) {
		t.Errorf("want one warning naming %s; logs:\n%s", missing, logs)
	}

	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = missing, 1, 1
	req.Topics = append(req.Topics, rt)
	if _, err := req.RequestWith(context.Background(), c.admin); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() bool { return consumer.Health() == nil },
		"Health still %v after the topic was created", consumer.Health())
	if err := run.Stop(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}
