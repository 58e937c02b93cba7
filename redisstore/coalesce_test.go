package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// roundTrips counts the client's round trips: a command or a pipeline.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// TestCoalescedCallsAnswerAsOneByOne claims and completes from many
// goroutines at once, 50 of them on one key and 200 on keys of their own:
// every answer is what the same calls made one after another would give
// (one winner on the shared key, every own key acquired and completed),
// and the calls shared round trips.
func TestCoalescedCallsAnswerAsOneByOne(t *testing.T) {
	client := redis.NewClient(testenv.Redis(t).Options())
	t.Cleanup(func() { client.Close() })
	hook := &roundTrips{}
	client.AddHook(hook)
	s := newStore(t, client, false)
	ctx := context.Background()
	scope := fmt.Sprintf("coalesce-%d", rand.Int64())

	const shared, own = 50, 200
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		winners  atomic.Int64
		losers   atomic.Int64
		failures = make(chan error, shared+own)
	)
	for i := range shared + own {
		wg.Go(func() {
			req := request(scope, "shared")
			if i >= shared {
				req = request(scope, fmt.Sprintf("own-%d", i))
			}
			<-start
			c, err := s.Claim(ctx, req)
			switch {
			case err != nil:
				failures <- err
				return
			case i < shared && (c.Status == dedup.ClaimInFlight || c.Status == dedup.ClaimDuplicate):
				losers.Add(1) // before the winner's completion, or after it
				return
			case c.Status != dedup.ClaimAcquired:
				failures <- fmt.Errorf("claim %s: %s", req.Key, c.Status)
				return
			case i < shared:
				winners.Add(1)
			}
			if err := s.Complete(ctx, req.Key, c.Record.Owner, []byte(req.Key.EventID), req.TTL); err != nil {
				failures <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	require.EqualValues(t, 1, winners.Load(), "winners on the shared key")
	require.EqualValues(t, shared-1, losers.Load(), "refused on the shared key")
	for i := shared; i < shared+own; i++ {
		rec, err := s.Get(ctx, dedup.Key{Scope: scope, EventID: fmt.Sprintf("own-%d", i)})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status)
		require.Equal(t, fmt.Sprintf("own-%d", i), string(rec.Result))
	}
	calls := int64(shared + 2*own) // every claim, every completion
	require.Less(t, hook.n.Load(), calls, "round trips for %d calls: none shared", calls)
	t.Logf("%d calls in %d round trips", calls, hook.n.Load())
}

// TestCoalescedBatchAnswersEachAlone checks that one request's bad record
// fails that request alone: a batch of claims shares a script call, not
// its answers.
func TestCoalescedBatchAnswersEachAlone(t *testing.T) {
	client := testenv.Redis(t)
	s := newStore(t, client, false)
	ctx := context.Background()
	scope := fmt.Sprintf("coalesce-%d", rand.Int64())
	bad, good := request(scope, "bad"), request(scope, "good")
	require.NoError(t, client.HSet(ctx, redisKey(s.prefix, bad.Key), "st", "PROCESSING", "fp", "fp", "at", "x", "lu", "x", "ea", "x").Err())
	t.Cleanup(func() { client.Del(context.Background(), redisKey(s.prefix, bad.Key), redisKey(s.prefix, good.Key)) })

	claims, errs := s.claimEach(ctx, "claim", []dedup.ClaimRequest{bad, good})
	require.ErrorIs(t, errs[0], dedup.ErrMalformedRecord)
	require.NoError(t, errs[1])
	require.Equal(t, dedup.ClaimAcquired, claims[1].Status)
}

// TestCoalescerWaiterLeaves checks that a caller whose context ends while
// it waits for a batch leaves the queue with its context's error and its
// request is never run, while the callers around it are answered.
func TestCoalescerWaiterLeaves(t *testing.T) {
	release := make(chan struct{})
	var ran []int
	var mu sync.Mutex
	c := &coalescer[int, int]{max: 1, run: func(_ context.Context, reqs []int) ([]int, []error) {
		mu.Lock()
		ran = append(ran, reqs...)
		mu.Unlock()
		if reqs[0] == 1 {
			<-release
		}
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r * 10
		}
		return out, make([]error, len(reqs))
	}}
	queued := func(n int) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue) == n
	}

	answers := make(chan [2]int, 3)
	ask := func(ctx context.Context, req int) {
		res, err := c.do(ctx, req)
		if err != nil {
			res = -1
		}
		answers <- [2]int{req, res}
	}
	go ask(context.Background(), 1) // runs at once, and blocks
	eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 1 }, "the first call to run")
	ctx, cancel := context.WithCancel(context.Background())
	go ask(ctx, 2)
	eventually(t, func() bool { return queued(1) }, "the second call to queue")
	go ask(context.Background(), 3)
	eventually(t, func() bool { return queued(2) }, "the third call to queue")

	cancel()
	require.Equal(t, [2]int{2, -1}, <-answers, "the caller who left")
	close(release)
	got := map[int]int{}
	for range 2 {
		a := <-answers
		got[a[0]] = a[1]
	}
	require.Equal(t, map[int]int{1: 10, 3: 30}, got)
	require.Equal(t, []int{1, 3}, ran, "requests run")
	require.True(t, queued(0))
	require.Zero(t, c.flights, "flights left")
}

// eventually waits until cond holds, polling: what it waits for is
// another goroutine's progress, so the bound is only there to end a hung
// test.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalescerPanicFreesItsWaiters checks that a call panicking in a batch
// answers the other callers it carried with an error and hands the flight
// on, while the panic goes on up the stack of the caller that ran it.
func TestCoalescerPanicFreesItsWaiters(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	c := &coalescer[int, int]{max: 1, run: func(_ context.Context, reqs []int) ([]int, []error) {
		mu.Lock()
		batches = append(batches, slices.Clone(reqs))
		mu.Unlock()
		switch reqs[0] {
		case 1:
			<-release
		case 2:
			panic("boom")
		}
		return reqs, make([]error, len(reqs))
	}}
	first := make(chan error, 1)
	go func() {
		_, err := c.do(context.Background(), 1) // runs alone, until released
		first <- err
	}()
	eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 }, "the first call to run")

	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_, _ = c.do(context.Background(), 2) // leads the next batch, which panics
	}()
	eventually(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.queue) == 1 }, "the second call to queue")
	carried := make(chan error, 1)
	go func() {
		_, err := c.do(context.Background(), 3) // carried by 2's batch
		carried <- err
	}()
	eventually(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.queue) == 2 }, "the third call to queue")

	close(release)
	require.NoError(t, <-first)
	require.Equal(t, "boom", <-panicked)
	err := <-carried
	require.ErrorContains(t, err, "panicked: boom")
	got, err := c.do(context.Background(), 4) // the flight was handed on
	require.NoError(t, err)
	require.Equal(t, 4, got)
	require.Zero(t, c.flights)
	require.Equal(t, [][]int{{1}, {2, 3}, {4}}, batches)
}
