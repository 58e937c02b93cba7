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
				i := tab.insert(keys[n])
				tab.slots[i].write(keys[n], "fp", fmt.Sprintf("owner%d", n), "", nil)
			}
			check := func(want []Key) {
				t.Helper()
				var got []Key
				for key, i := range tab.all() {
					got = append(got, key)
					if tab.find(key) != i || tab.slots[i].owner() != "owner"+key.EventID[1:] {
						t.Errorf("%v: found in slot %d, owner %q; listed in slot %d", key, tab.find(key), tab.slots[i].owner(), i)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("records %v, want %v", got, want)
				}
			}
			check(keys)
			for _, n := range []int{0, 3, 5} { // a chain's last, middle and first (newest) record
				tab.remove(tab.find(keys[n]), keys[n])
				if tab.find(keys[n]) != 0 {
					t.Errorf("%v found after its removal", keys[n])
				}
			}
			check([]Key{keys[1], keys[2], keys[4]})
			again := Key{Scope: "s", EventID: "k9"}
			i := tab.insert(again)
			if int(i) >= len(keys)+1 {
				t.Errorf("a new record in slot %d, not a freed one", i)
			}
			tab.slots[i].write(again, "fp", "owner9", "", []byte("r"))
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
