package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// v1LiveOwner is the owner token of the fixture's live lease (key "live").
const v1LiveOwner = "c0ffee00c0ffee00c0ffee00c0ffee01"

// v1StateKeys are the keys of testdata/postgres-v1/rows.sql written one by
// one, each in a state of its own; "expired" is left out: it has expired.
var v1StateKeys = []string{"succeeded", "live", "expired-lease", "retryable", "final", "custom-fp", "zero-fp", "upper-fp", "inbox"}

// v1Table is a table of the v1 schema holding the rows of the fixture.
type v1Table struct {
	pool      *pgxpool.Pool
	name      string // bare, unquoted: what WithTable is given
	scope     string
	hot, bulk int
}

// newV1Table creates a v1 table from testdata/postgres-v1 with hot and bulk
// SUCCEEDED rows besides the rows of every state, dropped (with what the
// migration leaves of it) when t ends.
func newV1Table(t *testing.T, pool *pgxpool.Pool, hot, bulk int) *v1Table {
	t.Helper()
	f := &v1Table{pool: pool, name: "dedup_v1_" + deduptype.NewOwnerToken()[:12],
		scope: "v1/" + deduptype.NewOwnerToken()[:8], hot: hot, bulk: bulk}
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+f.quoted()+`, `+f.quotedV1())
	})
	replace := strings.NewReplacer(
		"{{table}}", f.quoted(),
		"{{index}}", pgx.Identifier{f.name + "_expires_at_idx"}.Sanitize(),
		"{{scope}}", "'"+strings.ReplaceAll(f.scope, "'", "''")+"'",
		"{{hot}}", strconv.Itoa(hot),
		"{{bulk}}", strconv.Itoa(bulk))
	for _, file := range []string{"testdata/postgres-v1/schema.sql", "testdata/postgres-v1/rows.sql"} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		// Simple protocol: a file is several statements.
		_, err = pool.Exec(ctx, replace.Replace(string(b)), pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, file)
	}
	require.Equal(t, len(v1StateKeys)+1+hot+bulk, f.count(t, f.quoted(), ""))
	return f
}

func (f *v1Table) quoted() string   { return pgx.Identifier{f.name}.Sanitize() }
func (f *v1Table) quotedV1() string { return pgx.Identifier{f.name + "_v1"}.Sanitize() }
func (f *v1Table) key(id string) dedup.Key {
	return dedup.Key{Scope: f.scope, EventID: id}
}

// store returns a new store on the table.
func (f *v1Table) store(t *testing.T) *dedup.PostgresStore {
	t.Helper()
	s, err := dedup.NewPostgresStore(f.pool, dedup.WithTable(f.name))
	require.NoError(t, err)
	return s
}

// count counts the fixture's rows in table whose event ID starts with
// prefix.
func (f *v1Table) count(t *testing.T, table, prefix string) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table+
		` WHERE scope = $1 AND starts_with(event_id, $2)`, f.scope, prefix).Scan(&n))
	return n
}

// exists reports whether table exists.
func (f *v1Table) exists(t *testing.T, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok))
	return ok
}

// columnType returns the type of column in the table.
func (f *v1Table) columnType(t *testing.T, column string) string {
	t.Helper()
	var typ string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped`, f.quoted(), column).Scan(&typ))
	return typ
}

// records reads the state rows from the v1 table as v1 stored them, with
// plain SQL.
func (f *v1Table) records(t *testing.T) map[string]dedup.Record {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT event_id, status, fingerprint, attempts, owner, lease_until,
		created_at, updated_at, expires_at, last_error, first_failure, last_failure, result
		FROM `+f.quoted()+` WHERE scope = $1 AND event_id = ANY($2)`, f.scope, v1StateKeys)
	require.NoError(t, err)
	defer rows.Close()
	recs := map[string]dedup.Record{}
	for rows.Next() {
		var (
			r                         dedup.Record
			status                    string
			lastError                 pgtype.Text
			firstFailure, lastFailure pgtype.Timestamptz
		)
		require.NoError(t, rows.Scan(&r.Key.EventID, &status, &r.Fingerprint, &r.Attempts, &r.Owner, &r.LeaseUntil,
			&r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &lastError, &firstFailure, &lastFailure, &r.Result))
		r.Key.Scope, r.Status, r.LastError = f.scope, dedup.Status(status), lastError.String
		r.FirstFailure, r.LastFailure = firstFailure.Time, lastFailure.Time
		recs[r.Key.EventID] = r
	}
	require.NoError(t, rows.Err())
	require.Len(t, recs, len(v1StateKeys))
	return recs
}

