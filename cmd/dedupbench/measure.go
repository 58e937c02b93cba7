package main

import (
	"bufio"
	"context"
	"math"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/smithy-go/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// histogram counts durations in logarithmic buckets, 16 per power of two
// (about 4% wide), in fixed memory: recording N events costs nothing per N.
type histogram struct {
	counts [64 * subBuckets]atomic.Uint64
}

const subBits = 4
const subBuckets = 1 << subBits

func bucketOf(ns int64) int {
	if ns < subBuckets {
		return int(max(ns, 0))
	}
	u := uint64(ns)
	exp := bits.Len64(u) - 1 // u is in [2^exp, 2^(exp+1))
	sub := int(u>>(exp-subBits)) & (subBuckets - 1)
	return (exp-subBits+1)*subBuckets + sub
}

// lowerBound returns the smallest duration of bucket b.
func lowerBound(b int) float64 {
	if b < subBuckets {
		return float64(b)
	}
	exp := b/subBuckets + subBits - 1
	sub := b % subBuckets
	return math.Ldexp(1+float64(sub)/subBuckets, exp)
}

func (h *histogram) record(d time.Duration) { h.counts[bucketOf(int64(d))].Add(1) }

// count returns how many durations were recorded.
func (h *histogram) count() uint64 {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	return total
}

// quantile returns the q-quantile, the middle of its bucket.
func (h *histogram) quantile(q float64) time.Duration {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration((lowerBound(i) + lowerBound(i+1)) / 2)
		}
	}
	return 0
}

// pgCounter counts PostgreSQL round trips on a pool: every query, batch
// (pipelined: one round trip), COPY and statement preparation. It also
// times the round trips that claim (see isClaim), from sending the statement
// to reading its last row: the claim latency at the store call.
type pgCounter struct {
	n      atomic.Int64
	claims histogram

	mu      sync.Mutex
	pending map[*pgx.Conn]pendingClaim // a connection's statement in flight
}

type pendingClaim struct {
	at    int64
	claim bool
}

// isClaim reports whether sql claims: an INSERT into the table, which every
// store's claim statement is (and the floor's insert), and no completion is.
// Failures also insert, but no row here fails.
func isClaim(sql string) bool { return strings.Contains(sql, "INSERT INTO") }

func (c *pgCounter) begin(conn *pgx.Conn, claim bool) {
	c.mu.Lock()
	if c.pending == nil {
		c.pending = make(map[*pgx.Conn]pendingClaim)
	}
	c.pending[conn] = pendingClaim{at: now(), claim: claim}
	c.mu.Unlock()
}

func (c *pgCounter) end(conn *pgx.Conn) {
	t := now()
	c.mu.Lock()
	p, ok := c.pending[conn]
	delete(c.pending, conn)
	c.mu.Unlock()
	if ok && p.claim {
		c.claims.record(time.Duration(t - p.at))
	}
}

func (c *pgCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.begin(conn, isClaim(d.SQL))
	return ctx
}
func (c *pgCounter) TraceQueryEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	c.end(conn)
}
func (c *pgCounter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	c.begin(conn, false)
	return ctx
}
func (c *pgCounter) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	if isClaim(d.SQL) {
		c.mu.Lock()
		if p, ok := c.pending[conn]; ok {
			p.claim = true
			c.pending[conn] = p
		}
		c.mu.Unlock()
	}
}
func (c *pgCounter) TraceBatchEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	c.end(conn)
}
func (c *pgCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *pgCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
func (c *pgCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *pgCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// awsCounter counts the HTTP requests an aws-sdk-go-v2 client sends, retries
// included: it sits in the finalize step, after the retry middleware.
type awsCounter struct{ n atomic.Int64 }

func (c *awsCounter) apiOption(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("dedupbench-count",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.n.Add(1)
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// entries remembers when each event entered the dedup step, so that its
// latency is known when its result comes out. A key may be in flight twice
// (a duplicate in the same batch): it then keeps the earlier time.
type entries struct {
	mu sync.Mutex
	m  map[string]entry
}

type entry struct {
	at int64
	n  int
}

func newEntries() *entries { return &entries{m: make(map[string]entry)} }

func (e *entries) enter(id string, at int64) {
	e.mu.Lock()
	en, ok := e.m[id]
	if !ok {
		en.at = at
	}
	en.n++
	e.m[id] = en
	e.mu.Unlock()
}

// leave returns when id entered, or false.
func (e *entries) leave(id string) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.m[id]
	if !ok {
		return 0, false
	}
	if en.n--; en.n == 0 {
		delete(e.m, id)
	} else {
		e.m[id] = en
	}
	return en.at, true
}

// clock is a cheap monotonic clock in nanoseconds.
var start = time.Now()

func now() int64 { return int64(time.Since(start)) }

// mallocs returns the heap allocations made so far.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// peakRSS returns the process's peak resident set (VmHWM) in bytes.
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// cpuTime returns the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU returns the CPU time used so far by each PostgreSQL backend
// serving connections named app, read from /proc: it needs the server on
// this machine, and is empty otherwise.
func backendCPU(ctx context.Context, pool *pgxpool.Pool, app string) map[int]time.Duration {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command, which is in parentheses: utime and
		// stime are the 12th and 13th, in clock ticks of 1/100 s.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		out[int(pid)] = time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return out
}
