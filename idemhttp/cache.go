package idemhttp

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"net/http"
	"sync"
	"time"
	"unsafe"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/blob"
)

// replayCache keeps settled answers (the snapshots a replay writes) in
// process under a byte budget, so that a replay costs no store call. An
// entry is keyed as the store keys its record (tenant and scope in the
// Key) and carries the record's fingerprint, so that a changed request is
// refused from it as the store would refuse it. It is dropped by recency
// when the budget is spent, and is never used past its deadline: the
// record's expiry, or its max age after it was filled, whichever is first.
//
// A settled record never changes before it expires, so an entry is right
// until then unless someone deletes the record by hand; the max age bounds
// how long an instance replays such a deleted key.
//
// Every operation takes one mutex for O(1) work: a map lookup and a move in
// a doubly linked list of recency. It runs no goroutine; an expired entry
// is dropped when it is next looked up or when it reaches the list's tail.
//
// The garbage collector follows one pointer per entry and none in the
// index: an entry's parts are cut from one byte slice, the entries sit in
// one slice of slots linked by number, and the index maps a hash of the key
// to a slot number. A cache of strings and structs per entry made every
// collection of a server holding it walk thousands of objects, and cost a
// new key more than everything else the middleware does (BENCHMARKS.md).
type replayCache struct {
	budget   int // bytes the entries may hold together
	maxEntry int // bytes one entry may hold: larger answers are not cached
	maxAge   time.Duration
	now      func() time.Time
	seed     maphash.Seed

	mu    sync.Mutex
	index map[uint64]int32 // a hash of each entry's key (blob.HashKey) to its slot
	// slots holds the entries; slots[0] is the recency list's sentinel:
	// its next is the most recently used entry, its prev the least.
	slots []cacheSlot
	free  []int32 // slots of dropped entries, for the next ones
	used  int     // bytes held, as cacheSlot.size counts them
}

// cacheSlot is an entry in its place in the cache.
type cacheSlot struct {
	entry      cached
	hash       uint64
	deadline   int64 // Unix nanoseconds, on the cache's clock
	prev, next int32
}

// cached is one settled answer and what it is known to answer: its key,
// the record's fingerprint, the shape of a request it fits and the answer,
// each a part of one blob.Blob (in the order of partScope and the rest),
// which never changes once the entry is made, so that a copy is read
// outside the lock. The blob's head holds where each of the answer's
// header names and values ends in the text part, 4 bytes each.
type cached struct {
	parts  blob.Blob
	status int32
	json   bool // the shape's
	shaped bool // the shape is kept: its body was small enough
}

// The parts of a cached entry.
const (
	partScope = iota
	partID
	partFingerprint
	partMethod
	partRoute
	partQuery
	partRequest // the body of the request of the shape
	partText    // the answer's header names and values
	partBody    // the answer's body
)

// fingerprint returns the fingerprint of the record e was filled from.
func (e *cached) fingerprint() string { return e.parts.String(partFingerprint) }

// fits reports whether e's answer is known to fit requests of shape s,
// byte for byte like one it answered.
func (e *cached) fits(s *requestShape) bool {
	p := &e.parts
	return e.shaped && e.json == s.json && string(p.Part(partMethod)) == s.method &&
		string(p.Part(partRoute)) == s.route && string(p.Part(partQuery)) == s.query &&
		bytes.Equal(p.Part(partRequest), s.body)
}

// writeReplay answers w with e's answer, marked as a replay, byte for byte
// as a replay of the snapshot it came from.
func (e *cached) writeReplay(w http.ResponseWriter) {
	var ends [2 * maxSnapHeaders]int32
	head := e.parts.Head()
	fields := len(head) / 4
	for i := range fields {
		ends[i] = int32(binary.LittleEndian.Uint32(head[4*i:]))
	}
	writeReplay(w, int(e.status), e.parts.String(partText), ends[:fields], e.parts.Part(partBody))
}

// size returns what e costs the budget: its bytes and slotOverhead.
func (e *cached) size() int {
	if e.parts.Nil() {
		return 0
	}
	return e.parts.Len() + slotOverhead
}

// slotOverhead approximates what an entry costs beyond its data: its slot,
// its share of the index (a hash and a slot number, with the spare room of
// a growing map) and of the free list.
const slotOverhead = int(unsafe.Sizeof(cacheSlot{})) + 32

// maxShapeBody is the largest request body an entry keeps to answer a
// request of the same shape without a fingerprint: a larger one is
// fingerprinted, which costs little beside reading it.
const maxShapeBody = 4 << 10

// newReplayCache returns a cache of budget bytes whose entries live at most
// maxAge, or nil (no cache) when budget is 0.
func newReplayCache(budget int, maxAge time.Duration, now func() time.Time) *replayCache {
	if budget <= 0 {
		return nil
	}
	c := &replayCache{budget: budget, maxEntry: budget / replayCacheEntryShare, maxAge: maxAge, now: now,
		seed: maphash.MakeSeed(), index: make(map[uint64]int32), slots: make([]cacheSlot, 1)}
	return c
}

