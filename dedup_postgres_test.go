package dedup

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

const (
	testLease = 30 * time.Second
	testTTL   = time.Hour
)

// newTestPostgresStore returns a store on a fresh migrated table, dropped
// when t ends.
func newTestPostgresStore(t testing.TB, pool *pgxpool.Pool) *PostgresStore {
	t.Helper()
	table := "dedup_test_" + deduptype.NewOwnerToken()[:12]
	s, err := NewPostgresStore(pool, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+s.table); err != nil {
			t.Errorf("drop %s: %v", s.table, err)
		}
	})
	return s
}

func claimReq(scope, id, fingerprint string) ClaimRequest {
	return ClaimRequest{Key: Key{Scope: scope, EventID: id}, Fingerprint: fingerprint, Lease: testLease, TTL: testTTL}
}

func mustClaim(t *testing.T, s *PostgresStore, req ClaimRequest, want ClaimStatus) Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), req)
	if err != nil {
		t.Fatalf("claim %s: %v", req.Key, err)
	}
	if c.Status != want {
		t.Fatalf("claim %s = %v (record %+v), want %v", req.Key, c.Status, c.Record, want)
	}
	return c
}

func TestPostgresTableName(t *testing.T) {
	pool := testenv.Postgres(t)
	for _, name := range []string{"dedup_records", "Events", "_x1", "myschema.my_table", strings.Repeat("a", 63)} {
		if _, err := NewPostgresStore(pool, WithTable(name)); err != nil {
			t.Errorf("WithTable(%q): %v", name, err)
		}
	}
	bad := []string{"", "1abc", "a-b", `x"; DROP TABLE users; --`, "a.b.c", ".t", "s.", "tbl ", "tabla_ñ", strings.Repeat("a", 64)}
	for _, name := range bad {
		_, err := NewPostgresStore(pool, WithTable(name))
		var nameErr *TableNameError
		if !errors.As(err, &nameErr) || nameErr.Name != name {
			t.Errorf("WithTable(%q) = %v, want *TableNameError", name, err)
		}
	}
	if _, err := NewPostgresStore(nil); err == nil {
		t.Error("nil pool accepted")
	}
	s, err := NewPostgresStore(pool)
	if err != nil || s.table != `"dedup_records"` {
		t.Errorf("default table = %q, %v", s.table, err)
	}
}

// v2TestColumns is the v2 table's shape as v2TestShape describes it: its
// columns in order, with their types, NOT NULL and key collations.
var v2TestColumns = []string{
	"expires_at timestamp with time zone NOT NULL",
	`scope text NOT NULL COLLATE "C"`,
	`event_id text NOT NULL COLLATE "C"`,
	"fingerprint bytea NOT NULL",
	"status smallint",
	"attempts integer",
	"owner bytea",
	"lease_until timestamp with time zone",
	"created_at timestamp with time zone",
	"updated_at timestamp with time zone",
	"last_error text",
	"first_failure timestamp with time zone",
	"last_failure timestamp with time zone",
	"result bytea",
	"previous_status smallint",
}

// v2TestShape returns table's columns in order ("name type [NOT NULL]
// [COLLATE c]"), the definitions of its indexes and its storage options.
func v2TestShape(t *testing.T, pool *pgxpool.Pool, table string) (columns, indexes, options []string) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT attname || ' ' || format_type(atttypid, atttypmod)
			|| CASE WHEN attnotnull THEN ' NOT NULL' ELSE '' END
			|| CASE WHEN c.collname IS NOT NULL AND c.collname <> 'default' THEN ' COLLATE ' || quote_ident(c.collname) ELSE '' END
		FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation AND a.attcollation <> 0
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
	if err != nil {
		t.Fatal(err)
	}
	if columns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT CASE WHEN indisprimary THEN 'PRIMARY ' ELSE '' END
			|| regexp_replace(pg_get_indexdef(indexrelid), '^.* USING ', 'USING ')
		FROM pg_index WHERE indrelid = $1::regclass ORDER BY indexrelid`, table)
	if err != nil {
		t.Fatal(err)
	}
	if indexes, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&options); err != nil {
		t.Fatal(err)
	}
	return columns, indexes, options
}

// requireV2Shape fails t unless table has the v2 shape: the columns of
// v2TestColumns, the primary key as its only index (no expiry index: Purge
// sweeps the heap), fillfactor 50, and no v1 sibling left (v1 is the name of
// the table's v1 sibling, <t>_v1).
func requireV2Shape(t *testing.T, pool *pgxpool.Pool, table, v1 string) {
	t.Helper()
	columns, indexes, options := v2TestShape(t, pool, table)
	if !slices.Equal(columns, v2TestColumns) {
		t.Errorf("columns of %s:\n  %s\nwant\n  %s", table, strings.Join(columns, "\n  "), strings.Join(v2TestColumns, "\n  "))
	}
	if want := []string{"PRIMARY USING btree (scope, event_id)"}; !slices.Equal(indexes, want) {
		t.Errorf("indexes of %s = %q, want only %q", table, indexes, want)
	}
	if !slices.Contains(options, "fillfactor=50") {
		t.Errorf("options of %s = %q, want fillfactor=50", table, options)
	}
	var sibling *string
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1)::text`, v1).Scan(&sibling); err != nil {
		t.Fatal(err)
	}
	if sibling != nil {
		t.Errorf("the v1 sibling %s is still there", *sibling)
	}
}

func TestPostgresMigrate(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	schema := "dedup_schema_" + deduptype.NewOwnerToken()[:12]
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	s, err := NewPostgresStore(pool, WithTable(schema+".Records"))
	if err != nil {
		t.Fatal(err)
	}
	// Twice, and from two goroutines at once: both must succeed.
	for range 2 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = s.Migrate(ctx) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	requireV2Shape(t, pool, s.table, schema+`."Records_v1"`)
	mustClaim(t, s, claimReq("migrate", "e1", "f"), ClaimAcquired)
}

