package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The example serves its seeded records: the overview counts them, and
// it stops when its context ends.
func TestConsoleExample(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", func(url string) { urls <- url }) }()
	var base string
	select {
	case base = <-urls:
	case err := <-done:
		t.Fatal(err)
	}
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Per scope, 40 orders: 8 in flight, of which 4 stuck (a lapsed
	// lease), 4 failed retryably (not stuck: just now), 4 for good.
	for _, want := range []string{`data-count="processing">8<`, `data-count="final"><a href="failed?scope=orders%2Fship">4</a>`, `data-count="stuck"><a href="stuck?scope=orders%2Fship">4</a>`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("overview lacks %s\n%s", want, body)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
