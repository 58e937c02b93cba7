package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// cli runs the command line and returns its exit status and output.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBadUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"inspect", "-no-such-flag"},
		{"inspect", "-postgres", "postgres://x", "-scope", "s"},
		{"stuck", "-limit", "0", "-postgres", "postgres://x"},
		{"outbox"},
		{"outbox", "requeue", "-postgres", "postgres://x"},
		{"redrive", "rabbitmq"},
		{"redrive", "kafka", "-postgres", "postgres://x"},
		{"inspect", "-scope", "s", "-id", "i"}, // no store
	} {
		t.Setenv("DEDUP_POSTGRES_DSN", "")
		t.Setenv("DEDUP_DYNAMODB_ENDPOINT", "")
		t.Setenv("DEDUP_REDIS_ADDR", "")
		code, _, _ := cli(t, args...)
		require.Equal(t, 2, code, "%q", args)
	}
}

// Help asked for, of the tool or of any command, is no usage error.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"outbox", "-h"}, {"redrive", "--help"}, {"stuck", "-h"},
		{"redrive", "kafka", "-h"}, {"outbox", "status", "-h"}} {
		code, _, _ := cli(t, args...)
		require.Equal(t, 0, code, "%q", args)
	}
}

// A DSN that does not connect is a clear failure, not a usage error.
func TestUnreachableStore(t *testing.T) {
	code, _, errOut := cli(t, "inspect", "-postgres", "postgres://postgres@"+testenv.ClosedPort(t)+"/test?connect_timeout=2",
		"-scope", "s", "-id", "i")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot reach PostgreSQL")
}

// postgresTable returns the DSN and a migrated store on a table of its own.
func postgresTable(t *testing.T) (string, string, *dedup.PostgresStore, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.Postgres(t)
	table := "cli_" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	return testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN), table, store, pool
}

// A worker died holding a key: stuck lists it, inspect shows it, release
// does nothing without -yes, then frees it; a succeeded key is never
// released; purge counts, then deletes, expired records.
func TestRecordsPostgres(t *testing.T) {
	dsn, table, store, _ := postgresTable(t)
	testRecords(t, store, "-postgres", dsn, "-table", table)

	ctx := context.Background()
	_, err := store.Claim(ctx, dedup.ClaimRequest{Key: dedup.Key{Scope: "cli", EventID: "old"}, Fingerprint: "f",
		Lease: time.Millisecond, TTL: time.Millisecond})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	code, out, _ := cli(t, "purge", "-postgres", dsn, "-table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, "would delete 1 expired records")
	code, out, _ = cli(t, "purge", "-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 0, code)
	require.Contains(t, out, "deleted 1 expired records")
}

// TestRecordsDynamoDB runs with DEDUP_POSTGRES_DSN set, as the README
// tells users to: naming -dynamodb on the command line leaves PostgreSQL
// out.
func TestRecordsDynamoDB(t *testing.T) {
	t.Setenv("DEDUP_POSTGRES_DSN", testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	client := testenv.DynamoDB(t)
	table := "cli-" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	require.NoError(t, dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(table)))
	store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	require.NoError(t, err)
	testRecords(t, store, "-dynamodb", testenv.Env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"), "-table", table)
}

func testRecords(t *testing.T, store dedup.Store, flags ...string) {
	ctx := context.Background()
	scope := "cli/" + strings.ToLower(deduptype.NewOwnerToken()[:8])
	req := func(id string, lease time.Duration) dedup.Claim {
		c, err := store.Claim(ctx, dedup.ClaimRequest{Key: dedup.Key{Scope: scope, EventID: id}, Fingerprint: "f", Lease: lease, TTL: time.Hour})
		require.NoError(t, err)
		return c
	}
	req("dead", time.Millisecond)
	alive := req("alive", time.Hour)
	done := req("done", time.Hour)
	require.NoError(t, store.Complete(ctx, done.Record.Key, done.Record.Owner, nil, time.Hour))
	time.Sleep(10 * time.Millisecond)
	with := func(args ...string) []string { return append(args, flags...) }

	code, out, errOut := cli(t, with("stuck", "-scope", scope)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "PROCESSING")
	require.Contains(t, out, "/dead")
	require.NotContains(t, out, "/alive")
	require.Contains(t, out, "1 stuck")

	code, out, _ = cli(t, with("inspect", "-scope", scope, "-id", "dead", "-json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"status":"PROCESSING"`)
	code, out, _ = cli(t, with("inspect", "-scope", scope, "-id", "done")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "SUCCEEDED")
	code, _, errOut = cli(t, with("inspect", "-scope", scope, "-id", "never")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no record")

	code, out, _ = cli(t, with("release", "-scope", scope, "-id", "dead")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "would release")
	_, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: "dead"})
	require.NoError(t, err, "a dry run changes nothing")
	code, out, _ = cli(t, with("release", "-scope", scope, "-id", "dead", "-yes")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "released")
	again := req("dead", time.Hour)
	require.Equal(t, dedup.ClaimAcquired, again.Status)
	require.Equal(t, 1, again.Record.Attempts)

	code, _, errOut = cli(t, with("release", "-scope", scope, "-id", "alive", "-yes")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "may be alive")
	code, _, errOut = cli(t, with("release", "-scope", scope, "-id", "done", "-yes", "-force")...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "succeeded")
	rec, err := store.Get(ctx, alive.Record.Key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusProcessing, rec.Status)
}
