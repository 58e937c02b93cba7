package dedup_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// Key.String reads back one way even when scopes hold '/'.
func TestKeyStringIsUnambiguous(t *testing.T) {
	keys := []dedup.Key{
		{Scope: "a", EventID: "b/c"},
		{Scope: "a/b", EventID: "c"},
		{Scope: `"a`, EventID: "b"},
		{Scope: "billing", EventID: "e1"},
	}
	seen := map[string]dedup.Key{}
	for _, k := range keys {
		s := k.String()
		if other, ok := seen[s]; ok {
			t.Fatalf("%+v and %+v both print as %s", k, other, s)
		}
		seen[s] = k
	}
	require.Equal(t, `"billing/charge"/e1`, dedup.Key{Scope: "billing/charge", EventID: "e1"}.String())
	require.Equal(t, "billing/e1", dedup.Key{Scope: "billing", EventID: "e1"}.String())
	require.Equal(t, "", dedup.Key{}.String(), "no key=/ for a message without an ID")
}

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
