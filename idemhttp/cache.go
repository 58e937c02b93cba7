package idemhttp

import (
	"sync"
	"time"
	"unsafe"

	"github.com/dedupkit/dedup"
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
type replayCache struct {
	budget   int // bytes the entries may hold together
	maxEntry int // bytes one entry may hold: larger answers are not cached
	maxAge   time.Duration
	now      func() time.Time

	mu      sync.Mutex
	entries map[dedup.Key]*cacheEntry
	lru     cacheEntry // the list's sentinel: lru.next most recently used, lru.prev least
	used    int        // bytes held, as entrySize counts them
}

// cacheEntry is one settled answer. Its key, fingerprint, answer and
// deadline never change once it is in the cache, so they are read outside
// the lock; prev and next belong to the lock.
type cacheEntry struct {
	key         dedup.Key
	fingerprint string
	// shape is that of a request the answer is known to fit, when its body
	// is small enough to keep (shaped).
	shape      requestShape
	shaped     bool
	answer     storedAnswer
	ends       [4]int32  // answer's ends, for two headers or fewer: no allocation of their own
	deadline   time.Time // on the cache's clock
	size       int
	prev, next *cacheEntry
}

// entryOverhead approximates what an entry costs beyond its strings and
// slices: the entry itself, its share of the map (a slot holds the key's
// two string headers and a pointer, and a growing map has room to spare)
// and the rounding of its allocations up to the allocator's size classes.
// With it, the count is within about a tenth under what the heap holds for
// the entries (measured with bodies of 50 B to 4 KiB).
const entryOverhead = int(unsafe.Sizeof(cacheEntry{})) + 128

// entrySize approximates the bytes an entry holds: its key's strings, its
// fingerprint, its header names and values with their ends, its body, and
// entryOverhead. A body shares the buffer the store returned or the
// snapshot encoded, which is that body plus the encoded headers: close
// enough.
func entrySize(key dedup.Key, fingerprint string, shape *requestShape, a *storedAnswer) int {
	return len(key.Scope) + len(key.EventID) + len(fingerprint) +
		len(shape.route) + len(shape.query) + cap(shape.body) +
		len(a.text) + 4*len(a.ends) + len(a.body) + entryOverhead
}

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
		entries: make(map[dedup.Key]*cacheEntry)}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// replayCacheEntryShare is the share of the budget one answer may take at
// most: a larger one is not cached, so that one answer cannot evict all the
// others.
const replayCacheEntryShare = 8

// get returns key's entry, most recently used now, or nil when there is
// none or its deadline has passed (it is then dropped). A nil cache has no
// entries.
func (c *replayCache) get(key dedup.Key) *cacheEntry {
	if c == nil {
		return nil
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	switch {
	case e == nil:
		return nil
	case !now.Before(e.deadline):
		c.remove(e)
		return nil
	}
	if c.lru.next != e {
		e.unlink()
		c.pushFront(e)
	}
	return e
}

// put caches s, the settled answer of key for requests of fingerprint, one
// of which is of shape,
// until expires (the record's expiry; the zero time if unknown, and then it
// is not cached) or its max age, whichever is first. An answer over the
// entry limit is not cached, and an older entry of key is dropped either
// way. A nil cache keeps nothing.
func (c *replayCache) put(key dedup.Key, fingerprint string, shape *requestShape, s *snapshot, expires time.Time) {
	if c == nil {
		return
	}
	now := c.now()
	deadline := now.Add(c.maxAge)
	if !expires.IsZero() && expires.Before(deadline) {
		deadline = expires
	}
	e := &cacheEntry{fingerprint: fingerprint, deadline: deadline}
	if len(s.body)+len(s.text) < c.maxEntry { // cheap first test, before the copy
		e.answer = s.answerIn(e.ends[:0])
		// The key's ID is cut from its header field's value, a string of
		// its own at most a few bytes longer: kept, not copied.
		e.key = key
		if len(shape.body) <= maxShapeBody {
			e.shape, e.shaped = *shape, true
		}
		e.size = entrySize(e.key, fingerprint, &e.shape, &e.answer)
	}
	keep := e.size > 0 && e.size <= c.maxEntry && !expires.IsZero() && now.Before(deadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[key]; old != nil {
		c.remove(old)
	}
	if !keep {
		return
	}
	c.entries[e.key] = e
	c.pushFront(e)
	c.used += e.size
	for c.used > c.budget {
		c.remove(c.lru.prev)
	}
}

// stats returns the bytes the entries hold, as entrySize counts them, and
// their number.
func (c *replayCache) stats() (used, entries int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, len(c.entries)
}

// remove drops e. c.mu must be held.
func (c *replayCache) remove(e *cacheEntry) {
	e.unlink()
	delete(c.entries, e.key)
	c.used -= e.size
}

// pushFront makes e the most recently used. c.mu must be held.
func (c *replayCache) pushFront(e *cacheEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}

// unlink takes e out of the recency list.
func (e *cacheEntry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}
