package dedup_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// Every error chain names the package once.
func TestErrorsSayItOnce(t *testing.T) {
	h := func(context.Context, event) error { return nil }
	_, err := dedup.Wrap(dedup.NewMemoryStore(), events, h, dedup.WithScope(""), dedup.WithSink(dedup.NewMemorySink()))
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.Equal(t, `dedup: invalid configuration: WithScope(""): scope is empty`, err.Error())

	store := dedup.NewMemoryStore()
	_, err = store.Get(context.Background(), dedup.Key{Scope: "a/b", EventID: "e"})
	require.ErrorIs(t, err, dedup.ErrNotFound)
	require.Equal(t, `dedup: memory get "a/b"/e: record not found`, err.Error())

	_, err = store.Claim(context.Background(), dedup.ClaimRequest{Key: dedup.Key{Scope: "", EventID: "x"}})
	require.ErrorIs(t, err, dedup.ErrInvalidKey)
	require.Equal(t, 1, strings.Count(err.Error(), "dedup:"), err.Error())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w, err := dedup.Wrap(store, events, h, dedup.WithScope("a/b"), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)
	_, err = w.Handle(ctx, event{ID: "e1", Body: "x"})
	require.Error(t, err)
	require.Equal(t, 1, strings.Count(err.Error(), "dedup:"), err.Error())
}

// A refused key too long to be one is logged by its beginning and length,
// once cut, not repeated whole.
func TestLongInvalidIDIsLoggedCut(t *testing.T) {
	var logs bytes.Buffer
	sink := dedup.NewMemorySink()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error { return nil },
		dedup.WithScope("orders"), dedup.WithSink(sink), dedup.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	id := strings.Repeat("é", 150) // 300 bytes
	res, err := w.Handle(context.Background(), event{ID: id, Body: "{}"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.Equal(t, dedup.ReasonInvalidID, res.Reason)
	require.Contains(t, logs.String(), "(300 bytes)")
	require.NotContains(t, logs.String(), id[:100], "the key is cut to its first 64 bytes")
	require.Less(t, logs.Len(), 600, logs.String())
}
