package kafkadedup_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A poison record is tried MaxAttempts times, lands in <topic>.dlq with its
// key, value and headers plus the dedup-* and kafka_dlt-* metadata, and the
// records behind it on its partition are then processed in order.
func TestPoisonRecordIsDeadLetteredAndConsumerMovesOn(t *testing.T) {
	c := newCluster(t, 2)
	evs := []event{
		{id: "a-0", key: "a", value: "ok"},
		{id: "a-1", key: "a", value: "ok"},
		{id: "bad-1", key: "a", value: "poison", hdrs: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("t-1")}}},
		{id: "a-2", key: "a", value: "ok"},
		{id: "a-3", key: "a", value: "ok"},
	}
	evs = append(evs, events("b", 40, 7)...)
	recs := c.produce(evs...)
	poison := recs[2]

	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(kafkadedup.WithSpringHeaders()), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error {
			fx.call(r)
			if string(r.Value) == "poison" {
				return errPoison
			}
			fx.apply(r)
			return nil
		})
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))
	c.awaitCommitted(t, endOffsets(recs), fx)
	run.StopClean(t)

	if n := fx.calls["bad-1"]; n != 3 {
		t.Errorf("poison handler ran %d times, want MaxAttempts = 3", n)
	}
	var onA []string
	for _, id := range fx.order[poison.Partition] {
		if strings.HasPrefix(id, "a-") {
			onA = append(onA, id)
		}
	}
	if wantA := []string{"a-0", "a-1", "a-2", "a-3"}; !slices.Equal(onA, wantA) {
		t.Errorf("effects on the poison's partition %v, want %v", onA, wantA)
	}

	dlq := c.readAll(c.topic+".dlq", 1)
	if len(dlq) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dlq))
	}
	dl := dlq[0]
	if string(dl.Key) != "a" || string(dl.Value) != "poison" {
		t.Errorf("dead letter key %q value %q, want the original a/poison", dl.Key, dl.Value)
	}
	for k, v := range map[string]string{
		"trace-id":                          "t-1",
		"event-id":                          "bad-1",
		"dedup-reason":                      string(dedup.ReasonHandlerError),
		"dedup-attempts":                    "3",
		"dedup-event-id":                    "bad-1",
		"dedup-scope":                       dedup.Scope(c.group, "apply"),
		"dedup-cause":                       errPoison.Error(),
		"dedup-origin-topic":                c.topic,
		"dedup-origin-partition":            strconv.Itoa(int(poison.Partition)),
		"dedup-origin-offset":               strconv.FormatInt(poison.Offset, 10),
		"dedup-origin-group":                c.group,
		"dedup-origin-timestamp":            poison.Timestamp.UTC().Format(time.RFC3339Nano),
		"kafka_dlt-original-topic":          c.topic,
		"kafka_dlt-original-consumer-group": c.group,
		"kafka_dlt-exception-fqcn":          fmt.Sprintf("%T", errPoison),
		"kafka_dlt-exception-cause-fqcn":    fmt.Sprintf("%T", errPoison),
		"dedup-error-type":                  fmt.Sprintf("%T", errPoison),
	} {
		if got, _ := header(dl, k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if msg, _ := header(dl, "kafka_dlt-exception-message"); !strings.Contains(msg, errPoison.Error()) {
		t.Errorf("kafka_dlt-exception-message %q does not name the handler's error", msg)
	}
	checkBinary := func(key string, size int, want uint64) {
		t.Helper()
		v, ok := header(dl, key)
		if !ok || len(v) != size {
			t.Errorf("header %s is %d bytes (present %v), want %d", key, len(v), ok, size)
			return
		}
		var got uint64
		if size == 4 {
			got = uint64(binary.BigEndian.Uint32([]byte(v)))
		} else {
			got = binary.BigEndian.Uint64([]byte(v))
		}
		if got != want {
			t.Errorf("header %s = %d, want %d", key, got, want)
		}
	}
	checkBinary("kafka_dlt-original-partition", 4, uint64(poison.Partition))
	checkBinary("kafka_dlt-original-offset", 8, uint64(poison.Offset))
	checkBinary("kafka_dlt-original-timestamp", 8, uint64(poison.Timestamp.UnixMilli()))
}

// A letter dead-lettered again after a redrive carries one set of dedup-*
// and kafka_dlt-* headers, the new one, not the old one appended.
func TestRedriveReplacesMetadataHeaders(t *testing.T) {
	c := newCluster(t, 1)
	sink := c.sink(kafkadedup.WithSpringHeaders())
	dl := dedup.DeadLetter{
		Payload:    []byte("v"),
		MessageKey: []byte("k"),
		Headers: []dedup.Header{
			{Key: "event-id", Value: []byte("e-1")},
			{Key: "dedup-reason", Value: []byte("panic")},
			{Key: "dedup-origin-offset", Value: []byte("7")},
			{Key: "kafka_dlt-original-offset", Value: binary.BigEndian.AppendUint64(nil, 7)},
		},
		Origin:   dedup.Origin{Topic: c.topic, Partition: 0, Offset: 42, Group: "g"},
		Reason:   dedup.ReasonPermanent,
		Error:    "wrapped: root",
		Cause:    "root",
		Attempts: 1,
		EventID:  "e-1",
		Scope:    "g/h",
	}
	if err := sink.Send(context.Background(), dl); err != nil {
		t.Fatal(err)
	}
	got := c.readAll(c.topic+".dlq", 1)[0]
	for _, k := range []string{"event-id", "dedup-reason", "dedup-origin-offset", "kafka_dlt-original-offset", "dedup-event-id"} {
		if n := headerCount(got, k); n != 1 {
			t.Errorf("header %s appears %d times, want once", k, n)
		}
	}
	if v, _ := header(got, "dedup-reason"); v != string(dedup.ReasonPermanent) {
		t.Errorf("dedup-reason %q, want the new %q", v, dedup.ReasonPermanent)
	}
	if v, _ := header(got, "kafka_dlt-original-offset"); binary.BigEndian.Uint64([]byte(v)) != 42 {
		t.Errorf("kafka_dlt-original-offset %d, want the new 42", binary.BigEndian.Uint64([]byte(v)))
	}
	if err := sink.Send(context.Background(), dedup.DeadLetter{EventID: "x"}); err == nil {
		t.Error("a letter without an origin topic was accepted under the default topic naming")
	}
}

// While the dead-letter topic refuses writes the poison record is not
// acknowledged: nothing behind it on its partition runs, and once the topic
// accepts the letter the partition moves on.
func TestDLQProduceFailureHoldsThePartition(t *testing.T) {
	c := newCluster(t, 1)
	dlqTopic := c.topic + ".dlq"
	dlqID := c.topicID(dlqTopic)
	const refusals = 3
	var dlqProduces atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		if !slices.ContainsFunc(req.Topics, func(t kmsg.ProduceRequestTopic) bool { return t.Topic == dlqTopic || t.TopicID == dlqID }) {
			c.KeepControl()
			return nil, nil, false
		}
		if dlqProduces.Add(1) > refusals {
			return nil, nil, false // handled normally; the control is dropped
		}
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	recs := c.produce(
		event{id: "a-0", key: "a", value: "ok"},
		event{id: "bad", key: "a", value: "poison"},
		event{id: "a-1", key: "a", value: "ok"},
	)
	var mu sync.Mutex
	var seenAtA1 int32
	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), dedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error {
			if string(r.Value) == "poison" {
				return errPoison
			}
			if eventID(r) == "a-1" {
				mu.Lock()
				seenAtA1 = dlqProduces.Load()
				mu.Unlock()
			}
			fx.apply(r)
			return nil
		})
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...),
		kafkadedup.WithErrorBackoff(func(int) time.Duration { return 20 * time.Millisecond })))
	c.awaitCommitted(t, endOffsets(recs), fx)
	run.StopClean(t)

	mu.Lock()
	defer mu.Unlock()
	if seenAtA1 <= refusals {
		t.Errorf("the record behind the poison ran after %d dead-letter produces, want it to wait for the accepted one (> %d)", seenAtA1, refusals)
	}
	if dlq := c.readAll(dlqTopic, 1); len(dlq) != 1 || eventID(dlq[0]) != "bad" {
		t.Errorf("dead-letter topic holds %d records, want the poison once", len(dlq))
	}
	if count, _ := fx.snapshot(); count["a-0"] != 1 || count["a-1"] != 1 {
		t.Errorf("effects %v, want a-0 and a-1 once", count)
	}
}

