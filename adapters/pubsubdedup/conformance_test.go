package pubsubdedup_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/internal/wire"
)

// The consumer passes the adapter conformance suite on pstest, the
// client library's in-process Pub/Sub server: a topic whose event IDs
// travel in the "event-id" attribute (a copy published again is a new
// message, as a producer retrying would make), a subscription with a 10 s
// ack deadline shared by the consumers, a topic of its own as the
// dead-letter destination, and a TCP proxy between the consumers' client
// and the server, cut as a broken connection.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, adaptertest.Features{}, newHarness)
}

// harness is the suite's view of one env, with the consumers' client
// through a proxy.
type harness struct {
	e      *env
	proxy  *testenv.Proxy
	client *pubsub.Client // through proxy
	sink   *pubsubdedup.Sink
}

func newHarness(t *testing.T) adaptertest.Harness {
	e := newEnv(t, subConfig{})
	proxy := testenv.StartProxy(t, e.srv.Addr)
	return &harness{e: e, proxy: proxy, client: pubsubenv.Client(t, proxy.Addr(), project), sink: e.sink(t)}
}

// Publish publishes each message with its ID in the "event-id" attribute.
func (h *harness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	for _, m := range msgs {
		h.e.publish(t, m.ID, string(m.Payload), "", m.Headers)
	}
}

func (h *harness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, pubsubdedup.Messages(pubsubdedup.WithIDAttribute(wire.PubSubIDAttribute)), h.sink,
		func(m *pubsub.Message) adaptertest.Message {
			msg := adaptertest.Message{ID: eventID(m), Payload: m.Data, Headers: map[string]string{}}
			for k, v := range m.Attributes {
				if k != wire.PubSubIDAttribute {
					msg.Headers[k] = v
				}
			}
			return msg
		})
	// The client's connection is made before Run, which the suite's leak
	// check then does not count.
	if _, err := h.client.SubscriptionAdminClient.GetSubscription(context.Background(),
		&pubsubpb.GetSubscriptionRequest{Subscription: h.e.sub}); err != nil {
		t.Fatal(err)
	}
	c, err := pubsubdedup.NewConsumer(h.client, h.e.sub, w, pubsubdedup.WithInFlightDelay(time.Second),
		pubsubdedup.WithShutdownTimeout(cfg.ShutdownTimeout), pubsubdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeadLetters reads the dead-letter topic.
func (h *harness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	var out []adaptertest.Letter
	for _, m := range h.e.letters() {
		meta := map[string]string{}
		for k, v := range m.Attributes {
			meta[k] = v
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		out = append(out, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: m.Data, Metadata: meta})
	}
	return out
}

// Unsettled counts the topic's messages never acknowledged.
func (h *harness) Unsettled(*testing.T) int { return h.e.unacked() }

// BreakConnection cuts the proxy: the consumers' connection is closed, and
// connecting again is refused until restored.
func (h *harness) BreakConnection(t *testing.T) (restore func()) {
	t.Helper()
	h.proxy.Cut()
	// A call on the consumers' client fails while the proxy is cut.
	adaptertest.WaitFor(t, adaptertest.Deadline, "a call through the cut proxy failing", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := h.client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: h.e.sub})
		return err != nil
	})
	return h.proxy.Restore
}
