package deduptype

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// NewOwnerToken returns a random token identifying one claim: 32 hex
// digits.
func NewOwnerToken() string { return string(NewOwnerTokens(1, 0)) }

// OwnerTokens is a list of owner tokens made together for a batch claim,
// each followed by a separator but the last.
type OwnerTokens string

// NewOwnerTokens returns n new owner tokens of 32 hex digits, separated by
// sep, with one random read for every 32 tokens. A store that sends the
// batch's tokens as one list (the PostgreSQL store's array) passes the
// list's separator and sends the string as it is.
func NewOwnerTokens(n int, sep byte) OwnerTokens {
	var (
		b      strings.Builder
		random [16 * 32]byte // read for 32 tokens at a time
		digits [32]byte
	)
	b.Grow(max(33*n-1, 0))
	for w := range n {
		if w%32 == 0 {
			_, _ = rand.Read(random[:16*min(32, n-w)]) // crypto/rand.Read never returns an error.
		}
		hex.Encode(digits[:], random[16*(w%32):][:16])
		if w > 0 {
			b.WriteByte(sep)
		}
		b.Write(digits[:])
	}
	return OwnerTokens(b.String())
}

// At returns token w, a substring of t that costs no allocation.
func (t OwnerTokens) At(w int) string { return string(t[33*w : 33*w+32]) }
