package redisstreamsreliability_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
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
	// crashClaimIdle is the consumers' claim idle time: a killed worker's
	// entries are taken over this long after its last heartbeat.
	crashClaimIdle = 2 * time.Second
)

// TestRedisStreamsCrashCampaign runs worker processes of one consumer
// group, each a consumer of its own name, with the transactional inbox on
// PostgreSQL and kills them with SIGKILL at random moments (mid-batch,
// mid-handler, mid-transaction) while about 30% of the events are added
// twice and 2% are poison, restarting each killed worker under a new name:
// the entries a killed worker held are taken over with XAUTOCLAIM. At the
// end every good event has exactly one effect (the inbox commits the
// effect with its record: applied twice must be 0), every poison event has
// one letter in the dead-letter stream with its metadata and no effect,
// and the group has nothing pending.
func TestRedisStreamsCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	run := crashtest.RunID()
	token := strings.ToLower(run)
	ctx := context.Background()
	stream := "redisrel:" + token
	dlq := stream + redisstreamdedup.DefaultDLQSuffix
	if err := rdb.XGroupCreateMkStream(ctx, stream, "workers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), stream, dlq) })
	cfg := workerConfig{
		Addr: rdb.Options().Addr, Stream: stream, Group: "workers",
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		Table:        "redisrel_records_" + token,
		EffectsTable: crashtest.EffectsTable(t, pool, "redisrel_effects_"+token),
		Scope:        "redisrel-" + run,
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
	go func() { produced <- addOver(rdb, stream, messages, size.Produce) }()
	producing := true
	// pending is what the group has not settled: entries not yet
	// delivered, or delivered and not acknowledged (given back ones
	// waiting out their delay included).
	pending := func() int {
		groups, err := rdb.XInfoGroups(ctx, stream).Result()
		if err != nil || len(groups) != 1 {
			t.Fatalf("groups of %s: %v (%v)", stream, groups, err)
		}
		undelivered, err := rdb.XRange(ctx, stream, "("+groups[0].LastDeliveredID, "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(groups[0].Pending) + len(undelivered)
	}
	letterCount := func() int {
		n, err := rdb.XLen(ctx, dlq).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	done := func() bool {
		if producing {
			select {
			case err := <-produced:
				if err != nil {
					t.Fatalf("adding: %v", err)
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
	entries, err := rdb.XRange(ctx, dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range entries {
		id, _ := l.Values["dedup-event-id"].(string)
		letters[id]++
		if !crashtest.PoisonReason(l.Values["dedup-reason"]) || l.Values["dedup-origin-stream"] != stream {
			t.Errorf("letter %s: reason %q, origin stream %q", id, l.Values["dedup-reason"], l.Values["dedup-origin-stream"])
		}
	}
	for id, n := range letters {
		if n > 1 {
			t.Errorf("poison event %s has %d letters, want one (a letter sent again is added once)", id, n)
		}
	}
	crashtest.Verdict(t, "Redis Streams", pool, cfg.EffectsTable, events, len(messages), letters, f, time.Since(start))
}

// addOver adds messages evenly over d, 50 per pipeline, the event ID in
// the "id" field.
func addOver(rdb *redis.Client, stream string, messages []crashtest.Event, d time.Duration) error {
	const batch = 50
	pace := d / time.Duration((len(messages)+batch-1)/batch)
	for from := 0; from < len(messages); from += batch {
		ctx, cancel := context.WithTimeout(context.Background(), crashtest.Stall)
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range messages[from:min(from+batch, len(messages))] {
				p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
					redisstreamdedup.DefaultIDField, e.ID,
					redisstreamdedup.DefaultPayloadField, fmt.Sprintf(`{"event":%q,"poison":%t}`, e.ID, e.Poison),
				}})
			}
			return nil
		})
		cancel()
		if err != nil {
			return fmt.Errorf("add to %s: %w", stream, err)
		}
		time.Sleep(pace)
	}
	return nil
}
