package deduptest

import (
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

// testCompleteBatch checks BatchCompleter, for stores that implement it:
// each completion is fenced on its own owner and answered on its own.
func testCompleteBatch(t *testing.T, s dedup.Store) {
	bc, ok := s.(dedup.BatchCompleter)
	if !ok {
		t.Skip("the store does not implement dedup.BatchCompleter")
	}
	scope := newScope(t)
	errs, err := bc.CompleteBatch(ctxFor(t), nil)
	require.NoError(t, err)
	require.Empty(t, errs, "an empty batch completes nothing")

	held1 := acquire(t, s, request(key(scope, "held-1"), "fp"))
	held2 := acquire(t, s, request(key(scope, "held-2"), "fp"))
	done := acquire(t, s, request(key(scope, "done"), "fp"))
	complete(t, s, done, nil, longTTL)
	stale := acquire(t, s, request(key(scope, "stale"), "fp"))
	fail(t, s, stale, dedup.Failure{Error: "failed", TTL: longTTL})
	taken := acquire(t, s, request(key(scope, "stale"), "fp"))

	cs := []dedup.Completion{
		{Key: held1.Record.Key, Owner: held1.Record.Owner, Result: []byte("r1"), TTL: longTTL},
		{Key: done.Record.Key, Owner: done.Record.Owner, TTL: longTTL},
		{Key: stale.Record.Key, Owner: stale.Record.Owner, TTL: longTTL},
		{Key: held2.Record.Key, Owner: held2.Record.Owner, TTL: shortTTL},
	}
	errs, err = bc.CompleteBatch(ctxFor(t), cs)
	require.NoError(t, err)
	require.Len(t, errs, len(cs))
	require.NoError(t, errs[0], "held-1")
	require.ErrorIs(t, errs[1], dedup.ErrLeaseLost, "an already succeeded record")
	require.ErrorIs(t, errs[2], dedup.ErrLeaseLost, "a stale owner")
	require.NoError(t, errs[3], "held-2")

	rec := get(t, s, held1.Record.Key)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("r1"), rec.Result)
	rec = get(t, s, held2.Record.Key)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Empty(t, rec.Result)
	require.True(t, rec.ExpiresAt.Before(held2.Record.ExpiresAt), "held-2 is retained for its own TTL")
	rec = get(t, s, taken.Record.Key)
	require.Equal(t, dedup.StatusProcessing, rec.Status, "the new owner's record is untouched")
	require.Equal(t, taken.Record.Owner, rec.Owner)

	held3 := acquire(t, s, request(key(scope, "held-3"), "fp"))
	_, err = bc.CompleteBatch(ctxFor(t), []dedup.Completion{
		{Key: held3.Record.Key, Owner: held3.Record.Owner, TTL: longTTL},
		{Key: key(scope, ""), Owner: "x", TTL: longTTL},
	})
	require.ErrorIs(t, err, dedup.ErrInvalidKey)
	require.Equal(t, dedup.StatusProcessing, get(t, s, held3.Record.Key).Status, "nothing written")
}
