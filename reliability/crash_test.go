package reliability_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

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
	return crashCampaign{events: 20_000, crashers: 1, produceFor: 4 * time.Second, chaosFor: 25 * time.Second, converge: crashtest.Stall}
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
// never lost; its last attempt may have applied its effect before the
// crasher killed the worker (the claim-mode crash window), which is reported
// too. The inbox gets no crashers: it cannot count their attempts.
//
// A death costs an attempt to every event its worker holds, so the
// campaign's own kills could park a good event too, if they hit it
// MaxAttempts times before it settles; whether they do depends on how fast
// a loaded machine lets the workers get through their takeovers. The
// supervisor therefore holds a kill back while a good event is near
// MaxAttempts (killGate), so that a good event in the dead-letter topic
// always means the product failed, or a crasher's collateral. A worker that
// dies on its own must be a crasher's doing (it says so in its log): any
// other death fails the campaign.
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
		MaxAttempts:  5,
		Lease:        2 * time.Second,
	}
	f := crashtest.NewFleet(t, workerEnv, 3, func(slot int, name string) any {
		c := cfg
		c.Slot, c.Name = slot, name
		return c
	})

	produced := k.produceOver(p.records, size.produceFor)
	producing := true
	gate := killGate(pool, records, p, cfg.MaxAttempts)
	ch := supervise(t, f, rng, size.chaosFor, size.converge, func() bool {
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
	}, gate, k.moved(group, nil), k.progress(group, nil))
	for _, name := range f.Stop() {
		t.Logf("worker %s: Consumer.Run returned an error (see its log)", name)
	}
	f.CheckLogs()

	died := func(w string) bool { return f.WasKilled(w) || ch.crasherDeaths[w] }
	fig, twice := countDeaths(p, effectRows(t, pool, effects), k.readAll(k.dlq), died)
	fig.kills, fig.restarts, fig.rebalances, fig.crashes, fig.elapsed = f.Kills(), f.Restarts(), ch.late, len(ch.crasherDeaths), time.Since(began)
	t.Logf("%s campaign: %v; kills held back %d times (an unsettled good event had %d attempts or more)",
		mode, fig, ch.held, cfg.MaxAttempts-2)
	for _, l := range fig.goodLetters {
		t.Logf("dead-lettered good event: %s", l)
	}
	logAttempts(t, pool, records, p, cfg.MaxAttempts)
	if fig.kills == 0 {
		t.Error("no worker was killed")
	}
	for _, u := range ch.unplanned {
		t.Errorf("worker %s died on its own, neither killed by the campaign nor by a crasher (see its log)", u)
	}
	if n := len(ch.crasherDeaths); n > crashers*cfg.MaxAttempts {
		t.Errorf("the crashers killed %d workers, want at most %d (%d crashers, MaxAttempts %d)", n, crashers*cfg.MaxAttempts, crashers, cfg.MaxAttempts)
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
	switch {
	case fig.collateral != 0 && len(ch.crasherDeaths) == 0:
		// The campaign's own kills leave every event at least one attempt
		// (killGate): without a crasher's deaths, nothing may be parked.
		t.Errorf("%d good events parked as a crash loop, and no crasher killed a worker", fig.collateral)
	case fig.collateral != 0:
		t.Logf("crash-loop collateral: %d good events were in flight in a worker that died %d times and were parked with reason crash-loop, "+
			"%d of them applied by the last attempt before its worker died (RELIABILITY.md)",
			fig.collateral, cfg.MaxAttempts, fig.collateralApplied)
	}
}

// chaos is what supervise did and saw.
type chaos struct {
	late          int             // restarts late enough for the group to move the partitions
	held          int             // kills held back by the gate
	crasherDeaths map[string]bool // workers a crasher killed, by name
	unplanned     []string        // workers that died otherwise: "name: how"
}