// requireSameRecord fails unless got is the record want, field by field.
func requireSameRecord(t *testing.T, want, got dedup.Record) {
	t.Helper()
	id := want.Key.EventID
	require.Equal(t, want.Key, got.Key, id)
	require.Equal(t, want.Status, got.Status, "%s: status", id)
	require.Equal(t, want.Fingerprint, got.Fingerprint, "%s: fingerprint", id)
	require.Equal(t, want.Attempts, got.Attempts, "%s: attempts", id)
	require.Equal(t, want.Owner, got.Owner, "%s: owner", id)
	for _, tm := range []struct {
		name      string
		want, got time.Time
	}{
		{"lease_until", want.LeaseUntil, got.LeaseUntil}, {"created_at", want.CreatedAt, got.CreatedAt},
		{"updated_at", want.UpdatedAt, got.UpdatedAt}, {"expires_at", want.ExpiresAt, got.ExpiresAt},
		{"first_failure", want.FirstFailure, got.FirstFailure}, {"last_failure", want.LastFailure, got.LastFailure},
	} {
		require.True(t, tm.want.Equal(tm.got), "%s: %s = %v, want %v", id, tm.name, tm.got, tm.want)
	}
	require.Equal(t, want.LastError, got.LastError, "%s: last error", id)
	require.True(t, bytes.Equal(want.Result, got.Result), "%s: result = %q, want %q", id, got.Result, want.Result)
}

func migrateClaim(t *testing.T, s *dedup.PostgresStore, key dedup.Key, fingerprint string, want dedup.ClaimStatus) dedup.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: fingerprint, Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err, key.String())
	require.Equal(t, want, c.Status, "claim %s: record %+v", key, c.Record)
	return c
}

