package dedup

import (
	"encoding/hex"
	"strings"
)

// The bytes a packed fingerprint (a SHA-256 digest) and a packed owner token
// take in record v2.
const (
	fingerprintBytes = 32
	ownerBytes       = 16
)

// pgPack returns s as the hex of the bytea record v2 stores it as: a string
// of exactly 2n lowercase hex digits (a digest, an owner token) as its n
// bytes, unless it starts with a zero byte; any other string as a zero byte
// followed by its own bytes. The statements decode it with decode(x, 'hex').
// A canonical s is returned as it is, at no cost.
func pgPack(s string, n int) string {
	if canonicalHex(s, n) {
		return s
	}
	return string(appendPacked(nil, s, n))
}

// appendPacked appends pgPack(s, n) to b.
func appendPacked(b []byte, s string, n int) []byte {
	if canonicalHex(s, n) {
		return append(b, s...)
	}
	b = append(b, "00"...)
	return hex.AppendEncode(b, []byte(s))
}

// canonicalHex reports whether s is stored as the n bytes its hex digits
// spell: 2n lowercase digits not starting with a zero byte, which marks
// the other strings.
func canonicalHex(s string, n int) bool {
	if len(s) != 2*n || strings.HasPrefix(s, "00") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !lowerHex[s[i]] {
			return false
		}
	}
	return true
}

// lowerHex marks the bytes that are lowercase hex digits.
var lowerHex = func() (t [256]bool) {
	for _, c := range "0123456789abcdef" {
		t[c] = true
	}
	return t
}()

// pgUnpack reverses pgPack on a value read back as hex (encode(x, 'hex')),
// reporting whether it was one pgPack can have written for n.
func pgUnpack(h string, n int) (string, bool) {
	if rest, ok := strings.CutPrefix(h, "00"); ok {
		b, err := hex.DecodeString(rest)
		return string(b), err == nil
	}
	return h, len(h) == 2*n
}
