package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/internal/testenv"
)

// Event is one logical event of the campaign.
type Event struct {
	ID     string
	Poison bool
}

// Plan returns n events, 2% of them poison, and the messages carrying them:
// each event once and about 30% twice, shuffled.
func Plan(n int, rng *rand.Rand) (events, messages []Event) {
	for i := range n {
		e := Event{ID: fmt.Sprintf("evt-%05d", i), Poison: rng.Float64() < 0.02}
		events = append(events, e)
		messages = append(messages, e)
		if rng.Float64() < 0.3 {
			messages = append(messages, e)
		}
	}
	rng.Shuffle(len(messages), func(i, j int) { messages[i], messages[j] = messages[j], messages[i] })
	return events, messages
}

// Seeded returns the campaign's random source, seeded from DEDUP_SEED when
// set and from the clock otherwise, and logs the seed.
func Seeded(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := testenv.Env("DEDUP_SEED", ""); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (DEDUP_SEED=%d replays the plan and the kill schedule, not the timing)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// Poison returns how many of events are poison.
func Poison(events []Event) int {
	n := 0
	for _, e := range events {
		if e.Poison {
			n++
		}
	}
	return n
}

// EffectsTable creates the table of handler starts and effects named
// table in pool, dropped when t ends.
func EffectsTable(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (
		event_id text NOT NULL, worker text NOT NULL, kind text NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	return table
}

// Count returns how many distinct events have rows of kind.
func Count(t *testing.T, pool *pgxpool.Pool, table, kind string) int {
	t.Helper()
	var n int
	q := `SELECT count(DISTINCT event_id) FROM ` + table + ` WHERE kind = $1`
	if err := pool.QueryRow(context.Background(), q, kind).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// PerEvent returns the number of rows of kind per event.
func PerEvent(t *testing.T, pool *pgxpool.Pool, table, kind string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, count(*) FROM `+table+` WHERE kind = $1 GROUP BY 1`, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Sum returns the sum of m's values.
func Sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Pause sleeps up to max, at random, or until ctx is done.
func Pause(ctx context.Context, max time.Duration) error {
	select {
	case <-time.After(rand.N(max)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Size is the size of a campaign whose events are sent over a while.
type Size struct {
	Events  int
	Procs   int           // worker processes at once
	Produce time.Duration // the events are sent over this long
	Chaos   time.Duration // kills stop after this long
}

// Sized returns soak when the long campaigns run (Soak) and short otherwise.
func Sized(short, soak Size) Size {
	if Soak() {
		return soak
	}
	return short
}
