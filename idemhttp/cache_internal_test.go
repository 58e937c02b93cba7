package idemhttp

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/blob"
)

// cacheSnapshot returns the snapshot of a 200 with body, taken apart.
func cacheSnapshot(t *testing.T, body string) *snapshotParts {
	t.Helper()
	b, err := encodeSnapshot(http.StatusOK, http.Header{"Content-Type": {"text/plain"}}, defaultStoredHeaders, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var p snapshotParts
	if err := p.parse(b); err != nil {
		t.Fatal(err)
	}
	return &p
}

// The entry dropped for room is the least recently used, not the oldest;
// an entry past its deadline or without a known expiry is never returned.
func TestReplayCacheRecency(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	key := func(id string) dedup.Key { return dedup.Key{Scope: "s", EventID: id} }
	body := strings.Repeat("x", 1000)
	shape := &requestShape{method: "POST", route: "/p", body: []byte("{}")}
	sizer := newReplayCache(1<<20, time.Minute, clock)
	sizer.put(key("a"), "fp", shape, cacheSnapshot(t, body), now.Add(time.Hour))
	one, _ := sizer.stats()
	c := newReplayCache(2*one+one/2, time.Minute, clock) // room for two
	c.maxEntry = one                                     // past the budget's eighth, for this test
	later := now.Add(time.Hour)
	c.put(key("a"), "fp", shape, cacheSnapshot(t, body), later)
	c.put(key("b"), "fp", shape, cacheSnapshot(t, body), later)
	hit := func(id string) bool { _, ok := c.get(key(id)); return ok }
	if !hit("a") { // a is now the most recent
		t.Fatal("a missing")
	}
	c.put(key("c"), "fp", shape, cacheSnapshot(t, body), later)
	if hit("b") || !hit("a") || !hit("c") {
		t.Error("b, the least recently used, should have gone, a and c stayed")
	}
	if used, n := c.stats(); n != 2 || used != 2*one {
		t.Errorf("%d entries in %d bytes, want 2 in %d", n, used, 2*one)
	}

	c.put(key("d"), "fp", shape, cacheSnapshot(t, "short"), now.Add(10*time.Second))
	c.put(key("e"), "fp", shape, cacheSnapshot(t, "short"), time.Time{}) // expiry unknown: not cached
	if hit("e") {
		t.Error("an entry of unknown expiry was cached")
	}
	if e, ok := c.get(key("d")); !ok || e.fingerprint() != "fp" {
		t.Fatal("d missing")
	}
	now = now.Add(10 * time.Second) // d's record expires
	if hit("d") {
		t.Error("d outlived its record")
	}
	if !hit("c") {
		t.Error("c gone before its max age")
	}
	now = now.Add(50 * time.Second) // c's max age
	if hit("c") {
		t.Error("c outlived its max age")
	}
	if hit("a") {
		t.Error("a outlived its max age")
	}
	if used, n := c.stats(); n != 0 || used != 0 {
		t.Errorf("%d entries in %d bytes past every deadline", n, used)
	}
}

// An entry is found only by its own key, even where another key's hash is
// the same, and hands back every part as it was put: the answer's headers,
// body and status, the fingerprint and the request shape it fits.
func TestReplayCacheEntryParts(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := newReplayCache(1<<20, time.Minute, func() time.Time { return now })
	a, b := dedup.Key{Scope: "s", EventID: "a"}, dedup.Key{Scope: "s", EventID: "b"}
	shape := &requestShape{method: "POST", route: "/p", query: "x=1", json: true, body: []byte(`{"n":1}`)}
	h := http.Header{"Content-Type": {"application/json"}, "Location": {"/p/1"}}
	snap, err := encodeSnapshot(http.StatusCreated, h, defaultStoredHeaders, []byte(`{"id":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var parts snapshotParts
	if err := parts.parse(snap); err != nil {
		t.Fatal(err)
	}
	c.put(a, "fp-a", shape, &parts, now.Add(time.Hour))
	i := c.index[blob.HashKey(c.seed, a)]
	delete(c.index, blob.HashKey(c.seed, a))
	c.index[blob.HashKey(c.seed, b)] = i // b's hash now leads to a's entry
	if _, ok := c.get(b); ok {
		t.Fatal("b answered from a's entry")
	}
	c.index[blob.HashKey(c.seed, a)] = i
	e, ok := c.get(a)
	if !ok || e.fingerprint() != "fp-a" || !e.fits(shape) {
		t.Fatalf("a: found %v, fingerprint %q, fits %v", ok, e.fingerprint(), e.fits(shape))
	}
	for _, other := range []requestShape{
		{method: "PUT", route: "/p", query: "x=1", json: true, body: []byte(`{"n":1}`)},
		{method: "POST", route: "/q", query: "x=1", json: true, body: []byte(`{"n":1}`)},
		{method: "POST", route: "/p", query: "x=2", json: true, body: []byte(`{"n":1}`)},
		{method: "POST", route: "/p", query: "x=1", json: false, body: []byte(`{"n":1}`)},
		{method: "POST", route: "/p", query: "x=1", json: true, body: []byte(`{"n":2}`)},
	} {
		if e.fits(&other) {
			t.Errorf("fits %+v", other)
		}
	}
	w := httptest.NewRecorder()
	e.writeReplay(w)
	var want snapshot
	if err := decodeSnapshot(snap, &want); err != nil {
		t.Fatal(err)
	}
	direct := httptest.NewRecorder()
	want.writeReplay(direct)
	if w.Code != direct.Code || w.Body.String() != direct.Body.String() || fmt.Sprint(w.Header()) != fmt.Sprint(direct.Header()) {
		t.Errorf("from the cache %d %v %q, from the snapshot %d %v %q",
			w.Code, w.Header(), w.Body, direct.Code, direct.Header(), direct.Body)
	}
}
