package pubsubdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// A configuration that cannot work is refused with dedup.ErrConfig: by
// NewConsumer, or by Run for a subscription that does not exist.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{})
	w := wrap(t, dedup.NewMemoryStore(), adaptertest.NewEffects(), func(context.Context, *pubsub.Message) error { return nil },
		dedup.WithSink(e.sink(t)))
	for name, mk := range map[string]func() (*pubsubdedup.Consumer, error){
		"nil client":      func() (*pubsubdedup.Consumer, error) { return pubsubdedup.NewConsumer(nil, e.sub, w) },
		"no subscription": func() (*pubsubdedup.Consumer, error) { return pubsubdedup.NewConsumer(e.client, "", w) },
		"nil wrapper":     func() (*pubsubdedup.Consumer, error) { return pubsubdedup.NewConsumer(e.client, e.sub, nil) },
		"no workers": func() (*pubsubdedup.Consumer, error) {
			return pubsubdedup.NewConsumer(e.client, e.sub, w, pubsubdedup.WithWorkers(0))
		},
		"deadline too low": func() (*pubsubdedup.Consumer, error) {
			return pubsubdedup.NewConsumer(e.client, e.sub, w, pubsubdedup.WithAckDeadline(time.Second))
		},
		"no extension": func() (*pubsubdedup.Consumer, error) {
			return pubsubdedup.NewConsumer(e.client, e.sub, w, pubsubdedup.WithMaxExtension(0))
		},
		"nil logger": func() (*pubsubdedup.Consumer, error) {
			return pubsubdedup.NewConsumer(e.client, e.sub, w, pubsubdedup.WithLogger(nil))
		},
	} {
		if c, err := mk(); !errors.Is(err, dedup.ErrConfig) || c != nil {
			t.Errorf("%s: %v, want dedup.ErrConfig", name, err)
		}
	}
	for name, mk := range map[string]func() (*pubsubdedup.Sink, error){
		"sink nil client": func() (*pubsubdedup.Sink, error) { return pubsubdedup.NewSink(nil, e.dlq) },
		"sink no topic":   func() (*pubsubdedup.Sink, error) { return pubsubdedup.NewSink(e.client, "") },
	} {
		if s, err := mk(); !errors.Is(err, dedup.ErrConfig) || s != nil {
			t.Errorf("%s: %v, want dedup.ErrConfig", name, err)
		}
	}
	c, err := pubsubdedup.NewConsumer(e.client, "missing", w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := c.Run(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("Run on a missing subscription: %v, want an error at once", err)
	}
}

// A handler running past the ack deadline keeps its message: the client
// extends the deadline by itself, by the subscription's ack deadline each
// time, and the server delivers the message once.
func TestLeaseExtension(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{ackDeadline: 10 * time.Second})
	fx := adaptertest.NewEffects()
	hold := 25 * time.Second
	w := wrap(t, dedup.NewMemoryStore(), fx, func(ctx context.Context, m *pubsub.Message) error {
		fx.Call(eventID(m))
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return ctx.Err()
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithSink(e.sink(t)))
	run := e.start(t, w)
	id := e.publish(t, "slow-1", "slow", "", nil)
	adaptertest.WaitFor(t, deadline+hold, "the slow event applied and acknowledged", func() bool {
		return fx.Count("slow-1") == 1 && e.unacked() == 0
	})
	run.StopClean(t)
	m := e.srv.Message(id)
	if m.Deliveries != 1 || fx.Calls("slow-1") != 1 {
		t.Errorf("delivered %d times, handled %d; want once each", m.Deliveries, fx.Calls("slow-1"))
	}
	extended := 0
	for _, ma := range m.Modacks {
		if ma.AckDeadline == 10 {
			extended++
		}
	}
	if extended < 2 {
		t.Errorf("modacks %+v, want the deadline extended by 10 s at least twice over %v", m.Modacks, hold)
	}
}

// While the dead-letter topic is missing, a poison message is not
// acknowledged (the letter was not stored) and Health reports the sink's
// outage; once the topic exists, the letter is published and the message
// acknowledged.
func TestDeadLetterTopicMissing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{})
	ctx := context.Background()
	missing := e.dlq + "-later"
	sink, err := pubsubdedup.NewSink(e.client, missing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Stop)
	store, fx := dedup.NewMemoryStore(), adaptertest.NewEffects()
	w := wrap(t, store, fx, func(_ context.Context, m *pubsub.Message) error {
		fx.Call(eventID(m))
		return dedup.Permanent(errBoom)
	}, dedup.WithSink(sink), dedup.WithOutageThreshold(300*time.Millisecond))
	c, err := pubsubdedup.NewConsumer(e.client, e.sub, w, pubsubdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	e.publish(t, "bad-1", "poison", "", nil)
	adaptertest.WaitFor(t, deadline, "Health reporting the sink's outage", func() bool { return errors.Is(c.Health(), dedup.ErrOutage) })
	if n := e.unacked(); n != 1 {
		t.Errorf("%d messages unacknowledged while the letter cannot be stored, want 1", n)
	}
	if rec, err := store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: "bad-1"}); err == nil && rec.Status == dedup.StatusFailedFinal {
		t.Errorf("record FAILED_FINAL before its letter was stored")
	}

	if _, err := e.client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: missing}); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, deadline, "the letter stored and the message acknowledged", func() bool {
		return len(e.messages(missing)) == 1 && e.unacked() == 0
	})
	adaptertest.WaitFor(t, deadline, "Health nil again", func() bool { return c.Health() == nil })
	run.StopClean(t)
	if rec, err := store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: "bad-1"}); err != nil || rec.Status != dedup.StatusFailedFinal {
		t.Errorf("record %+v (%v), want FAILED_FINAL", rec, err)
	}
}
