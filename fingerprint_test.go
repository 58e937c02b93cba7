package dedup_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

func TestJSONFingerprint(t *testing.T) {
	fp := dedup.JSONFingerprint("v1", "amount", "account")
	same := []string{
		`{"amount": 10, "account": "A-1", "note": "first try"}`,
		`{"account":"A-1","amount":10,"note":"retry"}`,
		"{\n  \"amount\": 10.0,\n  \"account\": \"A-1\"\n}",
		`{"amount": 1e1, "account": "A\u002d1"}`,
	}
	want, err := fp([]byte(same[0]))
	require.NoError(t, err)
	for _, p := range same[1:] {
		got, err := fp([]byte(p))
		require.NoError(t, err)
		require.Equal(t, want, got, p)
	}
	different := []string{
		`{"amount": 11, "account": "A-1"}`,
		`{"amount": "10", "account": "A-1"}`,
		`{"amount": 10}`,
		`{"amount": 10, "account": "A-2"}`,
	}
	for _, p := range different {
		got, err := fp([]byte(p))
		require.NoError(t, err)
		require.NotEqual(t, want, got, p)
	}
	other, err := dedup.JSONFingerprint("v2", "amount", "account")([]byte(same[0]))
	require.NoError(t, err)
	require.NotEqual(t, want, other, "a new policy version changes every fingerprint")

	big1, _ := dedup.JSONFingerprint("v1")([]byte(`{"n": 9007199254740993}`))
	big2, _ := dedup.JSONFingerprint("v1")([]byte(`{"n": 9007199254740992}`))
	require.NotEqual(t, big1, big2, "integers past float64 precision stay distinct")

	for _, bad := range []string{``, `{`, `not json`, `{"a":1} {"b":2}`, `[1,2]`} {
		_, err := fp([]byte(bad))
		require.ErrorIs(t, err, dedup.ErrInvalidPayload, bad)
	}
}

// FuzzJSONFingerprint checks that re-encoding a JSON document (another key
// order and spacing) keeps its fingerprint.
func FuzzJSONFingerprint(f *testing.F) {
	f.Add(`{"b": [1, 2.50, {"z": null, "a": true}], "a": "x"}`)
	f.Add(`{"amount": 10, "account": "A-1"}`)
	f.Add(`[]`)
	fp := dedup.JSONFingerprint("v1")
	f.Fuzz(func(t *testing.T, doc string) {
		want, err := fp([]byte(doc))
		if err != nil {
			return
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader([]byte(doc)))
		dec.UseNumber() // keep numbers exact, as the fingerprint does
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("fingerprinted a document encoding/json rejects: %q", doc)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "   ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return
		}
		got, err := fp(buf.Bytes())
		if err != nil {
			t.Fatalf("re-encoded document rejected: %v", err)
		}
		if got != want {
			t.Fatalf("fingerprint changed after re-encoding %q as %q", doc, buf.String())
		}
	})
}

// FuzzKeyValidate checks that validation never panics and that accepted keys
// are non-empty, short and free of control characters.
func FuzzKeyValidate(f *testing.F) {
	f.Add("orders", "evt-1")
	f.Add("", "x")
	f.Add("s", "a\x00b")
	f.Add("s", "\xff")
	f.Fuzz(func(t *testing.T, scope, id string) {
		k := dedup.Key{Scope: scope, EventID: id}
		if err := k.Validate(); err != nil {
			require.ErrorIs(t, err, dedup.ErrInvalidKey)
			return
		}
		for _, s := range []string{scope, id} {
			require.NotEmpty(t, s)
			require.LessOrEqual(t, len(s), dedup.MaxIDLen)
			for _, r := range s {
				require.False(t, r < 0x20 || r == 0x7f, "control character accepted in %q", s)
			}
		}
	})
}
