package main

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A cycle of the workload, served by the exporter: the outage of its sink
// on dedup_outage while it lasts and after (see cycle), and the outcomes
// and the requests it made, counted.
func TestWorkloadMetrics(t *testing.T) {
	exp := newExporter(t)
	defer http.DefaultClient.CloseIdleConnections()
	cycle(t, exp)
	const scope = "metrics-example/apply-order"
	x := exp.scrape(t)
	rounds := cycleRounds + 1
	for outcome, want := range map[string]float64{
		"processed":     float64(rounds + (rounds+4)/5), // each round's order, and each flaky one once it succeeds
		"duplicate":     float64(rounds - 1),            // each round's redelivery of the one before
		"retry":         float64((rounds + 4) / 5),      // each flaky event's first attempt
		"dead-lettered": 6,                              // poison events of rounds 0, 10, ..., 40 and 60; those of the outage stay unsettled
	} {
		if v, _ := x.value("dedup_deliveries_total", "dedup_scope", scope, "dedup_outcome", outcome); v != want {
			t.Errorf("dedup_deliveries_total %s: %v, want %v", outcome, v, want)
		}
	}
	if v, _ := x.value("dedup_deliveries_total", "dedup_scope", scope, "dedup_outcome", "error"); v < outageRounds {
		t.Errorf("dedup_deliveries_total error: %v, want at least one per round of the outage (%d)", v, outageRounds)
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"http_response_status_code", "201", "idempotency_replayed", "false"}, float64(rounds)},
		{[]string{"http_response_status_code", "201", "idempotency_replayed", "true"}, float64((rounds + 2) / 3)},
		{[]string{"http_response_status_code", "422"}, float64((rounds + 6) / 7)},
	} {
		if v, _ := x.value("idemhttp_requests_total", append(c.labels, "dedup_scope", "metrics-example/payments")...); v != c.want {
			t.Errorf("idemhttp_requests_total %v: %v, want %v", c.labels, v, c.want)
		}
	}
	if v, _ := x.value("dedup_store_duration_seconds_count", "dedup_scope", scope, "dedup_store_operation", "claim"); v <= 0 {
		t.Errorf("dedup_store_duration_seconds_count claim: %v, want the claims counted", v)
	}
}

// run serves the metrics on a port and stops when its rounds are done.
func TestRun(t *testing.T) {
	if err := run(context.Background(), "127.0.0.1:0", time.Millisecond, 3); err != nil {
		t.Fatal(err)
	}
}
