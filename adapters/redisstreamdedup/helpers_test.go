package redisstreamdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestMain(m *testing.M) {
	// These tests spend their time waiting for Redis (idle times, reads
	// that block), not on the CPU: unless -test.parallel says otherwise,
	// run more of them at once than one per CPU.
	flag.Parse()
	parallel := false
	flag.Visit(func(f *flag.Flag) { parallel = parallel || f.Name == "test.parallel" })
	if !parallel {
		_ = flag.Set("test.parallel", "6")
	}
	goleak.VerifyTestMain(m)
}

// deadline bounds every wait for an effect: generous, for a loaded machine.
const deadline = 60 * time.Second

var errBoom = errors.New("cannot handle this")

func token() string { return strings.ToLower(rand.Text()[:10]) }

// env is one test's stream, its group and its dead-letter stream on the
// shared Redis, deleted when the test ends.
type env struct {
	rdb    *redis.Client
	stream string
	group  string
	dlq    string
}

// newEnv creates a stream of its own with a consumer group reading it
// from the start.
func newEnv(t *testing.T) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	e := &env{rdb: rdb, stream: "rs-test:" + token(), group: "g-" + token()}
	e.dlq = e.stream + redisstreamdedup.DefaultDLQSuffix
	if err := rdb.XGroupCreateMkStream(context.Background(), e.stream, e.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rdb.Del(context.Background(), e.stream, e.dlq).Err(); err != nil {
			t.Errorf("delete %s: %v", e.stream, err)
		}
	})
	return e
}

// publish adds an entry with fields (name, value pairs) and returns its ID.
func (e *env) publish(t *testing.T, fields ...string) string {
	t.Helper()
	values := make([]any, len(fields))
	for i, f := range fields {
		values[i] = f
	}
	id, err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: values}).Result()
	if err != nil {
		t.Fatalf("XADD: %v", err)
	}
	return id
}

// proxied returns a TCP proxy to the env's Redis, which a test cuts and
// restores, and a client through it that does not retry a failed command,
// closed when t ends.
func (e *env) proxied(t *testing.T) (*testenv.Proxy, *redis.Client) {
	t.Helper()
	proxy := testenv.StartProxy(t, e.rdb.Options().Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DialTimeout: 2 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	return proxy, rdb
}

// sink returns a Sink adding letters to the env's dead-letter stream.
func (e *env) sink(t *testing.T) *redisstreamdedup.Sink {
	t.Helper()
	s, err := redisstreamdedup.NewSink(e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// letters returns the entries of the dead-letter stream.
func (e *env) letters(t *testing.T) []redis.XMessage {
	t.Helper()
	ls, err := e.rdb.XRange(context.Background(), e.dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// unsettled returns how many entries the group has not acknowledged:
// pending ones and those not delivered yet.
func (e *env) unsettled(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	groups, err := e.rdb.XInfoGroups(ctx, e.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Name != e.group {
			continue
		}
		undelivered, err := e.rdb.XRange(ctx, e.stream, "("+g.LastDeliveredID, "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(g.Pending) + len(undelivered)
	}
	t.Fatalf("no group %s", e.group)
	return 0
}

// assertAllAcked fails t unless, within the deadline, the group has every
// entry acknowledged.
func (e *env) assertAllAcked(t *testing.T) {
	t.Helper()
	adaptertest.WaitFor(t, deadline, "every entry acknowledged", func() bool { return e.unsettled(t) == 0 })
}

// field returns an entry's field.
func field(m *redisstreamdedup.Message, name string) string {
	v, _ := m.Field(name)
	return v
}

// eventID reads an entry's event ID the way the consumer does.
func eventID(m *redisstreamdedup.Message) string {
	id, _ := redisstreamdedup.Messages().EventID(m)
	return id
}

// wrap returns a wrapper over store with test defaults (unique scope, no
// backoff, rec observing); opts come after them.
func wrap(t *testing.T, store dedup.Store, rec *adaptertest.Effects, h dedup.Handler[*redisstreamdedup.Message], opts ...dedup.Opt) *dedup.Wrapper[*redisstreamdedup.Message] {
	t.Helper()
	base := []dedup.Opt{
		dedup.WithScope("rs-test-" + token()),
		dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithObserver(rec.Observe),
		dedup.WithLogger(adaptertest.Logger(t)),
	}
	w, err := dedup.Wrap(store, redisstreamdedup.Messages(), h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a consumer of e's group until the returned stop is called (or
// the test ends); stop waits for Run to return nil.
func (e *env) start(t *testing.T, w *dedup.Wrapper[*redisstreamdedup.Message], opts ...redisstreamdedup.Opt) (stop func()) {
	t.Helper()
	base := []redisstreamdedup.Opt{redisstreamdedup.WithBlock(500 * time.Millisecond), redisstreamdedup.WithClaimIdle(2 * time.Second),
		redisstreamdedup.WithLogger(adaptertest.Logger(t))}
	c, err := redisstreamdedup.NewConsumer(e.rdb, e.stream, e.group, w, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	stop = func() { run.StopClean(t) }
	t.Cleanup(stop)
	return stop
}
