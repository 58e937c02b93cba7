package amqpdedup_test

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The consumer passes the adapter conformance suite on RabbitMQ: a quorum
// queue shared by the consumers, its ".dlq" queue as the dead-letter
// destination, and a TCP proxy between the consumers and the broker, cut
// as a broken connection. Health reports a broker it cannot consume from.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, adaptertest.Features{HealthCoversBroker: true}, newAMQPHarness)
}

// amqpHarness is the suite's view of one quorum queue and its ".dlq" queue.
type amqpHarness struct {
	b     *broker
	queue string
	proxy *testenv.Proxy
	url   string // the consumers', through proxy
	sink  *amqpdedup.Sink

	mu      sync.Mutex
	letters []adaptertest.Letter
}

func newAMQPHarness(t *testing.T) adaptertest.Harness {
	b := newBroker(t)
	u, err := amqp.ParseURI(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	u.Host, u.Port = "127.0.0.1", mustPort(t, proxy.Addr())
	sink, err := amqpdedup.NewSink(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return &amqpHarness{b: b, queue: b.queue("quorum"), proxy: proxy, url: u.String(), sink: sink}
}

// Publish publishes each message with its ID as message_id, confirmed.
func (h *amqpHarness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	for _, m := range msgs {
		var hdrs amqp.Table
		if len(m.Headers) > 0 {
			hdrs = amqp.Table{}
			for k, v := range m.Headers {
				hdrs[k] = v
			}
		}
		h.b.publish(h.queue, m.ID, string(m.Payload), hdrs)
	}
}

func (h *amqpHarness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, amqpdedup.Messages(h.queue), h.sink, func(d amqp.Delivery) adaptertest.Message {
		return adaptertest.Message{ID: d.MessageId, Payload: d.Body, Headers: text(d.Headers)}
	})
	c, err := amqpdedup.NewConsumer(h.url, h.queue, w, amqpdedup.WithLogger(adaptertest.Logger(t)),
		amqpdedup.WithErrorBackoff(func(int) time.Duration { return 100 * time.Millisecond }),
		amqpdedup.WithInFlightDelay(time.Second), amqpdedup.WithShutdownTimeout(cfg.ShutdownTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeadLetters gets what reached the dead-letter queue since the last call
// and returns every letter so far.
func (h *amqpHarness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.b.letters(h.queue + ".dlq") {
		meta := text(d.Headers)
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		h.letters = append(h.letters, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: d.Body, Metadata: meta})
	}
	return append([]adaptertest.Letter(nil), h.letters...)
}

// Unsettled counts the queue's ready messages: with no consumer connected,
// the broker has put back every delivery not acknowledged.
func (h *amqpHarness) Unsettled(t *testing.T) int {
	t.Helper()
	return h.b.depth(h.queue)
}

// BreakConnection cuts the proxy: every connection of the consumers is
// closed and new ones are refused until restored.
func (h *amqpHarness) BreakConnection(*testing.T) (restore func()) {
	h.proxy.Cut()
	return h.proxy.Restore
}

// text returns a table's entries as text.
func text(t amqp.Table) map[string]string {
	out := make(map[string]string, len(t))
	for k, v := range t {
		switch v := v.(type) {
		case string:
			out[k] = v
		case []byte:
			out[k] = string(v)
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}
