package kafkadedup_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// The consumer passes the adapter conformance suite on an in-process
// cluster (kfake): a topic of four partitions shared by a consumer group,
// its ".dlq" topic as the dead-letter destination, and kfake's control
// functions breaking every connection.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, adaptertest.Features{
		// kfake's side of a connection lives as long as its client: the
		// harness's producer and sink open connections when they like (a
		// metadata refresh under load), so kfake's goroutines are the
		// server's, not the consumer's; a client the consumer leaked still
		// shows its own.
		IgnoreGoroutines: []string{"github.com/twmb/franz-go/pkg/kfake.(*clientConn).read", "github.com/twmb/franz-go/pkg/kfake.(*clientConn).write",
			"github.com/twmb/franz-go/pkg/kfake.(*clientConn).read.func1"},
	}, newKafkaHarness)
}

// kafkaHarness is the suite's view of one kfake cluster and its topic.
type kafkaHarness struct {
	c    *cluster
	sink *kafkadedup.Sink

	mu      sync.Mutex
	end     map[int32]int64 // the topic's end offsets as produced
	sent    int             // records produced, for their keys
	reader  *kgo.Client     // of the dead-letter topic, made on first use
	letters []adaptertest.Letter
}

func newKafkaHarness(t *testing.T) adaptertest.Harness {
	c := newCluster(t, 4)
	return &kafkaHarness{c: c, sink: c.sink(), end: map[int32]int64{}}
}

// Publish produces each message with its ID in the event-id header and a
// key of its own, so that copies of an event spread over the partitions.
func (h *kafkaHarness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: h.c.topic, Key: []byte(strconv.Itoa(h.sent)), Value: m.Payload,
			Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte(m.ID)}}}
		for k, v := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		recs[i] = r
		h.sent++
	}
	ctx, cancel := context.WithTimeout(context.Background(), adaptertest.Deadline)
	defer cancel()
	if err := h.c.admin.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	for p, o := range endOffsets(recs) {
		h.end[p] = max(h.end[p], o)
	}
}

func (h *kafkaHarness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, kafkadedup.Messages(), h.sink, func(r *kgo.Record) adaptertest.Message {
		m := adaptertest.Message{Payload: r.Value, Headers: map[string]string{}}
		for _, hd := range r.Headers {
			if hd.Key == kafkadedup.DefaultIDHeader {
				m.ID = string(hd.Value)
			} else {
				m.Headers[hd.Key] = string(hd.Value)
			}
		}
		return m
	})
	return newConsumer(t, w, kafkadedup.WithClientOpts(h.c.clientOpts(h.c.group)...),
		kafkadedup.WithDrainTimeout(cfg.ShutdownTimeout),
		kafkadedup.WithErrorBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 500*time.Millisecond)),
		kafkadedup.WithLogger(adaptertest.Logger(t)))
}

// DeadLetters reads what reached the dead-letter topic since the last call
// and returns every letter so far.
func (h *kafkaHarness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reader == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.c.addrs...), kgo.ConsumeTopics(h.c.topic+".dlq"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		h.reader = cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	for _, r := range h.reader.PollFetches(ctx).Records() {
		meta := map[string]string{}
		for _, hd := range r.Headers {
			meta[hd.Key] = string(hd.Value)
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		h.letters = append(h.letters, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: r.Value, Metadata: meta})
	}
	return append([]adaptertest.Letter(nil), h.letters...)
}

// Unsettled counts the records past the group's committed offsets.
func (h *kafkaHarness) Unsettled(t *testing.T) int {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	committed := h.c.committed(h.c.group)
	n := 0
	for p, end := range h.end {
		n += int(end - committed[p])
	}
	return n
}

var errBroken = errors.New("connection broken by the test")

// BreakConnection has the cluster close the connection of every request
// until restored.
func (h *kafkaHarness) BreakConnection(t *testing.T) (restore func()) {
	t.Helper()
	var broken atomic.Bool
	var refused atomic.Int64
	broken.Store(true)
	h.c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		if !broken.Load() {
			h.c.DropControl()
			return nil, nil, false
		}
		h.c.KeepControl()
		refused.Add(1)
		return nil, errBroken, true
	})
	adaptertest.WaitFor(t, adaptertest.Deadline, "a request refused", func() bool { return refused.Load() > 0 })
	return func() { broken.Store(false) }
}
