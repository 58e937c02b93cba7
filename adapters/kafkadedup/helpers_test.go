package kafkadedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// cluster is an in-process Kafka cluster with one topic and its DLQ topic.
type cluster struct {
	*kfake.Cluster
	t     *testing.T
	topic string
	group string
	addrs []string
	admin *kgo.Client // producing, reading back, offset requests
}

func newCluster(t *testing.T, partitions int32) *cluster {
	t.Helper()
	topic := "events-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		kc.Close()
		t.Fatal(err)
	}
	c := &cluster{Cluster: kc, t: t, topic: topic, group: "g-" + topic, addrs: kc.ListenAddrs(), admin: admin}
	t.Cleanup(func() {
		admin.Close()
		kc.Close()
	})
	return c
}

// event is one record to produce: an event ID (none when empty), a key
// that picks the partition, a value.
type event struct {
	id    string
	key   string
	value string
	hdrs  []kgo.RecordHeader
}

// produce writes the events in order and returns them as written (with
// partition and offset).
func (c *cluster) produce(evs ...event) []*kgo.Record {
	c.t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		r := &kgo.Record{Topic: c.topic, Key: []byte(e.key), Value: []byte(e.value), Headers: e.hdrs}
		if e.id != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "event-id", Value: []byte(e.id)})
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.admin.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		c.t.Fatalf("produce: %v", err)
	}
	return recs
}

// endOffsets returns, per partition, the offset after the last record.
func endOffsets(recs []*kgo.Record) map[int32]int64 {
	end := map[int32]int64{}
	for _, r := range recs {
		end[r.Partition] = max(end[r.Partition], r.Offset+1)
	}
	return end
}

// committed returns the group's committed offsets for the topic.
func (c *cluster) committed(group string) map[int32]int64 {
	c.t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, c.admin)
	if err != nil {
		c.t.Fatalf("offset fetch: %v", err)
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		if t.Topic != c.topic {
			continue
		}
		for _, p := range t.Partitions {
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// readAll reads every record of topic from the start, waiting until n
// records arrived, then a little longer to catch any extra ones.
func (c *cluster) readAll(topic string, n int) []*kgo.Record {
	c.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(10 * time.Second)
	settle := time.Time{}
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		out = append(out, fs.Records()...)
		if len(out) >= n {
			if settle.IsZero() {
				settle = time.Now().Add(300 * time.Millisecond)
			} else if time.Now().After(settle) {
				break
			}
		}
	}
	if len(out) < n {
		c.t.Fatalf("read %d records from %s, want %d", len(out), topic, n)
	}
	return out
}

// clientOpts are the kgo options of a test consumer: quick heartbeats,
// fetches and autocommits so that tests take seconds.
func (c *cluster) clientOpts(group string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(c.addrs...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(c.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.AutoCommitInterval(100 * time.Millisecond),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.ProducerLinger(0),
	}
}

// sink returns a Kafka DLQ sink producing to the cluster.
func (c *cluster) sink(opts ...kafkadedup.SinkOpt) *kafkadedup.Sink {
	c.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs...), kgo.ProducerLinger(0))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.Close)
	s, err := kafkadedup.NewSink(cl, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// start runs c until the test ends or the returned run is stopped.
func start(t *testing.T, c *kafkadedup.Consumer) *adaptertest.Running {
	return adaptertest.Start(t, c.Run)
}

// eventually fails t unless cond holds within timeout.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// effects records the business effects of a handler: how often each event
// ran to success, in order per partition.
type effects struct {
	mu      sync.Mutex
	count   map[string]int
	order   map[int32][]string
	calls   map[string]int // handler invocations, failures included
	outcome map[dedup.Outcome]int
}

func newEffects() *effects {
	return &effects{count: map[string]int{}, order: map[int32][]string{}, calls: map[string]int{}, outcome: map[dedup.Outcome]int{}}
}

func (e *effects) apply(r *kgo.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := eventID(r)
	e.count[id]++
	e.order[r.Partition] = append(e.order[r.Partition], id)
}

func (e *effects) call(r *kgo.Record) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := eventID(r)
	e.calls[id]++
	return e.calls[id]
}

func (e *effects) observe(_ context.Context, res dedup.Result) {
	e.mu.Lock()
	e.outcome[res.Outcome]++
	e.mu.Unlock()
}

func (e *effects) snapshot() (count map[string]int, outcomes map[dedup.Outcome]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	count = make(map[string]int, len(e.count))
	for k, v := range e.count {
		count[k] = v
	}
	outcomes = make(map[dedup.Outcome]int, len(e.outcome))
	for k, v := range e.outcome {
		outcomes[k] = v
	}
	return count, outcomes
}

func eventID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == "event-id" {
			return string(h.Value)
		}
	}
	return ""
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func headerCount(r *kgo.Record, key string) int {
	n := 0
	for _, h := range r.Headers {
		if h.Key == key {
			n++
		}
	}
	return n
}

// wrap returns a wrapper over store with a short backoff and 3 attempts.
func wrap(t *testing.T, store dedup.Store, sink dedup.Sink, scope string, h dedup.Handler[*kgo.Record], opts ...dedup.Opt) *dedup.Wrapper[*kgo.Record] {
	t.Helper()
	opts = append([]dedup.Opt{
		dedup.WithScope(scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(3),
		dedup.WithBackoff(dedup.ExponentialBackoff(5*time.Millisecond, 20*time.Millisecond)),
	}, opts...)
	w, err := dedup.Wrap(store, kafkadedup.Messages(), h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func newConsumer(t *testing.T, w *dedup.Wrapper[*kgo.Record], opts ...kafkadedup.Opt) *kafkadedup.Consumer {
	t.Helper()
	c, err := kafkadedup.NewConsumer(w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var errPoison = errors.New("poison: this event can never succeed")

// events returns n events e-0..e-(n-1) spread over keys k-0..k-(keys-1).
func events(prefix string, n, keys int) []event {
	evs := make([]event, n)
	for i := range evs {
		evs[i] = event{id: fmt.Sprintf("%s-%d", prefix, i), key: fmt.Sprintf("k-%d", i%keys), value: fmt.Sprintf(`{"n":%d}`, i)}
	}
	return evs
}