// A v1 table migrated: every record it held answers through the store as
// it did before, v1's leases fenced, its results kept; a second Migrate
// does nothing.
func TestPostgresMigrateFromV1States(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	f := newV1Table(t, pool, 10, 3000)
	want := f.records(t)
	s := f.store(t)
	fp := func(id string) string { return mustFingerprint(t, "body:"+id) }

	plan, err := s.MigrationPlan(ctx)
	require.NoError(t, err)
	require.Equal(t, "v1", plan.State)
	require.NotEmpty(t, plan.Steps)
	require.Equal(t, "text", f.columnType(t, "status"), "the plan changed nothing")
	require.False(t, f.exists(t, f.quotedV1()), "the plan changed nothing")
	require.Equal(t, len(v1StateKeys)+1+f.hot+f.bulk, f.count(t, f.quoted(), ""), "the plan changed nothing")

	require.NoError(t, s.Migrate(ctx))
	require.False(t, f.exists(t, f.quotedV1()), "%s left behind", f.quotedV1())
	require.Equal(t, "smallint", f.columnType(t, "status"))
	require.Equal(t, f.bulk, f.count(t, f.quoted(), "bulk-"))
	require.Equal(t, f.hot, f.count(t, f.quoted(), "hot-"))

	// Get answers as v1 wrote, field by field.
	for _, id := range v1StateKeys {
		got, err := s.Get(ctx, f.key(id))
		require.NoError(t, err, id)
		requireSameRecord(t, want[id], got)
	}
	_, err = s.Get(ctx, f.key("expired"))
	require.ErrorIs(t, err, dedup.ErrNotFound, "an expired v1 record is no record")

	// A second Migrate is a no-op, and the plan has nothing left to do.
	require.NoError(t, s.Migrate(ctx))
	plan, err = s.MigrationPlan(ctx)
	require.NoError(t, err)
	require.Equal(t, "v2", plan.State)
	require.Empty(t, plan.Steps)
	require.Equal(t, f.bulk, f.count(t, f.quoted(), "bulk-"))
	for _, id := range []string{"succeeded", "live"} {
		got, err := s.Get(ctx, f.key(id))
		require.NoError(t, err, id)
		requireSameRecord(t, want[id], got)
	}

	// SUCCEEDED: a duplicate with its result; another payload a conflict.
	c := migrateClaim(t, s, f.key("succeeded"), fp("succeeded"), dedup.ClaimDuplicate)
	require.Equal(t, `{"ok":true}`, string(c.Record.Result))
	migrateClaim(t, s, f.key("succeeded"), fp("something else"), dedup.ClaimConflict)
	migrateClaim(t, s, f.key("inbox"), fp("inbox"), dedup.ClaimDuplicate)
	migrateClaim(t, s, f.key("hot-000007"), fp("hot-000007"), dedup.ClaimDuplicate)
	migrateClaim(t, s, f.key("bulk-002999"), fp("bulk-002999"), dedup.ClaimDuplicate)
	// Fingerprints the v2 packing keeps as text still dedup.
	c = migrateClaim(t, s, f.key("custom-fp"), "v1:custom", dedup.ClaimDuplicate)
	require.Equal(t, "custom", string(c.Record.Result))
	migrateClaim(t, s, f.key("custom-fp"), fp("custom-fp"), dedup.ClaimConflict)
	migrateClaim(t, s, f.key("zero-fp"), "00"+strings.Repeat("ab", 31), dedup.ClaimDuplicate)
	migrateClaim(t, s, f.key("upper-fp"), strings.ToUpper(fp("upper-fp")), dedup.ClaimDuplicate)
	migrateClaim(t, s, f.key("upper-fp"), fp("upper-fp"), dedup.ClaimConflict)

	// The live v1 lease stays fenced: in flight to others, its owner's to
	// settle, nobody else's.
	migrateClaim(t, s, f.key("live"), fp("live"), dedup.ClaimInFlight)
	err = s.Complete(ctx, f.key("live"), deduptype.NewOwnerToken(), []byte("stolen"), time.Hour)
	require.ErrorIs(t, err, dedup.ErrLeaseLost)
	require.ErrorIs(t, s.Extend(ctx, f.key("live"), deduptype.NewOwnerToken(), time.Hour), dedup.ErrLeaseLost)
	require.NoError(t, s.Extend(ctx, f.key("live"), v1LiveOwner, time.Hour))
	require.NoError(t, s.Complete(ctx, f.key("live"), v1LiveOwner, []byte("done"), time.Hour))
	rec, err := s.Get(ctx, f.key("live"))
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, "done", string(rec.Result))
	migrateClaim(t, s, f.key("live"), fp("live"), dedup.ClaimDuplicate)

	// A lapsed v1 lease and a retryable failure are taken over, one more
	// attempt; a final failure is refused.
	c = migrateClaim(t, s, f.key("expired-lease"), fp("expired-lease"), dedup.ClaimAcquired)
	require.Equal(t, dedup.StatusProcessing, c.Previous)
	require.Equal(t, want["expired-lease"].Attempts+1, c.Record.Attempts)
	require.NoError(t, s.Complete(ctx, f.key("expired-lease"), c.Record.Owner, nil, time.Hour))
	c = migrateClaim(t, s, f.key("retryable"), fp("retryable"), dedup.ClaimAcquired)
	require.Equal(t, dedup.StatusFailedRetryable, c.Previous)
	require.Equal(t, want["retryable"].Attempts+1, c.Record.Attempts)
	migrateClaim(t, s, f.key("final"), fp("final"), dedup.ClaimFinal)
	// An expired record is as if absent.
	c = migrateClaim(t, s, f.key("expired"), fp("expired"), dedup.ClaimAcquired)
	require.Equal(t, dedup.Status(""), c.Previous)
	require.Equal(t, 1, c.Record.Attempts)
}

