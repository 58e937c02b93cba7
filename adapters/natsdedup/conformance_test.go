package natsdedup_test

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The consumer passes the adapter conformance suite on NATS JetStream: a
// stream whose duplicate window is short (a copy of an event is published
// again once the window let it through, as a producer retrying later
// would), a durable pull consumer with a 2 s AckWait shared by the
// consumers, a stream of its own as the dead-letter destination, and a TCP
// proxy between the consumers' connection and the server, cut as a broken
// connection, which Health reports (WithJetStream).
func TestConformance(t *testing.T) {
	adaptertest.Run(t, adaptertest.Features{HealthCoversBroker: true}, newNATSHarness)
}

// natsHarness is the suite's view of one stream, its durable consumer and
// its dead-letter stream.
type natsHarness struct {
	e        *env
	durable  jetstream.Consumer  // on the harness's own connection
	consumed jetstream.Consumer  // the same durable, on the connection through proxy
	nc       *nats.Conn          // through proxy
	js       jetstream.JetStream // on nc
	proxy    *testenv.Proxy
	sink     *natsdedup.Sink
}

func newNATSHarness(t *testing.T) adaptertest.Harness {
	e := newEnv(t, 100*time.Millisecond)
	durable := e.consumer(t, 2*time.Second)
	u, err := url.Parse(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	consumed, err := js.Consumer(context.Background(), "T_"+e.token, durable.CachedInfo().Name)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	return &natsHarness{e: e, durable: durable, consumed: consumed, nc: nc, js: js, proxy: proxy, sink: sink}
}

// Publish publishes each message with its ID as Nats-Msg-Id, again after
// the stream's duplicate window when the stream dropped it as a copy.
func (h *natsHarness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	for _, m := range msgs {
		adaptertest.WaitFor(t, adaptertest.Deadline, "the stream to take a copy of "+m.ID, func() bool {
			return !h.e.publish(t, m.ID, string(m.Payload), m.Headers)
		})
	}
}

func (h *natsHarness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, natsdedup.Messages(), h.sink, func(m jetstream.Msg) adaptertest.Message {
		msg := adaptertest.Message{ID: eventID(m), Payload: m.Data(), Headers: map[string]string{}}
		for k := range m.Headers() {
			if k != jetstream.MsgIDHeader {
				msg.Headers[k] = m.Headers().Get(k)
			}
		}
		return msg
	})
	c, err := natsdedup.NewConsumer(h.consumed, w, natsdedup.WithJetStream(h.js), natsdedup.WithFetchWait(time.Second),
		natsdedup.WithInFlightDelay(time.Second), natsdedup.WithAckTimeout(2*time.Second),
		natsdedup.WithShutdownTimeout(cfg.ShutdownTimeout), natsdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeadLetters reads the dead-letter stream.
func (h *natsHarness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	var out []adaptertest.Letter
	for _, m := range h.e.letters(t) {
		meta := map[string]string{}
		for k := range m.Header {
			meta[k] = m.Header.Get(k)
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		out = append(out, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: m.Data, Metadata: meta})
	}
	return out
}

// Unsettled counts the durable consumer's messages not delivered yet or
// not acknowledged.
func (h *natsHarness) Unsettled(t *testing.T) int {
	t.Helper()
	info, err := h.durable.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(info.NumPending) + info.NumAckPending
}

// BreakConnection cuts the proxy: the consumers' connection is closed, and
// reconnecting is refused until restored.
func (h *natsHarness) BreakConnection(t *testing.T) (restore func()) {
	t.Helper()
	h.proxy.Cut()
	adaptertest.WaitFor(t, adaptertest.Deadline, "the consumers' connection lost", func() bool { return !h.nc.IsConnected() })
	return h.proxy.Restore
}
