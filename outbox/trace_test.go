package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// traceChain is one request's trace followed through the outbox, the
// relay, a consumer and its dead letters, with the SDK's in-memory
// exporter.
type traceChain struct {
	t       *testing.T
	spans   *tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	request trace.SpanContext

	mu      sync.Mutex
	handled map[string]trace.SpanContext // the handler's span, by payload
}

func newTraceChain(t *testing.T) *traceChain {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &traceChain{t: t, spans: spans, tp: tp, handled: map[string]trace.SpanContext{}}
}

// order writes an accepted and a poison order event to destination in one
// transaction, from inside a request's span.
func (c *traceChain) order(e *env, destination string) {
	ctx, span := c.tp.Tracer("orders-api").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	c.request = span.SpanContext()
	tx := e.begin()
	_, err := e.ob.Add(ctx, tx,
		outbox.Event{Destination: destination, Payload: []byte("accepted")},
		outbox.Event{Destination: destination, Payload: []byte("poison")})
	require.NoError(c.t, err)
	require.NoError(c.t, tx.Commit(ctx))
}

// handle is the consumer's handler: it records its span and refuses the
// poison order for good.
func (c *traceChain) handle(ctx context.Context, payload string) error {
	c.mu.Lock()
	c.handled[payload] = trace.SpanContextFromContext(ctx)
	c.mu.Unlock()
	if payload == "poison" {
		return dedup.Permanent(errors.New("unknown product"))
	}
	return nil
}

// deliveries returns the consumer's ended delivery spans.
func (c *traceChain) deliveries() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range c.spans.GetSpans().Snapshots() {
		if s.InstrumentationScope().Name == "github.com/dedupkit/dedup" {
			out = append(out, s)
		}
	}
	return out
}

// check asserts the chain: both deliveries are children of the request's
// span, each handler ran in its delivery's span, and the dead letter
// carries the poison delivery's span context.
func (c *traceChain) check(letter propagation.TextMapCarrier) {
	t := c.t
	waitFor(t, 10*time.Second, "two delivery spans", func() bool { return len(c.deliveries()) == 2 })
	byOutcome := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range c.deliveries() {
		require.Equal(t, c.request.TraceID(), s.SpanContext().TraceID(), "the delivery continues the request's trace")
		require.Equal(t, c.request.SpanID(), s.Parent().SpanID(), "the delivery is a child of the request's span")
		require.True(t, s.Parent().IsRemote(), "read from the message's headers")
		for _, kv := range s.Attributes() {
			if kv.Key == "dedup.outcome" {
				byOutcome[kv.Value.AsString()] = s
			}
		}
	}
	require.Contains(t, byOutcome, "processed")
	require.Contains(t, byOutcome, "dead-lettered")
	c.mu.Lock()
	require.Equal(t, byOutcome["processed"].SpanContext().SpanID(), c.handled["accepted"].SpanID(), "the handler runs in its delivery's span")
	require.Equal(t, byOutcome["dead-lettered"].SpanContext().SpanID(), c.handled["poison"].SpanID())
	c.mu.Unlock()
	parked := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), letter))
	require.Equal(t, c.request.TraceID(), parked.TraceID(), "the dead letter is in the request's trace")
	require.Equal(t, byOutcome["dead-lettered"].SpanContext().SpanID(), parked.SpanID(), "the dead letter's parent is its delivery")
}

// One trace links request → outbox row → relay → Kafka → consumer → dead
// letter, through a real kfake.
func TestTraceChainKafka(t *testing.T) {
	e := newEnv(t, 1)
	c := newTraceChain(t)
	c.order(e, e.topic)
	e.start(e.relay())

	_, err := kgoCreateTopic(e.producer(), e.topic+".dlq")
	require.NoError(t, err)
	sink, err := kafkadedup.NewSink(e.producer())
	require.NoError(t, err)
	w, err := dedup.Wrap(dedup.NewMemoryStore(), kafkadedup.Messages(), func(ctx context.Context, r *kgo.Record) error {
		return c.handle(ctx, string(r.Value))
	}, dedup.WithScope(dedup.Scope("shipping", "reserve-stock")), dedup.WithSink(sink),
		dedup.WithLogger(quietLogger()), dedup.WithTracerProvider(c.tp))
	require.NoError(t, err)
	consumer, err := kafkadedup.NewConsumer(w, kafkadedup.WithLogger(quietLogger()), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(e.addrs...), kgo.ConsumerGroup("shipping-"+e.topic), kgo.ConsumeTopics(e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	dlq := readTopic(t, e, e.topic+".dlq", 1)
	require.Len(t, dlq, 1)
	letter := propagation.MapCarrier{}
	for _, h := range dlq[0].Headers {
		letter[h.Key] = string(h.Value)
	}
	c.check(letter)
}

// The same chain through SQS: the outbox's SQS publisher, a real fauxqs,
// the SQS messages and an SQS dead-letter queue.
func TestTraceChainSQS(t *testing.T) {
	e := newEnv(t, 1)
	client := testenv.SQS(t)
	queue := testenv.SQSQueue(t, client, nil)
	dlq := testenv.SQSQueue(t, client, nil)
	c := newTraceChain(t)
	c.order(e, queue)
	e.start(sqsRelay(t, e, client, nil))

	sink, err := sqsdedup.NewSink(client, dlq)
	require.NoError(t, err)
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.Messages(queue), func(ctx context.Context, m types.Message) error {
		return c.handle(ctx, aws.ToString(m.Body))
	}, dedup.WithScope(dedup.Scope("shipping", "reserve-stock")), dedup.WithSink(sink),
		dedup.WithLogger(quietLogger()), dedup.WithTracerProvider(c.tp))
	require.NoError(t, err)
	for _, m := range receiveAll(t, client, queue, 2, 20*time.Second) {
		res, err := w.Handle(context.Background(), m)
		require.NoError(t, err)
		require.True(t, res.Settled())
	}

	letters := receiveAll(t, client, dlq, 1, 10*time.Second)
	require.Len(t, letters, 1)
	letter := propagation.MapCarrier{}
	for name, v := range letters[0].MessageAttributes {
		letter[name] = aws.ToString(v.StringValue)
	}
	c.check(letter)
}

// readTopic reads topic from the start until want records arrived, for up
// to 15 s.
func readTopic(t *testing.T, e *env, topic string, want int) []*kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(15 * time.Second)
	for len(recs) < want && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		cancel()
	}
	return recs
}
