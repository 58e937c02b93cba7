package amqpreliability_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashSizing sizes the campaign: about two minutes with -race on a busy
// two-core machine; DEDUP_SOAK=1 runs a long one.
func crashSizing() crashtest.Size {
	return crashtest.Sized(crashtest.Size{Events: 2000, Procs: 3, Produce: 20 * time.Second, Chaos: 50 * time.Second},
		crashtest.Size{Events: 30000, Procs: 4, Produce: 5 * time.Minute, Chaos: 8 * time.Minute})
}

const crashMaxAttempts = 4

// TestAMQPCrashCampaign runs worker processes of one quorum queue with the
// transactional inbox on PostgreSQL and kills them with SIGKILL at random
// moments (mid-batch, mid-handler, mid-transaction) while about 30% of the
// events are published twice and 2% are poison, restarting each killed
// worker. At the end every good event has exactly one effect (the inbox
// commits the effect with its record: applied twice must be 0), every poison
// event is in the dead-letter queue with its metadata and has no effect, and
// the queue is empty.
func TestAMQPCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	url := testenv.RabbitMQURL(t)
	conn := testenv.RabbitMQ(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The producer has a channel of its own: amqp091-go does not keep a
	// publish's frames together against another method on its channel
	// (depth's queue.declare), and RabbitMQ closes the connection on
	// UNEXPECTED_FRAME when they interleave.
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	run := crashtest.RunID()
	queue := "amqprel-" + run
	for _, q := range []string{queue, queue + ".dlq"} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}
	cfg := workerConfig{
		URL: url, Queue: queue,
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		Table:        "amqprel_records_" + run,
		EffectsTable: crashtest.EffectsTable(t, pool, "amqprel_effects_"+run),
		Scope:        "amqprel-" + run,
		MaxAttempts:  crashMaxAttempts,
		Prefetch:     40,
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
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
	produced := make(chan error, 1)
	go func() { produced <- publishOver(pub, queue, messages, size.Produce) }()
	producing := true
	depth := func(q string) int {
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			t.Fatal(err)
		}
		return st.Messages
	}
	done := func() bool {
		if producing {
			select {
			case err := <-produced:
				if err != nil {
					t.Fatalf("publishing: %v", err)
				}
				producing = false
			default:
				return false
			}
		}
		return depth(queue) == 0 && crashtest.Count(t, pool, cfg.EffectsTable, "effect") == good && depth(queue+".dlq") >= poison
	}

	f.Chaos(rng, start, size.Chaos, done, func() {
		t.Logf("%v: kills=%d effects=%d/%d queue=%d", time.Since(start).Round(time.Second), f.Kills(),
			crashtest.Count(t, pool, cfg.EffectsTable, "effect"), good, depth(queue))
	})
	// Settling is bounded by its progress (crashtest.Stall), not by a fixed
	// time: a loaded machine makes it slower, not wrong.
	applied := func() int { return crashtest.Count(t, pool, cfg.EffectsTable, "effect") }
	crashtest.Await(t, "every event settled after the chaos", done,
		func() int { return applied() + depth(queue+".dlq") - depth(queue) }, func() string {
			return fmt.Sprintf("effects %d/%d, queue %d, letters %d/%d",
				applied(), good, depth(queue), depth(queue+".dlq"), poison)
		})
	f.Finish()

	letters := map[string]int{}
	for {
		d, ok, err := ch.Get(queue+".dlq", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		id, _ := d.Headers["dedup-event-id"].(string)
		letters[id]++
		if !crashtest.PoisonReason(d.Headers["dedup-reason"]) || d.Headers["dedup-origin-queue"] != queue {
			t.Errorf("letter %s: reason %v, origin %v", id, d.Headers["dedup-reason"], d.Headers["dedup-origin-queue"])
		}
	}
	crashtest.Verdict(t, "RabbitMQ", pool, cfg.EffectsTable, events, len(messages), letters, f, time.Since(start))
}

// publishOver publishes messages evenly over d, each confirmed.
func publishOver(ch *amqp.Channel, queue string, messages []crashtest.Event, d time.Duration) error {
	const batch = 50
	pace := d / time.Duration((len(messages)+batch-1)/batch)
	for from := 0; from < len(messages); from += batch {
		var confirms []*amqp.DeferredConfirmation
		for _, e := range messages[from:min(from+batch, len(messages))] {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, amqp.Publishing{
				MessageId: e.ID, DeliveryMode: amqp.Persistent,
				Body: fmt.Appendf(nil, `{"event":%q,"poison":%t}`, e.ID, e.Poison)})
			if err != nil {
				return err
			}
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			if !dc.Wait() {
				return fmt.Errorf("publish to %s not confirmed", queue)
			}
		}
		time.Sleep(pace)
	}
	return nil
}
