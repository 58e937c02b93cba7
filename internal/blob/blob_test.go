package blob

import (
	"hash/maphash"
	"testing"

	"github.com/dedupkit/dedup/deduptype"
)

// Parts come back as they were added, empty ones included, after the
// head, and a Blob built again leaves the strings of the old one as they
// were.
func TestParts(t *testing.T) {
	b := NewBuilder(2, 16)
	copy(b.Head(), "hd")
	b.AddString("scope")
	b.Add(nil)
	b.Append([]byte("ab"))
	b.Append([]byte("cd"))
	b.End()
	b.Add([]byte("id"))
	blob := b.Blob()
	for i, want := range []string{"scope", "", "abcd", "id"} {
		if got := blob.String(i); got != want || string(blob.Part(i)) != want || cap(blob.Part(i)) != len(want) {
			t.Errorf("part %d: %q (capacity %d), want %q", i, got, cap(blob.Part(i)), want)
		}
	}
	if string(blob.Head()) != "hd" || blob.Nil() || !(&Blob{}).Nil() {
		t.Errorf("head %q, nil %v", blob.Head(), blob.Nil())
	}
	key := deduptype.Key{Scope: "scope", EventID: "id"}
	if !blob.Holds(0, 3, key) || blob.Holds(0, 2, key) {
		t.Error("Holds")
	}
	old := blob.String(0)
	b = NewBuilder(0, 5)
	b.AddString("other")
	blob = b.Blob()
	if old != "scope" || blob.String(0) != "other" {
		t.Errorf("old %q, new %q", old, blob.String(0))
	}
	seed := maphash.MakeSeed()
	if HashKey(seed, key) != HashKey(seed, deduptype.Key{Scope: "scope", EventID: "id"}) ||
		HashKey(seed, key) == HashKey(seed, deduptype.Key{Scope: "scopei", EventID: "d"}) {
		t.Error("HashKey")
	}
}
