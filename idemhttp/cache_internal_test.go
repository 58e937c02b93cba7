package idemhttp

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// cacheSnapshot returns the decoded snapshot of a 200 with body.
func cacheSnapshot(t *testing.T, body string) *snapshot {
	t.Helper()
	b, err := encodeSnapshot(http.StatusOK, http.Header{"Content-Type": {"text/plain"}}, defaultStoredHeaders, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var s snapshot
	if err := decodeSnapshot(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// The entry dropped for room is the least recently used, not the oldest;
// an entry past its deadline or without a known expiry is never returned.
func TestReplayCacheRecency(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	key := func(id string) dedup.Key { return dedup.Key{Scope: "s", EventID: id} }
	body := strings.Repeat("x", 1000)
	shape := &requestShape{method: "POST", route: "/p", body: []byte("{}")}
	one := entrySize(key("a"), "fp", shape, &storedAnswer{text: "Content-Typetext/plain", ends: make([]int32, 2), body: []byte(body)})
	c := newReplayCache(2*one+one/2, time.Minute, clock) // room for two
	c.maxEntry = one                                     // past the budget's eighth, for this test
	later := now.Add(time.Hour)
	c.put(key("a"), "fp", shape, cacheSnapshot(t, body), later)
	c.put(key("b"), "fp", shape, cacheSnapshot(t, body), later)
	if c.get(key("a")) == nil { // a is now the most recent
		t.Fatal("a missing")
	}
	c.put(key("c"), "fp", shape, cacheSnapshot(t, body), later)
	if c.get(key("b")) != nil || c.get(key("a")) == nil || c.get(key("c")) == nil {
		t.Error("b, the least recently used, should have gone, a and c stayed")
	}
	if used, n := c.stats(); n != 2 || used != 2*one {
		t.Errorf("%d entries in %d bytes, want 2 in %d", n, used, 2*one)
	}

	c.put(key("d"), "fp", shape, cacheSnapshot(t, "short"), now.Add(10*time.Second))
	c.put(key("e"), "fp", shape, cacheSnapshot(t, "short"), time.Time{}) // expiry unknown: not cached
	if c.get(key("e")) != nil {
		t.Error("an entry of unknown expiry was cached")
	}
	if e := c.get(key("d")); e == nil || e.fingerprint != "fp" {
		t.Fatal("d missing")
	}
	now = now.Add(10 * time.Second) // d's record expires
	if c.get(key("d")) != nil {
		t.Error("d outlived its record")
	}
	if c.get(key("c")) == nil {
		t.Error("c gone before its max age")
	}
	now = now.Add(50 * time.Second) // c's max age
	if c.get(key("c")) != nil {
		t.Error("c outlived its max age")
	}
	if c.get(key("a")) != nil {
		t.Error("a outlived its max age")
	}
	if used, n := c.stats(); n != 0 || used != 0 {
		t.Errorf("%d entries in %d bytes past every deadline", n, used)
	}
}
