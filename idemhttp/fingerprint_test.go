package idemhttp

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadAllReadsWhatIsSentWhateverTheDeclaredLength(t *testing.T) {
	body := []byte(strings.Repeat("0123456789", 10_000)) // 100,000 bytes
	for _, tc := range []struct {
		name     string
		declared int64
	}{
		{"declared", int64(len(body))},
		{"unknown", -1},
		{"declared short", 10},
		{"declared long", 200_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(iotest.HalfReader(bytes.NewReader(body)), tc.declared, math.MaxInt64)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("read %d bytes, error %v; want the %d sent", len(got), err, len(body))
			}
		})
	}
	boom := errors.New("boom")
	if _, err := readAll(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 3, math.MaxInt64); !errors.Is(err, boom) {
		t.Errorf("a failing read: %v, want %v", err, boom)
	}
}

func TestReadAllAllocatesOnceForTheDeclaredLength(t *testing.T) {
	body := strings.Repeat("x", 300)
	r := strings.NewReader(body)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(body)
		if b, err := readAll(r, int64(len(body)), math.MaxInt64); err != nil || len(b) != len(body) {
			t.Fatal(len(b), err)
		}
	})
	if allocs != 1 {
		t.Errorf("%v allocations, want 1", allocs)
	}
}

func TestReadBodyTrustsNoDeclaredLengthBeyondItsPresize(t *testing.T) {
	c := defaultConfig()
	c.maxBody = math.MaxInt64 // "no limit"
	for _, declared := range []int64{1 << 40, math.MaxInt64} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
		r.ContentLength = declared
		body, problem := c.readBody(r, new(bodyCopy))
		if problem != nil || string(body) != "abc" {
			t.Errorf("declared %d: read %q, %v", declared, body, problem)
		}
	}
}
