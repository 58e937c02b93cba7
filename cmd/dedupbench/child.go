package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
)

// meter measures one row in its own process.
type meter struct {
	target int64 // records to settle
	done   chan struct{}
	once   sync.Once

	settled, processed, duplicates atomic.Int64
	first, last                    atomic.Int64 // ns since start: consuming started, last record settled

	lat     histogram
	entries *entries
	pg      pgCounter  // PostgreSQL round trips
	store   awsCounter // DynamoDB requests
	sqs     awsCounter // SQS requests

	mallocs0, mallocs1 uint64
	pg0, store0, sqs0  int64
	cpu0, cpu1         time.Duration // this process's CPU time

	// pool and app name the PostgreSQL connections of the row, whose
	// backends' CPU time is measured from begin (backends0) to the end.
	pool      *pgxpool.Pool
	app       string
	backends0 map[int]time.Duration
	// table is the row's PostgreSQL table, measured as the row ends.
	table string
	// purge is the Purge running beside the row (-purge), or nil.
	purge *purgeRun
}

func newMeter(target int) *meter {
	return &meter{target: int64(target), done: make(chan struct{}), entries: newEntries()}
}

// started notes that consuming started.
func (m *meter) started() {
	if m.first.Load() == 0 {
		m.first.CompareAndSwap(0, now())
	}
}

// begin snapshots the counters before consuming starts.
func (m *meter) begin() {
	m.pg0, m.store0, m.sqs0 = m.pg.n.Load(), m.store.n.Load(), m.sqs.n.Load()
	if m.pool != nil {
		m.backends0 = backendCPU(context.Background(), m.pool, m.app)
	}
	m.mallocs0 = mallocs()
	m.cpu0 = cpuTime()
}

// settle counts one record whose outcome is final.
func (m *meter) settle(outcome dedup.Outcome, n int64) {
	switch outcome {
	case dedup.OutcomeProcessed:
		m.processed.Add(n)
	case dedup.OutcomeDuplicate:
		m.duplicates.Add(n)
	}
	if m.settled.Add(n) >= m.target {
		m.once.Do(func() {
			m.last.Store(now())
			m.cpu1 = cpuTime()
			m.mallocs1 = mallocs()
			close(m.done)
		})
	}
}

// observe is a wrapper observer: the latency of an event is from when the
// wrapper read its ID (enter) to its settled result.
func (m *meter) observe(_ context.Context, res dedup.Result) {
	at, ok := m.entries.leave(res.Key.EventID)
	if !res.Settled() {
		return
	}
	if ok {
		m.lat.record(time.Duration(now() - at))
	}
	m.settle(res.Outcome, 1)
}

// backendCPU returns the CPU time the row's PostgreSQL backends used since
// begin.
func (m *meter) backendCPU() time.Duration {
	if m.pool == nil {
		return 0
	}
	var total time.Duration
	for pid, t := range backendCPU(context.Background(), m.pool, m.app) {
		total += t - m.backends0[pid]
	}
	return total
}

// result is one row's measurements, as the child reports them.
type result struct {
	Row            string  `json:"row"`
	Title          string  `json:"title"`
	Records        int     `json:"records"`
	Unique         int     `json:"unique_events"`
	Processed      int64   `json:"processed"`
	Duplicates     int64   `json:"duplicates"`
	Seconds        float64 `json:"seconds"`
	EventsPerSec   float64 `json:"events_per_sec"`
	RatioToFloor   float64 `json:"ratio_to_floor,omitempty"`
	StorePerEvent  float64 `json:"store_calls_per_event"`
	SQSPerEvent    float64 `json:"sqs_calls_per_event,omitempty"`
	P50Micros      float64 `json:"p50_added_latency_us"`
	P99Micros      float64 `json:"p99_added_latency_us"`
	AllocsPerEvent float64 `json:"allocs_per_event"`
	// Client and PostgreSQL CPU time per event: the row's process, and the
	// server backends of its connections (0 when not measurable).
	ClientCPUMicros float64 `json:"client_cpu_us_per_event"`
	PGCPUMicros     float64 `json:"postgres_cpu_us_per_event"`
	// Runs are the events/s of every run of a repeated row; the others are
	// those of the median run.
	Runs       []float64 `json:"runs_events_per_sec,omitempty"`
	PeakRSSMiB float64   `json:"peak_rss_mib"`
	// The row's PostgreSQL table: the records it held before the run
	// besides the run's events (-records), its shape (v1, v2, floor),
	// and pg_total_relation_size as the row ended per million records it
	// held then (those before the run, expired ones included, and the
	// run's events).
	TableRecords         int     `json:"table_records"`
	TableShape           string  `json:"table_shape,omitempty"`
	TableBytes           int64   `json:"table_bytes,omitempty"`
	TableBytesPerMillion float64 `json:"table_bytes_per_million_records,omitempty"`
	// P99ClaimMicros is the 99th percentile of the claim round trips: each
	// statement (or pipelined batch) inserting into the table, from sending
	// it to reading its last row. It is per claim call: a batch's claim on
	// the batched paths, an event's on the naive row.
	P99ClaimMicros float64 `json:"p99_claim_us,omitempty"`
	ClaimCalls     uint64  `json:"claim_calls,omitempty"`
	// A Purge beside the row (-purge): of how many expired records, how
	// many it deleted, how long it ran (starting with the row) and the CPU
	// time of its backend. Purge PostgreSQL CPU is not in PGCPUMicros.
	PurgeExpired   int     `json:"purge_expired_records,omitempty"`
	Purged         int     `json:"purged,omitempty"`
	PurgeSeconds   float64 `json:"purge_seconds,omitempty"`
	PurgePGCPUSecs float64 `json:"purge_postgres_cpu_seconds,omitempty"`
	PurgeError     string  `json:"purge_error,omitempty"`
	Check          string  `json:"check"`
}

