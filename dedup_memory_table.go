package dedup

import (
	"hash/maphash"
	"iter"

	"github.com/dedupkit/dedup/internal/blob"
)

// memTable holds a MemoryStore's records so that the garbage collector
// follows one pointer per record and none in the index: each record's
// strings and result are cut from one byte slice (memRecord.parts), the
// records sit in pages of slots that never move, and the index maps a hash
// of the key to the slot of the first record of that hash, the others
// chained by slot number. A map of keys to records made every collection of a process
// holding many walk five objects a record, and cost a caller (idemhttp's
// new keys on the memory store) more than the store's own work
// (BENCHMARKS.md).
type memTable struct {
	seed  maphash.Seed
	mask  uint64           // the hash bits the index uses: all, but in a test of chains
	index map[uint64]int32 // the hash of a key to the first slot of its chain
	pages [][]memRecord    // slot i is pages[i/memPage][i%memPage]; slot 0 is never used: it ends a chain
	slots int32            // slots taken so far, 0 included
	free  []int32          // slots of removed records, for the next ones
}

// memPage is the slots of a page: a growing store adds a page, and never
// copies the records it holds.
const memPage = 256

func newMemTable() memTable {
	return memTable{seed: maphash.MakeSeed(), mask: ^uint64(0), index: make(map[uint64]int32), slots: 1,
		pages: [][]memRecord{make([]memRecord, memPage)}}
}

// at returns the record in slot i.
func (t *memTable) at(i int32) *memRecord { return &t.pages[i/memPage][i%memPage] }

// hash returns the index's hash of key.
func (t *memTable) hash(key Key) uint64 { return blob.HashKey(t.seed, key) & t.mask }

// find returns the slot of key's record, or 0 when there is none.
func (t *memTable) find(key Key) int32 {
	i, _ := t.lookup(key)
	return i
}

// lookup returns the slot of key's record, 0 when there is none, and key's
// hash.
func (t *memTable) lookup(key Key) (int32, uint64) {
	h := t.hash(key)
	i := t.index[h]
	for i != 0 && !t.at(i).holds(key) {
		i = t.at(i).next
	}
	return i, h
}

// get returns key's record, or nil.
func (t *memTable) get(key Key) *memRecord {
	if i := t.find(key); i != 0 {
		return t.at(i)
	}
	return nil
}

// insert returns a new, empty record of key, which the caller writes
// (memRecord.write) before anything else looks key up.
func (t *memTable) insert(key Key) *memRecord { return t.insertHashed(t.hash(key)) }

// insertHashed is insert for a key of hash h, which it has none of.
func (t *memTable) insertHashed(h uint64) *memRecord {
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if int(t.slots) == len(t.pages)*memPage {
			t.pages = append(t.pages, make([]memRecord, memPage))
		}
		i = t.slots
		t.slots++
	}
	rec := t.at(i)
	rec.next = t.index[h]
	t.index[h] = i
	return rec
}

// remove removes key's record, if there is one.
func (t *memTable) remove(key Key) {
	i := t.find(key)
	if i == 0 {
		return
	}
	h := t.hash(key)
	next := t.at(i).next
	switch j := t.index[h]; {
	case j == i && next == 0:
		delete(t.index, h)
	case j == i:
		t.index[h] = next
	default:
		for t.at(j).next != i {
			j = t.at(j).next
		}
		t.at(j).next = next
	}
	*t.at(i) = memRecord{}
	t.free = append(t.free, i)
}

// all yields every record with its key. A record may be removed meanwhile.
func (t *memTable) all() iter.Seq2[Key, *memRecord] {
	return func(yield func(Key, *memRecord) bool) {
		for i := int32(1); i < t.slots; i++ {
			if rec := t.at(i); !rec.parts.Nil() && !yield(rec.key(), rec) {
				return
			}
		}
	}
}

// The parts of a record's data, in order.
const (
	memScope = iota
	memEventID
	memFingerprint
	memOwner
	memLastError
	memResult
	memParts
)

func (r *memRecord) key() Key {
	return Key{Scope: r.parts.String(memScope), EventID: r.parts.String(memEventID)}
}
func (r *memRecord) fingerprint() string { return r.parts.String(memFingerprint) }
func (r *memRecord) owner() string       { return r.parts.String(memOwner) }
func (r *memRecord) lastError() string   { return r.parts.String(memLastError) }

// result returns r's result, nil for none.
func (r *memRecord) result() []byte {
	if b := r.parts.Part(memResult); len(b) > 0 {
		return b
	}
	return nil
}

// holds reports whether r is key's record.
func (r *memRecord) holds(key Key) bool { return r.parts.Holds(memScope, memEventID, key) }

// write makes r's parts anew: one allocation, which strings and results
// handed out before keep sharing.
func (r *memRecord) write(key Key, fingerprint, owner, lastError string, result []byte) {
	b := blob.NewBuilder(0, len(key.Scope)+len(key.EventID)+len(fingerprint)+len(owner)+len(lastError)+len(result))
	for _, p := range [...]string{key.Scope, key.EventID, fingerprint, owner, lastError} {
		b.AddString(p)
	}
	b.Add(result)
	r.parts = b.Blob()
}
