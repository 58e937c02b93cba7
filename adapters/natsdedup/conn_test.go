package natsdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// keptLogs is a slog.Handler keeping every record with its attributes.
type keptLogs struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *keptLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *keptLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *keptLogs) WithGroup(string) slog.Handler            { return l }
func (l *keptLogs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// find returns the attributes of the records at level whose message
// contains text.
func (l *keptLogs) find(level slog.Level, text string) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.records {
		if r.Level != level || !strings.Contains(r.Message, text) {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// A private nats-server killed under a running Consumer: from the moment
// the connection is lost, Health reports an outage matching ErrOutage and
// a WARN says so; once the server is back, Health is nil again, an INFO
// says how long the connection was lost, and the consumer goes on. The
// disconnect handler the user set on the connection is still called.
func TestConnectionLossShowsInHealth(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATSServer(t, "")
	var userHandler atomic.Int32
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { userHandler.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CONN", Subjects: []string{"conn.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.conn.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(_ context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	})
	logs := &keptLogs{}
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js), natsdedup.WithFetchWait(time.Second),
		natsdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	publish := func(id string) {
		t.Helper()
		if _, err := js.Publish(ctx, "conn.orders", []byte(id), jetstream.WithMsgID(id)); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	run := adaptertest.Start(t, c.Run)
	publish("before")
	adaptertest.WaitFor(t, deadline, "the first event applied", func() bool { return rec.Count("before") == 1 })
	if err := c.Health(); err != nil {
		t.Fatalf("Health while connected: %v", err)
	}

	srv.Kill()
	var herr error
	adaptertest.WaitFor(t, deadline, "Health reporting the lost connection", func() bool {
		herr = c.Health()
		return herr != nil
	})
	if !errors.Is(herr, natsdedup.ErrOutage) || !strings.Contains(herr.Error(), "connection to the NATS server lost") {
		t.Errorf("Health with the server down: %v, want ErrOutage naming the lost connection", herr)
	}
	t.Logf("Health with the server down: %v", herr)
	if n := len(logs.find(slog.LevelWarn, "connection to the NATS server lost")); n != 1 {
		t.Errorf("%d WARNs of the lost connection, want 1", n)
	}

	srv.Start()
	adaptertest.WaitFor(t, deadline, "Health nil once the server is back", func() bool { return c.Health() == nil })
	back := logs.find(slog.LevelInfo, "connection to the NATS server back")
	if len(back) != 1 {
		t.Fatalf("%d INFOs of the connection back, want 1", len(back))
	}
	if d, err := time.ParseDuration(back[0]["lost_for"].String()); err != nil || d <= 0 {
		t.Errorf("lost_for %q: want a Go duration string (%v)", back[0]["lost_for"], err)
	}
	publish("after")
	adaptertest.WaitFor(t, deadline, "an event published after the outage applied", func() bool { return rec.Count("after") == 1 })
	if userHandler.Load() == 0 {
		t.Error("the user's DisconnectErrHandler was not called")
	}
	run.StopClean(t)
	if err := c.Health(); err != nil {
		t.Errorf("Health after Run: %v", err)
	}
}
