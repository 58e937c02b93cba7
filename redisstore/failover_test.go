package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// failoverEvents is how many events a failover run handles, a tenth of them
// delivered twice.
const failoverEvents = 4000

// A Redis Cluster master killed with SIGKILL mid-run, and never restarted:
// its replica is promoted, the store follows it within seconds (it reloads
// the cluster's layout when a node refuses connections, instead of waiting
// for the client's 60 s periodic reload), and the wrapper keeps trying the
// completions it owns past their lease, so that no event is lost and none
// runs twice. The only repeats allowed are those asynchronous replication
// explains: an event whose claim or completion the dead master acknowledged
// just before the kill, which the replica may never have received.
//
// The consumer is modelled on a Kafka one: events are spread over
// partitions, each handled in order by one worker that waits in place until
// its event is settled, so that no other worker is ever given an event
// while its worker still holds it.
func TestClusterFailover(t *testing.T) {
	nodes := testenv.StartRedisCluster(t, 3, 1, "--cluster-node-timeout", "2000", "--appendonly", "yes", "--appendfsync", "everysec")
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	// The client as the README shows it, except for the reload interval,
	// left at go-redis's default of 60 s: following the failover is the
	// store's job.
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	store, err := New(client)
	if err != nil {
		t.Fatal(err)
	}

	run := newFailoverRun(t)
	logs := &testenv.Logs{}
	// A lease shorter than the failover: the completions in flight at the
	// kill are written after their leases lapsed.
	w, err := dedup.Wrap(store, run.messages(), run.handle, dedup.WithScope(dedup.Scope("failover", "apply")),
		dedup.WithSink(dedup.NewMemorySink()), dedup.WithLease(2*time.Second), dedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := run.consume(ctx, w)

	run.waitSettled(t, failoverEvents/3)
	victim, replica := busiestMaster(t, nodes)
	run.killedAt = time.Now()
	victim.Kill()
	promoted := waitPromoted(t, replica)
	t.Logf("master %s killed; replica %s promoted %v later", victim.Addr(), replica.Addr(), promoted.Sub(run.killedAt).Round(time.Millisecond))

	// The run has at most its whole length again to finish: the events
	// handled before the kill took that long.
	before := run.killedAt.Sub(run.began)
	if err := run.waitAll(max(2*time.Minute, 3*before)); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done

	resumed := run.firstAfter(promoted, replica.Addr(), client)
	t.Logf("events on the dead master's slots settled again %v after the promotion", resumed.Round(time.Millisecond))
	if resumed > 10*time.Second {
		t.Errorf("the store followed the promotion after %v, want seconds", resumed)
	}
	lost, twice, explained := run.verdict()
	t.Logf("%d events: lost %d, applied twice %d (%d of them explained by writes the dead master acknowledged in its last second)",
		failoverEvents, lost, twice, explained)
	t.Logf("the wrapper logged %d ERRORs that an outcome went unrecorded and %d that a lease was lost",
		logs.Count(slog.LevelError, "outcome not recorded"), logs.Count(slog.LevelError, "lease lost"))
	if lost != 0 || twice != explained {
		t.Errorf("lost %d, applied twice %d of which %d explained by asynchronous replication", lost, twice, explained)
	}
	if n := logs.Count(slog.LevelError, "outcome not recorded"); n != 0 {
		t.Errorf("%d successes left unrecorded: the wrapper gave up on completions it still owned", n)
	}
}

// failoverRun is one run's events, their effects and when they settled.
type failoverRun struct {
	t        *testing.T
	began    time.Time
	killedAt time.Time
	parts    [][]string // each partition's deliveries, in order

	mu       sync.Mutex
	applied  map[string]int
	firstRun map[string]time.Time // when each event's handler first ran
	settled  map[string]time.Time // when each event was first settled
	doneKeys atomic.Int32
	allDone  chan struct{}
}

const failoverPartitions = 8

func newFailoverRun(t *testing.T) *failoverRun {
	r := &failoverRun{t: t, parts: make([][]string, failoverPartitions), applied: map[string]int{},
		firstRun: map[string]time.Time{}, settled: map[string]time.Time{}, allDone: make(chan struct{})}
	for i := range failoverEvents {
		id := fmt.Sprintf("evt-%05d", i)
		p := i % failoverPartitions
		r.parts[p] = append(r.parts[p], id)
		if i%10 == 0 { // redelivered a little later, as after a lost ack
			r.parts[p] = append(r.parts[p], id)
		}
	}
	return r
}

func (r *failoverRun) messages() dedup.Messages[string] {
	return dedup.Messages[string]{
		EventID:    func(id string) (string, error) { return id, nil },
		Payload:    func(id string) []byte { return []byte(id) },
		DeadLetter: func(id string) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(id)} },
	}
}

