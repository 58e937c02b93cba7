package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// scrape returns the exporter's /metrics text.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sample returns the value of the sample of metric having every one of
// labels (`name="value"`), or -1.
func sample(text, metric string, labels ...string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line[:end], l)
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64); ok && err == nil {
			return v
		}
	}
	return -1
}

// A cycle of the workload, served by the exporter: the outcomes and the
// requests it made, counted, and the outage of its sink on dedup_outage
// while it lasts and after.
func TestWorkloadMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	mp, err := meterProvider(reg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	wl, err := newWorkload(mp, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections()
	ctx := context.Background()
	const scope = `dedup_scope="metrics-example/apply-order"`
	for i := range cycleRounds {
		if err := wl.round(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	if v := sample(scrape(t, srv.URL), "dedup_outage", scope); v != 1 {
		t.Errorf("dedup_outage at the end of the sink's outage: %v, want 1", v)
	}
	if err := wl.round(ctx, cycleRounds); err != nil { // the sink is back
		t.Fatal(err)
	}
	text := scrape(t, srv.URL)
	if v := sample(text, "dedup_outage", scope); v != 0 {
		t.Errorf("dedup_outage after the outage: %v, want 0", v)
	}
	rounds := cycleRounds + 1
	for outcome, want := range map[string]float64{
		"processed":     float64(rounds + (rounds+4)/5), // each round's order, and each flaky one once it succeeds
		"duplicate":     float64(rounds - 1),            // each round's redelivery of the one before
		"retry":         float64((rounds + 4) / 5),      // each flaky event's first attempt
		"dead-lettered": 6,                              // poison events of rounds 0, 10, ..., 40 and 60; those of the outage stay unsettled
	} {
		if v := sample(text, "dedup_deliveries_total", scope, `dedup_outcome="`+outcome+`"`); v != want {
			t.Errorf("dedup_deliveries_total %s: %v, want %v", outcome, v, want)
		}
	}
	if v := sample(text, "dedup_deliveries_total", scope, `dedup_outcome="error"`); v < outageRounds {
		t.Errorf("dedup_deliveries_total error: %v, want at least one per round of the outage (%d)", v, outageRounds)
	}
	const payments = `dedup_scope="metrics-example/payments"`
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{`http_response_status_code="201"`, `idempotency_replayed="false"`}, float64(rounds)},
		{[]string{`http_response_status_code="201"`, `idempotency_replayed="true"`}, float64((rounds + 2) / 3)},
		{[]string{`http_response_status_code="422"`}, float64((rounds + 6) / 7)},
	} {
		if v := sample(text, "idemhttp_requests_total", append(c.labels, payments)...); v != c.want {
			t.Errorf("idemhttp_requests_total %v: %v, want %v", c.labels, v, c.want)
		}
	}
	if v := sample(text, "dedup_store_duration_seconds_count", scope, `dedup_store_operation="claim"`); v <= 0 {
		t.Errorf("dedup_store_duration_seconds_count claim: %v, want the claims counted", v)
	}
}

// run serves the metrics on a port and stops when its rounds are done.
func TestRun(t *testing.T) {
	if err := run(context.Background(), "127.0.0.1:0", time.Millisecond, 3); err != nil {
		t.Fatal(err)
	}
}
