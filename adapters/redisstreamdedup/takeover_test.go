package redisstreamdedup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// A consumer that dies holding an entry (its connection to Redis and to
// the store cut while its handler runs, nothing acknowledged) has the
// entry taken over by another with XAUTOCLAIM once idle for the claim idle
// time: the second delivery counts 2 or more, the event is applied once,
// by the second, only once the first one's store lease is over, and the
// first one, coming back to complete, is fenced by the store: the record
// stays the second's.
func TestTakeoverByXAutoClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	shared := dedup.NewMemoryStore()
	scope := "rs-takeover-" + token()

	// The first consumer, through a proxy, over a store it can lose.
	proxy, rdbA := e.proxied(t)
	storeA := &cutStore{Store: shared}
	fxA := adaptertest.NewEffects()
	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	wA := wrap(t, storeA, fxA, func(ctx context.Context, m *redisstreamdedup.Message) error {
		close(started)
		<-release
		defer close(returned)
		return nil
	}, dedup.WithScope(scope))
	cA, err := redisstreamdedup.NewConsumer(rdbA, e.stream, e.group, wA, redisstreamdedup.WithConsumerName("a"),
		redisstreamdedup.WithBlock(500*time.Millisecond), redisstreamdedup.WithClaimIdle(2*time.Second),
		redisstreamdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	runA := adaptertest.Start(t, cA.Run)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	e.publish(t, "id", "ev-1", "payload", "p")
	select {
	case <-started:
	case <-time.After(deadline):
		t.Fatal("the first consumer never ran the event")
	}
	// The first consumer dies: nothing it sends reaches Redis or the store.
	proxy.Cut()
	storeA.SetDown(true)
	began := time.Now()

	fxB := adaptertest.NewEffects()
	var delivered []int64
	deliveries := make(chan int64, 16)
	wB := wrap(t, shared, fxB, func(_ context.Context, m *redisstreamdedup.Message) error {
		deliveries <- m.DeliveredCount
		fxB.Apply(eventID(m))
		return nil
	}, dedup.WithScope(scope))
	e.start(t, wB, redisstreamdedup.WithConsumerName("b"))
	adaptertest.WaitFor(t, deadline, "the second consumer applying the event", func() bool { return fxB.Count("ev-1") == 1 })
	took := time.Since(began)
	delivered = append(delivered, <-deliveries)
	if delivered[0] < 2 {
		t.Errorf("the second consumer's delivery counted %d, want 2 or more (a takeover counts)", delivered[0])
	}
	if took < 2*time.Second {
		t.Errorf("taken over after %v, before the claim idle time (2s)", took)
	}
	e.assertAllAcked(t)
	key := dedup.Key{Scope: scope, EventID: "ev-1"}
	won, err := shared.Get(context.Background(), key)
	if err != nil || won.Status != dedup.StatusSucceeded {
		t.Fatalf("record %+v (%v), want SUCCEEDED", won, err)
	}

	// The first one comes back to its store and completes: fenced.
	storeA.SetDown(false)
	close(release)
	<-returned
	runA.StopClean(t)
	if n := fxA.Outcomes(dedup.OutcomeProcessed); n != 0 {
		t.Errorf("the dead consumer's late completion was processed %d times, want fenced", n)
	}
	if rec, err := shared.Get(context.Background(), key); err != nil || rec.Owner != won.Owner || rec.Status != dedup.StatusSucceeded {
		t.Errorf("record after the late completion %+v (%v), want the second consumer's %+v", rec, err, won)
	}
	if n := fxB.Count("ev-1"); n != 1 {
		t.Errorf("applied %d times, want once", n)
	}
}

// cutStore is a dedup.Store every call of which fails while it is down,
// as for a process cut off from its database: its leases are not extended.
type cutStore struct {
	dedup.Store
	down atomic.Bool
}

func (s *cutStore) SetDown(down bool) { s.down.Store(down) }

func (s *cutStore) err() error {
	if s.down.Load() {
		return adaptertest.ErrStoreDown
	}
	return nil
}

func (s *cutStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if err := s.err(); err != nil {
		return dedup.Claim{}, err
	}
	return s.Store.Claim(ctx, req)
}

func (s *cutStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *cutStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *cutStore) Fail(ctx context.Context, key dedup.Key, owner string, f dedup.Failure) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Fail(ctx, key, owner, f)
}

func (s *cutStore) Extend(ctx context.Context, key dedup.Key, owner string, lease time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Extend(ctx, key, owner, lease)
}

func (s *cutStore) Release(ctx context.Context, key dedup.Key, owner string) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Release(ctx, key, owner)
}
