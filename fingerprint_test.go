package dedup_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestJSONFingerprintUnchanged pins fingerprints computed before numbers
// were bounded: no ordinary document's fingerprint may change, or stored
// keys would conflict with their own retries after an upgrade.
func TestJSONFingerprintUnchanged(t *testing.T) {
	for doc, want := range map[string]string{
		`{"amount": 4200, "currency": "EUR"}`:                           "5c9659d0221977302d4dc01999eeb09cbb6b9dddf18c36f35077fd74d67bc808",
		`{"b": [1, 2.50, {"z": null, "a": true}], "a": "x", "c": -0.0}`: "56651736cf3c4c857d0fb03e9ab33f2fd13c818ec17a4d01d539ae9f4a5686f6",
		`{"n": 1e400, "m": -1e-400}`:                                    "3cfea80ae792fa1299b77cd419f5666d3a61ced953b77eb51b5c67c8903d2935",
		`[1e2, 1E-2, -3.25e+10, 18017000000000001, 5e-324, ` +
			`1.7976931348623157e308, 0.1, 123456789012345678901234567890]`: "6be86b314506bae155fb80dc19306c3d51f223dfc9b8a4bd257c7019057181b7",
		// Escapes, HTML characters, repeated keys, -0 and integers either
		// side of 18 digits, invalid UTF-8.
		`{"s": "a<b>&c \"q\" \\ \u00e9 \u2028 tab\t", "k\u0001": [-0, 0, -12, 123456789012345678, 1234567890123456789, ` +
			`-9223372036854775808], "dup": 1, "dup": 2, "é": "\ud83d\ude00"}`: "d88a48ba508eb79055cb4fa73637747215344985d9d1324879592bb9bc36dd0c",
		"{\"bad\": \"\xff\xfe\", \"ok\": \"plain ascii ~!@#$%^*()\"}": "6e4f02d05634b535091400171c96c99850b81b261a60b14d17926863fe19389c",
	} {
		got, err := dedup.JSONFingerprint("v1")([]byte(doc))
		require.NoError(t, err)
		require.Equal(t, want, got, doc)
	}
}

// TestJSONFingerprintBoundsNumbers: a number whose exact value would take
// seconds and megabytes (1e999999) is refused as an invalid payload, at
// once, even a megabyte of them; numbers within the bounds are accepted.
func TestJSONFingerprintBoundsNumbers(t *testing.T) {
	fp := dedup.JSONFingerprint("v1")
	for _, doc := range []string{
		`{"a":1e999999999}`, `{"a":1e999999}`, `{"a":1E+401}`, `[-1e-401]`, `[0e100000000000000000000]`,
		`[` + strings.Repeat("9", 801) + `]`, `[0.` + strings.Repeat("0", 800) + `1]`,
	} {
		_, err := fp([]byte(doc))
		require.ErrorIs(t, err, dedup.ErrInvalidPayload, "%.40s", doc)
	}
	for _, doc := range []string{
		`[1e400, -1e-400, 1e0000000000000000000400]`, `[` + strings.Repeat("9", 800) + `]`, `[5e-324]`,
	} {
		_, err := fp([]byte(doc))
		require.NoError(t, err, "%.40s", doc)
	}
	flood := []byte("[" + strings.Repeat("1e999999,", 100_000) + "1]") // hours of work unbounded
	done := make(chan error, 1)
	go func() { _, err := fp(flood); done <- err }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, dedup.ErrInvalidPayload)
	case <-time.After(30 * time.Second):
		t.Fatal("a megabyte of huge numbers still being fingerprinted after 30 s")
	}
}

// FuzzJSONFingerprint checks that re-encoding a JSON document (another key
// order and spacing) keeps its fingerprint.
func FuzzJSONFingerprint(f *testing.F) {
	f.Add(`{"b": [1, 2.50, {"z": null, "a": true}], "a": "x"}`)
	f.Add(`{"amount": 10, "account": "A-1"}`)
	f.Add(`[]`)
	f.Add(`{"a":1e999999999}`)
	f.Add(`{"b": "x<y", "a": [1.50, -0, "\u00e9"], "a": {"z": true, "y": null}, "c": 1e999999}`)
	f.Add("{\"a\": \"\xff\", \"\\u0062\": 1} ")
	fp, fpFields := dedup.JSONFingerprint("v1"), dedup.JSONFingerprint("v1", "a", "b")
	f.Fuzz(func(t *testing.T, doc string) {
		want, err := fp([]byte(doc))
		if err != nil {
			return
		}
		if ref := referenceFingerprint(t, "v1", doc); ref != want {
			t.Fatalf("fingerprint of %q is %s, the reference encoding's %s", doc, want, ref)
		}
		if picked, err := fpFields([]byte(doc)); err == nil {
			if ref := referenceFingerprint(t, "v1", doc, "a", "b"); ref != picked {
				t.Fatalf("fingerprint of fields a, b of %q is %s, the reference encoding's %s", doc, picked, ref)
			}
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

// referenceFingerprint is JSONFingerprint as first written, through
// encoding/json and math/big alone: the fingerprints of stored keys, which
// the faster encoding must reproduce byte for byte.
func referenceFingerprint(t *testing.T, version, doc string, fields ...string) string {
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("fingerprinted a document encoding/json rejects: %q", doc)
	}
	if len(fields) > 0 {
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("fingerprinted fields of %q, which is not an object", doc)
		}
		picked := map[string]any{}
		for _, f := range fields {
			if fv, ok := obj[f]; ok {
				picked[f] = fv
			}
		}
		v = picked
	}
	var write func(v any)
	var buf bytes.Buffer
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := slices.Sorted(maps.Keys(v))
			buf.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					buf.WriteByte(',')
				}
				b, _ := json.Marshal(k)
				buf.Write(b)
				buf.WriteByte(':')
				write(v[k])
			}
			buf.WriteByte('}')
		case []any:
			buf.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					buf.WriteByte(',')
				}
				write(e)
			}
			buf.WriteByte(']')
		case json.Number:
			r, ok := new(big.Rat).SetString(v.String())
			if !ok {
				t.Fatalf("number %q", v)
			}
			buf.WriteString(r.RatString())
		default: // strings, booleans, null
			b, _ := json.Marshal(v)
			buf.Write(b)
		}
	}
	write(v)
	sum := sha256.Sum256(append([]byte(version+"\x00"), buf.Bytes()...))
	return hex.EncodeToString(sum[:])
}

// TestJSONFingerprintDeepNesting: a document nested deeper than the fast
// path follows is fingerprinted as encoding/json reads it, and one deeper
// than encoding/json reads is an invalid payload.
func TestJSONFingerprintDeepNesting(t *testing.T) {
	fp := dedup.JSONFingerprint("v1")
	for _, depth := range []int{511, 512, 513, 2000} {
		doc := strings.Repeat(`[{"a":`, depth) + "1" + strings.Repeat("}]", depth)
		got, err := fp([]byte(doc))
		require.NoError(t, err, "depth %d", depth)
		require.Equal(t, referenceFingerprint(t, "v1", doc), got, "depth %d", depth)
	}
	_, err := fp([]byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001)))
	require.ErrorIs(t, err, dedup.ErrInvalidPayload)
}

// BenchmarkJSONFingerprint measures the fingerprint of a small order, the
// cost a JSON request or message pays before its claim.
func BenchmarkJSONFingerprint(b *testing.B) {
	fp := dedup.JSONFingerprint("v1")
	doc := []byte(`{"amount": 4200, "currency": "EUR", "customer": "cus_123", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fp(doc); err != nil {
			b.Fatal(err)
		}
	}
}
