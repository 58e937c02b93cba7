package kafkadedup_test

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Re-sent events (same event-id, same payload) give one effect each, and
// the group's committed offsets reach the end of every partition.
func TestDuplicatesGiveOneEffect(t *testing.T) {
	c := newCluster(t, 4)
	evs := events("dup", 600, 16)
	all := slices.Clone(evs)
	for i := 0; i < len(evs); i += 5 { // every fifth event is sent again
		all = append(all, evs[i])
	}
	rand.Shuffle(len(all)-len(evs), func(i, j int) {
		all[len(evs)+i], all[len(evs)+j] = all[len(evs)+j], all[len(evs)+i]
	})
	recs := c.produce(all...)

	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error { fx.apply(r); return nil },
		dedup.WithObserver(fx.observe))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))

	want := endOffsets(recs)
	eventually(t, 15*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.StopClean(t)

	count, outcomes := fx.snapshot()
	if len(count) != len(evs) {
		t.Errorf("%d distinct events had an effect, want %d", len(count), len(evs))
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s had %d effects, want 1", id, n)
		}
	}
	if outcomes[dedup.OutcomeProcessed] != len(evs) || outcomes[dedup.OutcomeDuplicate] != len(all)-len(evs) {
		t.Errorf("outcomes %v, want %d processed and %d duplicates", outcomes, len(evs), len(all)-len(evs))
	}
}

// Records that fail transiently are retried in place: every partition's
// effects come in the order the records were produced, each once.
func TestOrderHoldsAcrossRetries(t *testing.T) {
	c := newCluster(t, 3)
	evs := events("ord", 300, 9)
	recs := c.produce(evs...)
	flaky := func(id string) bool { n, _ := strconv.Atoi(strings.TrimPrefix(id, "ord-")); return n%7 == 0 }

	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error {
			if fx.call(r) <= 2 && flaky(eventID(r)) {
				return errors.New("transient")
			}
			fx.apply(r)
			return nil
		}, dedup.WithObserver(fx.observe))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	want := endOffsets(recs)
	eventually(t, 20*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.StopClean(t)

	produced := map[int32][]string{}
	nflaky := 0
	for _, r := range recs {
		produced[r.Partition] = append(produced[r.Partition], eventID(r))
		if flaky(eventID(r)) {
			nflaky++
		}
	}
	for p, ids := range produced {
		if got := fx.order[p]; !slices.Equal(got, ids) {
			t.Errorf("partition %d: effects in order %v,\nwant %v", p, got, ids)
		}
	}
	if _, outcomes := fx.snapshot(); outcomes[dedup.OutcomeRetry] != 2*nflaky || outcomes[dedup.OutcomeProcessed] != len(evs) {
		t.Errorf("outcomes %v, want %d retries and %d processed", outcomes, 2*nflaky, len(evs))
	}
}

