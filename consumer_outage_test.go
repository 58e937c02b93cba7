package dedup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// logRecords is a slog.Handler keeping every record, for tests.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

// at returns the messages logged at level.
func (h *logRecords) at(level slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var msgs []string
	for _, r := range h.recs {
		if r.Level == level {
			msgs = append(msgs, r.Message)
		}
	}
	return msgs
}

// deliverFor calls Handle with msg repeatedly for d, as a transport retrying
// in place, and returns how many calls failed.
func deliverFor(w *dedup.Wrapper[event], msg event, d time.Duration) int {
	failed := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		if _, err := w.Handle(context.Background(), msg); err != nil {
			failed++
		}
		time.Sleep(20 * time.Millisecond)
	}
	return failed
}

// A store that cannot be reached is reported at ERROR when it stays down
// past the threshold (its start once, then at most a reminder each
// threshold), not once per delivery, and through Health and Stats.
func TestStoreOutageIsLoggedOnceAtError(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+testenv.ClosedPort(t)+"/test?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool)
	require.NoError(t, err)
	logs := &logRecords{}
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope("outage"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLogger(slog.New(logs)),
		dedup.WithOutageThreshold(300*time.Millisecond))
	require.NoError(t, err)

	require.NoError(t, w.Health())
	require.True(t, w.Stats().FailingSince.IsZero())
	began := time.Now()
	failed := deliverFor(w, event{ID: "e", Body: "x"}, time.Second)
	require.Greater(t, failed, 3)
	require.Equal(t, 1, countContaining(logs.at(slog.LevelError), "has been failing"), "one ERROR for the outage's start")
	require.LessOrEqual(t, len(logs.at(slog.LevelError)), 1+int(time.Since(began)/(300*time.Millisecond)),
		"at most a reminder each threshold")
	require.ErrorIs(t, w.Health(), dedup.ErrOutage)
	st := w.Stats()
	require.False(t, st.FailingSince.IsZero())
	require.Error(t, st.LastError)
	require.True(t, st.LastSuccess.IsZero())
}

// A dead-letter sink that fails is an outage too; once it takes letters
// again the recovery is logged and Health clears.
func TestSinkOutageAndRecovery(t *testing.T) {
	sink, logs := deduptest.NewFailingSink(), &logRecords{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error {
		return dedup.Permanent(errors.New("unsupported"))
	}, dedup.WithScope("sink-outage"), dedup.WithSink(sink), dedup.WithLogger(slog.New(logs)),
		dedup.WithOutageThreshold(300*time.Millisecond))
	require.NoError(t, err)
	sink.FailWith(errors.New("dlq down"))
	require.Greater(t, deliverFor(w, event{ID: "p", Body: "x"}, time.Second), 3)
	require.Equal(t, 1, countContaining(logs.at(slog.LevelError), "has been failing"))
	require.ErrorIs(t, w.Health(), dedup.ErrOutage)
	sink.FailWith(nil)
	res := deliverUntilSettled(t, w, event{ID: "p", Body: "x"})
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.NoError(t, w.Health())
	require.True(t, w.Stats().FailingSince.IsZero())
	require.Contains(t, logs.at(slog.LevelInfo), "dedup: deliveries are recorded again after an outage")
}

func countContaining(msgs []string, part string) int {
	n := 0
	for _, m := range msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

// Without WithLogger, the wrapper logs through slog.Default.
func TestLoggerDefaultsToSlogDefault(t *testing.T) {
	logs := &logRecords{}
	prev := slog.Default()
	slog.SetDefault(slog.New(logs))
	t.Cleanup(func() { slog.SetDefault(prev) })
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error {
		return dedup.Permanent(errors.New("unsupported"))
	}, dedup.WithScope("default-logger"), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), event{ID: "p", Body: "x"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.Contains(t, logs.at(slog.LevelWarn), "dedup: message dead-lettered")
}
