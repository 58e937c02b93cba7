package pubsubdedup_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// A poison message on a subscription with a dead-letter policy (so that
// Pub/Sub counts deliveries, read as attempts) is dead-lettered by the
// wrapper after its 3 attempts, well before the policy's 10, with the
// metadata and origin as attributes beside the original's; it is
// acknowledged, and the server never forwards it itself.
func TestPoisonToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{maxDeliveries: 10})
	store, fx := dedup.NewMemoryStore(), adaptertest.NewEffects()
	w := wrap(t, store, fx, func(_ context.Context, m *pubsub.Message) error {
		fx.Call(eventID(m))
		return errBoom
	}, dedup.WithSink(e.sink(t)))
	run := e.start(t, w)
	id := e.publish(t, "poison-1", `{"n":1}`, "", map[string]string{"trace-id": "t-1"})

	adaptertest.WaitFor(t, deadline, "the poison message dead-lettered", func() bool { return len(e.letters()) > 0 })
	run.StopClean(t)
	adaptertest.WaitFor(t, deadline, "the poison message acknowledged", func() bool { return e.unacked() == 0 })
	letters := e.letters()
	if len(letters) != 1 {
		t.Fatalf("%d letters, want 1", len(letters))
	}
	l := letters[0]
	for k, want := range map[string]string{
		"dedup-reason":                          string(dedup.ReasonHandlerError),
		"dedup-attempts":                        "3",
		"dedup-event-id":                        "poison-1",
		"dedup-scope":                           w.Scope(),
		"dedup-cause":                           errBoom.Error(),
		pubsubdedup.OriginMessageIDAttribute:    id,
		pubsubdedup.OriginSubscriptionAttribute: e.sub,
		"trace-id":                              "t-1",
		"event-id":                              "poison-1",
	} {
		if got := l.Attributes[k]; got != want {
			t.Errorf("letter's %s = %q, want %q", k, got, want)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, l.Attributes[pubsubdedup.OriginPublishTimeAttribute]); err != nil {
		t.Errorf("letter's publish time: %v", err)
	}
	if string(l.Data) != `{"n":1}` {
		t.Errorf("letter's data %q, want the original's", l.Data)
	}
	if n := fx.Calls("poison-1"); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
	if m := e.srv.Message(id); m.Deliveries != 3 {
		t.Errorf("the message was delivered %d times, want 3", m.Deliveries)
	}
}

// A message without the event ID attribute is never handled: it is
// dead-lettered with reason invalid-id and an error naming the attribute,
// and acknowledged.
func TestMissingIDAttribute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{})
	store, fx := dedup.NewMemoryStore(), adaptertest.NewEffects()
	w := wrap(t, store, fx, func(_ context.Context, m *pubsub.Message) error {
		fx.Call(m.ID)
		return nil
	}, dedup.WithSink(e.sink(t)))
	e.start(t, w)
	id := e.publish(t, "", "no id", "", map[string]string{"other": "x"})

	adaptertest.WaitFor(t, deadline, "the message dead-lettered and acknowledged", func() bool {
		return len(e.letters()) == 1 && e.unacked() == 0
	})
	l := e.letters()[0]
	if r := l.Attributes["dedup-reason"]; r != string(dedup.ReasonInvalidID) {
		t.Errorf("reason %q, want %q", r, dedup.ReasonInvalidID)
	}
	if msg := l.Attributes["dedup-error"]; !strings.Contains(msg, `"event-id"`) {
		t.Errorf("dedup-error %q, want it to name the attribute", msg)
	}
	if l.Attributes[pubsubdedup.OriginMessageIDAttribute] != id || l.Attributes["other"] != "x" || string(l.Data) != "no id" {
		t.Errorf("letter %v %q, want the original with its message ID", l.Attributes, l.Data)
	}
	if n := fx.CallCount(); n != 0 {
		t.Errorf("handler ran %d times, want never", n)
	}
}