// awaitCommitted waits until the group committed want, for as long as it
// moves (crashtest.Await): offsets committed, handlers run. A poison
// record's attempts and letter take a while on a loaded machine.
func (c *cluster) awaitCommitted(t *testing.T, want map[int32]int64, fx *effects) {
	t.Helper()
	sum := func(m map[int32]int64) int {
		n := 0
		for _, off := range m {
			n += int(off)
		}
		return n
	}
	progress := func() int {
		n := sum(c.committed(c.group))
		fx.mu.Lock()
		defer fx.mu.Unlock()
		for _, m := range []map[string]int{fx.calls, fx.count} {
			for _, k := range m {
				n += k
			}
		}
		return n
	}
	crashtest.Await(t, fmt.Sprintf("committed offsets %v", want), func() bool { return maps.Equal(c.committed(c.group), want) },
		progress, func() string { return fmt.Sprintf("committed %v", c.committed(c.group)) })
}

// topicID returns the topic's ID, for matching requests of versions that
// name topics by ID.
func (c *cluster) topicID(topic string) [16]byte {
	c.t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), c.admin)
	if err != nil || len(resp.Topics) != 1 {
		c.t.Fatalf("metadata for %s: %v", topic, err)
	}
	return resp.Topics[0].TopicID
}

// A dead-letter topic that does not exist is an error naming it, at once,
// every time (not a produce waiting for the topic until its context ends),
// and the letter is sent once the topic exists.
func TestMissingDLQTopicIsNamed(t *testing.T) {
	c := newCluster(t, 1)
	sink, err := kafkadedup.NewSink(c.admin, kafkadedup.WithDLQTopic(func(string) string { return "letters-not-created" }))
	if err != nil {
		t.Fatal(err)
	}
	letter := dedup.DeadLetter{Scope: "s", EventID: "bad", Payload: []byte("poison"), Origin: dedup.Origin{Topic: c.topic}}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := sink.Send(ctx, letter)
		cancel()
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || !strings.Contains(err.Error(), "letters-not-created") {
			t.Fatalf("Send to a missing topic: %v, want UnknownTopicOrPartition naming it", err)
		}
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "letters-not-created", 1, 1
	req.Topics = append(req.Topics, rt)
	if _, err := req.RequestWith(context.Background(), c.admin); err != nil {
		t.Fatal(err)
	}
	if err := sink.Send(context.Background(), letter); err != nil {
		t.Fatalf("Send once the topic exists: %v", err)
	}
	if got := c.readAll("letters-not-created", 1); len(got) != 1 {
		t.Errorf("the topic holds %d letters, want 1", len(got))
	}
}
