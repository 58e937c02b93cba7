package kafkadedup_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/twmb/franz-go/pkg/kgo"
)

// bufferedCounter is a kgo hook counting the records the client buffers
// from fetch responses.
type bufferedCounter struct{ n atomic.Int64 }

func (b *bufferedCounter) OnFetchRecordBuffered(*kgo.Record) { b.n.Add(1) }

// A partition whose worker is WithPartitionBuffer records behind stops being
// fetched, and is fetched again once the worker catches up: with the
// handler stuck on the first record, the client buffers far fewer than the
// partition's records; released, every record is handled once, in order.
func TestPartitionBufferPausesFetching(t *testing.T) {
	c := newCluster(t, 1)
	const batches, perBatch, buffer = 40, 10, 20
	for b := range batches {
		evs := make([]event, perBatch)
		for i := range evs {
			n := b*perBatch + i
			evs[i] = event{id: "pb-" + strconv.Itoa(n), key: "k", value: strconv.Itoa(n)}
		}
		c.produce(evs...) // one batch each
	}
	release := make(chan struct{})
	var order []int
	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(ctx context.Context, r *kgo.Record) error {
			<-release
			n, _ := strconv.Atoi(string(r.Value))
			order = append(order, n) // one partition: one worker goroutine
			fx.apply(r)
			return nil
		})
	buffered := &bufferedCounter{}
	opts := append(c.clientOpts(c.group), kgo.FetchMaxPartitionBytes(1), kgo.FetchMaxBytes(1), kgo.WithHooks(buffered))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(opts...), kafkadedup.WithPartitionBuffer(buffer),
		kafkadedup.WithMaxPollRecords(perBatch)))

	eventually(t, 10*time.Second, func() bool { return buffered.n.Load() >= buffer }, "no records fetched")
	time.Sleep(500 * time.Millisecond) // unpaused, the client would fetch the rest in this time
	if n := buffered.n.Load(); n >= batches*perBatch {
		t.Errorf("the client buffered all %d records behind a stuck handler; want fetching paused near the buffer of %d", n, buffer)
	}
	close(release)
	eventually(t, 15*time.Second, func() bool { count, _ := fx.snapshot(); return len(count) == batches*perBatch },
		"not every record was handled after the handler was released")
	run.StopClean(t)
	for i, n := range order {
		if n != i {
			t.Fatalf("record %d handled at position %d: order broken", n, i)
		}
	}
}
