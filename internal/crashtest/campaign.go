package crashtest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Chaos kills a random worker of f every 0.3 to 1.2 s and starts it again
// 0 to 0.5 s later, until done or for d since start, calling report every
// 10 s.
func (f *Fleet) Chaos(rng *rand.Rand, start time.Time, d time.Duration, done func() bool, report func()) {
	lastReport := time.Now()
	for !done() && time.Since(start) < d {
		time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(900*time.Millisecond))))
		i := rng.IntN(f.Slots())
		f.Kill(i)
		time.Sleep(time.Duration(rng.Int64N(int64(500 * time.Millisecond))))
		f.Start(i)
		if time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			report()
		}
	}
}

// Finish stops the workers gracefully and fails t for one whose Run
// returned an error, one that exited without being killed or stopped, and
// a log line no worker should write.
func (f *Fleet) Finish() {
	f.t.Helper()
	for _, name := range f.Stop() {
		f.t.Errorf("worker %s: Consumer.Run returned an error (see its log)", name)
	}
	for _, c := range f.Crashed() {
		f.t.Errorf("worker exited without being killed or stopped: %s", c)
	}
	f.CheckLogs()
}

// Verdict judges a campaign named name once it settled: the effects and
// starts of events in table, and letters (dead letters by event ID). It
// logs the summary and fails t unless every good event has exactly one
// effect, no poison event has one, every letter is a poison event's, every
// poison event has a letter, and a kill landed mid-handler (a good event's
// handler ran again).
func Verdict(t *testing.T, name string, pool *pgxpool.Pool, table string, events []Event, messages int,
	letters map[string]int, f *Fleet, took time.Duration) {
	t.Helper()
	effects := PerEvent(t, pool, table, "effect")
	starts := PerEvent(t, pool, table, "start")
	var lost, twice, poisonApplied, goodParked []string
	poison := map[string]bool{}
	reruns := 0 // runs of a good event's handler after its first: each one a kill's doing
	for _, e := range events {
		if e.Poison {
			poison[e.ID] = true
		} else {
			reruns += max(0, starts[e.ID]-1)
		}
		switch n := effects[e.ID]; {
		case e.Poison && n > 0:
			poisonApplied = append(poisonApplied, e.ID)
		case !e.Poison && n == 0:
			lost = append(lost, e.ID)
		case n > 1:
			twice = append(twice, fmt.Sprintf("%s×%d", e.ID, n))
		}
	}
	for id := range letters { // a letter of no poison event: a good one's, or one that lost its ID
		if !poison[id] {
			goodParked = append(goodParked, id)
		}
	}
	slices.Sort(goodParked)
	t.Logf("%s crash campaign: %d events (%d messages, %d poison) in %v; kills %d, restarts %d; good events' handlers run again %d times; "+
		"lost %d, applied twice %d, poison applied %d, good dead-lettered %d, letters %d for %d poison events",
		name, len(events), messages, len(poison), took.Round(time.Second), f.Kills(), f.Restarts(), reruns,
		len(lost), len(twice), len(poisonApplied), len(goodParked), Sum(letters), len(letters))
	if len(lost) > 0 || len(twice) > 0 || len(poisonApplied) > 0 || len(goodParked) > 0 {
		t.Errorf("lost %v; applied twice %v; poison applied %v; good dead-lettered %v", lost, twice, poisonApplied, goodParked)
	}
	if len(letters) != len(poison) {
		t.Errorf("%d events have letters, want the %d poison ones", len(letters), len(poison))
	}
	if f.Kills() == 0 || reruns == 0 {
		t.Errorf("no kill landed mid-handler (kills %d): the campaign proved nothing", f.Kills())
	}
}
