// Package hexsha spells a SHA-256 sum as the fingerprints of dedup and
// idemhttp store it: 64 lowercase hex digits.
package hexsha

import (
	"crypto/sha256"
	"encoding/hex"
	"unsafe"
)

// Size is the length of a sum's spelling.
const Size = 2 * sha256.Size

// Into writes the hex SHA-256 of b into into and returns it as a string
// sharing into, which the caller must never write again.
func Into(b []byte, into *[Size]byte) string {
	spell(b, into)
	return unsafe.String(&into[0], Size)
}

// String returns the hex SHA-256 of b, allocating only the string.
func String(b []byte) string {
	var buf [Size]byte
	spell(b, &buf)
	return string(buf[:])
}

func spell(b []byte, into *[Size]byte) {
	sum := sha256.Sum256(b)
	hex.Encode(into[:], sum[:])
}
