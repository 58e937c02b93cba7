package main

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/pubsubenv"
)

// pubsubTopics is a test's pstest server with an origin topic and its
// subscription, and a dead-letter topic and its subscription.
type pubsubTopics struct {
	srv                          *pstest.Server
	client                       *pubsub.Client
	topic, sub, dlqTopic, dlqSub string // full names
}

func newPubSubTopics(t *testing.T) *pubsubTopics {
	t.Helper()
	ctx := context.Background()
	srv, client := pubsubenv.Start(t, "shop")
	tok := strings.ToLower(rand.Text()[:8])
	p := &pubsubTopics{srv: srv, client: client,
		topic: "projects/shop/topics/orders-" + tok, sub: "projects/shop/subscriptions/app-" + tok,
		dlqTopic: "projects/shop/topics/dlq-" + tok, dlqSub: "projects/shop/subscriptions/dlq-" + tok}
	for _, name := range []string{p.topic, p.dlqTopic} {
		_, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name})
		require.NoError(t, err)
	}
	for sub, topic := range map[string]string{p.sub: p.topic, p.dlqSub: p.dlqTopic} {
		_, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 10})
		require.NoError(t, err)
	}
	return p
}

// letters returns the event IDs of the dead-letter topic's letters not
// acknowledged yet, in order.
func (p *pubsubTopics) letters() []string {
	var ids []string
	for _, m := range p.srv.Messages() {
		if m.Topic == p.dlqTopic && m.Acks == 0 {
			ids = append(ids, m.Attributes["dedup-event-id"])
		}
	}
	return ids
}

// A Pub/Sub dead letter goes back to the topic of the subscription it came
// from once the bug is fixed, with the original's message ID (the event ID
// here) and ordering key: a dry run lists it and leaves the letters
// available; -yes resets its record, the consumer runs it exactly once and
// the letter is acknowledged; -reason and the loop guard leave the other
// letters until a run chooses them.
func TestRedrivePubSub(t *testing.T) {
	ctx := context.Background()
	p := newPubSubTopics(t)
	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("pubsub-redrive", "apply")
	sink, err := pubsubdedup.NewSink(p.client, p.dlqTopic)
	require.NoError(t, err)
	t.Cleanup(sink.Stop)
	h := newRedriven()
	msgs := pubsubdedup.Messages()
	keys := map[string]string{}
	w, err := dedup.Wrap(store, msgs, func(_ context.Context, m *pubsub.Message) error {
		id, _ := msgs.EventID(m)
		keys[id] = m.OrderingKey
		return h.handle(id, string(m.Data), m.Attributes[redriveCountHeader])
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithObserver(h.fx.Observe), dedup.WithLogger(quietLog()))
	require.NoError(t, err)
	c, err := pubsubdedup.NewConsumer(p.client, p.sub, w, pubsubdedup.WithLogger(quietLog()), pubsubdedup.WithWorkers(1))
	require.NoError(t, err)
	running := adaptertest.Start(t, c.Run)

	// The poison message, dead-lettered by the consumer.
	p1 := p.srv.PublishOrdered(p.topic, []byte("v-p1"), nil, "order-1")
	adaptertest.WaitFor(t, redriveWait, "p1 dead-lettered", func() bool { return h.fx.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	// Two more letters of the same subscription: one redriven thrice
	// already, one of another reason.
	park := func(id string, reason dedup.Reason, headers ...dedup.Header) {
		parkedRecord(t, store, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, sink.Send(ctx, dedup.DeadLetter{Payload: []byte("v-" + id), Reason: reason, Error: "bug",
			Attempts: 1, EventID: id, Scope: scope, LastFailure: time.Now(), Headers: headers,
			Origin: dedup.Origin{Group: p.sub, MessageID: id}}))
	}
	park("looping", dedup.ReasonPermanent, dedup.Header{Key: redriveCountHeader, Value: []byte("3")})
	park("other", dedup.ReasonHandlerError)
	letters := []string{p1, "looping", "other"}
	require.Equal(t, letters, p.letters())

	redrive := func(extra ...string) string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"redrive", "pubsub", "-project", "shop", "-endpoint", p.srv.Addr,
			"-subscription", p.dlqSub, "-postgres", dsn, "-table", table}, extra...)...)
		require.Equal(t, 0, code, errOut)
		return out
	}
	out := redrive()
	require.Contains(t, out, "3 dead letters read, would send back 2, skipped 1")
	require.Contains(t, out, p1+" (permanent, message ")
	require.Contains(t, out, "back to topic "+p.topic+" (subscription "+p.sub+")")
	require.Contains(t, out, "redriven 3 times already")
	require.Equal(t, letters, p.letters(), "a dry run acknowledges no letter")
	rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: p1})
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status, "a dry run resets nothing")

	h.fixed.Store(true) // the bug is fixed and deployed
	out = redrive("-yes", "-reason", "permanent")
	require.Contains(t, out, "3 dead letters read, sent back 1, skipped 2")
	require.Contains(t, out, "redriven 3 times already (-max-redrives)")
	require.Contains(t, out, "reason handler-error not chosen (-reason)")
	adaptertest.WaitFor(t, redriveWait, "p1 run again", func() bool { return h.fx.Count(p1) == 1 })
	require.Equal(t, []string{"looping", "other"}, p.letters(), "the skipped letters stay")

	out = redrive("-yes")
	require.Contains(t, out, "2 dead letters read, sent back 1, skipped 1")
	adaptertest.WaitFor(t, redriveWait, "other run again", func() bool { return h.fx.Count("other") == 1 })
	out = redrive("-yes", "-max-redrives", "5")
	require.Contains(t, out, "1 dead letters read, sent back 1, skipped 0")
	adaptertest.WaitFor(t, redriveWait, "looping run again", func() bool { return h.fx.Count("looping") == 1 })

	running.StopClean(t)
	require.Empty(t, p.letters(), "every letter acknowledged")
	require.Equal(t, "order-1", keys[p1], "the ordering key kept")
	for id, want := range map[string][2]string{p1: {"v-p1", "1"}, "other": {"v-other", "1"}, "looping": {"v-looping", "4"}} {
		require.Equal(t, 1, h.fx.Calls(id), "%s ran once", id)
		require.Equal(t, want, h.saw(id), "%s: its body, and its redrive count", id)
		rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status, id)
	}
	out = redrive("-yes")
	require.Contains(t, out, "0 dead letters read, sent back 0, skipped 0")
}

// A dead-letter subscription that does not exist is a clear failure.
func TestRedrivePubSubUnknownSubscription(t *testing.T) {
	p := newPubSubTopics(t)
	dsn, table, _, _ := postgresTable(t)
	code, _, errOut := cli(t, "redrive", "pubsub", "-project", "shop", "-endpoint", p.srv.Addr, "-subscription", "nope",
		"-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "subscription projects/shop/subscriptions/nope")
	require.Contains(t, errOut, "NotFound")
}
