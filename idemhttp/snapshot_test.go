package idemhttp

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestSnapshotRoundTrip(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Location": {"/p/1"}, "Set-Cookie": {"s=1"}, "Etag": {`"a"`, `"b"`}}
	b, err := encodeSnapshot(201, h, defaultStoredHeaders, []byte(`{"id":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var s snapshot
	if err := decodeSnapshot(b, &s); err != nil {
		t.Fatal(err)
	}
	got := s.header()
	if s.status != 201 || string(s.body) != `{"id":1}` || got.Get("Location") != "/p/1" ||
		got.Get("Set-Cookie") != "" || len(got.Values("Etag")) != 2 {
		t.Errorf("decoded %d %v %q", s.status, got, s.body)
	}
	replaced := http.Header{"Etag": {`"old"`}, "Vary": {"Accept"}}
	s.writeHeader(replaced, 0)
	if v := replaced.Values("Etag"); len(v) != 2 || v[0] != `"a"` || replaced.Get("Vary") != "Accept" {
		t.Errorf("written over a header: %v", replaced)
	}
}

func TestSnapshotRefusesDamage(t *testing.T) {
	good, _ := encodeSnapshot(200, http.Header{"Content-Type": {"text/plain"}}, defaultStoredHeaders, []byte("hello"))
	for name, b := range map[string][]byte{
		"empty":        nil,
		"other magic":  append([]byte{0x7b}, good[1:]...),
		"next version": append([]byte{snapshotMagic, 2}, good[2:]...),
		"status 500":   append([]byte{snapshotMagic, 1, 0x01, 0xf4}, good[4:]...),
		"cut header":   good[:9],
		"huge count":   append([]byte{snapshotMagic, 1, 0, 200, 0xff, 0xff, 0x03}, good[5:]...),
		"bad name":     encodeSnapshotRaw("content type", "x"),
		"CR in value":  encodeSnapshotRaw("Location", "/a\r\nSet-Cookie: x"),
	} {
		if err := decodeSnapshot(b, new(snapshot)); !errors.Is(err, errSnapshot) {
			t.Errorf("%s: %v, want a snapshot error", name, err)
		}
	}
}

// TestSnapshotEncodeRefusesWhatDecodeRefuses: a response the decoder would
// refuse is not encoded, so it is never stored to fail at replay.
func TestSnapshotEncodeRefusesWhatDecodeRefuses(t *testing.T) {
	many := http.Header{}
	for i := range maxSnapHeaders + 1 {
		many.Add("Link", "</p/"+strings.Repeat("x", i)+">")
	}
	for name, h := range map[string]http.Header{
		"65 values":      many,
		"NUL in value":   {"Location": {"/a\x00b"}},
		"CR LF in value": {"Location": {"/a\r\nSet-Cookie: x"}},
		"DEL in value":   {"Etag": {"\x7f"}},
	} {
		if b, err := encodeSnapshot(200, h, canonicalNames("Link", "Location", "ETag"), nil); err == nil {
			derr := decodeSnapshot(b, new(snapshot))
			t.Errorf("%s: encoded (decoding: %v), want refused", name, derr)
		}
	}
	most := http.Header{"Location": {"/tab\tallowed"}}
	for range maxSnapHeaders - 1 {
		most.Add("Link", "</p>")
	}
	b, err := encodeSnapshot(200, most, []string{"Link", "Location"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeSnapshot(b, new(snapshot)); err != nil {
		t.Errorf("64 values, one with a tab: %v", err)
	}
}

// header returns s's headers.
func (s *snapshot) header() http.Header {
	h := http.Header{}
	s.writeHeader(h, 0)
	return h
}

func encodeSnapshotRaw(name, value string) []byte {
	b := []byte{snapshotMagic, snapshotVersion, 0, 200, 1, byte(len(name))}
	b = append(b, name...)
	b = append(b, byte(len(value)))
	return append(b, value...)
}

// FuzzSnapshot: decoding anything never panics, and whatever decodes
// re-encodes to the same bytes.
func FuzzSnapshot(f *testing.F) {
	seed, _ := encodeSnapshot(201, http.Header{"Location": {"/x"}}, defaultStoredHeaders, []byte("body"))
	f.Add(seed)
	f.Add([]byte{snapshotMagic, 1, 0, 200, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s snapshot
		if err := decodeSnapshot(b, &s); err != nil {
			return
		}
		h := s.header()
		names := make([]string, 0, len(h))
		for k := range h {
			names = append(names, k)
		}
		b, err := encodeSnapshot(s.status, h, names, s.body)
		if err != nil {
			t.Fatalf("re-encoding %x: %v", b, err)
		}
		var again snapshot
		if err := decodeSnapshot(b, &again); err != nil || again.status != s.status || !bytes.Equal(again.body, s.body) {
			t.Fatalf("re-encoding %x: %v", b, err)
		}
	})
}

func TestParseKeyField(t *testing.T) {
	for in, want := range map[string]string{
		`"abc"`:             "abc",
		`"a\"b\\c"`:         `a"b\c`,
		`"x";p=1`:           "x",
		`"x" `:              "x",
		`"x";p="y;z";q=?1`:  "x",
		`"x";p=-1.5`:        "x",
		`"x";p=*tok:en/1.0`: "x",
		// Without quotes, as clients written for other APIs send it.
		`abc`:                                  "abc",
		`'x'`:                                  "'x'",
		`8e03978e-40d5-43e8-bc93-6894a57f9324`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
	} {
		if got, err := parseKeyField(in); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`"abc`, `"a\b"`, `"x" y`, `"x",`, `"x";=1`, `"x";p=`, `"x";p=?2`, `"x";p=:a b:`, `"a` + "\x7f" + `"`,
		`a b`, `x;p=1`, `a,b`, `ab"c`, `a\b`, "abé", ""} {
		if got, err := parseKeyField(in); err == nil {
			t.Errorf("%s: accepted as %q", in, got)
		}
	}
}

func TestEntropy(t *testing.T) {
	for key, ok := range map[string]bool{
		"8e03978e-40d5-43e8-bc93-6894a57f9324": true,
		"01ARZ3NDEKTSV4RRFFQ69G5FAV":           true,
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa":     false,
		"1234567890":                           false,
		"order-1":                              false,
	} {
		if got := entropyBits(key) >= DefaultMinKeyBits; got != ok {
			t.Errorf("%s: %.1f bits", key, entropyBits(key))
		}
	}
}

// FuzzKeyField: parsing any field value never panics, and an accepted key is
// printable ASCII that round-trips through its sf-string form.
func FuzzKeyField(f *testing.F) {
	for _, s := range []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `"a\"b";p=1;q`, `"pre\\post\"q"`, `"x";p=:aGk=:`, `abc`, `"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseKeyField(v)
		if err != nil {
			return
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("%q accepted as %q", v, key)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := parseKeyField(quoted); err != nil || again != key {
			t.Fatalf("%q: %q re-parsed as %q, %v", v, key, again, err)
		}
	})
}
