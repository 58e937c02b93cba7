package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestMain lets the test binary serve as a row's subprocess, as the
// dedupbench binary does.
func TestMain(m *testing.M) {
	if childMain() {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs one row of each kind with a few hundred events: each must
// consume them all, with one effect per distinct event, and the JSON must
// list them. (-quick runs them all; this stays within a few seconds.)
func TestSmoke(t *testing.T) {
	testenv.Postgres(t)
	testenv.DynamoDB(t)
	testenv.SQS(t)
	testenv.Redis(t)
	p := plan{
		cfg: config{
			Postgres:            testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
			DynamoDB:            testenv.Env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"),
			SQS:                 testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
			Redis:               testenv.Env("DEDUP_REDIS_ADDR", testenv.DefaultRedisAddr),
			Partitions:          2,
			BatchWait:           50 * time.Millisecond,
			FetchPartitionBytes: 128 << 10,
		},
		n: 400, smallN: 50, dup: 0.2,
		only: []string{"none", "batched", "redis-batched", "floor", "dynamodb", "dynamodb-floor", "sqs", "sqs-none"},
	}
	out := filepath.Join(t.TempDir(), "results.json")
	if err := p.run(t.Context(), out, false); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rep.Results {
		seen[r.Row]++
		if r.EventsPerSec <= 0 || r.PeakRSSMiB <= 0 {
			t.Errorf("row %s (N=%d): %+v", r.Row, r.Records, r)
		}
	}
	for _, name := range p.only {
		if seen[name] == 0 {
			t.Errorf("row %s missing from the results", name)
		}
	}
	// Each row is measured against its own floor, which is 1x itself.
	for _, r := range rep.Results {
		if r.Row == floorOf(r.Row) && math.Abs(r.RatioToFloor-1) > 1e-9 {
			t.Errorf("floor row %s (N=%d) has ratio %v to itself", r.Row, r.Records, r.RatioToFloor)
		}
		if r.RatioToFloor <= 0 {
			t.Errorf("row %s (N=%d) has no ratio to %s", r.Row, r.Records, floorOf(r.Row))
		}
	}
}
