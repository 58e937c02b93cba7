// Package blob keeps the strings and bytes of one record in one byte slice,
// for the in-process tables that hold many records (dedup's memory store,
// idemhttp's replay cache): the garbage collector then follows one pointer
// per record, where a struct of strings and slices made it follow one per
// field and mark an object each.
package blob

import (
	"hash/maphash"
	"unsafe"

	"github.com/dedupkit/dedup/deduptype"
)

// MaxParts is the most parts a Blob holds.
const MaxParts = 9

// Blob is a record's parts, cut from one byte slice that never changes once
// built: a record that changes builds a new Blob, so that the strings and
// slices handed out before keep the bytes they had.
type Blob struct {
	data  []byte
	start int32           // where the first part begins: data before it is the caller's own
	ends  [MaxParts]int32 // where each part ends
}

// Builder builds a Blob, part by part, in the order of their numbers.
type Builder struct {
	b Blob
	n int
}

// NewBuilder returns a builder of a Blob of size bytes at most, whose first
// head bytes are the caller's (Head) and the rest its parts.
func NewBuilder(head, size int) Builder {
	return Builder{b: Blob{data: make([]byte, head, head+size), start: int32(head)}}
}

// Head returns the bytes before the first part, for the caller to fill.
func (b *Builder) Head() []byte { return b.b.data[:b.b.start] }

// Add appends the next part.
func (b *Builder) Add(p []byte) {
	b.Append(p)
	b.End()
}

// AddString appends the next part.
func (b *Builder) AddString(p string) {
	b.b.data = append(b.b.data, p...)
	b.End()
}

// Append appends p to the part being built, which End ends.
func (b *Builder) Append(p []byte) { b.b.data = append(b.b.data, p...) }

// End ends the part being built.
func (b *Builder) End() {
	b.b.ends[b.n] = int32(len(b.b.data))
	b.n++
}

// Blob returns the Blob built.
func (b *Builder) Blob() Blob { return b.b }

// Nil reports whether b was never built.
func (b *Blob) Nil() bool { return b.data == nil }

// Head returns the bytes before the first part.
func (b *Blob) Head() []byte { return b.data[:b.start] }

// Part returns part i. Its capacity ends with it.
func (b *Blob) Part(i int) []byte {
	from := b.start
	if i > 0 {
		from = b.ends[i-1]
	}
	return b.data[from:b.ends[i]:b.ends[i]]
}

// String returns part i as a string sharing its bytes, which never change.
func (b *Blob) String(i int) string {
	p := b.Part(i)
	return unsafe.String(unsafe.SliceData(p), len(p))
}

// Len returns the bytes b holds.
func (b *Blob) Len() int { return cap(b.data) }

// HashKey returns the hash of key under seed, as the tables index it.
func HashKey(seed maphash.Seed, key deduptype.Key) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	h.WriteString(key.Scope)
	h.WriteByte(0)
	h.WriteString(key.EventID)
	return h.Sum64()
}

// Holds reports whether parts scope and id of b are key's.
func (b *Blob) Holds(scope, id int, key deduptype.Key) bool {
	return string(b.Part(scope)) == key.Scope && string(b.Part(id)) == key.EventID
}