// Migrate called by many at once: every call succeeds, and the table is v2
// with every row.
func TestPostgresMigrateConcurrent(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	f := newV1Table(t, pool, 100, 5000)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range errs {
		s := f.store(t)
		wg.Go(func() {
			<-start
			errs[i] = s.Migrate(ctx)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "Migrate #%d", i)
	}
	require.False(t, f.exists(t, f.quotedV1()), "%s left behind", f.quotedV1())
	require.Equal(t, "smallint", f.columnType(t, "status"))
	require.Equal(t, f.bulk, f.count(t, f.quoted(), "bulk-"))
	require.Equal(t, f.hot, f.count(t, f.quoted(), "hot-"))
	for _, id := range v1StateKeys {
		require.Equal(t, 1, f.count(t, f.quoted(), id), id)
	}
	plan, err := f.store(t).MigrationPlan(ctx)
	require.NoError(t, err)
	require.Equal(t, "v2", plan.State)
	require.Empty(t, plan.Steps)
	migrateClaim(t, f.store(t), f.key("bulk-004321"), mustFingerprint(t, "body:bulk-004321"), dedup.ClaimDuplicate)
}

// migrateChildEnv names the table the migrating child process migrates.
const migrateChildEnv = "DEDUP_TEST_MIGRATE_CHILD"

// TestPostgresMigrateChild is the migrating process of
// TestPostgresMigrateUnderConsumersWithSIGKILL, which runs the test binary
// again with migrateChildEnv set; otherwise it does nothing.
func TestPostgresMigrateChild(t *testing.T) {
	table := os.Getenv(migrateChildEnv)
	if table == "" {
		return
	}
	s, err := dedup.NewPostgresStore(testenv.Postgres(t), dedup.WithTable(table))
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, s.Migrate(context.Background()))
	fmt.Printf("migrated %s in %v\n", table, time.Since(start))
}

// migrateChild is one run of the migrating child process.
type migrateChild struct {
	cmd     *exec.Cmd
	appName string // its connections' application_name
	out     *lockedBuffer
	done    chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startMigrateChild(t *testing.T, table string, run int) *migrateChild {
	t.Helper()
	c := &migrateChild{appName: fmt.Sprintf("dedup-migrate-%s-%d", table, run), out: &lockedBuffer{}, done: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestPostgresMigrateChild$", "-test.v", "-test.count=1")
	c.cmd.Env = append(os.Environ(), migrateChildEnv+"="+table, "PGAPPNAME="+c.appName)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	require.NoError(t, c.cmd.Start())
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		c.done <- nil
	})
	return c
}

// exited returns the child's exit error and true once it has exited.
func (c *migrateChild) exited() (error, bool) {
	select {
	case err := <-c.done:
		c.done <- err
		return err, true
	default:
		return nil, false
	}
}

// kill kills the child with SIGKILL, as a crash would, and waits for it.
func (c *migrateChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.done
	c.done <- err
}

// waitUntil polls cond every interval until it holds, failing t when it has
// not within patience of the last progress: progress returns a figure that
// changes while things move (nil: the deadline is patience from now).
func waitUntil(t *testing.T, what string, interval, patience time.Duration, progress func() int, cond func() bool) {
	t.Helper()
	last, lastAt := 0, time.Now()
	if progress != nil {
		last = progress()
	}
	for !cond() {
		if progress != nil {
			if p := progress(); p != last {
				last, lastAt = p, time.Now()
			}
		}
		if time.Since(lastAt) > patience {
			t.Fatalf("%s: no progress for %v", what, patience)
		}
		time.Sleep(interval)
	}
}