// replayCacheEntryShare is the share of the budget one answer may take at
// most: a larger one is not cached, so that one answer cannot evict all the
// others.
const replayCacheEntryShare = 8

// get returns key's entry, most recently used now, and false when there is
// none or its deadline has passed (it is then dropped). A nil cache has no
// entries.
func (c *replayCache) get(key dedup.Key) (cached, bool) {
	if c == nil {
		return cached{}, false
	}
	h := blob.HashKey(c.seed, key)
	now := c.now().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[h]
	switch {
	case !ok || !c.slots[i].entry.parts.Holds(partScope, partID, key):
		return cached{}, false
	case now >= c.slots[i].deadline:
		c.drop(i)
		return cached{}, false
	}
	if c.slots[0].next != i {
		c.unlink(i)
		c.pushFront(i)
	}
	return c.slots[i].entry, true
}

// put caches snap, the settled answer of key, taken apart, for requests of
// fingerprint, one of which is of shape, until expires (the record's
// expiry; the zero time if unknown, and then it is not cached) or its max
// age, whichever is first. An answer over the entry limit is not cached,
// and an older entry of key is dropped either way. A nil cache keeps
// nothing. It returns the entry, and whether it was kept.
func (c *replayCache) put(key dedup.Key, fingerprint string, shape *requestShape, snap *snapshotParts, expires time.Time) (cached, bool) {
	if c == nil {
		return cached{}, false
	}
	now := c.now()
	deadline := now.Add(c.maxAge)
	if !expires.IsZero() && expires.Before(deadline) {
		deadline = expires
	}
	h := blob.HashKey(c.seed, key)
	var slot cacheSlot
	if !expires.IsZero() && now.Before(deadline) {
		slot = cacheSlot{entry: c.entry(key, fingerprint, shape, snap), hash: h, deadline: deadline.UnixNano()}
	}
	size := slot.entry.size()
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.index[h]; ok {
		c.drop(old)
	}
	if size == 0 {
		return cached{}, false
	}
	i := c.take()
	c.slots[i] = slot
	c.index[h] = i
	c.pushFront(i)
	c.used += size
	for c.used > c.budget {
		c.drop(c.slots[0].prev)
	}
	return slot.entry, true
}

// entry makes the entry of p, a settled answer's snapshot taken apart, or
// returns none (size 0) when it is over the entry limit.
func (c *replayCache) entry(key dedup.Key, fingerprint string, shape *requestShape, p *snapshotParts) cached {
	e := cached{status: int32(p.status), json: shape.json, shaped: len(shape.body) <= maxShapeBody}
	head := 4 * 2 * p.n // where each header name and value ends, 4 bytes each
	n := len(key.Scope) + len(key.EventID) + len(fingerprint) + p.text + len(p.body)
	if e.shaped {
		n += len(shape.method) + len(shape.route) + len(shape.query) + len(shape.body)
	}
	if head+n+slotOverhead > c.maxEntry {
		return cached{}
	}
	b := blob.NewBuilder(head, n)
	ends, text := b.Head(), 0
	for i := range 2 * p.n {
		text += len(p.field(i))
		binary.LittleEndian.PutUint32(ends[4*i:], uint32(text))
	}
	for _, part := range [...]string{key.Scope, key.EventID, fingerprint} {
		b.AddString(part)
	}
	if e.shaped {
		for _, part := range [...]string{shape.method, shape.route, shape.query} {
			b.AddString(part)
		}
		b.Add(shape.body)
	} else {
		for range partRequest - partMethod + 1 {
			b.Add(nil)
		}
	}
	for i := range 2 * p.n {
		b.Append(p.field(i))
	}
	b.End()
	b.Add(p.body)
	e.parts = b.Blob()
	return e
}

// stats returns the bytes the entries hold, as their sizes count them, and
// their number.
func (c *replayCache) stats() (used, entries int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, len(c.index)
}

// take returns a free slot. c.mu must be held.
func (c *replayCache) take() int32 {
	if n := len(c.free); n > 0 {
		i := c.free[n-1]
		c.free = c.free[:n-1]
		return i
	}
	c.slots = append(c.slots, cacheSlot{})
	return int32(len(c.slots) - 1)
}

// drop removes the entry in slot i. c.mu must be held.
func (c *replayCache) drop(i int32) {
	c.unlink(i)
	delete(c.index, c.slots[i].hash)
	c.used -= c.slots[i].entry.size()
	c.slots[i] = cacheSlot{} // its data goes
	c.free = append(c.free, i)
}

// pushFront makes slot i the most recently used. c.mu must be held.
func (c *replayCache) pushFront(i int32) {
	s, head := &c.slots[i], c.slots[0].next
	s.prev, s.next = 0, head
	c.slots[head].prev = i
	c.slots[0].next = i
}

// unlink takes slot i out of the recency list. c.mu must be held.
func (c *replayCache) unlink(i int32) {
	s := &c.slots[i]
	c.slots[s.prev].next, c.slots[s.next].prev = s.next, s.prev
	s.prev, s.next = 0, 0
}
