package kafkadedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/twmb/franz-go/pkg/kgo"
)

func rec(hdrs ...string) *kgo.Record {
	r := &kgo.Record{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("k"), Value: []byte("v"),
		Timestamp: time.UnixMilli(1700000000123)}
	for i := 0; i+1 < len(hdrs); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: hdrs[i], Value: []byte(hdrs[i+1])})
	}
	return r
}

func TestEventID(t *testing.T) {
	byFunc := kafkadedup.WithIDFunc(func(r *kgo.Record) (string, error) { return string(r.Key), nil })
	for _, tc := range []struct {
		name    string
		opts    []kafkadedup.MessagesOpt
		rec     *kgo.Record
		want    string
		wantErr error
	}{
		{"event-id header", nil, rec("event-id", "e-1"), "e-1", nil},
		{"ce_id accepted", nil, rec("ce_id", "ce-1"), "ce-1", nil},
		{"event-id before ce_id", nil, rec("ce_id", "ce-1", "event-id", "e-1"), "e-1", nil},
		{"repeated equal header", nil, rec("event-id", "e-1", "event-id", "e-1"), "e-1", nil},
		{"conflicting headers", nil, rec("event-id", "e-1", "event-id", "e-2"), "", kafkadedup.ErrAmbiguousEventID},
		{"custom header", []kafkadedup.MessagesOpt{kafkadedup.WithIDHeader("x-id")}, rec("event-id", "no", "x-id", "x-1"), "x-1", nil},
		{"custom header, ce_id still accepted", []kafkadedup.MessagesOpt{kafkadedup.WithIDHeader("x-id")}, rec("ce_id", "ce-1"), "ce-1", nil},
		{"no header is an error by default", nil, rec("other", "x"), "", kafkadedup.ErrNoEventID},
		{"offset fallback only when asked", []kafkadedup.MessagesOpt{kafkadedup.WithOffsetFallback()}, rec(), "orders/3/42", nil},
		{"offset fallback never overrides a header", []kafkadedup.MessagesOpt{kafkadedup.WithOffsetFallback()}, rec("event-id", "e-1"), "e-1", nil},
		{"user function", []kafkadedup.MessagesOpt{byFunc}, rec("event-id", "ignored"), "k", nil},
		{"nil record", nil, nil, "", kafkadedup.ErrNilRecord},
		{"nil record with a user function", []kafkadedup.MessagesOpt{byFunc}, nil, "", kafkadedup.ErrNilRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kafkadedup.Messages(tc.opts...).EventID(tc.rec)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Errorf("EventID = %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestDeadLetterOfRecord(t *testing.T) {
	m := kafkadedup.Messages()
	dl := m.DeadLetter(rec("event-id", "e-1", "trace", "t"))
	if string(dl.Payload) != "v" || string(dl.MessageKey) != "k" {
		t.Errorf("payload %q key %q, want v and k", dl.Payload, dl.MessageKey)
	}
	if o := dl.Origin; o.Topic != "orders" || o.Partition != 3 || o.Offset != 42 {
		t.Errorf("origin %+v, want orders/3@42", o)
	}
	if len(dl.Headers) < 2 || dl.Headers[0].Key != "event-id" || dl.Headers[1].Key != "trace" {
		t.Errorf("headers %v, want the original ones first, in order", dl.Headers)
	}
	if got := m.DeadLetter(nil); got.Payload != nil || got.Origin.Topic != "" {
		t.Errorf("dead letter of a nil record %+v, want empty", got)
	}
	if p := m.Payload(nil); p != nil {
		t.Errorf("payload of a nil record %q", p)
	}
}

// A nil record and a record without an event ID are dead-lettered as
// invalid-id, never processed without dedup and never a panic.
func TestUnusableRecordsAreDeadLettered(t *testing.T) {
	sink := dedup.NewMemorySink()
	ran := 0
	w, err := dedup.Wrap(dedup.NewMemoryStore(), kafkadedup.Messages(),
		func(context.Context, *kgo.Record) error { ran++; return nil },
		dedup.WithScope(dedup.Scope("g", "h")), dedup.WithSink(sink))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*kgo.Record{nil, rec("other", "x"), rec("event-id", "")} {
		res, err := w.Handle(context.Background(), r)
		if err != nil || res.Outcome != dedup.OutcomeDeadLettered || res.Reason != dedup.ReasonInvalidID {
			t.Errorf("Handle = %+v, %v; want dead-lettered as invalid-id", res, err)
		}
	}
	if ran != 0 {
		t.Errorf("handler ran %d times for records without a usable ID", ran)
	}
	if n := len(sink.Letters()); n != 3 {
		t.Errorf("%d dead letters, want 3", n)
	}
}

func TestNewConsumerAndSinkRejectBadConfig(t *testing.T) {
	if _, err := kafkadedup.NewConsumer(nil); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("NewConsumer(nil) = %v, want ErrConfig", err)
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), kafkadedup.Messages(),
		func(context.Context, *kgo.Record) error { return nil },
		dedup.WithScope("g/h"), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kafkadedup.NewConsumer(w, kafkadedup.WithMaxPollRecords(0)); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("NewConsumer with 0 poll records = %v, want ErrConfig", err)
	}
	if _, err := kafkadedup.NewSink(nil); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("NewSink(nil) = %v, want ErrConfig", err)
	}
}

// NewConsumer names the client option that is missing or invalid, without
// contacting a broker: the seed here is a port nothing listens on.
func TestNewConsumerChecksClientOpts(t *testing.T) {
	w, err := dedup.Wrap(dedup.NewMemoryStore(), kafkadedup.Messages(),
		func(context.Context, *kgo.Record) error { return nil },
		dedup.WithScope("g/h"), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	seed := kgo.SeedBrokers("127.0.0.1:1")
	for _, tc := range []struct {
		name  string
		opts  []kgo.Opt
		names string
	}{
		{"no options", nil, "kgo.ConsumerGroup"},
		{"no group", []kgo.Opt{seed, kgo.ConsumeTopics("orders")}, "kgo.ConsumerGroup"},
		{"no topics", []kgo.Opt{seed, kgo.ConsumerGroup("billing")}, "kgo.ConsumeTopics"},
		{"direct partitions in a group", []kgo.Opt{seed, kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"payments": {0: kgo.NewOffset()}})}, "direct-partition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kafkadedup.NewConsumer(w, kafkadedup.WithClientOpts(tc.opts...))
			if !errors.Is(err, dedup.ErrConfig) || !strings.Contains(err.Error(), tc.names) {
				t.Errorf("NewConsumer = %v, want ErrConfig naming %s", err, tc.names)
			}
		})
	}
	if _, err := kafkadedup.NewConsumer(w, kafkadedup.WithClientOpts(seed, kgo.ConsumerGroup("billing"), kgo.ConsumeRegex(), kgo.ConsumeTopics("orders-.*"))); err != nil {
		t.Errorf("NewConsumer with a group and a topic pattern = %v, want nil", err)
	}
}