// migrationConsumers deliver events to Wrap and WrapTx wrappers on one
// store, each worker every key of each round of new keys and a sample of
// the v1 fixture's keys, redelivering what does not settle, as a transport
// would.
type migrationConsumers struct {
	t      *testing.T
	f      *v1Table
	ledger string

	stopping atomic.Bool
	settled  atomic.Int64 // deliveries settled
	errs     atomic.Int64 // deliveries that returned an error
	doubles  atomic.Int64 // effects refused by the ledger's unique key: applied twice

	mu        sync.Mutex
	processed map[string]int // OutcomeProcessed per key
	outcomes  map[string]map[dedup.Outcome]int
	rounds    int // rounds of new keys started, by the worker furthest on
	firstErrs []string
}

const migrationRoundKeys = 16

func newKeyOf(round, i int) string { return fmt.Sprintf("new-%05d-%02d", round, i) }

func (mc *migrationConsumers) noteErr(format string, args ...any) {
	mc.errs.Add(1)
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if len(mc.firstErrs) < 10 {
		mc.firstErrs = append(mc.firstErrs, fmt.Sprintf(format, args...))
	}
}

// effect writes the event's effect; a second effect of one key breaks the
// ledger's unique key, and is counted.
func (mc *migrationConsumers) effect(ctx context.Context, exec func(context.Context, string, ...any) (pgconn.CommandTag, error), e event, via string) error {
	_, err := exec(ctx, `INSERT INTO `+mc.ledger+` (event_id, via) VALUES ($1, $2)`, e.ID, via)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		mc.doubles.Add(1)
		mc.noteErr("%s applied twice (via %s)", e.ID, via)
	}
	return err
}

