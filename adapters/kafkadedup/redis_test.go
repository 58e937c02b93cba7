package kafkadedup_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/redisstore"
)

// The consumer over Redis: batched claims and batch completion, re-sent
// events, transient failures retried in place and a poison event
// dead-lettered. Every event has one effect and partition order holds.
func TestRedisStore(t *testing.T) {
	store, err := redisstore.New(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 4)
	evs := events("rds", 400, 12)
	recs := c.produce(append(slices.Clone(evs), evs[:80]...)...)
	n := func(id string) int { i, _ := strconv.Atoi(strings.TrimPrefix(id, "rds-")); return i }

	fx := newEffects()
	w := wrap(t, store, c.sink(), dedup.Scope(c.group+"-"+deduptype.NewOwnerToken()[:8], "apply"),
		func(_ context.Context, r *kgo.Record) error {
			id := eventID(r)
			if n(id) == 13 {
				return dedup.Permanent(errPoison)
			}
			if fx.call(r) == 1 && n(id)%9 == 0 {
				return errors.New("transient")
			}
			fx.apply(r)
			return nil
		}, dedup.WithObserver(fx.observe), dedup.WithBatchCompletion(20*time.Millisecond))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	want := endOffsets(recs)
	eventually(t, 20*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.StopClean(t)

	count, outcomes := fx.snapshot()
	for _, ev := range evs {
		want := 1
		if n(ev.id) == 13 {
			want = 0
		}
		if count[ev.id] != want {
			t.Errorf("event %s had %d effects, want %d", ev.id, count[ev.id], want)
		}
	}
	if outcomes[dedup.OutcomeProcessed] != len(evs)-1 || outcomes[dedup.OutcomeDeadLettered] != 1 {
		t.Errorf("outcomes %v, want %d processed and 1 dead-lettered", outcomes, len(evs)-1)
	}
	produced := map[int32][]string{}
	for _, r := range recs[:len(evs)] {
		if id := eventID(r); n(id) != 13 {
			produced[r.Partition] = append(produced[r.Partition], id)
		}
	}
	for p, ids := range produced {
		if got := fx.order[p]; !slices.Equal(got, ids) {
			t.Errorf("partition %d: effects in order %v,\nwant %v", p, got, ids)
		}
	}
}