// Offset commits that fail make the group redeliver everything to the next
// consumer; the redeliveries are recognised as duplicates and have no
// second effect.
func TestCommitFailuresRedeliverWithoutSecondEffect(t *testing.T) {
	c := newCluster(t, 2)
	var failing atomic.Bool
	var refused atomic.Int32
	failing.Store(true)
	c.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		req := kreq.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	evs := events("cf", 200, 8)
	recs := c.produce(evs...)
	store := dedup.NewMemoryStore()
	fx := newEffects()
	handler := func(_ context.Context, r *kgo.Record) error { fx.apply(r); return nil }

	first := start(t, newConsumer(t, wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"), handler),
		kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	eventually(t, 15*time.Second, func() bool {
		count, _ := fx.snapshot()
		return len(count) == len(evs) && refused.Load() >= 2
	}, "the first consumer did not process every event")
	if err := first.Stop(t); err == nil {
		t.Error("Run returned nil although its final commit was refused")
	}
	if got := c.committed(c.group); len(got) != 0 {
		t.Fatalf("offsets %v committed although every commit was refused", got)
	}

	failing.Store(false)
	redelivered := newEffects()
	second := start(t, newConsumer(t, wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"), handler,
		dedup.WithObserver(redelivered.observe)), kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	want := endOffsets(recs)
	eventually(t, 15*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	second.StopClean(t)

	if _, outcomes := redelivered.snapshot(); outcomes[dedup.OutcomeDuplicate] != len(evs) || len(outcomes) != 1 {
		t.Errorf("redelivery outcomes %v, want %d duplicates only", outcomes, len(evs))
	}
	count, _ := fx.snapshot()
	for _, e := range evs {
		if count[e.id] != 1 {
			t.Errorf("event %s had %d effects, want 1", e.id, count[e.id])
		}
	}
}

// A consumer stopped in the middle of a batch while a second consumer of the
// group takes over its partitions leaves every event with exactly one
// effect: the running handlers finish within the drain time, the revoked
// and the stopped partitions commit what was settled, and the second
// consumer sees the rest (and the re-sent copies) once.
//
// With the claim mode a handler canceled mid-effect may run again (see the
// WrapTx variant on PostgreSQL for abandoned handlers), so this one drains.
func TestHandoverMidBatch(t *testing.T) {
	c := newCluster(t, 4)
	evs := events("ho", 800, 16)
	recs := c.produce(append(slices.Clone(evs), evs[:160]...)...)
	store := dedup.NewMemoryStore()
	fx := newEffects()
	var canceled atomic.Int32
	// A handler takes 0.5 ms for the first 100 events, then 40 ms: the
	// 700 left take the first consumer at least 7 s over its 4 partitions,
	// so the second joins mid-stream however slowly a loaded machine
	// rebalances, and the second finishes the rest well within its wait.
	var started atomic.Int32
	handler := func(ctx context.Context, r *kgo.Record) error {
		pause := 500 * time.Microsecond
		if started.Add(1) > 100 {
			pause = 40 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			canceled.Add(1)
			return ctx.Err()
		case <-time.After(pause):
		}
		fx.apply(r)
		return nil
	}
	consumer := func(obs *effects) *kafkadedup.Consumer {
		return newConsumer(t, wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"), handler,
			dedup.WithObserver(obs.observe)),
			kafkadedup.WithClientOpts(c.clientOpts(c.group)...), kafkadedup.WithMaxPollRecords(200))
	}
	applied := func() int { count, _ := fx.snapshot(); return len(count) }

	seenA, seenB := newEffects(), newEffects()
	a := start(t, consumer(seenA))
	eventually(t, 10*time.Second, func() bool { return applied() >= 100 }, "first consumer made no progress")
	b := start(t, consumer(seenB))
	eventually(t, 10*time.Second, func() bool { _, o := seenB.snapshot(); return o[dedup.OutcomeProcessed] > 0 },
		"second consumer never got a partition")
	a.StopClean(t)
	if applied() == len(evs) {
		t.Fatal("the first consumer finished before it was stopped; the handover was not mid-batch")
	}
	want := endOffsets(recs)
	eventually(t, 20*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	b.StopClean(t)

	count, _ := fx.snapshot()
	for _, e := range evs {
		if count[e.id] != 1 {
			t.Errorf("event %s had %d effects, want 1", e.id, count[e.id])
		}
	}
	if n := canceled.Load(); n != 0 {
		t.Errorf("%d handlers were canceled although the drain time let them finish", n)
	}
	_, oa := seenA.snapshot()
	_, ob := seenB.snapshot()
	t.Logf("first consumer %v, second %v", oa, ob)
}

// While the store is unreachable nothing runs and nothing is committed; when
// it is back every record is processed once, in order.
func TestStoreOutageHoldsProgress(t *testing.T) {
	c := newCluster(t, 2)
	evs := events("so", 100, 4)
	recs := c.produce(evs...)
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	store.SetDown(true)
	fx := newEffects()
	w := wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error { fx.apply(r); return nil })
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...),
		kafkadedup.WithErrorBackoff(dedup.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond))))

	time.Sleep(700 * time.Millisecond)
	if count, _ := fx.snapshot(); len(count) != 0 {
		t.Fatalf("%d events ran while the store was down", len(count))
	}
	if got := c.committed(c.group); len(got) != 0 {
		t.Fatalf("offsets %v committed while the store was down", got)
	}
	store.SetDown(false)
	want := endOffsets(recs)
	eventually(t, 15*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.StopClean(t)

	produced := map[int32][]string{}
	for _, r := range recs {
		produced[r.Partition] = append(produced[r.Partition], eventID(r))
	}
	for p, ids := range produced {
		if got := fx.order[p]; !slices.Equal(got, ids) {
			t.Errorf("partition %d: effects %v, want %v", p, got, ids)
		}
	}
}

// countingStore counts the claim calls made of the store it wraps.
type countingStore struct {
	dedup.Store
	mu      sync.Mutex
	claims  int
	batches []int
}

func (s *countingStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.mu.Lock()
	s.claims++
	s.mu.Unlock()
	return s.Store.Claim(ctx, req)
}

func (s *countingStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.mu.Lock()
	s.batches = append(s.batches, len(reqs))
	s.mu.Unlock()
	return s.Store.ClaimBatch(ctx, reqs)
}

// The records of a fetched partition batch are claimed with one store call,
// not one call per record.
func TestFetchedBatchIsClaimedInOneCall(t *testing.T) {
	c := newCluster(t, 2)
	evs := events("bc", 1000, 8)
	recs := c.produce(evs...)
	store := &countingStore{Store: dedup.NewMemoryStore()}
	w := wrap(t, store, c.sink(), dedup.Scope(c.group, "apply"),
		func(context.Context, *kgo.Record) error { return nil })
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	want := endOffsets(recs)
	eventually(t, 15*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.StopClean(t)

	store.mu.Lock()
	defer store.mu.Unlock()
	claimed := store.claims
	for _, n := range store.batches {
		claimed += n
	}
	t.Logf("%d single claims, batch claims of %v", store.claims, store.batches)
	if claimed != len(evs) {
		t.Errorf("%d keys claimed, want %d", claimed, len(evs))
	}
	if calls := store.claims + len(store.batches); calls > len(evs)/10 {
		t.Errorf("%d claim calls for %d records, want batches", calls, len(evs))
	}
}