// worker runs rounds until told to stop, then one more.
func (mc *migrationConsumers) worker(ctx context.Context, w *dedup.Wrapper[event], seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 40))
	for round, last := 0, false; !last; round++ {
		last = mc.stopping.Load()
		mc.mu.Lock()
		mc.rounds = max(mc.rounds, round+1)
		mc.mu.Unlock()
		ids := make([]string, 0, migrationRoundKeys+16)
		for i := range migrationRoundKeys {
			ids = append(ids, newKeyOf(round, i))
		}
		for range 8 {
			ids = append(ids, fmt.Sprintf("hot-%06d", 1+rng.IntN(mc.f.hot)))
		}
		ids = append(ids, "succeeded", "inbox", "final", "retryable", "expired-lease", "live")
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for len(ids) > 0 {
			if ctx.Err() != nil {
				mc.noteErr("gave up on %d deliveries of round %d: %v", len(ids), round, ctx.Err())
				return
			}
			var again []string
			for _, id := range ids {
				res, err := w.Handle(ctx, event{ID: id, Body: "body:" + id})
				switch {
				case err != nil:
					mc.noteErr("%s: %v", id, err)
					again = append(again, id)
				case id == "live":
					// The v1 lease is fenced for the hour: never settled.
					mc.note(id, res.Outcome)
				case !res.Settled():
					again = append(again, id)
				default:
					mc.settled.Add(1)
					mc.note(id, res.Outcome)
				}
			}
			if ids = again; len(ids) > 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

func (mc *migrationConsumers) note(id string, o dedup.Outcome) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if mc.outcomes[id] == nil {
		mc.outcomes[id] = map[dedup.Outcome]int{}
	}
	mc.outcomes[id][o]++
	if o == dedup.OutcomeProcessed {
		mc.processed[id]++
	}
}

// The online migration under load: consumers run on the table throughout,
// through the plain wrapper and the transactional inbox, on new keys and
// on keys v1 recorded, while the migrating process is killed with SIGKILL
// twice in the middle of its copy and run a third time to the end. No v1
// record is lost, no effect applied twice, no v1 success applied again.
func TestPostgresMigrateUnderConsumersWithSIGKILL(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newV1Table(t, pool, 1000, 20000)
	v1 := f.quotedV1()

	// The copy is throttled, a millisecond a row moved out of the v1 table,
	// so that it lasts long enough (20 s) to be killed in the middle on any
	// machine. The trigger follows the table through its rename; a
	// consumer's pull of one key pays a millisecond.
	throttle := pgx.Identifier{f.name + "_throttle"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+throttle+`() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN PERFORM pg_sleep(0.001); RETURN OLD; END$$`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP FUNCTION IF EXISTS `+throttle+` CASCADE`) })
	_, err = pool.Exec(ctx, `CREATE TRIGGER throttle BEFORE DELETE ON `+f.quoted()+` FOR EACH ROW EXECUTE FUNCTION `+throttle+`()`)
	require.NoError(t, err)

	ledger := pgx.Identifier{f.name + "_ledger"}.Sanitize()
	_, err = pool.Exec(ctx, `CREATE TABLE `+ledger+` (event_id text PRIMARY KEY, via text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+ledger) })
	// bulkLeft counts the rows of the copy's own (bulk- keys, which no
	// consumer touches) still in the v1 table; none once it is dropped.
	bulkLeft := func() int {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+v1+` WHERE starts_with(event_id, 'bulk-')`).Scan(&n)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			return 0
		}
		require.NoError(t, err)
		return n
	}

	// Run 1 renames the table; the consumers of this code start on it
	// once it is being migrated (on a v1 table not being migrated, the
	// store refuses to work: see V2.md).
	child := startMigrateChild(t, f.name, 1)
	waitUntil(t, "run 1 renames the v1 table", 10*time.Millisecond, 3*time.Minute, nil, func() bool {
		if err, ok := child.exited(); ok {
			t.Fatalf("run 1 exited (%v) before the copy began:\n%s", err, child.out)
		}
		return f.exists(t, v1)
	})

	mc := &migrationConsumers{t: t, f: f, ledger: ledger, processed: map[string]int{}, outcomes: map[string]map[dedup.Outcome]int{}}
	store := f.store(t)
	logger := slog.New(slog.DiscardHandler)
	opts := []dedup.Opt{dedup.WithScope(f.scope), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLogger(logger),
		dedup.WithLease(time.Minute), dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond))}
	plain, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
		return mc.effect(ctx, pool.Exec, e, "wrap")
	}, opts...)
	require.NoError(t, err)
	inbox, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		return mc.effect(ctx, tx.Exec, e, "inbox")
	}, opts...)
	require.NoError(t, err)
	var workers sync.WaitGroup
	for i := range 6 {
		w := plain
		if i%2 == 1 {
			w = inbox
		}
		workers.Go(func() { mc.worker(ctx, w, uint64(i)) })
	}
	stopWorkers := sync.OnceFunc(func() {
		mc.stopping.Store(true)
		workers.Wait()
	})
	defer func() {
		if t.Failed() {
			cancel() // the workers give up on what has not settled
		}
		stopWorkers()
	}()
	settledAtStart := mc.settled.Load()

	// Runs 1 and 2 are killed once they have moved rows of the copy's own
	// (bulk- keys, which no consumer touches), with the copy unfinished.
	for run := 1; run <= 2; run++ {
		before := bulkLeft()
		waitUntil(t, fmt.Sprintf("run %d copies", run), 2*time.Millisecond, 3*time.Minute, nil, func() bool {
			if err, ok := child.exited(); ok {
				t.Fatalf("run %d exited (%v) before it could be killed mid-copy:\n%s", run, err, child.out)
			}
			return bulkLeft() < before
		})
		child.kill()
		left := bulkLeft()
		t.Logf("run %d killed with %d of %d bulk rows left to copy", run, left, f.bulk)
		require.Positive(t, left, "run %d was killed after its copy ended", run)
		// Its server session may finish its last statement first.
		waitUntil(t, fmt.Sprintf("run %d's sessions end", run), 10*time.Millisecond, 2*time.Minute, nil, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`,
				child.appName).Scan(&n))
			return n == 0
		})
		child = startMigrateChild(t, f.name, run+1)
	}

	// Run 3 finishes, moving as long as rows move.
	waitUntil(t, "run 3 finishes", 20*time.Millisecond, 3*time.Minute, bulkLeft, func() bool {
		_, ok := child.exited()
		return ok
	})
	err, _ = child.exited()
	require.NoError(t, err, "run 3:\n%s", child.out)
	require.Contains(t, child.out.String(), "migrated")
	duringMigration := mc.settled.Load() - settledAtStart
	stopWorkers()
	mc.mu.Lock()
	defer mc.mu.Unlock()
	t.Logf("consumers: %d deliveries settled while the migration ran, %d in all over %d rounds, %d errors %q",
		duringMigration, mc.settled.Load(), mc.rounds, mc.errs.Load(), mc.firstErrs)
	require.Positive(t, duringMigration, "the consumers were stopped by the migration")
	require.Zero(t, mc.doubles.Load(), "effects applied twice: %q", mc.firstErrs)
	require.NoError(t, ctx.Err(), "%q", mc.firstErrs)

	// The migration is done.
	require.False(t, f.exists(t, v1), "%s left behind", v1)
	require.Equal(t, "smallint", f.columnType(t, "status"))
	plan, err := store.MigrationPlan(ctx)
	require.NoError(t, err)
	require.Equal(t, "v2", plan.State)
	require.Empty(t, plan.Steps)

	// Nothing lost: every v1 key is in the table, the bulk ones still
	// SUCCEEDED (status 2, or NULL as the inbox writes it).
	require.Equal(t, f.bulk, f.count(t, f.quoted(), "bulk-"))
	require.Equal(t, f.hot, f.count(t, f.quoted(), "hot-"))
	for _, id := range v1StateKeys {
		require.Equal(t, 1, f.count(t, f.quoted(), id), id)
	}
	var succeeded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+f.quoted()+` WHERE scope = $1
		AND starts_with(event_id, 'bulk-') AND coalesce(status, 2) = 2`, f.scope).Scan(&succeeded))
	require.Equal(t, f.bulk, succeeded)
	for _, i := range []int{1, 5000, 12345, 20000} {
		id := fmt.Sprintf("bulk-%06d", i)
		migrateClaim(t, store, f.key(id), mustFingerprint(t, "body:"+id), dedup.ClaimDuplicate)
	}
	rec, err := store.Get(ctx, f.key("live"))
	require.NoError(t, err)
	require.Equal(t, dedup.StatusProcessing, rec.Status, "the live v1 lease")
	require.Equal(t, v1LiveOwner, rec.Owner, "the live v1 lease")

	// Each effect once: every new key and the two v1 keys left to retry,
	// none of v1's successes, nor its live lease or final failure.
	effected := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT event_id FROM `+ledger)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		effected[id]++
	}
	require.NoError(t, rows.Err())
	want := map[string]int{"retryable": 1, "expired-lease": 1}
	for round := range mc.rounds {
		for i := range migrationRoundKeys {
			want[newKeyOf(round, i)] = 1
		}
	}
	for id, n := range effected {
		if want[id] == 0 {
			t.Errorf("%s effected %d times, never wanted (outcomes %v)", id, n, mc.outcomes[id])
		}
	}
	for id := range want {
		if effected[id] != 1 || mc.processed[id] != 1 {
			t.Errorf("%s effected %d times, processed %d times, want once (outcomes %v)", id, effected[id], mc.processed[id], mc.outcomes[id])
		}
	}
	for _, id := range []string{"live", "final", "succeeded", "inbox"} {
		require.Zero(t, mc.processed[id], id)
	}
	require.Zero(t, mc.outcomes["live"][dedup.OutcomeProcessed])
	require.NotEmpty(t, mc.outcomes["live"], "the live key was delivered")
}
