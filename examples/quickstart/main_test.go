package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestQuickstart runs the README's main command end to end at a smaller
// size: its own check (effects equal unique good events, dead letters equal
// poison events) decides the result. The deadline only ends a run that hangs:
// on a loaded two-core machine the chain's consumer group can take tens of
// seconds to form.
func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, 2000, 0.2, 5, 4, "", "", false, nil); err != nil {
		t.Fatal(err)
	}
}

// TestQuickstartRedis is the same with -redis.
func TestQuickstartRedis(t *testing.T) {
	testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, 2000, 0.2, 5, 4, "", testenv.Env("DEDUP_REDIS_ADDR", testenv.DefaultRedisAddr), false, nil); err != nil {
		t.Fatal(err)
	}
}

// TestQuickstartMetrics runs it with -metrics and scrapes the metrics as
// Prometheus would: the deliveries by outcome are there.
func TestQuickstartMetrics(t *testing.T) {
	mp, url, stop, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, 2000, 0.2, 5, 4, "", "", false, mp); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`dedup_deliveries_total{dedup_outcome="processed",dedup_scope="quickstart/apply-order"`,
		`dedup_deliveries_total{dedup_outcome="duplicate",dedup_scope="quickstart/apply-order"`,
		`dedup_deliveries_total{dedup_outcome="dead-lettered",dedup_scope="quickstart/apply-order"`,
		"messaging_process_duration_seconds_count",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the scrape has no %s:\n%s", want, body)
		}
	}
}