func (m *meter) result(r *row, cfg config) result {
	events := float64(cfg.Records)
	secs := time.Duration(m.last.Load() - m.first.Load()).Seconds()
	res := result{
		Row:             r.name,
		Title:           r.title,
		Records:         cfg.Records,
		Unique:          cfg.Unique,
		Processed:       m.processed.Load(),
		Duplicates:      m.duplicates.Load(),
		Seconds:         secs,
		EventsPerSec:    events / secs,
		StorePerEvent:   float64(m.pg.n.Load()-m.pg0+m.store.n.Load()-m.store0) / events,
		SQSPerEvent:     float64(m.sqs.n.Load()-m.sqs0) / events,
		P50Micros:       float64(m.lat.quantile(0.50)) / 1e3,
		P99Micros:       float64(m.lat.quantile(0.99)) / 1e3,
		AllocsPerEvent:  float64(m.mallocs1-m.mallocs0) / events,
		ClientCPUMicros: float64((m.cpu1 - m.cpu0).Microseconds()) / events,
		PGCPUMicros:     float64(m.backendCPU().Microseconds()) / events,
		PeakRSSMiB:      float64(peakRSS()) / (1 << 20),
		TableRecords:    cfg.Fill,
		PurgeExpired:    cfg.Purge,
		Check:           "ok",
	}
	if calls := m.pg.claims.count(); calls > 0 {
		res.P99ClaimMicros = float64(m.pg.claims.quantile(0.99)) / 1e3
		res.ClaimCalls = calls
	}
	if m.pool != nil && m.table != "" {
		ctx := context.Background()
		res.TableShape, _ = tableShape(ctx, m.pool, m.table)
		if res.TableBytes = tableBytes(ctx, m.pool, m.table); res.TableBytes > 0 {
			res.TableBytesPerMillion = float64(res.TableBytes) / float64(cfg.Fill+cfg.Purge+cfg.Unique) * 1e6
		}
	}
	wantProcessed := int64(cfg.Unique)
	if r.name == "none" || r.name == "sqs-none" || r.name == "pubsub-none" {
		wantProcessed = int64(cfg.Records)
	}
	if res.Processed != wantProcessed || res.Processed+res.Duplicates != int64(cfg.Records) {
		res.Check = fmt.Sprintf("processed %d, duplicates %d; want %d and %d",
			res.Processed, res.Duplicates, wantProcessed, int64(cfg.Records)-wantProcessed)
	}
	return res
}

// runChild runs one row and prints its result as JSON on stdout.
func runChild(ctx context.Context, name, confJSON string) error {
	var cfg config
	if err := json.Unmarshal([]byte(confJSON), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	r := rowByName(name)
	if r == nil {
		return fmt.Errorf("unknown row")
	}
	m := newMeter(cfg.Records)
	if prefix := os.Getenv("DEDUPBENCH_CPUPROFILE"); prefix != "" {
		// For finding where a row's time goes: go tool pprof <prefix>-<row>.pprof
		f, err := os.Create(prefix + "-" + name + ".pprof")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.run(runCtx, cfg, m) }()
	// A row that cannot finish within this bound is reported as an error
	// rather than hanging the whole benchmark.
	limit := time.NewTimer(10 * time.Minute)
	defer limit.Stop()
	select {
	case <-m.done:
	case err := <-errc:
		if err == nil {
			err = fmt.Errorf("stopped after %d of %d records", m.settled.Load(), cfg.Records)
		}
		return err
	case <-limit.C:
		return fmt.Errorf("timed out after %d of %d records", m.settled.Load(), cfg.Records)
	case <-ctx.Done():
		return ctx.Err()
	}
	res := m.result(r, cfg)
	if prefix := os.Getenv("DEDUPBENCH_MEMPROFILE"); prefix != "" {
		// The heap profile as the row ends: go tool pprof -sample_index=alloc_objects
		f, err := os.Create(prefix + "-" + name + ".pprof")
		if err != nil {
			return err
		}
		err = pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
		if err != nil {
			return err
		}
	}
	cancel()
	if err := <-errc; err != nil && ctx.Err() == nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if pr := m.purge; pr != nil {
		// The row's run waited for the purge to end.
		res.Purged, res.PurgePGCPUSecs = pr.purged, pr.cpu.Seconds()
		res.PurgeSeconds = time.Duration(pr.ended - pr.began).Seconds()
		if pr.err != nil {
			res.PurgeError = pr.err.Error()
			res.Check = "purge: " + pr.err.Error()
		}
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
