package dedup_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dedupkit/dedup"
)

type healthFunc func() error

func (f healthFunc) Health() error { return f() }

// The readiness handler answers 200 while every part is healthy, else 503
// naming each failing part.
func TestReadinessHandler(t *testing.T) {
	var failing error
	ok := healthFunc(func() error { return nil })
	flaky := healthFunc(func() error { return failing })
	srv := httptest.NewServer(dedup.ReadinessHandler(ok, flaky))
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("healthy: %d %q", code, body)
	}
	failing = errors.New("store unreachable")
	if code, body := get(); code != http.StatusServiceUnavailable || body != "check 2: store unreachable\n" {
		t.Fatalf("failing: %d %q", code, body)
	}
}
