package dedup

import (
	"encoding/hex"
	"testing"
)

func TestOwnerTokensAreDistinctHexTokensSeparatedBySep(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range []int{0, 1, 2, 31, 32, 33, 64, 100} {
		tokens := ownerTokens(n, ',')
		if want := max(33*n-1, 0); len(tokens) != want {
			t.Fatalf("ownerTokens(%d): %d bytes, want %d", n, len(tokens), want)
		}
		for w := range n {
			tok := ownerToken(tokens, w)
			if b, err := hex.DecodeString(tok); err != nil || len(b) != 16 {
				t.Fatalf("ownerTokens(%d): token %d is %q, not 32 hex digits", n, w, tok)
			}
			if w < n-1 && tokens[33*w+32] != ',' {
				t.Fatalf("ownerTokens(%d): no separator after token %d", n, w)
			}
			if seen[tok] {
				t.Fatalf("ownerTokens(%d): token %q made twice", n, tok)
			}
			seen[tok] = true
		}
	}
}