// On an ordered subscription, the messages of one ordering key are handled
// in publish order, one at a time, keys in parallel; a poison message's
// letter keeps its ordering key.
func TestOrderingKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{ordered: true})
	store, fx := dedup.NewMemoryStore(), adaptertest.NewEffects()
	var mu sync.Mutex
	seen := map[string][]string{} // by key
	running := map[string]bool{}
	var overlap []string
	w := wrap(t, store, fx, func(ctx context.Context, m *pubsub.Message) error {
		id := eventID(m)
		fx.Call(id)
		if strings.HasPrefix(id, "poison") {
			return dedup.Permanent(errBoom)
		}
		mu.Lock()
		if running[m.OrderingKey] {
			overlap = append(overlap, id)
		}
		running[m.OrderingKey] = true
		mu.Unlock()
		time.Sleep(time.Millisecond) // give another message of the key a chance to overlap
		mu.Lock()
		running[m.OrderingKey] = false
		seen[m.OrderingKey] = append(seen[m.OrderingKey], id)
		mu.Unlock()
		fx.Apply(id)
		return nil
	}, dedup.WithSink(e.sink(t)))
	e.start(t, w)

	const keys, per = 3, 15
	want := map[string][]string{}
	for i := range per {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			id := fmt.Sprintf("%s-%02d", key, i)
			want[key] = append(want[key], id)
			e.publish(t, id, id, key, nil)
		}
	}
	e.publish(t, "poison-1", "poison", "k-poison", nil)

	adaptertest.WaitFor(t, deadline, "every message handled and the poison one dead-lettered", func() bool {
		return fx.Applied() == keys*per && len(e.letters()) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	for key, ids := range want {
		if !slices.Equal(seen[key], ids) {
			t.Errorf("key %s handled in the order %v, want %v", key, seen[key], ids)
		}
	}
	if len(overlap) > 0 {
		t.Errorf("handled while another message of their key ran: %v", overlap)
	}
	if l := e.letters()[0]; l.OrderingKey != "k-poison" || l.Attributes["dedup-reason"] != string(dedup.ReasonPermanent) {
		t.Errorf("letter's ordering key %q, reason %q; want k-poison, %s", l.OrderingKey, l.Attributes["dedup-reason"], dedup.ReasonPermanent)
	}
}

// A retry is nacked at once when the subscription has a retry policy (the
// server's backoff applies): it runs again well within the wrapper's
// backoff of ten minutes. Without one it is held for the wrapper's backoff,
// here 3 s, before it is nacked: it runs again no sooner.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		policy  bool
		backoff time.Duration
	}{{true, 10 * time.Minute}, {false, 3 * time.Second}} {
		e := newEnv(t, subConfig{retryPolicy: c.policy})
		fx := adaptertest.NewEffects()
		var mu sync.Mutex
		var calls []time.Time
		w := wrap(t, dedup.NewMemoryStore(), fx, func(_ context.Context, m *pubsub.Message) error {
			mu.Lock()
			calls = append(calls, time.Now())
			mu.Unlock()
			if fx.Call(eventID(m)) == 1 {
				return errBoom
			}
			fx.Apply(eventID(m))
			return nil
		}, dedup.WithSink(e.sink(t)), dedup.WithBackoff(func(int) time.Duration { return c.backoff }))
		run := e.start(t, w)
		e.publish(t, "retry-1", "x", "", nil)
		adaptertest.WaitFor(t, deadline, "the retry run again and applied", func() bool {
			return fx.Count("retry-1") == 1 && e.unacked() == 0
		})
		run.StopClean(t)
		mu.Lock()
		gap := calls[1].Sub(calls[0])
		mu.Unlock()
		switch {
		case fx.Calls("retry-1") != 2:
			t.Errorf("retry policy %t: handler ran %d times, want 2", c.policy, fx.Calls("retry-1"))
		case c.policy && gap >= c.backoff:
			t.Errorf("with a retry policy the retry ran %v after the failure, want it nacked at once", gap)
		case !c.policy && gap < c.backoff:
			t.Errorf("without a retry policy the retry ran %v after the failure, want it held for the backoff %v", gap, c.backoff)
		}
	}
}