// A table Migrate made before is left as it is (an operator's fillfactor
// too), and its records stay; a v1 table, here one made before the key
// columns compared bytes, is migrated to v2 with its records: a success
// stays a duplicate with its result, a live lease stays its owner's, a
// failure keeps its attempts. (The migration itself is tested in
// dedup_postgres_migrate_test.go.)
func TestPostgresMigrateKeepsEarlierTable(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()

	t.Run("v2", func(t *testing.T) {
		s := newTestPostgresStore(t, pool)
		old := mustClaim(t, s, claimReq("earlier", "kept", "f"), ClaimAcquired)
		if err := s.Complete(ctx, old.Record.Key, old.Record.Owner, []byte("r"), testTTL); err != nil {
			t.Fatal(err)
		}
		held := mustClaim(t, s, claimReq("earlier", "held", "f"), ClaimAcquired)
		if _, err := pool.Exec(ctx, `ALTER TABLE `+s.table+` SET (fillfactor = 70)`); err != nil {
			t.Fatal(err)
		}
		var before uint32
		if err := pool.QueryRow(ctx, `SELECT $1::regclass::oid`, s.table).Scan(&before); err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		var after uint32
		var options []string
		err := pool.QueryRow(ctx, `SELECT oid, reloptions FROM pg_class WHERE oid = $1::regclass`, s.table).Scan(&after, &options)
		if err != nil {
			t.Fatal(err)
		}
		if after != before || !slices.Equal(options, []string{"fillfactor=70"}) {
			t.Errorf("after Migrate: table oid %d (was %d), options %q (want fillfactor=70)", after, before, options)
		}
		if c := mustClaim(t, s, claimReq("earlier", "kept", "f"), ClaimDuplicate); string(c.Record.Result) != "r" {
			t.Errorf("earlier record's result = %q", c.Record.Result)
		}
		if c := mustClaim(t, s, claimReq("earlier", "held", "f"), ClaimInFlight); c.Record.Owner != held.Record.Owner {
			t.Errorf("held record's owner = %q, want %q", c.Record.Owner, held.Record.Owner)
		}
	})

	t.Run("v1", func(t *testing.T) {
		bare := "dedup_earlier_" + deduptype.NewOwnerToken()[:12]
		_, err := pool.Exec(ctx, `CREATE TABLE `+bare+` (
	scope text NOT NULL, event_id text NOT NULL,
	status text NOT NULL CONSTRAINT dedup_status_check
		CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
	fingerprint text NOT NULL, attempts integer NOT NULL, owner text NOT NULL,
	lease_until timestamptz NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL, last_error text, first_failure timestamptz, last_failure timestamptz,
	result bytea, previous_status text, PRIMARY KEY (scope, event_id)) WITH (fillfactor = 50);
CREATE INDEX `+bare+`_expires_at_idx ON `+bare+` (expires_at)`)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+bare+", "+bare+"_v1") })
		owner := deduptype.NewOwnerToken()
		sha := strings.Repeat("ab", 32) // a SHA-256 fingerprint
		_, err = pool.Exec(ctx, `INSERT INTO `+bare+` (scope, event_id, status, fingerprint, attempts, owner,
			lease_until, created_at, updated_at, expires_at, last_error, first_failure, last_failure, result) VALUES
			('earlier', 'kept', 'SUCCEEDED', $1, 1, 'o1', now(), now(), now(), now() + interval '1 hour', NULL, NULL, NULL, 'r'),
			('earlier', 'held', 'PROCESSING', 'f', 1, $2, now() + interval '1 hour', now(), now(), now() + interval '1 hour', NULL, NULL, NULL, NULL),
			('earlier', 'failed', 'FAILED_RETRYABLE', 'f', 2, 'o3', now(), now(), now(), now() + interval '1 hour', 'boom', now(), now(), NULL),
			('earlier', 'gone', 'SUCCEEDED', 'f', 1, 'o4', now(), now(), now(), now() - interval '1 second', NULL, NULL, NULL, NULL)`,
			sha, owner)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewPostgresStore(pool, WithTable(bare))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		requireV2Shape(t, pool, s.table, bare+"_v1")

		if c := mustClaim(t, s, claimReq("earlier", "kept", sha), ClaimDuplicate); string(c.Record.Result) != "r" {
			t.Errorf("v1 success's result = %q", c.Record.Result)
		}
		mustClaim(t, s, claimReq("earlier", "kept", strings.Repeat("cd", 32)), ClaimConflict)
		held := mustClaim(t, s, claimReq("earlier", "held", "f"), ClaimInFlight)
		if held.Record.Owner != owner {
			t.Errorf("v1 lease's owner = %q, want %q", held.Record.Owner, owner)
		}
		if err := s.Complete(ctx, held.Record.Key, "someone-else", nil, testTTL); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("complete of the v1 lease by a stranger = %v, want ErrLeaseLost", err)
		}
		if err := s.Complete(ctx, held.Record.Key, owner, nil, testTTL); err != nil {
			t.Errorf("complete of the v1 lease by its owner = %v", err)
		}
		mustClaim(t, s, claimReq("earlier", "held", "f"), ClaimDuplicate)
		failed := mustClaim(t, s, claimReq("earlier", "failed", "f"), ClaimAcquired)
		if failed.Previous != StatusFailedRetryable || failed.Record.Attempts != 3 || failed.Record.LastError != "boom" {
			t.Errorf("claim of the v1 failure = %+v", failed)
		}
		if gone := mustClaim(t, s, claimReq("earlier", "gone", "other"), ClaimAcquired); gone.Record.Attempts != 1 {
			t.Errorf("claim of the expired v1 record = %+v", gone)
		}

		reqs := []ClaimRequest{claimReq("earlier", "b", "f"), claimReq("earlier", "a", "f"), claimReq("earlier", "kept", sha)}
		claims, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if claims[0].Status != ClaimAcquired || claims[1].Status != ClaimAcquired || claims[2].Status != ClaimDuplicate {
			t.Fatalf("batch on the migrated table = %v, %v, %v", claims[0].Status, claims[1].Status, claims[2].Status)
		}
		errs, err := s.CompleteBatch(ctx, []deduptype.Completion{
			{Key: reqs[0].Key, Owner: claims[0].Record.Owner, TTL: testTTL},
			{Key: reqs[1].Key, Owner: claims[1].Record.Owner, TTL: testTTL},
		})
		if err != nil || errors.Join(errs...) != nil {
			t.Fatalf("complete batch on the migrated table: %v %v", err, errs)
		}
		mustClaim(t, s, claimReq("earlier", "a", "f"), ClaimDuplicate)
	})
}

