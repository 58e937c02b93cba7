package dedup

import (
	"fmt"
	"slices"
	"testing"
)

// Keys of one hash share a chain: each is found, rewritten and removed by
// itself, wherever it sits in the chain, and a removed record's slot is
// used again.
func TestMemTableChains(t *testing.T) {
	for _, collide := range []bool{false, true} {
		t.Run(fmt.Sprintf("collide=%v", collide), func(t *testing.T) {
			tab := newMemTable()
			if collide {
				tab.mask = 0 // every key hashes alike
			}
			keys := make([]Key, 6)
			for n := range keys {
				keys[n] = Key{Scope: "s", EventID: fmt.Sprintf("k%d", n)}
				tab.insert(keys[n]).write(keys[n], "fp", fmt.Sprintf("owner%d", n), "", nil)
			}
			check := func(want []Key) {
				t.Helper()
				var got []Key
				for key, rec := range tab.all() {
					got = append(got, key)
					if tab.get(key) != rec || rec.owner() != "owner"+key.EventID[1:] {
						t.Errorf("%v: found %p, owner %q; listed %p", key, tab.get(key), rec.owner(), rec)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("records %v, want %v", got, want)
				}
			}
			check(keys)
			for _, n := range []int{0, 3, 5} { // a chain's last, middle and first (newest) record
				tab.remove(keys[n])
				if tab.find(keys[n]) != 0 {
					t.Errorf("%v found after its removal", keys[n])
				}
			}
			check([]Key{keys[1], keys[2], keys[4]})
			again := Key{Scope: "s", EventID: "k9"}
			tab.insert(again).write(again, "fp", "owner9", "", []byte("r"))
			if tab.slots != int32(len(keys)+1) {
				t.Errorf("%d slots taken for %d records at most", tab.slots, len(keys))
			}
			if rec := tab.get(again); rec == nil || string(rec.result()) != "r" || rec.key() != again {
				t.Errorf("k9: %+v", rec)
			}
			if tab.get(Key{Scope: "t", EventID: "k1"}) != nil {
				t.Error("another scope's key found")
			}
			if collide && len(tab.index) != 1 {
				t.Errorf("%d chains, want 1", len(tab.index))
			}
		})
	}
}

// Records on several pages are each found where they were put.
func TestMemTablePages(t *testing.T) {
	tab := newMemTable()
	recs := map[Key]*memRecord{}
	for n := range 3 * memPage {
		key := Key{Scope: "s", EventID: fmt.Sprint(n)}
		rec := tab.insert(key)
		rec.write(key, "fp", "o", "", nil)
		recs[key] = rec
	}
	for key, rec := range recs {
		if tab.get(key) != rec || rec.key() != key {
			t.Fatalf("%v: found %p, put at %p", key, tab.get(key), rec)
		}
	}
	if len(tab.pages) != 4 { // 3 pages of records and slot 0
		t.Errorf("%d pages", len(tab.pages))
	}
}
