package sqsdedup_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// callCounter counts the store calls that claim and complete, on a real
// store.
type callCounter struct {
	dedup.Store
	claims, claimBatches, completes, completeBatches atomic.Int32
}

func (s *callCounter) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, req)
}

func (s *callCounter) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.claimBatches.Add(1)
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *callCounter) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *callCounter) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	s.completeBatches.Add(1)
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

// The messages of one receive from a standard queue are claimed in one store
// call, their handlers run at the same time, and their successes are
// completed in one write: ten messages whose handlers each wait for all ten
// to have started are processed once each, with two store calls.
func TestReceiveClaimedAndCompletedTogether(t *testing.T) {
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			url := queue(t, c)
			const n = 10
			for i := range n {
				send(t, c, url, "r-"+strconv.Itoa(i), "x", nil)
			}
			store := &callCounter{Store: sc.open(t)}
			rec := adaptertest.NewEffects()
			var started sync.WaitGroup
			started.Add(n)
			allStarted := make(chan struct{})
			go func() {
				started.Wait()
				close(allStarted)
			}()
			w := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error {
				started.Done()
				select {
				case <-allStarted: // every handler of the receive runs at once
				case <-time.After(20 * time.Second):
				}
				rec.Apply(eventID(m))
				return nil
			},
				// Successes wait for one another at most a third of the lease
				// (or the batch wait): long, so that ten handlers returning
				// at once on a loaded machine are still written together.
				dedup.WithLease(time.Minute), dedup.WithBatchCompletion(time.Minute))
			stop := start(t, c, url, w)
			adaptertest.WaitFor(t, 30*time.Second, "every message processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == n })
			stop()
			select {
			case <-allStarted:
			default:
				t.Fatal("the handlers of one receive did not run at the same time")
			}
			for i := range n {
				if got := rec.Count("r-" + strconv.Itoa(i)); got != 1 {
					t.Errorf("r-%d applied %d times, want 1", i, got)
				}
			}
			if got := store.claimBatches.Load(); got != 1 || store.claims.Load() != 0 {
				t.Errorf("%d batch claims and %d single claims, want 1 and 0", got, store.claims.Load())
			}
			if got := store.completeBatches.Load(); got != 1 || store.completes.Load() != 0 {
				t.Errorf("%d batch completions and %d single ones, want 1 and 0", got, store.completes.Load())
			}
			assertDrained(t, c, url)
		})
	}
}

// claimSizes records how many keys each batch claim of a real store asks
// for.
type claimSizes struct {
	dedup.Store
	mu    sync.Mutex
	sizes []int
}

func (s *claimSizes) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(reqs))
	s.mu.Unlock()
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *claimSizes) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

func (s *claimSizes) largest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Max(append([]int{0}, s.sizes...))
}

// Under a backlog, the messages of a receive that comes back full are
// handled with those of the receives made right after it: 40 messages
// waiting, with 80 workers (batches of up to 40), are claimed in fewer
// calls than their receives, each processed once.
func TestBacklogReceivesClaimedTogether(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := queue(t, c)
	const n = 40
	for i := range n {
		send(t, c, url, "backlog-"+strconv.Itoa(i), "x", nil)
	}
	store := &claimSizes{Store: dedup.NewMemoryStore()}
	rec := adaptertest.NewEffects()
	w := wrap(t, store, url, rec, func(_ context.Context, m types.Message) error {
		rec.Apply(eventID(m))
		return nil
	})
	stop := start(t, c, url, w, sqsdedup.WithWorkers(80))
	adaptertest.WaitFor(t, 30*time.Second, "every message processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == n })
	stop()
	if got := store.largest(); got <= 10 {
		t.Errorf("largest batch claim held %d keys, want more than one receive's 10", got)
	}
	for i := range n {
		if got := rec.Count("backlog-" + strconv.Itoa(i)); got != 1 {
			t.Errorf("backlog-%d applied %d times, want 1", i, got)
		}
	}
	assertDrained(t, c, url)
}

// callCount counts the calls of one SQS operation.
type callCount struct {
	operation string
	n         atomic.Int32
}

func (c *callCount) APIOption(stack *middleware.Stack) error {
	if stack.ID() != c.operation {
		return nil
	}
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("callCount",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			c.n.Add(1)
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}

// A copy of an event that another batch of this consumer is handling is
// looked at again once that batch is settled, and deleted as a duplicate:
// it is not given back to SQS, where it would stay invisible for a second
// at least and be received and claimed again. The first copy's handler is
// released only once the second copy has been found in flight, and the
// in-flight delay is longer than the test waits.
func TestInFlightCopyOfThisConsumerIsADuplicateAtOnce(t *testing.T) {
	t.Parallel()
	changes := &callCount{operation: "ChangeMessageVisibilityBatch"}
	c := client(t, changes.APIOption)
	// No heartbeat (a third of the timeout) comes within the test.
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "300"})
	rec := adaptertest.NewEffects()
	started, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	var inFlight atomic.Int32
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		started <- struct{}{}
		<-release
		rec.Apply(eventID(m))
		return nil
	}, dedup.WithObserver(func(ctx context.Context, res dedup.Result) {
		rec.Observe(ctx, res)
		if res.Outcome == dedup.OutcomeInFlight {
			inFlight.Add(1)
			once.Do(func() { close(release) })
		}
	}))
	send(t, c, url, "copied", "x", nil)
	// Two batches of up to 10 at once.
	stop := start(t, c, url, w, sqsdedup.WithWorkers(20), sqsdedup.WithInFlightDelay(time.Hour))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first copy never started")
	}
	send(t, c, url, "copied", "x", nil)
	adaptertest.WaitFor(t, 60*time.Second, "both copies settled", func() bool {
		return rec.Outcomes(dedup.OutcomeProcessed) == 1 && rec.Outcomes(dedup.OutcomeDuplicate) == 1
	})
	stop()
	if got := inFlight.Load(); got != 1 {
		t.Errorf("the copy was found in flight %d times, want 1", got)
	}
	if got := changes.n.Load(); got != 0 {
		t.Errorf("%d ChangeMessageVisibilityBatch calls, want none: the copy was given back", got)
	}
	if got := rec.Count("copied"); got != 1 {
		t.Errorf("%d effects, want 1", got)
	}
	assertDrained(t, c, url)
}
