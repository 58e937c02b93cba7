package kafkadedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/dedupkit/dedup"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Spring Kafka's dead-letter header names (KafkaHeaders.DLT_*), written by
// [WithSpringHeaders].
const (
	springPrefix            = "kafka_dlt-"
	springOriginalTopic     = springPrefix + "original-topic"
	springOriginalPartition = springPrefix + "original-partition"
	springOriginalOffset    = springPrefix + "original-offset"
	springOriginalTimestamp = springPrefix + "original-timestamp"
	springOriginalGroup     = springPrefix + "original-consumer-group"
	springExceptionFQCN     = springPrefix + "exception-fqcn"
	springExceptionCause    = springPrefix + "exception-cause-fqcn"
	springExceptionMessage  = springPrefix + "exception-message"
)

// ErrNoDLQTopic is returned by [Sink.Send] when no dead-letter topic can be
// named for a letter (a letter without an origin topic, under the default
// naming).
var ErrNoDLQTopic = errors.New("kafkadedup: no dead-letter topic for this letter")

// Sink is a dedup.Sink that produces dead letters to a Kafka topic,
// synchronously: Send returns nil only once the broker acknowledged the
// record.
type Sink struct {
	cl     *kgo.Client
	topic  func(origin string) string
	spring bool

	mu     sync.Mutex
	exists map[string]bool // dead-letter topics the cluster was seen to know
}

// SinkOpt configures a [Sink].
type SinkOpt interface{ apply(*Sink) }

type sinkOptFunc func(*Sink)

func (f sinkOptFunc) apply(x *Sink) { f(x) }

// WithDLQTopic names the dead-letter topic for a letter from the origin
// topic; the default is origin + ".dlq". Returning "" refuses the letter.
func WithDLQTopic(f func(origin string) string) SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.topic = f })
}

// WithSpringHeaders also writes Spring Kafka's kafka_dlt-* headers, replacing
// any the original carried, so tools built for Spring dead-letter topics can
// read the letters. Go has no exception classes: the *-fqcn headers carry
// the Go types of the error and of its root cause (as %T prints them).
func WithSpringHeaders() SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.spring = true })
}

// NewSink returns a Sink producing with cl, which the caller owns and
// closes. The dead-letter topic must exist or cl must be allowed to create
// it (kgo.AllowAutoTopicCreation).
func NewSink(cl *kgo.Client, opts ...SinkOpt) (*Sink, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: kafkadedup.NewSink: nil client", dedup.ErrConfig)
	}
	s := &Sink{cl: cl, topic: defaultDLQTopic, exists: make(map[string]bool)}
	for _, o := range opts {
		o.apply(s)
	}
	if s.topic == nil {
		return nil, fmt.Errorf("%w: kafkadedup.WithDLQTopic: nil function", dedup.ErrConfig)
	}
	return s, nil
}

func defaultDLQTopic(origin string) string {
	if origin == "" {
		return ""
	}
	return origin + ".dlq"
}

// Send produces dl with the original key, value and headers, its dedup-*
// metadata replacing any earlier one, and waits for the broker's
// acknowledgement. A [Consumer] has the wrapper fill in the consumer group
// of its letters (dedup.CallGroup).
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	topic := s.topic(dl.Origin.Topic)
	if topic == "" {
		return fmt.Errorf("%w: %s/%s from topic %q", ErrNoDLQTopic, dl.Scope, dl.EventID, dl.Origin.Topic)
	}
	if err := s.ensureTopic(ctx, topic); err != nil {
		return fmt.Errorf("kafkadedup: dead letter %s/%s: %w", dl.Scope, dl.EventID, err)
	}
	hs := dl.HeadersWithMetadata()
	rec := &kgo.Record{Topic: topic, Key: dl.MessageKey, Value: dl.Payload, Headers: make([]kgo.RecordHeader, 0, len(hs)+8)}
	for _, h := range hs {
		if s.spring && strings.HasPrefix(h.Key, springPrefix) {
			continue
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if s.spring {
		rec.Headers = append(rec.Headers, springHeaders(&dl)...)
	}
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("kafkadedup: produce dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, topic, err)
	}
	return nil
}

// ensureTopic returns an error naming topic, at once, when the cluster does
// not know it and the client may not create it: producing to it would
// wait for the topic until the context ends, saying nothing. A topic seen
// to exist is not asked about again.
func (s *Sink) ensureTopic(ctx context.Context, topic string) error {
	if auto, _ := s.cl.OptValue(kgo.AllowAutoTopicCreation).(bool); auto {
		return nil
	}
	s.mu.Lock()
	known := s.exists[topic]
	s.mu.Unlock()
	if known {
		return nil
	}
	missing, err := absentTopics(ctx, s.cl, []string{topic})
	switch {
	case err != nil:
		return nil // the produce will say what is wrong with the cluster
	case len(missing) > 0:
		return fmt.Errorf("dead-letter topic %s does not exist: create it, or let the sink's client create it (kgo.AllowAutoTopicCreation): %w",
			topic, kerr.UnknownTopicOrPartition)
	}
	s.mu.Lock()
	s.exists[topic] = true
	s.mu.Unlock()
	return nil
}

func springHeaders(dl *dedup.DeadLetter) []kgo.RecordHeader {
	o := dl.Origin
	hs := []kgo.RecordHeader{
		{Key: springOriginalTopic, Value: []byte(o.Topic)},
		{Key: springOriginalPartition, Value: binary.BigEndian.AppendUint32(nil, uint32(o.Partition))},
		{Key: springOriginalOffset, Value: binary.BigEndian.AppendUint64(nil, uint64(o.Offset))},
	}
	if !o.Timestamp.IsZero() {
		hs = append(hs, kgo.RecordHeader{Key: springOriginalTimestamp, Value: binary.BigEndian.AppendUint64(nil, uint64(o.Timestamp.UnixMilli()))})
	}
	if o.Group != "" {
		hs = append(hs, kgo.RecordHeader{Key: springOriginalGroup, Value: []byte(o.Group)})
	}
	return append(hs,
		kgo.RecordHeader{Key: springExceptionFQCN, Value: []byte(dl.ErrorType)},
		kgo.RecordHeader{Key: springExceptionCause, Value: []byte(dl.CauseType)},
		kgo.RecordHeader{Key: springExceptionMessage, Value: []byte(dl.Error)},
	)
}
