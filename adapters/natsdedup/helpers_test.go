package natsdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestMain(m *testing.M) {
	// These tests spend their time waiting for the server (AckWait,
	// redelivery delays), not on the CPU: unless -test.parallel says
	// otherwise, run more of them at once than one per CPU.
	flag.Parse()
	parallel := false
	flag.Visit(func(f *flag.Flag) { parallel = parallel || f.Name == "test.parallel" })
	if !parallel {
		_ = flag.Set("test.parallel", "6")
	}
	goleak.VerifyTestMain(m)
}

// deadline bounds every wait for an effect: generous, for a loaded machine.
const deadline = 60 * time.Second

// env is one test's stream, dead-letter stream and subjects, deleted when
// the test ends.
type env struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	token   string
	stream  jetstream.Stream
	subject string // the one subject the tests publish to
	dlq     jetstream.Stream
}

func token() string { return strings.ToLower(rand.Text()[:10]) }

// newEnv creates a stream capturing "<token>.>", with a duplicate window of
// dupWindow, and a dead-letter stream capturing "dlq.<token>.>".
func newEnv(t *testing.T, dupWindow time.Duration) *env {
	t.Helper()
	nc, js := testenv.NATS(t)
	e := &env{nc: nc, js: js, token: token()}
	e.subject = e.token + ".orders"
	ctx := context.Background()
	var err error
	e.stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "T_" + e.token, Subjects: []string{e.token + ".>"}, Duplicates: dupWindow, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.dlq, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "DLQ_" + e.token, Subjects: []string{"dlq." + e.token + ".>"}, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"T_" + e.token, "DLQ_" + e.token} {
			if err := js.DeleteStream(context.Background(), name); err != nil {
				t.Errorf("delete stream %s: %v", name, err)
			}
		}
	})
	return e
}

// consumer creates a durable pull consumer with explicit acks and the
// given AckWait.
func (e *env) consumer(t *testing.T, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	c, err := e.stream.CreateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: "c_" + token(), AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// publish publishes data to the env's subject with id as Nats-Msg-Id (none
// when empty) and extra headers, and reports whether the stream dropped it
// as a duplicate within its window.
func (e *env) publish(t *testing.T, id, data string, headers map[string]string) (duplicate bool) {
	t.Helper()
	msg := &nats.Msg{Subject: e.subject, Data: []byte(data), Header: nats.Header{}}
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ack, err := e.js.PublishMsg(context.Background(), msg, opts...)
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return ack.Duplicate
}

// publishAgain publishes a copy of an event already published, once the
// stream's duplicate window no longer drops it.
func (e *env) publishAgain(t *testing.T, id, data string) {
	t.Helper()
	until := time.Now().Add(deadline)
	for e.publish(t, id, data, nil) {
		if time.Now().After(until) {
			t.Fatalf("the stream kept dropping %s as a duplicate", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// letters returns the messages of the dead-letter stream.
func (e *env) letters(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := e.dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := e.dlq.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("dead letter %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// assertAllAcked fails t unless, within the deadline, the consumer has
// every message of its stream acknowledged (or terminated): none pending,
// none awaiting an acknowledgement.
func assertAllAcked(t *testing.T, c jetstream.Consumer) {
	t.Helper()
	var info *jetstream.ConsumerInfo
	until := time.Now().Add(deadline)
	for time.Now().Before(until) {
		var err error
		if info, err = c.Info(context.Background()); err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.NumWaiting >= 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("consumer %s: %d pending, %d awaiting acknowledgement", info.Name, info.NumPending, info.NumAckPending)
}

// eventID reads a message's event ID the way the consumer does.
func eventID(m jetstream.Msg) string {
	id, _ := natsdedup.Messages().EventID(m)
	return id
}

func uniqueScope() string { return "nats-test-" + token() }

// wrap returns a wrapper over store with test defaults (unique scope,
// memory sink, no backoff, rec observing); opts come after them.
func wrap(t *testing.T, store dedup.Store, rec *adaptertest.Effects, h dedup.Handler[jetstream.Msg], opts ...dedup.Opt) *dedup.Wrapper[jetstream.Msg] {
	t.Helper()
	base := []dedup.Opt{
		dedup.WithScope(uniqueScope()),
		dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithObserver(rec.Observe),
	}
	w, err := dedup.Wrap(store, natsdedup.Messages(), h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a consumer until the returned stop is called (or the test
// ends); stop waits for Run to return nil.
func start(t *testing.T, cons jetstream.Consumer, w *dedup.Wrapper[jetstream.Msg], opts ...natsdedup.Opt) (stop func()) {
	t.Helper()
	base := []natsdedup.Opt{natsdedup.WithFetchWait(time.Second), natsdedup.WithLogger(adaptertest.Logger(t))}
	c, err := natsdedup.NewConsumer(cons, w, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	stop = func() { run.StopClean(t) }
	t.Cleanup(stop)
	return stop
}

var errBoom = errors.New("cannot handle this")
