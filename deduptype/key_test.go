package deduptype_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup/deduptype"
)

// Key.String reads back one way even when scopes hold '/'.
func TestKeyStringIsUnambiguous(t *testing.T) {
	keys := []deduptype.Key{
		{Scope: "a", EventID: "b/c"},
		{Scope: "a/b", EventID: "c"},
		{Scope: `"a`, EventID: "b"},
		{Scope: "billing", EventID: "e1"},
	}
	seen := map[string]deduptype.Key{}
	for _, k := range keys {
		s := k.String()
		if other, ok := seen[s]; ok {
			t.Fatalf("%+v and %+v both print as %s", k, other, s)
		}
		seen[s] = k
	}
	require.Equal(t, `"billing/charge"/e1`, deduptype.Key{Scope: "billing/charge", EventID: "e1"}.String())
	require.Equal(t, "billing/e1", deduptype.Key{Scope: "billing", EventID: "e1"}.String())
	require.Equal(t, "", deduptype.Key{}.String(), "no key=/ for a message without an ID")
}
