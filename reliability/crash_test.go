package reliability_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashCampaign sizes a crash campaign.
type crashCampaign struct {
	events     int
	crashers   int           // events whose handler kills its worker (claim mode)
	produceFor time.Duration // production is spread over this long
	chaosFor   time.Duration // workers are killed during this long, at most
	converge   time.Duration // then the group must keep moving: the longest it may stand still
}

func crashSize() crashCampaign {
	if soak() {
		return crashCampaign{events: 200_000, crashers: 5, produceFor: 4 * time.Minute, chaosFor: 5 * time.Minute, converge: 5 * time.Minute}
	}
	return crashCampaign{events: 20_000, crashers: 1, produceFor: 4 * time.Second, chaosFor: 25 * time.Second, converge: 150 * time.Second}
}

// Three consumer processes of one group, killed with SIGKILL at random
// moments and restarted, consume 20,000 events of which 30% are sent twice
// and 2% are poison. At the end every good event has its effect, every
// poison event is in the dead-letter topic without an effect, and the
// group's committed offsets reach the end of every partition.
//
// In the transactional inbox the effect commits with the dedup record, so
// no event may be applied twice: batched (the events of a fetch share
// transactions) and with a transaction per event (inbox-per-event). In claim mode the effect commits on its
// own before the record is completed: a kill between the two re-runs the
// effect (the claim-mode crash window, RELIABILITY.md); the campaign counts
// and reports those instead of failing on them. Claim mode also gets a
// crasher, an event whose handler kills its own worker: each must end in the
// dead-letter topic with reason crash-loop after MaxAttempts deaths. A good
// event that was in flight in the same worker at each of those deaths is
// parked with it (crash-loop collateral, RELIABILITY.md): reported, and
// never lost. The inbox gets no crashers: it cannot count their attempts.
func TestKafkaCrashCampaign(t *testing.T) {
	for _, mode := range []string{modeInbox, modeInboxPerEvent, modeClaim} {
		t.Run(mode, func(t *testing.T) { runCrashCampaign(t, mode, crashSize()) })
	}
}

func runCrashCampaign(t *testing.T, mode string, size crashCampaign) {
	began := time.Now()
	pool := testenv.Postgres(t)
	k := newKafka(t, 6)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	crashers := 0
	if mode == modeClaim {
		crashers = size.crashers
	}
	p := newPlan(k.topic, "ev", size.events, 0.30, 0.02, crashers, rng)

	records := recordsTable(t, pool)
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(records))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	effects := effectsTable(t, pool)
	group := "crash-" + mode + "-" + runID()
	cfg := workerConfig{
		Mode:         mode,
		Brokers:      k.addrs,
		Group:        group,
		Topic:        k.topic,
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		RecordsTable: records,
		EffectsTable: effects,
		Scope:        group + "/apply",
		MaxAttempts:  dedup.DefaultMaxAttempts,
		Lease:        2 * time.Second,
	}
	f := crashtest.NewFleet(t, workerEnv, 3, func(slot int, name string) any {
		c := cfg
		c.Slot, c.Name = slot, name
		return c
	})

	produced := k.produceOver(p.records, size.produceFor)
	producing := true
	late, crashes := supervise(t, f, rng, size.chaosFor, size.converge, func() bool {
		if producing {
			select {
			case err := <-produced:
				if err != nil {
					t.Fatal(err)
				}
				producing = false
			default:
				return false
			}
		}
		return k.caughtUp(group)
	}, k.progress(group, nil))
	for _, name := range f.Stop() {
		t.Logf("worker %s: Consumer.Run returned an error (see its log)", name)
	}
	f.CheckLogs()

	fig, twice := count(p, effectRows(t, pool, effects), k.readAll(k.dlq))
	fig.kills, fig.restarts, fig.rebalances, fig.crashes, fig.elapsed = f.Kills(), f.Restarts(), late, crashes, time.Since(began)
	t.Logf("%s campaign: %v", mode, fig)
	if fig.kills == 0 {
		t.Error("no worker was killed")
	}
	if fig.lost != 0 || fig.goodDeadLettered != 0 || fig.poisonApplied != 0 {
		t.Errorf("lost %d events, dead-lettered %d good events, applied %d poison events; want none",
			fig.lost, fig.goodDeadLettered, fig.poisonApplied)
	}
	switch {
	case mode != modeClaim && fig.appliedTwice != 0:
		t.Errorf("%d events applied twice through the transactional inbox, want 0: %s", fig.appliedTwice, strings.Join(twice, ", "))
	case fig.appliedTwice != 0:
		t.Logf("claim-mode crash window: %d events applied twice: %s", fig.appliedTwice, strings.Join(twice, ", "))
	}
	if fig.collateral != 0 {
		t.Logf("crash-loop collateral: %d good events were in flight in a worker that died %d times and were parked with reason crash-loop (RELIABILITY.md)",
			fig.collateral, dedup.DefaultMaxAttempts)
	}
}

// supervise keeps the fleet's workers running until done reports true,
// restarting any that dies, as a process supervisor would. For the first
// chaosFor it also kills them with SIGKILL at random moments: most are
// started again at once, one in four only after the session timeout, so
// that the group first moves their partitions to the others. It fails t if
// done is not true once the chaos is over and nothing has moved for
// stallFor (no offset committed, no worker died: a crash loop resolves one
// death at a time, each a worker's whole start, join and lease, which a
// loaded machine stretches), or after four times that in all, and returns
// how many restarts were late and how many workers died on their own.
func supervise(t *testing.T, f *crashtest.Fleet, rng *rand.Rand, chaosFor, stallFor time.Duration, done func() bool, progress func() string) (late, crashes int) {
	t.Helper()
	down := map[int]time.Time{} // slot: when to start it again
	began := time.Now()
	next := began.Add(time.Second)
	lastSeen, movedAt := "", began
	for polls := 0; ; time.Sleep(100 * time.Millisecond) {
		now := time.Now()
		for slot, err := range f.Reap() {
			t.Logf("worker slot %d died on its own: %v", slot+1, err)
			crashes++
			down[slot] = now.Add(100 * time.Millisecond)
			movedAt = now
		}
		if polls++; polls%10 == 0 { // the committed offsets, once a second
			if seen := progress(); seen != lastSeen {
				lastSeen, movedAt = seen, now
			}
		}
		if done() {
			return late, crashes // the slots still down stay down
		}
		for slot, at := range down {
			if now.After(at) {
				f.Start(slot)
				delete(down, slot)
			}
		}
		switch {
		case now.Sub(began) > chaosFor && now.Sub(movedAt) > stallFor:
			t.Fatalf("the group had not caught up after %v, nothing moved for %v: %s", now.Sub(began).Round(time.Second), stallFor, progress())
		case now.Sub(began) > chaosFor+4*stallFor:
			t.Fatalf("the group had not caught up after %v: %s", now.Sub(began).Round(time.Second), progress())
		case now.Sub(began) > chaosFor || now.Before(next):
			continue
		}
		next = now.Add(1500*time.Millisecond + rand.N(2500*time.Millisecond))
		slot := rng.IntN(f.Slots())
		if _, isDown := down[slot]; isDown {
			continue
		}
		f.Kill(slot)
		delay := rand.N(500 * time.Millisecond)
		if rng.IntN(4) == 0 {
			delay = sessionTimeout + time.Second
			late++
		}
		down[slot] = now.Add(delay)
	}
}
