package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// States names the state of each requested event that exists, and leaves
// the unknown IDs out.
func TestStates(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := "outbox_states_" + runID()
	ob, err := outbox.New(outbox.WithTable(table))
	require.NoError(t, err)
	_, err = ob.States(ctx, pool, "x")
	require.ErrorIs(t, err, outbox.ErrNotMigrated)
	_, err = ob.States(ctx, nil, "x")
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.NoError(t, ob.Migrate(ctx, pool))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := ob.Add(ctx, tx, outbox.Event{Destination: "d", Payload: []byte("a")},
		outbox.Event{Destination: "d", Payload: []byte("b")}, outbox.Event{Destination: "d", Payload: []byte("c")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = pool.Exec(ctx, "UPDATE "+table+" SET status = 'failed', attempts = 3, last_error = 'refused' WHERE event_id = $1", ids[1])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+table+" SET status = 'sent', sent_at = now() WHERE event_id = $1", ids[2])
	require.NoError(t, err)

	states, err := ob.States(ctx, pool, ids[0], ids[1], ids[2], "unknown", ids[1])
	require.NoError(t, err)
	require.Equal(t, map[string]string{ids[0]: "pending", ids[1]: "failed", ids[2]: "sent"}, states)
	states, err = ob.States(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, states)

	// What States calls failed is what Requeue changes.
	n, err := ob.Requeue(ctx, pool, ids...)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	states, err = ob.States(ctx, pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, map[string]string{ids[1]: "pending"}, states)
}
