package hexsha

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

func TestSpelling(t *testing.T) {
	sum := sha256.Sum256([]byte("payload"))
	want := hex.EncodeToString(sum[:])
	var buf [Size]byte
	if got := Into([]byte("payload"), &buf); got != want {
		t.Errorf("Into: %s, want %s", got, want)
	}
	if got := String([]byte("payload")); got != want {
		t.Errorf("String: %s, want %s", got, want)
	}
}
