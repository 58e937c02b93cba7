package amqpdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// effectDeadline bounds the wait for effects: long, so that a loaded
// machine slows a test down without failing it.
const effectDeadline = 90 * time.Second

var errPoison = errors.New("poison")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// broker is a test's RabbitMQ: its URL and a channel for setting up and
// inspecting queues.
type broker struct {
	t   *testing.T
	url string
	ch  *amqp.Channel
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	conn := testenv.RabbitMQ(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return &broker{t: t, url: testenv.RabbitMQURL(t), ch: ch}
}

// queue declares a durable queue of kind ("classic" or "quorum") and its
// ".dlq" queue under a name of the test's own, deleted when the test ends.
func (b *broker) queue(kind string) string {
	b.t.Helper()
	name := "dedup-test-" + strings.ToLower(rand.Text()[:12])
	for _, q := range []string{name, name + ".dlq"} {
		if _, err := b.ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind}); err != nil {
			b.t.Fatalf("declare %s: %v", q, err)
		}
		b.t.Cleanup(func() {
			conn, err := amqp.Dial(b.url)
			if err != nil {
				return
			}
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		})
	}
	return name
}

// publish publishes body with message_id id to queue and waits for the
// broker's confirmation.
func (b *broker) publish(queue, id, body string, headers amqp.Table) {
	b.t.Helper()
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false,
		amqp.Publishing{MessageId: id, Body: []byte(body), Headers: headers, DeliveryMode: amqp.Persistent})
	if err != nil {
		b.t.Fatal(err)
	}
	if !dc.Wait() {
		b.t.Fatalf("publish %s to %s: not confirmed", id, queue)
	}
}

// depth returns how many messages queue holds, ready or unacknowledged.
func (b *broker) depth(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}

// letters gets every message of queue.
func (b *broker) letters(queue string) []amqp.Delivery {
	b.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(queue, true)
		if err != nil {
			b.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// run starts c and returns a function that stops it and checks that Run
// returned nil.
func run(t *testing.T, c *amqpdedup.Consumer) (stop func()) {
	t.Helper()
	run := adaptertest.Start(t, c.Run)
	stop = func() { run.StopClean(t) }
	t.Cleanup(stop)
	return stop
}

// consumer returns a Consumer of queue through a wrapper of h on store,
// with a Sink to the broker.
func (b *broker) consumer(queue string, store dedup.Store, h dedup.Handler[amqp.Delivery], opts ...dedup.Opt) *amqpdedup.Consumer {
	b.t.Helper()
	return b.consumerAt(b.url, queue, store, h, nil, opts...)
}

// consumerAt is consumer with the consumer connecting to url, with copts.
func (b *broker) consumerAt(url, queue string, store dedup.Store, h dedup.Handler[amqp.Delivery], copts []amqpdedup.Opt, opts ...dedup.Opt) *amqpdedup.Consumer {
	b.t.Helper()
	sink, err := amqpdedup.NewSink(b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { sink.Close() })
	opts = append([]dedup.Opt{dedup.WithSink(sink), dedup.WithScope("amqp-test/" + queue), dedup.WithLogger(quiet()),
		dedup.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond })}, opts...)
	w, err := dedup.Wrap(store, amqpdedup.Messages(queue), h, opts...)
	if err != nil {
		b.t.Fatal(err)
	}
	copts = append([]amqpdedup.Opt{amqpdedup.WithLogger(quiet()),
		amqpdedup.WithErrorBackoff(func(int) time.Duration { return 100 * time.Millisecond })}, copts...)
	c, err := amqpdedup.NewConsumer(url, queue, w, copts...)
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

// header returns the text of header name of d.
func header(d amqp.Delivery, name string) string {
	v, _ := d.Headers[name].(string)
	return v
}

// logCount counts the records logged with each message.
type logCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *logCount) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCount) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = make(map[string]int)
	}
	l.n[r.Message]++
	return nil
}
func (l *logCount) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCount) WithGroup(string) slog.Handler      { return l }

func (l *logCount) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.n {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}
