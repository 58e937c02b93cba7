package pubsubdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/internal/wire"
)

func TestMain(m *testing.M) { pubsubenv.RunTests(m) }

// deadline bounds every wait for an effect: generous, for a loaded machine.
const deadline = 60 * time.Second

// project is the project of every test's server.
const project = "dedup-test"

var errBoom = errors.New("boom")

// env is one test's in-process Pub/Sub server (pstest), with a topic, its
// subscription and a dead-letter topic.
type env struct {
	srv    *pstest.Server
	client *pubsub.Client // straight to srv
	topic  string         // full names
	sub    string
	dlq    string
}

// subConfig is what a test's subscription has beside its topic.
type subConfig struct {
	ackDeadline time.Duration
	ordered     bool
	// maxDeliveries, when not 0, gives the subscription a dead-letter
	// policy (to the env's dlq topic), which makes Pub/Sub set the
	// delivery attempt.
	maxDeliveries int
	// retryPolicy gives the subscription a retry policy (which pstest
	// keeps but does not apply).
	retryPolicy bool
}

func token() string { return strings.ToLower(rand.Text()[:10]) }

// newEnv starts a server with the topic, the dead-letter topic and a
// subscription configured by sc, all closed when t ends.
func newEnv(t *testing.T, sc subConfig) *env {
	t.Helper()
	srv, client := pubsubenv.Start(t, project)
	tok := token()
	e := &env{srv: srv, client: client,
		topic: "projects/" + project + "/topics/orders-" + tok,
		sub:   "projects/" + project + "/subscriptions/billing-" + tok,
		dlq:   "projects/" + project + "/topics/orders-dlq-" + tok}
	ctx := context.Background()
	for _, name := range []string{e.topic, e.dlq} {
		if _, err := e.client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if sc.ackDeadline == 0 {
		sc.ackDeadline = 10 * time.Second
	}
	s := &pubsubpb.Subscription{Name: e.sub, Topic: e.topic, AckDeadlineSeconds: int32(sc.ackDeadline / time.Second),
		EnableMessageOrdering: sc.ordered}
	if sc.retryPolicy {
		s.RetryPolicy = &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second), MaximumBackoff: durationpb.New(time.Minute)}
	}
	if sc.maxDeliveries > 0 {
		s.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.dlq, MaxDeliveryAttempts: int32(sc.maxDeliveries)}
	}
	if _, err := e.client.SubscriptionAdminClient.CreateSubscription(ctx, s); err != nil {
		t.Fatal(err)
	}
	return e
}

// publish publishes data with id as its "event-id" attribute and attrs,
// under key (ordering key, or ""), and returns the message ID.
func (e *env) publish(t testing.TB, id, data, key string, attrs map[string]string) string {
	t.Helper()
	a := map[string]string{}
	if id != "" {
		a[wire.PubSubIDAttribute] = id
	}
	for k, v := range attrs {
		a[k] = v
	}
	return e.srv.PublishOrdered(e.topic, []byte(data), a, key)
}

// messages returns what the server holds in topic, in publish order.
func (e *env) messages(topic string) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range e.srv.Messages() {
		if m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// letters returns the dead-letter topic's messages.
func (e *env) letters() []*pstest.Message { return e.messages(e.dlq) }

// unacked counts the topic's messages never acknowledged.
func (e *env) unacked() int {
	n := 0
	for _, m := range e.messages(e.topic) {
		if m.Acks == 0 {
			n++
		}
	}
	return n
}

// sink returns a Sink to the env's dead-letter topic, stopped when t ends.
func (e *env) sink(t testing.TB) *pubsubdedup.Sink {
	t.Helper()
	s, err := pubsubdedup.NewSink(e.client, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// eventID returns the event ID m carries in its "event-id" attribute.
func eventID(m *pubsub.Message) string { return m.Attributes[wire.PubSubIDAttribute] }

// wrap returns a wrapper reading the "event-id" attribute, in a scope of
// its own, with 3 attempts and a short backoff, observed by fx.
func wrap(t testing.TB, store dedup.Store, fx *adaptertest.Effects, h dedup.Handler[*pubsub.Message], opts ...dedup.Opt) *dedup.Wrapper[*pubsub.Message] {
	t.Helper()
	opts = append([]dedup.Opt{
		dedup.WithScope("billing." + token()),
		dedup.WithMaxAttempts(3),
		dedup.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }),
		dedup.WithObserver(fx.Observe),
		dedup.WithLogger(adaptertest.Logger(t)),
	}, opts...)
	w, err := dedup.Wrap(store, pubsubdedup.Messages(pubsubdedup.WithIDAttribute(wire.PubSubIDAttribute)), h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a Consumer of the env's subscription over w until the end of
// the test.
func (e *env) start(t *testing.T, w *dedup.Wrapper[*pubsub.Message], opts ...pubsubdedup.Opt) *adaptertest.Running {
	t.Helper()
	opts = append([]pubsubdedup.Opt{pubsubdedup.WithShutdownTimeout(time.Second), pubsubdedup.WithLogger(adaptertest.Logger(t))}, opts...)
	c, err := pubsubdedup.NewConsumer(e.client, e.sub, w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	return run
}
