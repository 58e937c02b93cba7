package kafkadedup_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// postgresInbox returns a migrated store, a fresh effects table without any
// unique constraint (a second effect would be a second row), and a scope
// unique to this run.
func postgresInbox(t *testing.T) (pool *pgxpool.Pool, store *dedup.PostgresStore, table, scope string) {
	t.Helper()
	pool = testenv.Postgres(t)
	ctx := context.Background()
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	table = "kafkadedup_effects_" + run
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (event_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	return pool, store, table, "kafkadedup-test/" + t.Name() + "/" + run
}

// A consumer stopped in the middle of a batch while a second consumer of the
// group takes over its partitions leaves exactly one row per event in the
// effects table, written by the transactional inbox: whether the stopped
// consumer's running handlers finish (drain) or are canceled mid-transaction
// (abandon), which rolls their effect back with their dedup record.
func TestHandoverMidBatchPostgresInbox(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drain time.Duration
	}{
		// A batch's events share a transaction that runs to its end once
		// started: up to 256 handlers of 100 ms each after the park, which
		// a loaded machine stretches past the default drain timeout. The
		// point here is handlers allowed to finish, not how fast they do.
		{"drain", 5 * time.Minute},
		{"abandon", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, store, table, scope := postgresInbox(t)
			c := newCluster(t, 4)
			evs := events("pg", 1500, 16)
			recs := c.produce(append(slices.Clone(evs), evs[:100]...)...)

			var canceled atomic.Int32
			insert := "INSERT INTO " + table + " (event_id) VALUES ($1)"
			// handler writes the effect, then holds the transaction open: 20 ms
			// normally, so that the first consumer still has work when the
			// second joins (a batch's events share a transaction, which makes
			// short handlers fast), and 100 ms once park is set, so that it is
			// certainly mid-transaction when it is stopped.
			handler := func(park *atomic.Bool, parked chan<- struct{}) dedup.TxHandler[*kgo.Record] {
				return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
					if _, err := tx.Exec(ctx, insert, eventID(r)); err != nil {
						return err
					}
					hold := 20 * time.Millisecond
					if park.Load() {
						hold = 100 * time.Millisecond
						select {
						case parked <- struct{}{}:
						default:
						}
					}
					select {
					case <-ctx.Done():
						canceled.Add(1)
						return ctx.Err()
					case <-time.After(hold):
						return nil
					}
				}
			}
			consumer := func(obs *effects, h dedup.TxHandler[*kgo.Record]) *kafkadedup.Consumer {
				w, err := dedup.WrapTx(store, kafkadedup.Messages(), h,
					dedup.WithScope(scope), dedup.WithSink(c.sink()), dedup.WithMaxAttempts(5),
					dedup.WithBackoff(dedup.ExponentialBackoff(5*time.Millisecond, 20*time.Millisecond)),
					dedup.WithObserver(obs.observe))
				if err != nil {
					t.Fatal(err)
				}
				return newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...),
					kafkadedup.WithDrainTimeout(tc.drain), kafkadedup.WithMaxPollRecords(200))
			}
			rows := func() int {
				var n int
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}

			seenA, seenB := newEffects(), newEffects()
			var parkA, never atomic.Bool
			parkedA := make(chan struct{}, 1)
			a := start(t, consumer(seenA, handler(&parkA, parkedA)))
			a.Within(adaptertest.Deadline + tc.drain) // its started batch runs to its end
			eventually(t, 60*time.Second, func() bool { return rows() >= 60 }, "first consumer made no progress")
			b := start(t, consumer(seenB, handler(&never, nil)))
			eventually(t, 60*time.Second, func() bool { _, o := seenB.snapshot(); return o[dedup.OutcomeProcessed] > 0 },
				"second consumer never got a partition")
			parkA.Store(true)
			caught := true
			select {
			case <-parkedA:
			case <-time.After(60 * time.Second):
				caught = false
				// Seen on a loaded machine: the first consumer's work after
				// the rebalance waits elsewhere. Stopping it then still
				// checks one row per event; only abandoning needs a handler
				// caught mid-transaction.
				if tc.drain == 0 {
					t.Fatal("the first consumer ran no handler after the handover")
				}
				t.Log("the first consumer ran no handler within 60 s of the handover; stopping it between handlers")
			}
			a.StopClean(t)
			// Draining lets the first consumer finish its started batch while
			// the second finishes the rest: every event may be done by now.
			// Abandoning rolls the batch back, so events must remain.
			if caught && tc.drain == 0 && rows() == len(evs) {
				t.Fatal("the first consumer finished before it was stopped; the handover was not mid-batch")
			}
			want := endOffsets(recs)
			eventually(t, 30*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
				"committed offsets never reached %v", want)
			b.StopClean(t)

			var distinct, total int
			err := pool.QueryRow(context.Background(), "SELECT count(DISTINCT event_id), count(*) FROM "+table).Scan(&distinct, &total)
			if err != nil {
				t.Fatal(err)
			}
			if distinct != len(evs) || total != len(evs) {
				bad, _ := pool.Query(context.Background(), "SELECT event_id, count(*) FROM "+table+" GROUP BY 1 HAVING count(*) <> 1 LIMIT 5")
				ids, _ := pgx.CollectRows(bad, pgx.RowTo[string])
				t.Errorf("%d rows for %d events, want exactly one row for each of %d events (e.g. %v)", total, distinct, len(evs), ids)
			}
			_, oa := seenA.snapshot()
			_, ob := seenB.snapshot()
			t.Logf("first consumer %v, second %v, handlers canceled mid-transaction %d", oa, ob, canceled.Load())
			if tc.drain == 0 && canceled.Load() == 0 {
				t.Error("no handler was abandoned mid-transaction")
			}
			if tc.drain > 0 && canceled.Load() != 0 {
				t.Errorf("%d handlers were canceled although the drain time let them finish", canceled.Load())
			}
		})
	}
}
