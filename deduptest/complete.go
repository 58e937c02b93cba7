package deduptest

import (
	"strconv"
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/stretchr/testify/require"
)

// testCompleteBatch checks BatchCompleter, for stores that implement it:
// each completion is fenced on its own owner and answered on its own.
func testCompleteBatch(t *testing.T, s dedup.Store) {
	bc, ok := s.(deduptype.BatchCompleter)
	if !ok {
		t.Skip("the store does not implement deduptype.BatchCompleter")
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

	cs := []deduptype.Completion{
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

	// More completions than a store's multi-item request may hold (25 for
	// DynamoDB), one of them stale in the middle: each is answered on its
	// own, in its place.
	cs = cs[:0]
	for i := range 60 {
		c := acquire(t, s, request(key(scope, "many-"+strconv.Itoa(i)), "fp"))
		cs = append(cs, deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, Result: []byte(strconv.Itoa(i)), TTL: longTTL})
	}
	cs[30].Owner = stale.Record.Owner
	errs, err = bc.CompleteBatch(ctxFor(t), cs)
	require.NoError(t, err)
	require.Len(t, errs, len(cs))
	for i, c := range cs {
		rec := get(t, s, c.Key)
		if i == 30 {
			require.ErrorIs(t, errs[i], dedup.ErrLeaseLost, "a stale owner among many")
			require.Equal(t, dedup.StatusProcessing, rec.Status)
			continue
		}
		require.NoError(t, errs[i], "completion %d of many", i)
		require.Equal(t, dedup.StatusSucceeded, rec.Status, "completion %d of many", i)
		require.Equal(t, []byte(strconv.Itoa(i)), rec.Result, "completion %d of many", i)
	}

	held3 := acquire(t, s, request(key(scope, "held-3"), "fp"))
	_, err = bc.CompleteBatch(ctxFor(t), []deduptype.Completion{
		{Key: held3.Record.Key, Owner: held3.Record.Owner, TTL: longTTL},
		{Key: key(scope, ""), Owner: "x", TTL: longTTL},
	})
	require.ErrorIs(t, err, dedup.ErrInvalidKey)
	require.Equal(t, dedup.StatusProcessing, get(t, s, held3.Record.Key).Status, "nothing written")
}