// supervise keeps the fleet's workers running until done reports true,
// restarting any that dies, as a process supervisor would. For the first
// chaosFor it also kills them with SIGKILL at random moments: most are
// started again at once, one in four only after the session timeout, so
// that the group first moves their partitions to the others. Before each
// kill it asks gate, and holds the kill back while gate says why not. It
// fails t if done is not true once the chaos is over and nothing has moved
// for stallFor: moved did not reach a new high (no offset committed) and no
// crasher killed a worker (a crash loop resolves one death at a time, each a
// worker's whole start, join and lease, which a loaded machine stretches).
// There is no bound on the whole: a loaded machine makes the campaign
// slower, not wrong. A worker that dies on its own is a crasher's doing when
// its log says so (crasherLine), else unplanned.
func supervise(t *testing.T, f *crashtest.Fleet, rng *rand.Rand, chaosFor, stallFor time.Duration, done func() bool, gate func() string, moved func() int, progress func() string) chaos {
	t.Helper()
	ch := chaos{crasherDeaths: map[string]bool{}}
	down := map[int]time.Time{} // slot: when to start it again
	began := time.Now()
	next := began.Add(time.Second)
	best, movedAt := 0, began
	holding := ""
	for polls := 0; ; time.Sleep(100 * time.Millisecond) {
		now := time.Now()
		for slot, err := range f.Reap() {
			name, crasher := deathOf(f, slot)
			if crasher != "" {
				ch.crasherDeaths[name] = true
				movedAt = now
				t.Logf("%v: worker %s killed itself, as crasher %s does (%v)", now.Sub(began).Round(time.Millisecond), name, crasher, err)
			} else {
				ch.unplanned = append(ch.unplanned, fmt.Sprintf("%s: %v", name, err))
				t.Logf("%v: worker %s died on its own, unplanned: %v", now.Sub(began).Round(time.Millisecond), name, err)
			}
			down[slot] = now.Add(100 * time.Millisecond)
		}
		if polls++; polls%10 == 0 { // the committed offsets, once a second
			if n := moved(); n > best {
				best, movedAt = n, now
			}
		}
		if done() {
			return ch // the slots still down stay down
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
		case now.Sub(began) > chaosFor || now.Before(next):
			continue
		}
		slot := rng.IntN(f.Slots())
		if _, isDown := down[slot]; isDown {
			next = now.Add(1500*time.Millisecond + rand.N(2500*time.Millisecond))
			continue
		}
		if why := gate(); why != "" {
			if holding == "" {
				t.Logf("%v: kill held back: %s", now.Sub(began).Round(time.Millisecond), why)
			}
			ch.held++
			holding, next = why, now.Add(250*time.Millisecond)
			continue
		}
		holding = ""
		next = now.Add(1500*time.Millisecond + rand.N(2500*time.Millisecond))
		f.Kill(slot)
		delay := rand.N(500 * time.Millisecond)
		if rng.IntN(4) == 0 {
			delay = sessionTimeout + time.Second
			ch.late++
		}
		down[slot] = now.Add(delay)
		t.Logf("%v: killed slot %d, restart in %v", now.Sub(began).Round(time.Millisecond), slot+1, delay.Round(time.Millisecond))
	}
}

// deathOf returns the name of the worker of slot that just died on its
// own, and the crasher's event ID when its log says a crasher killed it.
func deathOf(f *crashtest.Fleet, slot int) (name, crasher string) {
	prefix := fmt.Sprintf("w%d-", slot+1)
	var last string
	for _, l := range f.Logs() { // in the order started: the slot's last is the one that died
		if strings.HasPrefix(filepath.Base(l), prefix) {
			last = l
		}
	}
	name = strings.Replace(strings.TrimSuffix(filepath.Base(last), ".log"), "-", "#", 1)
	b, _ := os.ReadFile(last)
	if i := bytes.Index(b, []byte(crasherLine)); i >= 0 {
		line, _, _ := bytes.Cut(b[i+len(crasherLine):], []byte("\n"))
		crasher = string(bytes.TrimSpace(line))
	}
	return name, crasher
}

// killGate keeps the campaign's own kills below maxAttempts per event,
// whatever the scheduler does. A kill costs an attempt to every event its
// worker holds (attempts are counted when a key is claimed, and a death
// leaves the attempt standing); how many events are still held when the
// next kill comes depends only on how fast the workers got through their
// takeovers, which a loaded machine stretches. So a kill waits while a good
// event that is not settled has maxAttempts-2 attempts or more: it is killed
// with at most maxAttempts-1 (one claim may land between this look and the
// kill), and its next claim still runs the handler. Only a crasher's deaths
// on top can park a good event then: crash-loop collateral.
func killGate(pool *pgxpool.Pool, records string, p *plan, maxAttempts int) func() string {
	good := map[string]bool{}
	for _, e := range p.events {
		good[e.id] = !e.poison && !e.crasher
	}
	return func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Status 1 is PROCESSING, 3 FAILED_RETRYABLE; NULL attempts are 1.
		rows, err := pool.Query(ctx, `SELECT event_id, coalesce(attempts, 1) FROM `+records+
			` WHERE status IN (1, 3) AND coalesce(attempts, 1) >= $1`, maxAttempts-2)
		if err != nil {
			return fmt.Sprintf("cannot read the attempts: %v", err)
		}
		var held []string
		var id string
		var attempts int
		_, err = pgx.ForEachRow(rows, []any{&id, &attempts}, func() error {
			if good[id] {
				held = append(held, fmt.Sprintf("%s (%d attempts)", id, attempts))
			}
			return nil
		})
		switch {
		case err != nil:
			return fmt.Sprintf("cannot read the attempts: %v", err)
		case len(held) > 0:
			slices.Sort(held)
			return "unsettled good events near MaxAttempts: " + strings.Join(held, ", ")
		}
		return ""
	}
}

