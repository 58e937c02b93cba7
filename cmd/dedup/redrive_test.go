package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
)

// effectLog counts the effects of a handler per event.
type effectLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *effectLog) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[id]++
}

func (e *effectLog) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.n))
	for k, v := range e.n {
		out[k] = v
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var sentBack = regexp.MustCompile(`dead letters read, sent back (\d+)`)

// Dead letters produced by a bug are sent back once it is fixed: a dry run
// sends nothing, an interrupted redrive resumes where it stopped, every
// event is then processed exactly once, the dead-letter topic is drained
// (the redrive's group reaches its end) and a second redrive is a no-op. A
// letter without its origin is reported and left in the topic.
func TestRedriveKafka(t *testing.T) {
	ctx := context.Background()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders", "orders.dlq"))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	brokers := strings.Join(kc.ListenAddrs(), ",")
	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("app", "apply")

	client, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	const events = 20
	for i := range events {
		id := "e" + strconv.Itoa(i)
		require.NoError(t, client.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte(id), Value: []byte("v" + id),
			Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte(id)}}}).FirstErr())
	}
	require.NoError(t, client.ProduceSync(ctx, &kgo.Record{Topic: "orders.dlq", Value: []byte("orphan"),
		Headers: []kgo.RecordHeader{{Key: "dedup-event-id", Value: []byte("orphan")}}}).FirstErr())

	var fixed atomic.Bool
	var letters atomic.Int32
	fx := &effectLog{}
	consume := func() (stop func()) {
		sink, err := kafkadedup.NewSink(client)
		require.NoError(t, err)
		w, err := dedup.Wrap(store, kafkadedup.Messages(), func(_ context.Context, r *kgo.Record) error {
			if !fixed.Load() {
				return dedup.Permanent(errors.New("bug: cannot parse v2 orders"))
			}
			fx.add(string(r.Key))
			return nil
		}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithObserver(func(_ context.Context, res dedup.Result) {
			if res.Outcome == dedup.OutcomeDeadLettered {
				letters.Add(1)
			}
		}))
		require.NoError(t, err)
		c, err := kafkadedup.NewConsumer(w, kafkadedup.WithClientOpts(kgo.SeedBrokers(kc.ListenAddrs()...),
			kgo.ConsumerGroup("app"), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(100*time.Millisecond), kgo.HeartbeatInterval(100*time.Millisecond)))
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = c.Run(cctx)
		}()
		return func() { cancel(); <-done }
	}
	stop := consume()
	eventually(t, "every event dead-lettered", func() bool { return letters.Load() == events })
	stop()

	fixed.Store(true) // the bug is fixed and deployed
	stop = consume()
	defer stop()
	redrive := func(ctx context.Context, extra ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		args := append([]string{"redrive", "kafka", "-brokers", brokers, "-dlq", "orders.dlq", "-idle", "1s",
			"-postgres", dsn, "-table", table}, extra...)
		code := run(ctx, args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	sent := func(out string) int {
		m := sentBack.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		n, _ := strconv.Atoi(m[1])
		return n
	}

	// A dry run commits nothing, so it can run again: under load one can
	// end (idle) before the group hands it the second partition, as the
	// README says of redrives.
	var code int
	var out, errOut string
	for deadline := time.Now().Add(time.Minute); ; {
		code, out, errOut = redrive(ctx)
		require.Equal(t, 0, code, errOut)
		if strings.Contains(out, "would send back 20") || time.Now().After(deadline) {
			break
		}
	}
	require.Contains(t, out, "would send back 20")
	require.Contains(t, out, "no origin in its metadata")
	require.Empty(t, fx.snapshot(), "a dry run sends nothing")

	// Interrupted (Ctrl-C) once a few letters were sent back (five a
	// second), then run again. The letters sent back are counted where they
	// land, the broker, not by the app's consumer, whose pace under load
	// would decide whether the redrive ends (idle) before it is
	// interrupted; a long -idle leaves the interruption to end it.
	var landed atomic.Int32
	kc.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		// Only the redrive produces now (the app's handler succeeds); a
		// request may name its topic by ID, so every one counts.
		for _, tp := range kreq.(*kmsg.ProduceRequest).Topics {
			landed.Add(int32(len(tp.Partitions)))
		}
		return nil, nil, false
	})
	ictx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		deadline := time.Now().Add(20 * time.Second)
		for landed.Load() < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	code, out, _ = redrive(ictx, "-yes", "-rate", "5", "-idle", "5m")
	cancel()
	require.Equal(t, 1, code)
	t.Logf("letters landed before the interruption: %d", landed.Load())
	first, outs := sent(out), out
	require.Greater(t, first, 0)
	require.Less(t, first, events)
	// Run again until everything is sent back: a run ends after -idle
	// without letters, which can come before the group gives it the
	// partitions the interrupted run held.
	total := first
	for run := 0; total < events && run < 5; run++ {
		code, out, errOut = redrive(ctx, "-yes")
		require.Equal(t, 0, code, errOut)
		total += sent(out)
		outs += out
	}
	require.Equal(t, events, total, outs)
	require.Contains(t, outs, "skipped 1: no origin in its metadata")

	eventually(t, "every event processed", func() bool { return len(fx.snapshot()) == events })
	time.Sleep(300 * time.Millisecond) // a second copy would show by now
	for id, n := range fx.snapshot() {
		require.Equal(t, 1, n, id)
	}
	code, out, _ = redrive(ctx, "-yes")
	require.Equal(t, 0, code)
	require.Contains(t, out, "sent back 0,", "the dead-letter topic is drained: nothing to send again")
	for i := range events {
		rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: "e" + strconv.Itoa(i)})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status)
	}
}

// A dead-letter topic that does not exist is a clear failure.
func TestRedriveKafkaUnknownTopic(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	dsn, table, _, _ := postgresTable(t)
	code, _, errOut := cli(t, "redrive", "kafka", "-brokers", strings.Join(kc.ListenAddrs(), ","), "-dlq", "no-such.dlq",
		"-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "topic no-such.dlq does not exist")
}
