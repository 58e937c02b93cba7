package dedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The console refuses a table of record v1 with ErrRecordV1, which says
// what to run, and reads it once migrated: the v1 fixture's records in
// their states.
func TestPostgresBrowseRecordV1(t *testing.T) {
	ctx := context.Background()
	f := newV1Table(t, testenv.Postgres(t), 0, 0)
	s := f.store(t)
	_, err := s.Summary(ctx, dedup.SummaryQuery{})
	require.ErrorIs(t, err, dedup.ErrRecordV1)
	_, err = s.Browse(ctx, dedup.BrowseQuery{List: dedup.ListFailedFinal, Limit: 10})
	require.ErrorIs(t, err, dedup.ErrRecordV1)
	require.True(t, errors.Is(s.CreateConsoleIndexes(ctx), dedup.ErrRecordV1))

	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.CreateConsoleIndexes(ctx))
	final, err := s.Browse(ctx, dedup.BrowseQuery{List: dedup.ListFailedFinal, Scope: f.scope, Limit: 10})
	require.NoError(t, err)
	require.Len(t, final, 1)
	require.Equal(t, f.key("final"), final[0].Key)
	sum, err := s.Summary(ctx, dedup.SummaryQuery{Scope: f.scope})
	require.NoError(t, err)
	require.Len(t, sum.Scopes, 1)
	require.Equal(t, int64(1), sum.Scopes[0].Final)
}
