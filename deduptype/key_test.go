package deduptype_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
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

// A log line names the key as scope/id without inner quotes, in JSON and in
// text, and the zero Key as "".
func TestKeyLogValue(t *testing.T) {
	key := deduptype.Key{Scope: "order-payments/record-payment", EventID: "evt_1"}
	var js, text bytes.Buffer
	slog.New(slog.NewJSONHandler(&js, nil)).Info("m", slog.Any("key", key), slog.Any("none", deduptype.Key{}))
	slog.New(slog.NewTextHandler(&text, nil)).Info("m", slog.Any("key", key))
	var rec map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &rec))
	require.Equal(t, "order-payments/record-payment/evt_1", rec["key"])
	require.Equal(t, "", rec["none"])
	require.Contains(t, text.String(), " key=order-payments/record-payment/evt_1\n")
	require.Equal(t, `"order-payments/record-payment"/evt_1`, key.String(), "errors keep the unambiguous form")
}
