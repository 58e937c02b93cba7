package dedup

import (
	"context"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The store operations timed by dedup.store.duration, as its
// dedup.store.operation attribute.
const (
	opClaim = iota
	opClaimBatch
	opComplete
	opCompleteBatch
	opFail
	opExtend
	opRelease
	opGet
	opPurge
	numOps
)

var opNames = [numOps]string{"claim", "claim_batch", "complete", "complete_batch", "fail", "extend", "release", "get", "purge"}

// storeTimer records the duration of each store call.
type storeTimer struct {
	hist metric.Float64Histogram
	ops  [numOps][]metric.RecordOption // one slice each: passing them allocates nothing
}

func newStoreTimer(m metric.Meter, scope attribute.KeyValue) (*storeTimer, error) {
	hist, err := m.Float64Histogram("dedup.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the wrapper's store calls, by operation."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
	if err != nil {
		return nil, err
	}
	t := &storeTimer{hist: hist}
	for op, name := range opNames {
		t.ops[op] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(scope, attribute.String("dedup.store.operation", name)))}
	}
	return t, nil
}

func (t *storeTimer) since(ctx context.Context, op int, began time.Time) {
	t.hist.Record(ctx, time.Since(began).Seconds(), t.ops[op]...)
}

// timedStore is a Store whose calls are timed; timedBatchCompleter is a
// BatchCompleter whose calls are.
type timedStore struct {
	Store
	t *storeTimer
}

type timedBatchCompleter struct {
	deduptype.BatchCompleter
	t *storeTimer
}

// timed returns store, and its BatchCompleter bc when it has one (nil
// otherwise), with their calls timed by t.
func timed(store Store, bc deduptype.BatchCompleter, t *storeTimer) (Store, deduptype.BatchCompleter) {
	if bc != nil {
		bc = timedBatchCompleter{BatchCompleter: bc, t: t}
	}
	return timedStore{Store: store, t: t}, bc
}

func (s timedStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	defer s.t.since(ctx, opClaim, time.Now())
	return s.Store.Claim(ctx, req)
}

func (s timedStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	defer s.t.since(ctx, opClaimBatch, time.Now())
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s timedStore) Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error {
	defer s.t.since(ctx, opComplete, time.Now())
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s timedStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	defer s.t.since(ctx, opFail, time.Now())
	return s.Store.Fail(ctx, key, owner, f)
}

func (s timedStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	defer s.t.since(ctx, opExtend, time.Now())
	return s.Store.Extend(ctx, key, owner, lease)
}

func (s timedStore) Release(ctx context.Context, key Key, owner string) error {
	defer s.t.since(ctx, opRelease, time.Now())
	return s.Store.Release(ctx, key, owner)
}

func (s timedStore) Get(ctx context.Context, key Key) (Record, error) {
	defer s.t.since(ctx, opGet, time.Now())
	return s.Store.Get(ctx, key)
}

func (s timedStore) Purge(ctx context.Context) (int, error) {
	defer s.t.since(ctx, opPurge, time.Now())
	return s.Store.Purge(ctx)
}

func (s timedBatchCompleter) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	defer s.t.since(ctx, opCompleteBatch, time.Now())
	return s.BatchCompleter.CompleteBatch(ctx, cs)
}