func TestPostgresClaimLifecycle(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	req := claimReq("billing", "evt-1", "fp-1")

	c := mustClaim(t, s, req, ClaimAcquired)
	rec := c.Record
	if c.Previous != "" || rec.Status != StatusProcessing || rec.Attempts != 1 || rec.Owner == "" ||
		rec.Key != req.Key || rec.Fingerprint != "fp-1" {
		t.Fatalf("new claim = %+v", c)
	}
	// Lease and expiry come from the database clock, both from one now().
	if d := rec.LeaseUntil.Sub(rec.CreatedAt); d != testLease {
		t.Errorf("lease = %v, want %v", d, testLease)
	}
	if d := rec.ExpiresAt.Sub(rec.CreatedAt); d != testTTL+testTTL/64 {
		t.Errorf("ttl = %v, want %v (the TTL and its slack)", d, testTTL+testTTL/64)
	}

	mustClaim(t, s, req, ClaimInFlight)
	conflict := mustClaim(t, s, claimReq("billing", "evt-1", "fp-2"), ClaimConflict)
	if conflict.Record.Owner != rec.Owner {
		t.Errorf("conflict record owner = %q, want %q", conflict.Record.Owner, rec.Owner)
	}

	if err := s.Complete(ctx, req.Key, "someone-else", nil, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("complete by stranger = %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, req.Key, rec.Owner, []byte("receipt"), testTTL); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, req.Key, rec.Owner, nil, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("second complete = %v, want ErrLeaseLost", err)
	}
	got, err := s.Get(ctx, req.Key)
	if err != nil || got.Status != StatusSucceeded || string(got.Result) != "receipt" || got.Attempts != 1 {
		t.Fatalf("get = %+v, %v", got, err)
	}
	dup := mustClaim(t, s, req, ClaimDuplicate)
	if string(dup.Record.Result) != "receipt" {
		t.Errorf("duplicate result = %q", dup.Record.Result)
	}
	mustClaim(t, s, claimReq("billing", "evt-1", "fp-2"), ClaimConflict)
	// Another scope is another key.
	mustClaim(t, s, claimReq("shipping", "evt-1", "fp-2"), ClaimAcquired)

	if _, err := s.Get(ctx, Key{Scope: "billing", EventID: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("get absent = %v, want ErrNotFound", err)
	}
}

func TestPostgresLeaseTakeoverAndFencing(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	req := claimReq("orders", "evt-1", "fp")
	req.Lease = time.Millisecond
	first := mustClaim(t, s, req, ClaimAcquired)
	time.Sleep(5 * time.Millisecond)

	req.Lease = testLease
	second := mustClaim(t, s, req, ClaimAcquired)
	if second.Previous != StatusProcessing || second.Record.Attempts != 2 || second.Record.Owner == first.Record.Owner ||
		!second.Record.CreatedAt.Equal(first.Record.CreatedAt) {
		t.Fatalf("takeover = %+v", second)
	}
	old, cur := first.Record.Owner, second.Record.Owner
	if err := s.Extend(ctx, req.Key, old, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("extend by old owner = %v", err)
	}
	if err := s.Fail(ctx, req.Key, old, Failure{Error: "late", TTL: testTTL}); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("fail by old owner = %v", err)
	}
	if err := s.Complete(ctx, req.Key, old, nil, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("complete by old owner = %v", err)
	}
	if err := s.Extend(ctx, req.Key, cur, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, req.Key)
	if err != nil || got.Owner != cur || got.Status != StatusProcessing || got.LeaseUntil.Sub(got.UpdatedAt) != time.Hour {
		t.Fatalf("after extend: %+v, %v", got, err)
	}
}

func TestPostgresFailures(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	req := claimReq("mail", "evt-1", "fp")

	c := mustClaim(t, s, req, ClaimAcquired)
	if err := s.Fail(ctx, req.Key, c.Record.Owner, Failure{Error: "smtp down", TTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Get(ctx, req.Key)
	if err != nil || first.Status != StatusFailedRetryable || first.LastError != "smtp down" ||
		first.FirstFailure.IsZero() || !first.FirstFailure.Equal(first.LastFailure) {
		t.Fatalf("after fail: %+v, %v", first, err)
	}
	mustClaim(t, s, claimReq("mail", "evt-1", "other"), ClaimConflict)

	c = mustClaim(t, s, req, ClaimAcquired)
	if c.Previous != StatusFailedRetryable || c.Record.Attempts != 2 || c.Record.LastError != "smtp down" {
		t.Fatalf("retry claim = %+v", c)
	}
	if err := s.Fail(ctx, req.Key, c.Record.Owner, Failure{Final: true, Error: "bounced", TTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	final, err := s.Get(ctx, req.Key)
	if err != nil || final.Status != StatusFailedFinal || final.LastError != "bounced" || final.Attempts != 2 ||
		!final.FirstFailure.Equal(first.FirstFailure) || !final.LastFailure.After(first.LastFailure) {
		t.Fatalf("after final fail: %+v, %v", final, err)
	}
	mustClaim(t, s, req, ClaimFinal)
}

func TestPostgresExpiry(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	req := claimReq("expiry", "evt-1", "fp")
	c := mustClaim(t, s, req, ClaimAcquired)
	if err := s.Fail(ctx, req.Key, c.Record.Owner, Failure{Error: "x", TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := s.Get(ctx, req.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get expired = %v, want ErrNotFound", err)
	}
	if err := s.Complete(ctx, req.Key, c.Record.Owner, nil, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("complete expired = %v, want ErrLeaseLost", err)
	}
	// An expired record is absent: a new fingerprint starts afresh.
	fresh := mustClaim(t, s, claimReq("expiry", "evt-1", "fp-new"), ClaimAcquired)
	r := fresh.Record
	if fresh.Previous != "" || r.Attempts != 1 || r.LastError != "" || !r.FirstFailure.IsZero() ||
		!r.LastFailure.IsZero() || !r.CreatedAt.After(c.Record.CreatedAt) {
		t.Fatalf("claim after expiry = %+v", fresh)
	}
}

func TestPostgresClaimRace(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	req := claimReq("race", "evt-1", "fp")
	var acquired, inFlight atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			<-start
			c, err := s.Claim(context.Background(), req)
			switch {
			case err != nil:
				t.Error(err)
			case c.Status == ClaimAcquired:
				acquired.Add(1)
			case c.Status == ClaimInFlight:
				inFlight.Add(1)
			default:
				t.Errorf("claim = %v", c.Status)
			}
		})
	}
	close(start)
	wg.Wait()
	if acquired.Load() != 1 || inFlight.Load() != 49 {
		t.Fatalf("acquired %d, in flight %d; want 1 and 49", acquired.Load(), inFlight.Load())
	}
}

func TestPostgresInvalidKeyWritesNothing(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	bad := []Key{{Scope: "", EventID: "e"}, {Scope: "s", EventID: ""}, {Scope: "s", EventID: "a\x00b"}, {Scope: "s", EventID: strings.Repeat("x", MaxIDLen+1)}, {Scope: "s", EventID: "\xff"}}
	for _, k := range bad {
		if _, err := s.Claim(ctx, ClaimRequest{Key: k, Fingerprint: "f", Lease: testLease, TTL: testTTL}); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("claim %q = %v, want ErrInvalidKey", k, err)
		}
		if _, err := s.Get(ctx, k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("get %q = %v, want ErrInvalidKey", k, err)
		}
	}
	batch := []ClaimRequest{claimReq("s", "ok-1", "f"), {Key: bad[2], Fingerprint: "f"}, claimReq("s", "ok-2", "f")}
	if _, err := s.ClaimBatch(ctx, batch); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("batch with a bad key = %v, want ErrInvalidKey", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+s.table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written = %d, %v", n, err)
	}
}

// countingTracer counts statements sent to the server.
// newTracedPostgresStore returns a store on a fresh table whose pool counts
// the statements it sends.
func newTracedPostgresStore(t *testing.T) (*PostgresStore, *pgxpool.Pool, *countingTracer) {
	base := testenv.Postgres(t)
	cfg := base.Config()
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newTestPostgresStore(t, base)
	s.pool = pool
	return s, pool, tracer
}

// countingTracer counts the statements sent, and keeps the last one's text.
type countingTracer struct {
	n    atomic.Int32
	last atomic.Pointer[string]
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.last.Store(&data.SQL)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestPostgresClaimBatchMatchesSingleClaims(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	batchStore, singleStore := newTestPostgresStore(t, pool), newTestPostgresStore(t, pool)

	// The same existing records in both tables, one per state.
	const scope = "batch"
	rnd := rand.New(rand.NewPCG(1, 2))
	var reqs []ClaimRequest
	for i := range 60 {
		reqs = append(reqs, claimReq(scope, fmt.Sprintf("seed-%d", i), "fp"))
	}
	for _, s := range []*PostgresStore{batchStore, singleStore} {
		for i, req := range reqs {
			if i%6 == 5 {
				req.Lease = -time.Second // a worker that died: lease already lapsed
			}
			c := mustClaim(t, s, req, ClaimAcquired)
			var err error
			switch i % 6 {
			case 1:
				err = s.Complete(ctx, req.Key, c.Record.Owner, []byte("r"), testTTL)
			case 2:
				err = s.Fail(ctx, req.Key, c.Record.Owner, Failure{Error: "e", TTL: testTTL})
			case 3:
				err = s.Fail(ctx, req.Key, c.Record.Owner, Failure{Final: true, Error: "e", TTL: testTTL})
			case 4:
				err = s.Complete(ctx, req.Key, c.Record.Owner, nil, -time.Second) // expired
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// 300 claims of distinct keys: existing keys, new keys, other
	// fingerprints, lapsed leases.
	batch := make([]ClaimRequest, 0, 300)
	inBatch := map[Key]bool{}
	for len(batch) < cap(batch) {
		var req ClaimRequest
		if rnd.IntN(2) == 0 {
			req = reqs[rnd.IntN(len(reqs))]
		} else {
			req = claimReq(scope, fmt.Sprintf("new-%d", rnd.IntN(300)), "fp")
		}
		if rnd.IntN(5) == 0 {
			req.Fingerprint = "fp-other"
		}
		if rnd.IntN(10) == 0 {
			req.Lease = 0
		}
		if !inBatch[req.Key] {
			inBatch[req.Key] = true
			batch = append(batch, req)
		}
	}
	got, err := batchStore.ClaimBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(batch) {
		t.Fatalf("%d answers for %d claims", len(got), len(batch))
	}
	counts := map[ClaimStatus]int{}
	for i, req := range batch {
		want, err := singleStore.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		g := got[i]
		counts[g.Status]++
		if g.Status != want.Status || g.Previous != want.Previous || g.Record.Status != want.Record.Status ||
			g.Record.Attempts != want.Record.Attempts || g.Record.Fingerprint != want.Record.Fingerprint ||
			g.Record.Key != req.Key || string(g.Record.Result) != string(want.Record.Result) {
			t.Errorf("claim %d (%s %s lease %v): batch %v/%v %+v, single %v/%v %+v", i, req.Key, req.Fingerprint, req.Lease,
				g.Status, g.Previous, g.Record, want.Status, want.Previous, want.Record)
		}
	}
	for _, st := range []ClaimStatus{ClaimAcquired, ClaimDuplicate, ClaimInFlight, ClaimConflict, ClaimFinal} {
		if counts[st] == 0 {
			t.Errorf("the batch never answered %v: %v", st, counts)
		}
	}
}

func TestPostgresClaimBatchRoundTrips(t *testing.T) {
	s, _, tracer := newTracedPostgresStore(t)
	ctx := context.Background()
	reqs := make([]ClaimRequest, 500)
	for i := range reqs {
		reqs[i] = claimReq("trips", fmt.Sprintf("e-%d", i), "fp")
	}

	tracer.n.Store(0)
	if _, err := s.ClaimBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if n := tracer.n.Load(); n != 1 {
		t.Errorf("500 new keys took %d statements, want 1", n)
	}
	tracer.n.Store(0)
	got, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := tracer.n.Load(); n != 2 {
		t.Errorf("500 held keys took %d statements, want 2", n)
	}
	for i, c := range got {
		if c.Status != ClaimInFlight {
			t.Fatalf("answer %d = %v, want in-flight", i, c.Status)
		}
	}
}

func TestPostgresClaimBatchConcurrentOrders(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	reqs := make([]ClaimRequest, 200)
	for i := range reqs {
		reqs[i] = claimReq("orders", fmt.Sprintf("e-%d", i), "fp")
	}
	// Overlapping batches in different orders must neither deadlock nor
	// let two claims acquire one key.
	var acquired atomic.Int32
	var wg sync.WaitGroup
	for w := range 6 {
		batch := append([]ClaimRequest(nil), reqs...)
		rand.New(rand.NewPCG(uint64(w), 9)).Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		wg.Go(func() {
			got, err := s.ClaimBatch(context.Background(), batch)
			if err != nil {
				t.Error(err)
				return
			}
			for _, c := range got {
				if c.Status == ClaimAcquired {
					acquired.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := acquired.Load(); n != int32(len(reqs)) {
		t.Fatalf("%d keys acquired, want %d", n, len(reqs))
	}
}

func TestPostgresPurge(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	// Expired rows of both shapes: the inbox's narrow row and the store's.
	_, err := pool.Exec(ctx, `INSERT INTO `+s.table+` (scope, event_id, fingerprint, expires_at)
		SELECT 'purge', 'old-inbox-' || i, '\x00'::bytea || convert_to('fp', 'UTF8'), now() - interval '1 second'
		FROM generate_series(1, 1250) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+s.table+` (scope, event_id, status, fingerprint, attempts, owner,
		lease_until, created_at, updated_at, expires_at)
		SELECT 'purge', 'old-store-' || i, 2, '\x00'::bytea || convert_to('fp', 'UTF8'), 1, $1::bytea, now(), now(), now(),
			now() - interval '1 second'
		FROM generate_series(1, 1250) AS i`, v2TestPack(deduptype.NewOwnerToken(), 16))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mustClaim(t, s, claimReq("purge", fmt.Sprintf("live-%d", i), "fp"), ClaimAcquired)
	}
	n, err := s.Purge(ctx)
	if err != nil || n != 2500 {
		t.Fatalf("purge = %d, %v; want 2500", n, err)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+s.table).Scan(&left); err != nil || left != 3 {
		t.Fatalf("rows left = %d, %v; want the 3 live ones", left, err)
	}
	if n, err := s.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("second purge = %d, %v", n, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Purge(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("purge with cancelled context = %v", err)
	}
}

// v2TestPack packs s as the v2 table stores a fingerprint (n = 32) or an
// owner token (n = 16): exactly 2n lowercase hex digits not starting with
// "00" as the bytes they spell, any other string as 0x00 then its bytes.
func v2TestPack(s string, n int) []byte {
	if len(s) == 2*n && !strings.HasPrefix(s, "00") && strings.Trim(s, "0123456789abcdef") == "" {
		b, _ := hex.DecodeString(s) // lowercase hex digits of even length: no error
		return b
	}
	return append([]byte{0}, s...)
}

// v2TestUnpack reads back a value v2TestPack packed.
func v2TestUnpack(b []byte) string {
	if len(b) > 0 && b[0] == 0 {
		return string(b[1:])
	}
	return hex.EncodeToString(b)
}

// v2TestStatus names a v2 status column's value: NULL is SUCCEEDED, as the
// inbox writes it.
func v2TestStatus(s *int16) Status {
	if s == nil {
		return StatusSucceeded
	}
	switch *s {
	case 1:
		return StatusProcessing
	case 2:
		return StatusSucceeded
	case 3:
		return StatusFailedRetryable
	case 4:
		return StatusFailedFinal
	}
	return Status(fmt.Sprint("status ", *s))
}

// The store writes the v2 columns packed: a lowercase SHA-256 hex
// fingerprint and an owner token as the bytes they spell, any other string
// behind a 0x00; each reads back as the string it was.
func TestPostgresRecordPacking(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	sha := strings.Repeat("0123456789abcdef", 4)
	shaBytes, err := hex.DecodeString(sha)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		fp   string
		want []byte
	}{
		{sha, shaBytes},
		{strings.ToUpper(sha), append([]byte{0}, strings.ToUpper(sha)...)},
		{"00" + sha[2:], append([]byte{0}, "00"+sha[2:]...)},
		{sha[2:], append([]byte{0}, sha[2:]...)},
		{"fp", []byte("\x00fp")},
		{"", []byte{0}},
		{"née\x1f", append([]byte{0}, "née\x1f"...)},
	} {
		req := claimReq("packing", fmt.Sprintf("e%d", i), c.fp)
		claim := mustClaim(t, s, req, ClaimAcquired)
		var fp, owner []byte
		var status *int16
		var attempts *int32
		err := pool.QueryRow(ctx, `SELECT fingerprint, owner, status, attempts FROM `+s.table+` WHERE scope = $1 AND event_id = $2`,
			req.Key.Scope, req.Key.EventID).Scan(&fp, &owner, &status, &attempts)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fp, c.want) {
			t.Errorf("fingerprint %q stored as %x, want %x", c.fp, fp, c.want)
		}
		if want := v2TestPack(claim.Record.Owner, 16); !bytes.Equal(owner, want) || len(claim.Record.Owner) != 32 {
			t.Errorf("owner %q stored as %x, want %x", claim.Record.Owner, owner, want)
		}
		if v2TestStatus(status) != StatusProcessing || status == nil || attempts != nil && *attempts != 1 {
			t.Errorf("claim of %q stored status %v attempts %v", c.fp, status, attempts)
		}
		rec, err := s.Get(ctx, req.Key)
		if err != nil || rec.Fingerprint != c.fp || rec.Owner != claim.Record.Owner {
			t.Errorf("get of %q = %+v, %v", c.fp, rec, err)
		}
		mustClaim(t, s, req, ClaimInFlight)
		if err := s.Complete(ctx, req.Key, claim.Record.Owner, nil, testTTL); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, req, ClaimDuplicate)
		mustClaim(t, s, claimReq("packing", req.Key.EventID, c.fp+"x"), ClaimConflict)
	}
}

// Rows the v2 table admits that are no record: each is reported as
// ErrMalformedRecord by every read. The table's CHECK refuses a status out
// of 1..4, so status can no longer be wrong.
func TestPostgresMalformedRecords(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	for _, status := range []int{0, 5, 9} {
		_, err := pool.Exec(ctx, `INSERT INTO `+s.table+` (scope, event_id, status, fingerprint, attempts, owner,
			lease_until, created_at, updated_at, expires_at)
			VALUES ('bad', 'status', $1, '\x006670', 1, '\x006f', now(), now(), now(), now() + interval '1 hour')`, status)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" { // check_violation
			t.Errorf("insert of status %d = %v, want a check violation", status, err)
		}
	}
	owner := v2TestPack(deduptype.NewOwnerToken(), 16)
	// '\x006670' is "fp" packed (a zero byte, then its bytes); '\x0102' is
	// no packed value: neither the 32 (16) bytes of a canonical fingerprint
	// (owner) nor led by a zero byte. A PROCESSING row needs its lease.
	_, err := pool.Exec(ctx, `INSERT INTO `+s.table+` (scope, event_id, status, fingerprint, attempts, owner,
		lease_until, created_at, updated_at, expires_at) VALUES
		('bad', 'fp-length', 2, '\x0102', 1, $1, now(), now(), now(), now() + interval '1 hour'),
		('bad', 'owner-length', 1, '\x006670', 1, '\x0102', now() + interval '1 hour', now(), now(), now() + interval '1 hour'),
		('bad', 'null-lease', 1, '\x006670', 1, $1, NULL, now(), now(), now() + interval '1 hour'),
		('bad', 'infinite', 2, '\x006670', 1, $1, now(), now(), now(), 'infinity'),
		('bad', 'infinite-lease', 1, '\x006670', 1, $1, 'infinity', now(), now(), now() + interval '1 hour'),
		('bad', 'negative', 2, '\x006670', -3, $1, now(), now(), now(), now() + interval '1 hour')`, owner)
	if err != nil {
		t.Fatal(err)
	}
	// The inbox's narrow row is a record: SUCCEEDED, one attempt.
	_, err = pool.Exec(ctx, `INSERT INTO `+s.table+` (scope, event_id, fingerprint, expires_at)
		VALUES ('bad', 'fine', '\x006670', now() + interval '1 hour')`)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, Key{Scope: "bad", EventID: "fine"}); err != nil || rec.Status != StatusSucceeded ||
		rec.Attempts != 1 || rec.Fingerprint != "fp" || rec.Owner != "" {
		t.Errorf("inbox row = %+v, %v", rec, err)
	}
	mustClaim(t, s, claimReq("bad", "fine", "fp"), ClaimDuplicate)
	mustClaim(t, s, claimReq("bad", "fine", "other"), ClaimConflict)
	for _, id := range []string{"fp-length", "owner-length", "null-lease", "infinite", "infinite-lease", "negative"} {
		req := claimReq("bad", id, "fp")
		if _, err := s.Get(ctx, req.Key); !errors.Is(err, ErrMalformedRecord) {
			t.Errorf("get %s = %v, want ErrMalformedRecord", id, err)
		}
		if _, err := s.Claim(ctx, req); !errors.Is(err, ErrMalformedRecord) {
			t.Errorf("claim %s = %v, want ErrMalformedRecord", id, err)
		}
		if _, err := s.ClaimBatch(ctx, []ClaimRequest{claimReq("bad", "new", "fp"), req}); !errors.Is(err, ErrMalformedRecord) {
			t.Errorf("claim batch %s = %v, want ErrMalformedRecord", id, err)
		}
	}
	// A column of the wrong type cannot be scanned: malformed, not a panic.
	// (first_failure is read as it is; attempts, read through coalesce,
	// would make the statement fail instead.)
	if _, err := pool.Exec(ctx, `ALTER TABLE `+s.table+` ALTER COLUMN first_failure TYPE text`); err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `UPDATE `+s.table+` SET first_failure = 'long ago' WHERE event_id = 'fine'`)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh pool: cached statements on the old one describe the old column type.
	fresh, err := pgxpool.NewWithConfig(ctx, pool.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	s.pool = fresh
	if _, err := s.Get(ctx, Key{Scope: "bad", EventID: "fine"}); !errors.Is(err, ErrMalformedRecord) {
		t.Errorf("get with a text first_failure = %v, want ErrMalformedRecord", err)
	}
}

func TestPostgresMissingTable(t *testing.T) {
	s, err := NewPostgresStore(testenv.Postgres(t), WithTable("dedup_never_migrated"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := claimReq("missing", "e", "fp")
	_, claimErr := s.Claim(ctx, req)
	_, batchErr := s.ClaimBatch(ctx, []ClaimRequest{req})
	_, getErr := s.Get(ctx, req.Key)
	_, purgeErr := s.Purge(ctx)
	for name, err := range map[string]error{
		"claim": claimErr, "batch": batchErr, "get": getErr, "purge": purgeErr,
		"complete": s.Complete(ctx, req.Key, "o", nil, testTTL),
	} {
		var pgErr *pgconn.PgError
		if err == nil || !strings.Contains(err.Error(), "run Migrate") || !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("%s on a missing table = %v, want a hint to run Migrate wrapping undefined_table", name, err)
		}
	}
}

func TestPostgresUnreachable(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := NewPostgresStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Claim(ctx, claimReq("down", "e", "fp")); err == nil || !strings.Contains(err.Error(), "down/e") {
		t.Errorf("claim with no server = %v, want an error naming the key", err)
	}
	if err := s.Migrate(ctx); err == nil {
		t.Error("migrate with no server succeeded")
	}
}

// inboxClaim claims req in a new transaction and returns the transaction.
func inboxClaim(t *testing.T, pool *pgxpool.Pool, s *PostgresStore, req ClaimRequest) (pgx.Tx, Claim) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.claimInTx(context.Background(), tx, req)
	if err != nil {
		_ = tx.Rollback(context.Background())
		t.Fatal(err)
	}
	return tx, c
}

// waitForLockWaiter waits until a session is blocked on a lock on table.
func waitForLockWaiter(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatal("no claim blocked on the first transaction")
}

func TestPostgresInboxBlocksUntilFirstTxEnds(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		req := claimReq("inbox", fmt.Sprintf("commit-%v", commit), "fp")
		tx1, c1 := inboxClaim(t, pool, s, req)
		if c1.Status != ClaimAcquired || c1.Record.Status != StatusSucceeded || c1.Record.Attempts != 1 {
			t.Fatalf("first inbox claim = %+v", c1)
		}
		second := make(chan Claim, 1)
		go func() {
			var c2 Claim
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
				c2, err = s.claimInTx(ctx, tx, req)
				return err
			})
			if err != nil {
				t.Error(err)
			}
			second <- c2
		}()
		waitForLockWaiter(t, pool, s.table)
		var err error
		if commit {
			err = tx1.Commit(ctx)
		} else {
			err = tx1.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		c2 := <-second
		want := ClaimDuplicate
		if !commit {
			want = ClaimAcquired
		}
		if c2.Status != want || c2.Record.Attempts != 1 {
			t.Errorf("commit=%v: blocked claim = %v attempts %d, want %v attempts 1", commit, c2.Status, c2.Record.Attempts, want)
		}
	}
}

func TestPostgresInboxRace(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	business := "dedup_test_orders_" + deduptype.NewOwnerToken()[:12]
	if _, err := pool.Exec(ctx, "CREATE TABLE "+business+" (event_id text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+business) })

	req := claimReq("inbox-race", "evt-1", "fp")
	var acquired, duplicates atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			<-start
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				c, err := s.claimInTx(ctx, tx, req)
				if err != nil {
					return err
				}
				switch c.Status {
				case ClaimAcquired:
					acquired.Add(1)
					_, err = tx.Exec(ctx, "INSERT INTO "+business+" VALUES ($1)", req.Key.EventID)
					time.Sleep(2 * time.Millisecond) // keep the others waiting on the key
					return err
				case ClaimDuplicate:
					duplicates.Add(1)
					return nil
				}
				return fmt.Errorf("inbox claim = %v", c.Status)
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+business).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || acquired.Load() != 1 || duplicates.Load() != 49 {
		t.Fatalf("business rows %d, acquired %d, duplicates %d; want 1, 1, 49", rows, acquired.Load(), duplicates.Load())
	}
}

func TestPostgresInboxAttempts(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	req := claimReq("inbox-attempts", "evt-1", "fp")

	for attempt := 1; attempt <= 3; attempt++ {
		tx, c := inboxClaim(t, pool, s, req)
		wantPrevious := Status("")
		if attempt > 1 {
			wantPrevious = StatusFailedRetryable
		}
		if c.Status != ClaimAcquired || c.Record.Attempts != attempt || c.Previous != wantPrevious {
			t.Fatalf("attempt %d: claim = %+v", attempt, c)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := s.recordFailure(ctx, req, Failure{Final: attempt == 3, Error: fmt.Sprint("boom ", attempt), TTL: testTTL})
		if err != nil || n != attempt {
			t.Fatalf("attempt %d: recordFailure = %d, %v", attempt, n, err)
		}
	}
	rec, err := s.Get(ctx, req.Key)
	if err != nil || rec.Status != StatusFailedFinal || rec.Attempts != 3 || rec.LastError != "boom 3" ||
		rec.FirstFailure.IsZero() || rec.LastFailure.Before(rec.FirstFailure) {
		t.Fatalf("after three failures: %+v, %v", rec, err)
	}
	tx, c := inboxClaim(t, pool, s, req)
	_ = tx.Rollback(ctx)
	if c.Status != ClaimFinal {
		t.Errorf("claim of a final record = %v", c.Status)
	}
	if _, err := s.recordFailure(ctx, req, Failure{Error: "again", TTL: testTTL}); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("recordFailure on a final record = %v, want ErrLeaseLost", err)
	}

	// Committed success is never counted as a failure afterwards.
	ok := claimReq("inbox-attempts", "evt-2", "fp")
	tx, _ = inboxClaim(t, pool, s, ok)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.recordFailure(ctx, ok, Failure{Error: "late", TTL: testTTL}); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("recordFailure after commit = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, ok.Key); err != nil || rec.Status != StatusSucceeded || rec.Attempts != 1 {
		t.Errorf("committed record = %+v, %v", rec, err)
	}
	// The row an inbox transaction commits is narrow: status NULL
	// (SUCCEEDED), attempts NULL (1), no owner, lease or timestamps.
	if got, want := v2TestColumnsSet(t, pool, s.table, ok.Key), v2TestInboxColumns; !slices.Equal(got, want) {
		t.Errorf("committed inbox row sets %q, want only %q", got, want)
	}
}

// v2TestInboxColumns are the columns a committed inbox row sets, in order.
var v2TestInboxColumns = []string{"event_id", "expires_at", "fingerprint", "scope"}

// v2TestColumnsSet returns the names of the columns of key's row in table
// that are not NULL, in order.
func v2TestColumnsSet(t *testing.T, pool *pgxpool.Pool, table string, key Key) []string {
	t.Helper()
	var set []string
	err := pool.QueryRow(context.Background(), `SELECT array_agg(k ORDER BY k)
		FROM `+table+` r, json_object_keys(json_strip_nulls(row_to_json(r))) k
		WHERE r.scope = $1 AND r.event_id = $2`, key.Scope, key.EventID).Scan(&set)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestPostgresInboxAfterClaimMode(t *testing.T) {
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	ctx := context.Background()
	live := claimReq("mixed", "live", "fp")
	mustClaim(t, s, live, ClaimAcquired)
	tx, c := inboxClaim(t, pool, s, live)
	_ = tx.Rollback(ctx)
	if c.Status != ClaimInFlight {
		t.Errorf("inbox claim over a live lease = %v, want in-flight", c.Status)
	}

	dead := claimReq("mixed", "dead", "fp")
	dead.Lease = -time.Second
	mustClaim(t, s, dead, ClaimAcquired)
	tx, c = inboxClaim(t, pool, s, dead)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Status != ClaimAcquired || c.Previous != StatusProcessing || c.Record.Attempts != 2 || c.Record.Status != StatusSucceeded {
		t.Errorf("inbox takeover of a lapsed lease = %+v", c)
	}
	if _, err := s.claimInTx(ctx, nil, ClaimRequest{Key: Key{Scope: "", EventID: "x"}}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("inbox claim of an invalid key = %v", err)
	}
}

// BenchmarkPostgresClaimComplete measures one new key claimed then
// completed, the per-message path; pg-µs/event is as in
// BenchmarkPostgresCompleteBatch.
func BenchmarkPostgresClaimComplete(b *testing.B) {
	pool, serverCPU := onePostgresConn(b)
	s := newTestPostgresStore(b, pool)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	before := serverCPU()
	defer func() { reportServerCPU(b, serverCPU()-before, i) }()
	for b.Loop() {
		i++
		req := claimReq("bench", fmt.Sprintf("evt-%d", i), "fp")
		c, err := s.Claim(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, req.Key, c.Record.Owner, nil, testTTL); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPostgresCompleteBatch measures CompleteBatch per completion; the
// claims it completes are made with the timer stopped. pg-µs/event is the
// server's CPU time per completion, where the server runs on this machine.
// by=locator completes as a wrapper does, by=key as a caller that has only
// the keys and owners.
func BenchmarkPostgresCompleteBatch(b *testing.B) {
	pool, serverCPU := onePostgresConn(b)
	s := newTestPostgresStore(b, pool)
	ctx := context.Background()
	for _, bench := range []struct {
		size    int
		located bool
	}{{1, true}, {10, true}, {100, true}, {500, true}, {10, false}, {500, false}} {
		size := bench.size
		by := map[bool]string{true: "locator", false: "key"}[bench.located]
		b.Run(fmt.Sprintf("size=%d/by=%s", size, by), func(b *testing.B) {
			b.ReportAllocs()
			reqs := make([]ClaimRequest, size)
			cs := make([]deduptype.Completion, size)
			var server time.Duration
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				for j := range reqs {
					reqs[j] = claimReq("bench", fmt.Sprintf("c%d%s-%d-%d", size, by, n, j), "fp")
				}
				claims, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					b.Fatal(err)
				}
				for j, c := range claims {
					cs[j] = deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, TTL: testTTL}
					if bench.located {
						cs[j].Locator = c.Locator
					}
				}
				before := serverCPU()
				b.StartTimer()
				if _, err := s.CompleteBatch(ctx, cs); err != nil {
					b.Fatal(err)
				}
				server += serverCPU() - before
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/event")
			reportServerCPU(b, server, b.N*size)
		})
	}
}

// BenchmarkPostgresClaimBatch measures ClaimBatch of new keys per key;
// pg-µs/event is as in BenchmarkPostgresCompleteBatch.
func BenchmarkPostgresClaimBatch(b *testing.B) {
	pool, serverCPU := onePostgresConn(b)
	s := newTestPostgresStore(b, pool)
	ctx := context.Background()
	for _, size := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			reqs := make([]ClaimRequest, size)
			batches := 0
			before := serverCPU()
			for b.Loop() {
				batches++
				for j := range reqs {
					reqs[j] = claimReq("bench", fmt.Sprintf("b%d-%d-%d", size, batches, j), "fp")
				}
				if _, err := s.ClaimBatch(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(batches*size), "ns/event")
			reportServerCPU(b, serverCPU()-before, batches*size)
		})
	}
}

// onePostgresConn returns a pool of one connection to the test server, and
// a function reading the CPU time its backend has used so far, from /proc:
// zero when the server is not on this machine.
func onePostgresConn(b *testing.B) (*pgxpool.Pool, func() time.Duration) {
	cfg := testenv.Postgres(b).Config().Copy()
	cfg.MinConns, cfg.MaxConns = 1, 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var pid int
	if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	return pool, func() time.Duration {
		// The first field of schedstat is the time on a CPU, in ns.
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return 0
		}
		ns, _ := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		return time.Duration(ns)
	}
}

func reportServerCPU(b *testing.B, server time.Duration, events int) {
	if server > 0 {
		b.ReportMetric(float64(server.Nanoseconds())/1e3/float64(events), "pg-µs/event")
	}
}

// Fingerprints are free-form: one that cannot travel as a list item (empty,
// or holding the list separator) makes the batch send them as an array.
func TestPostgresClaimBatchOddFingerprints(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	for _, fps := range [][]string{{""}, {"a\x1fb", "plain"}, {"", "x", ""}} {
		scope := "odd-" + deduptype.NewOwnerToken()[:8]
		reqs := make([]ClaimRequest, len(fps))
		for i, fp := range fps {
			reqs[i] = claimReq(scope, fmt.Sprintf("e%d", i), fp)
		}
		claims, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatalf("%q: %v", fps, err)
		}
		for i, c := range claims {
			if c.Status != ClaimAcquired || c.Record.Fingerprint != fps[i] {
				t.Errorf("%q: claim %d = %v with fingerprint %q", fps, i, c.Status, c.Record.Fingerprint)
			}
			if again := mustClaim(t, s, reqs[i], ClaimInFlight); again.Record.Fingerprint != fps[i] {
				t.Errorf("%q: stored fingerprint %q", fps, again.Record.Fingerprint)
			}
		}
	}
}

// A completion soon after its claim keeps the claim's expiry, so that the
// row is updated in place; one asking for a retention outside the claim's
// slack sets its own.
func TestPostgresCompletionKeepsExpiry(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		scope := fmt.Sprintf("expiry-%v", batch)
		complete := func(c Claim, ttl time.Duration) {
			t.Helper()
			if !batch {
				if err := s.Complete(ctx, c.Record.Key, c.Record.Owner, nil, ttl); err != nil {
					t.Fatal(err)
				}
				return
			}
			errs, err := s.CompleteBatch(ctx, []deduptype.Completion{{Key: c.Record.Key, Owner: c.Record.Owner, TTL: ttl}})
			if err != nil || errs[0] != nil {
				t.Fatal(err, errs)
			}
		}
		kept := mustClaim(t, s, claimReq(scope, "kept", "fp"), ClaimAcquired)
		complete(kept, testTTL)
		rec, err := s.Get(ctx, kept.Record.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.ExpiresAt.Equal(kept.Record.ExpiresAt) || rec.ExpiresAt.Sub(rec.UpdatedAt) < testTTL {
			t.Errorf("batch=%v: expiry %v after completion at %v, claim had %v", batch, rec.ExpiresAt, rec.UpdatedAt, kept.Record.ExpiresAt)
		}
		short := mustClaim(t, s, claimReq(scope, "short", "fp"), ClaimAcquired)
		complete(short, time.Minute)
		rec, err = s.Get(ctx, short.Record.Key)
		if err != nil {
			t.Fatal(err)
		}
		if d := rec.ExpiresAt.Sub(rec.UpdatedAt); d != time.Minute {
			t.Errorf("batch=%v: retention %v after a completion asking for 1m", batch, d)
		}
	}
}

// An owner that cannot be a list item is no token of the store: it holds
// nothing, and the rest of the batch is completed.
func TestPostgresCompleteBatchOddOwner(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	ctx := context.Background()
	c := mustClaim(t, s, claimReq("odd-owner", "e", "fp"), ClaimAcquired)
	errs, err := s.CompleteBatch(ctx, []deduptype.Completion{
		{Key: c.Record.Key, Owner: "x\x1fy", TTL: testTTL},
		{Key: c.Record.Key, Owner: "", TTL: testTTL},
		{Key: c.Record.Key, Owner: c.Record.Owner, Result: []byte("r"), TTL: testTTL},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], ErrLeaseLost) || !errors.Is(errs[1], ErrLeaseLost) || errs[2] != nil {
		t.Fatalf("errs = %v", errs)
	}
	if rec, err := s.Get(ctx, c.Record.Key); err != nil || rec.Status != StatusSucceeded || string(rec.Result) != "r" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
}

// Completions of a wrapper's batch claim find their rows where the claim
// wrote them, in one statement; a row that has moved since (extended), whose
// lease ran out, or that a locator does not match is completed by key, and a
// row taken over stays its new owner's.
func TestPostgresCompleteBatchByLocator(t *testing.T) {
	s, pool, tracer := newTracedPostgresStore(t)
	ctx := context.Background()
	claimAll := func(prefix string, n int) ([]ClaimRequest, []deduptype.Completion) {
		reqs := make([]ClaimRequest, n)
		for i := range reqs {
			reqs[i] = claimReq("located", fmt.Sprintf("%s-%d", prefix, i), "fp")
		}
		claims, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]deduptype.Completion, n)
		for i, c := range claims {
			if c.Status != ClaimAcquired || c.Locator == 0 {
				t.Fatalf("claim %d = %v, locator %d", i, c.Status, c.Locator)
			}
			cs[i] = deduptype.Completion{Key: reqs[i].Key, Owner: c.Record.Owner, TTL: testTTL, Locator: c.Locator}
		}
		return reqs, cs
	}
	row := func(key Key) (status Status, owner, result string) {
		var st *int16
		var packed, res []byte
		err := pool.QueryRow(ctx, `SELECT status, owner, result FROM `+s.table+` WHERE scope = $1 AND event_id = $2`,
			key.Scope, key.EventID).Scan(&st, &packed, &res)
		if err != nil {
			t.Fatal(err)
		}
		return v2TestStatus(st), v2TestUnpack(packed), string(res)
	}

	_, cs := claimAll("plain", 50)
	tracer.n.Store(0)
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil || errors.Join(errs...) != nil {
		t.Fatalf("complete: %v %v", err, errs)
	}
	if n := tracer.n.Load(); n != 1 || *tracer.last.Load() != s.sql.completeLocated {
		t.Errorf("50 located completions took %d statements, the last %q", n, *tracer.last.Load())
	}
	for _, c := range cs {
		if status, _, _ := row(c.Key); status != StatusSucceeded {
			t.Fatalf("%s is %s", c.Key, status)
		}
	}

	reqs, cs := claimAll("mixed", 7)
	// 0: moved by an extension. 1: lease ran out, not taken over.
	// 2: lease ran out, taken over. 3: with a result. 4, 5: locators
	// swapped. 6: untouched.
	if err := s.Extend(ctx, cs[0].Key, cs[0].Owner, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs[1:3] {
		if _, err := pool.Exec(ctx, `UPDATE `+s.table+` SET lease_until = now() - interval '1 second'
			WHERE scope = $1 AND event_id = $2`, c.Key.Scope, c.Key.EventID); err != nil {
			t.Fatal(err)
		}
	}
	thief, err := s.ClaimBatch(ctx, []ClaimRequest{reqs[2], claimReq("located", "other", "fp")})
	if err != nil || thief[0].Status != ClaimAcquired {
		t.Fatalf("takeover = %+v, %v", thief, err)
	}
	cs[3].Result = []byte("result")
	cs[4].Locator, cs[5].Locator = cs[5].Locator, cs[4].Locator
	errs, err = s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		status, owner, result := row(c.Key)
		switch {
		case i == 2:
			if !errors.Is(errs[i], ErrLeaseLost) || status != StatusProcessing || owner != thief[0].Record.Owner {
				t.Errorf("taken over: err %v, row %s %s", errs[i], status, owner)
			}
		case errs[i] != nil || status != StatusSucceeded || owner != c.Owner:
			t.Errorf("completion %d: err %v, row %s %s", i, errs[i], status, owner)
		case i == 3 && result != "result":
			t.Errorf("result = %q", result)
		}
	}
}
