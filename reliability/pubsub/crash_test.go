package pubsubreliability_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashSizing sizes the campaign: about a minute with -race on a busy
// two-core machine; DEDUP_SOAK=1 runs a long one.
func crashSizing() crashtest.Size {
	return crashtest.Sized(crashtest.Size{Events: 1000, Procs: 3, Produce: 10 * time.Second, Chaos: 25 * time.Second},
		crashtest.Size{Events: 20000, Procs: 4, Produce: 5 * time.Minute, Chaos: 8 * time.Minute})
}

const (
	crashMaxAttempts = 4
	// crashAckDeadline is the subscription's ack deadline, Pub/Sub's
	// shortest: a killed worker's messages are delivered again this long
	// after the client's last extension.
	crashAckDeadline = 10 * time.Second
	project          = "pubsubrel"
)

// TestPubSubCrashCampaign runs worker processes of one Pub/Sub subscription
// with the transactional inbox on PostgreSQL and kills them with SIGKILL at
// random moments (mid-handler, mid-transaction, between a letter and its
// acknowledgement) while about 30% of the events are published twice and
// 2% are poison, restarting each killed worker. The server is pstest, run
// by this (parent) process, which is never killed; the workers reach it
// over gRPC. At the end every good event has exactly one effect (the inbox
// commits the effect with its record: applied twice must be 0), every
// poison event is in the dead-letter topic with its metadata and has no
// effect, and every message is acknowledged.
func TestPubSubCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	pool := testenv.Postgres(t)
	run := crashtest.RunID()
	token := strings.ToLower(run)
	ctx := context.Background()
	srv, admin := pubsubenv.Start(t, project)
	topic := "projects/" + project + "/topics/orders-" + token
	dlqTopic := "projects/" + project + "/topics/orders-dlq-" + token
	sub := "projects/" + project + "/subscriptions/workers-" + token
	for _, name := range []string{topic, dlqTopic} {
		if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: sub, Topic: topic, AckDeadlineSeconds: int32(crashAckDeadline / time.Second)}); err != nil {
		t.Fatal(err)
	}
	cfg := workerConfig{
		Addr: srv.Addr, Project: project, Subscription: sub, DLQTopic: dlqTopic,
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		Table:        "pubsubrel_records_" + run,
		EffectsTable: crashtest.EffectsTable(t, pool, "pubsubrel_effects_"+run),
		Scope:        "pubsubrel-" + run,
		MaxAttempts:  crashMaxAttempts,
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+cfg.Table) })

	events, messages := crashtest.Plan(size.Events, rng)
	poison := crashtest.Poison(events)
	good := len(events) - poison

	start := time.Now()
	f := crashtest.NewFleet(t, workerEnv, size.Procs, func(_ int, name string) any {
		c := cfg
		c.Name = name
		return c
	})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		publishOver(srv, topic, messages, size.Produce)
	}()
	producing := true
	// pending is what the consumers have not settled: messages never
	// acknowledged.
	pending := func() int {
		n := 0
		for _, m := range messagesOf(srv, topic) {
			if m.Acks == 0 {
				n++
			}
		}
		return n
	}
	letterCount := func() int { return len(messagesOf(srv, dlqTopic)) }
	done := func() bool {
		if producing {
			select {
			case <-produced:
				producing = false
			default:
				return false
			}
		}
		return pending() == 0 && crashtest.Count(t, pool, cfg.EffectsTable, "effect") == good && letterCount() >= poison
	}

	f.Chaos(rng, start, size.Chaos, done, func() {
		t.Logf("%v: kills=%d effects=%d/%d pending=%d", time.Since(start).Round(time.Second), f.Kills(),
			crashtest.Count(t, pool, cfg.EffectsTable, "effect"), good, pending())
	})
	// Settling is bounded by its progress (crashtest.Stall), not by a fixed
	// time: a loaded machine makes it slower, not wrong.
	applied := func() int { return crashtest.Count(t, pool, cfg.EffectsTable, "effect") }
	crashtest.Await(t, "every event settled after the chaos", done,
		func() int { return applied() + letterCount() - pending() }, func() string {
			return fmt.Sprintf("effects %d/%d, pending %d, letters %d/%d",
				applied(), good, pending(), letterCount(), poison)
		})
	f.Finish()

	letters := map[string]int{}
	for _, m := range messagesOf(srv, dlqTopic) {
		id := m.Attributes["dedup-event-id"]
		letters[id]++
		if !crashtest.PoisonReason(m.Attributes["dedup-reason"]) || m.Attributes[pubsubdedup.OriginSubscriptionAttribute] != sub {
			t.Errorf("letter %s: reason %q, origin subscription %q", id, m.Attributes["dedup-reason"],
				m.Attributes[pubsubdedup.OriginSubscriptionAttribute])
		}
	}
	crashtest.Verdict(t, "Pub/Sub", pool, cfg.EffectsTable, events, len(messages), letters, f, time.Since(start))
}

// messagesOf returns the messages the server holds in topic.
func messagesOf(srv *pstest.Server, topic string) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range srv.Messages() {
		if m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// publishOver publishes messages evenly over d, the event ID in the
// event-id attribute, straight into the in-process server.
func publishOver(srv *pstest.Server, topic string, messages []crashtest.Event, d time.Duration) {
	const batch = 50
	pace := d / time.Duration((len(messages)+batch-1)/batch)
	for from := 0; from < len(messages); from += batch {
		for _, e := range messages[from:min(from+batch, len(messages))] {
			srv.Publish(topic, fmt.Appendf(nil, `{"event":%q,"poison":%t}`, e.ID, e.Poison), map[string]string{idAttribute: e.ID})
		}
		time.Sleep(pace)
	}
}
