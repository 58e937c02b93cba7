package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// An operator lists the keys held without progress and forgets them, fenced
// on the owner token read: a record claimed again since, or completed, is
// left alone.
func TestAdmin(t *testing.T) {
	all := stores()
	all["dynamodb"] = func(t *testing.T) dedup.Store {
		s, _, _ := newDynamoDBStore(t)
		return s
	}
	for name, newStore := range all {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			admin, ok := store.(dedup.Admin)
			if !ok {
				t.Skipf("%T has no Admin", store)
			}
			ctx := context.Background()
			scope := uniqueScope(t)
			claim := func(id string, lease time.Duration) dedup.Claim {
				c, err := store.Claim(ctx, dedup.ClaimRequest{Key: dedup.Key{Scope: scope, EventID: id}, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
				require.NoError(t, err)
				require.Equal(t, dedup.ClaimAcquired, c.Status)
				return c
			}
			dead := claim("dead", time.Millisecond) // its worker died
			alive := claim("alive", time.Hour)      // running
			failed := claim("failed", time.Hour)    // failed, its message gone
			done := claim("done", time.Hour)        // succeeded
			require.NoError(t, store.Fail(ctx, failed.Record.Key, failed.Record.Owner, dedup.Failure{Error: "boom", TTL: time.Hour}))
			require.NoError(t, store.Complete(ctx, done.Record.Key, done.Record.Owner, nil, time.Hour))
			time.Sleep(20 * time.Millisecond)

			stuck, err := admin.Stuck(ctx, scope, 10*time.Millisecond, 10)
			require.NoError(t, err)
			var ids []string
			for _, r := range stuck {
				ids = append(ids, r.Key.EventID)
			}
			require.ElementsMatch(t, []string{"dead", "failed"}, ids)
			none, err := admin.Stuck(ctx, scope, time.Hour, 10)
			require.NoError(t, err)
			require.Len(t, none, 1, "a failure younger than the age is not stuck")

			// Fenced on the owner read: a stale token changes nothing.
			forgot, err := admin.Forget(ctx, dead.Record.Key, "not-its-owner")
			require.NoError(t, err)
			require.False(t, forgot)
			forgot, err = admin.Forget(ctx, done.Record.Key, done.Record.Owner)
			require.NoError(t, err)
			require.False(t, forgot, "a succeeded record is never forgotten")
			for _, c := range []dedup.Claim{dead, failed, alive} {
				forgot, err = admin.Forget(ctx, c.Record.Key, c.Record.Owner)
				require.NoError(t, err)
				require.True(t, forgot, c.Record.Key.EventID)
				_, err = store.Get(ctx, c.Record.Key)
				require.True(t, errors.Is(err, dedup.ErrNotFound), c.Record.Key.EventID)
			}
			again := claim("dead", time.Hour)
			require.Equal(t, 1, again.Record.Attempts, "a forgotten event runs afresh")
		})
	}
}
