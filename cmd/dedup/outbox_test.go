package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// outbox status counts the events by state and lists the failed ones;
// requeue lists what it would do, then makes them pending again.
func TestOutboxStatusAndRequeue(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := "cli_outbox_" + strings.ToLower(dedup.NewOwnerToken()[:12])
	ob, err := outbox.New(outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(ctx, pool))
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := ob.Add(ctx, tx, outbox.Event{Destination: "orders", Payload: []byte("a")},
		outbox.Event{Destination: "orders", Payload: []byte("b")}, outbox.Event{Destination: "orders", Payload: []byte("c")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	// The relay gave up on one of them (as after WithMaxAttempts).
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET status = 'failed', attempts = 5, last_error = 'broker refused' WHERE event_id = $1`, ids[1])
	require.NoError(t, err)

	dsn := testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	code, out, errOut := cli(t, "outbox", "status", "-postgres", dsn, "-table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "pending 2")
	require.Contains(t, out, "failed 1")
	require.Contains(t, out, ids[1])
	require.Contains(t, out, "broker refused")

	code, out, _ = cli(t, "outbox", "requeue", "-postgres", dsn, "-table", table, "-all")
	require.Equal(t, 0, code)
	require.Contains(t, out, "would requeue 1 events: "+ids[1])
	code, out, _ = cli(t, "outbox", "requeue", "-postgres", dsn, "-table", table, "-id", ids[1], "-yes")
	require.Equal(t, 0, code)
	require.Contains(t, out, "requeued 1 of 1")
	code, out, _ = cli(t, "outbox", "status", "-postgres", dsn, "-table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, "pending 3")
	require.Contains(t, out, "failed 0")
}