func (r *failoverRun) handle(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied[id]++
	if _, ok := r.firstRun[id]; !ok {
		r.firstRun[id] = time.Now()
	}
	return nil
}

// consume runs one worker per partition; the returned channel is closed
// when they have all returned.
func (r *failoverRun) consume(ctx context.Context, w *dedup.Wrapper[string]) <-chan struct{} {
	r.began = time.Now()
	var wg sync.WaitGroup
	for _, part := range r.parts {
		wg.Go(func() {
			for _, id := range part {
				for ctx.Err() == nil {
					res, err := w.Handle(ctx, id)
					if err == nil && res.Settled() {
						r.settle(id)
						break
					}
					time.Sleep(50 * time.Millisecond) // waiting in place, as a Kafka partition does
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

func (r *failoverRun) settle(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.settled[id]; ok {
		return
	}
	r.settled[id] = time.Now()
	if int(r.doneKeys.Add(1)) == failoverEvents {
		close(r.allDone)
	}
}

func (r *failoverRun) waitSettled(t *testing.T, n int) {
	for int(r.doneKeys.Load()) < n {
		select {
		case <-r.allDone:
			t.Fatal("the run ended before the kill")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *failoverRun) waitAll(within time.Duration) error {
	select {
	case <-r.allDone:
		return nil
	case <-time.After(within):
		return fmt.Errorf("%d of %d events settled %v after the kill", r.doneKeys.Load(), failoverEvents, within)
	}
}

// firstAfter returns how long after promoted the first event whose record
// lives on the node at addr was settled.
func (r *failoverRun) firstAfter(promoted time.Time, addr string, client *redis.ClusterClient) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := time.Duration(-1)
	ctx := context.Background()
	for id, at := range r.settled {
		if at.Before(promoted) || (first >= 0 && at.Sub(promoted) >= first) {
			continue
		}
		node, err := client.MasterForKey(ctx, redisKey(DefaultKeyPrefix, dedup.Key{Scope: "failover/apply", EventID: id}))
		if err == nil && node.Options().Addr == addr {
			first = at.Sub(promoted)
		}
	}
	if first < 0 {
		r.t.Fatalf("no event on %s settled after the promotion", addr)
	}
	return first
}

// verdict counts the events never applied, those applied more than once,
// and of those the ones whose first run began in the last second before
// the kill: their claim or completion may have been acknowledged by the dead
// master and never reached its replica.
func (r *failoverRun) verdict() (lost, twice, explained int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var repeats []string
	for i := range failoverEvents {
		id := fmt.Sprintf("evt-%05d", i)
		switch n := r.applied[id]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
			began := r.firstRun[id]
			inWindow := !began.Before(r.killedAt.Add(-time.Second)) && began.Before(r.killedAt)
			if inWindow {
				explained++
			}
			repeats = append(repeats, fmt.Sprintf("%s ran %d times, first %v before the kill (explained: %v)",
				id, n, r.killedAt.Sub(began).Round(time.Millisecond), inWindow))
		}
	}
	if len(repeats) > 0 {
		r.t.Logf("repeats:\n%s", strings.Join(repeats, "\n"))
	}
	return lost, twice, explained
}

// busiestMaster returns the running master holding the most keys, and its
// replica.
func busiestMaster(t *testing.T, nodes []*testenv.RedisServer) (master, replica *testenv.RedisServer) {
	t.Helper()
	ctx := t.Context()
	var most int64 = -1
	var masterID string
	for _, n := range nodes {
		c := n.Client()
		if !strings.Contains(c.Info(ctx, "replication").Val(), "role:master") {
			continue
		}
		if size := c.DBSize(ctx).Val(); size > most {
			most, master = size, n
			masterID = c.ClusterMyID(ctx).Val()
		}
	}
	for _, n := range nodes {
		if n == master {
			continue
		}
		// CLUSTER NODES: "<id> <addr>@<bus> <flags> <master id> ...".
		for _, line := range strings.Split(n.Client().ClusterNodes(ctx).Val(), "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.Contains(f[2], "myself") && strings.Contains(f[2], "slave") && f[3] == masterID {
				replica = n
			}
		}
	}
	if master == nil || replica == nil {
		t.Fatal("no master with a replica found")
	}
	return master, replica
}

// waitPromoted waits until replica says it is a master, and returns when.
func waitPromoted(t *testing.T, replica *testenv.RedisServer) time.Time {
	t.Helper()
	c := replica.Client()
	for t.Context().Err() == nil {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		role := c.Info(ctx, "replication").Val()
		cancel()
		if strings.Contains(role, "role:master") {
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the replica was never promoted")
	return time.Time{}
}
