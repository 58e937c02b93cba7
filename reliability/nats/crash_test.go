package natsreliability_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashSizing sizes the campaign: about a minute with -race on a busy
// two-core machine; DEDUP_SOAK=1 runs a long one.
func crashSizing() crashtest.Size {
	return crashtest.Sized(crashtest.Size{Events: 2000, Procs: 3, Produce: 20 * time.Second, Chaos: 50 * time.Second},
		crashtest.Size{Events: 30000, Procs: 4, Produce: 5 * time.Minute, Chaos: 8 * time.Minute})
}

const (
	crashMaxAttempts = 4
	// crashAckWait is the durable consumer's AckWait: a killed worker's
	// messages are delivered again this long after its last heartbeat.
	crashAckWait = 2 * time.Second
)

// TestNATSCrashCampaign runs worker processes of one durable JetStream pull
// consumer with the transactional inbox on PostgreSQL and kills them with
// SIGKILL at random moments (mid-batch, mid-handler, mid-transaction) while
// about 30% of the events are published twice and 2% are poison,
// restarting each killed worker. At the end every good event has exactly
// one effect (the inbox commits the effect with its record: applied twice
// must be 0), every poison event is in the dead-letter stream with its
// metadata and has no effect, and the consumer has nothing pending.
func TestNATSCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	url := testenv.NATSURL(t)
	_, js := testenv.NATS(t)
	pool := testenv.Postgres(t)
	run := crashtest.RunID()
	token := strings.ToLower(run)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NREL_" + run, Subjects: []string{token + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NRELDLQ_" + run, Subjects: []string{"dlq." + token + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), "NREL_"+run)
		_ = js.DeleteStream(context.Background(), "NRELDLQ_"+run)
	})
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: crashAckWait, MaxDeliver: -1})
	if err != nil {
		t.Fatal(err)
	}
	subject := token + ".orders"
	cfg := workerConfig{
		URL: url, Stream: "NREL_" + run, Durable: "workers",
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		Table:        "natsrel_records_" + run,
		EffectsTable: crashtest.EffectsTable(t, pool, "natsrel_effects_"+run),
		Scope:        "natsrel-" + run,
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
	produced := make(chan error, 1)
	go func() { produced <- publishOver(js, subject, messages, size.Produce) }()
	producing := true
	// pending is what the consumer has not settled: not yet delivered, or
	// delivered and not acknowledged (naked ones waiting out their delay
	// included).
	pending := func() int {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return int(info.NumPending) + info.NumAckPending
	}
	letterCount := func() int {
		info, err := dlq.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return int(info.State.Msgs)
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
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get("dedup-event-id")
		letters[id]++
		if !crashtest.PoisonReason(m.Header.Get("dedup-reason")) || m.Header.Get("dedup-origin-stream") != cfg.Stream {
			t.Errorf("letter %s: reason %q, origin stream %q", id, m.Header.Get("dedup-reason"), m.Header.Get("dedup-origin-stream"))
		}
	}
	crashtest.Verdict(t, "NATS", pool, cfg.EffectsTable, events, len(messages), letters, f, time.Since(start))
}

// publishOver publishes messages evenly over d, each acknowledged by the
// stream, the event ID in the event-id header.
func publishOver(js jetstream.JetStream, subject string, messages []crashtest.Event, d time.Duration) error {
	const batch = 50
	pace := d / time.Duration((len(messages)+batch-1)/batch)
	for from := 0; from < len(messages); from += batch {
		var acks []jetstream.PubAckFuture
		for _, e := range messages[from:min(from+batch, len(messages))] {
			msg := &nats.Msg{Subject: subject, Header: nats.Header{idHeader: []string{e.ID}},
				Data: fmt.Appendf(nil, `{"event":%q,"poison":%t}`, e.ID, e.Poison)}
			ack, err := js.PublishMsgAsync(msg)
			if err != nil {
				return err
			}
			acks = append(acks, ack)
		}
		for _, a := range acks {
			select {
			case <-a.Ok():
			case err := <-a.Err():
				return err
			case <-time.After(crashtest.Stall):
				return fmt.Errorf("publish to %s: no acknowledgement within %v", subject, crashtest.Stall)
			}
		}
		time.Sleep(pace)
	}
	return nil
}
