package deduptype

import (
	"encoding/hex"
	"testing"
)

func TestOwnerTokensAreDistinctHexTokensSeparatedBySep(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range []int{0, 1, 2, 31, 32, 33, 64, 100} {
		tokens := NewOwnerTokens(n, ',')
		if want := max(33*n-1, 0); len(tokens) != want {
			t.Fatalf("NewOwnerTokens(%d): %d bytes, want %d", n, len(tokens), want)
		}
		for w := range n {
			tok := tokens.At(w)
			if b, err := hex.DecodeString(tok); err != nil || len(b) != 16 {
				t.Fatalf("NewOwnerTokens(%d): token %d is %q, not 32 hex digits", n, w, tok)
			}
			if w < n-1 && tokens[33*w+32] != ',' {
				t.Fatalf("NewOwnerTokens(%d): no separator after token %d", n, w)
			}
			if seen[tok] {
				t.Fatalf("NewOwnerTokens(%d): token %q made twice", n, tok)
			}
			seen[tok] = true
		}
	}
	if tok := NewOwnerToken(); len(tok) != 32 || seen[tok] {
		t.Fatalf("NewOwnerToken() = %q, want 32 new hex digits", tok)
	}
}