// logAttempts logs how many attempts the records of good events took, and
// the good events that took maxAttempts-1 or more.
func logAttempts(t *testing.T, pool *pgxpool.Pool, records string, p *plan, maxAttempts int) {
	t.Helper()
	good := map[string]bool{}
	for _, e := range p.events {
		good[e.id] = !e.poison && !e.crasher
	}
	rows, err := pool.Query(context.Background(), `SELECT event_id, coalesce(attempts, 1),
		CASE coalesce(status, 2) WHEN 1 THEN 'PROCESSING' WHEN 2 THEN 'SUCCEEDED' WHEN 3 THEN 'FAILED_RETRYABLE'
			WHEN 4 THEN 'FAILED_FINAL' ELSE 'status ' || status END FROM `+records)
	if err != nil {
		t.Fatal(err)
	}
	hist := map[int]int{}
	var most []string
	var id, status string
	var attempts int
	_, err = pgx.ForEachRow(rows, []any{&id, &attempts, &status}, func() error {
		if good[id] {
			hist[attempts]++
			if attempts >= maxAttempts-1 {
				most = append(most, fmt.Sprintf("%s:%d:%s", id, attempts, status))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(most)
	t.Logf("good events by attempts recorded: %v; %d or more: %v", hist, maxAttempts-1, most)
}

// The crash campaign's accounting of a good event parked as a crash loop:
// collateral when it has no effect, or only effects of workers that died
// (its last attempt applied it, then the crasher killed the worker: the
// claim-mode crash window, as in the run that left ev-4309 applied by w1#16,
// the crasher's fifth death, and parked by w1#17); a good event dead-lettered
// when a worker that lived applied it, or when the letter has another reason.
func TestCrashCampaignCountsCollateral(t *testing.T) {
	letter := func(id string, reason dedup.Reason) *kgo.Record {
		return &kgo.Record{Headers: []kgo.RecordHeader{
			{Key: "dedup-event-id", Value: []byte(id)}, {Key: "dedup-reason", Value: []byte(reason)}}}
	}
	p := &plan{events: []planned{{id: "parked"}, {id: "applied-by-dead"}, {id: "applied-by-live"}, {id: "handler-error"},
		{id: "ok"}, {id: "crasher", crasher: true}}, crashers: 1}
	effects := map[string][]string{"applied-by-dead": {"w1#16"}, "applied-by-live": {"w2#3"}, "handler-error": {"w1#16"}, "ok": {"w2#3"}}
	dlq := []*kgo.Record{letter("parked", dedup.ReasonCrashLoop), letter("applied-by-dead", dedup.ReasonCrashLoop),
		letter("applied-by-live", dedup.ReasonCrashLoop), letter("handler-error", dedup.ReasonHandlerError), letter("crasher", dedup.ReasonCrashLoop)}
	died := func(w string) bool { return w == "w1#16" }

	fig, _ := countDeaths(p, effects, dlq, died)
	if fig.collateral != 2 || fig.collateralApplied != 1 || fig.goodDeadLettered != 2 || fig.lost != 0 || fig.poisonApplied != 0 {
		t.Errorf("collateral %d (applied %d), good dead-lettered %d, lost %d, poison applied %d; want 2 (1), 2, 0, 0: %v",
			fig.collateral, fig.collateralApplied, fig.goodDeadLettered, fig.lost, fig.poisonApplied, fig.goodLetters)
	}
	// Without deaths to explain it (the in-process campaigns), an applied
	// event in the dead-letter topic is a good event dead-lettered.
	if fig, _ := count(p, effects, dlq); fig.collateral != 1 || fig.goodDeadLettered != 3 {
		t.Errorf("count: collateral %d, good dead-lettered %d; want 1, 3", fig.collateral, fig.goodDeadLettered)
	}
}
