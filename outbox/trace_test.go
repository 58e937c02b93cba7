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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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
	e.start(e.relay(outbox.WithTracerProvider(c.tp)))

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
	c.checkRelay()
}

// checkRelay asserts that the relay's publish span is linked to the trace
// of the request that wrote the events, inside a span of its pass.
func (c *traceChain) checkRelay() {
	var publish, pass sdktrace.ReadOnlySpan
	// The consumer may have its messages before the pass that sent them
	// ended.
	waitFor(c.t, 10*time.Second, "the relay's pass and publish spans", func() bool {
		for _, s := range c.spans.GetSpans().Snapshots() {
			switch s.Name() {
			case "publish":
				publish = s
			case "outbox relay pass":
				pass = s
			}
		}
		return publish != nil && pass != nil
	})
	require.Equal(c.t, trace.SpanKindProducer, publish.SpanKind())
	require.Equal(c.t, pass.SpanContext().SpanID(), publish.Parent().SpanID())
	require.Len(c.t, publish.Links(), 2, "one link per event")
	for _, l := range publish.Links() {
		require.Equal(c.t, c.request.SpanID(), l.SpanContext.SpanID(), "linked to the request that wrote the event")
	}
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
	e.start(sqsRelay(t, e, client, nil, outbox.WithTracerProvider(c.tp)))

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
	c.checkRelay()
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

// The relay's metrics: while the broker refuses every produce the events
// wait, counted as pending with the age of the oldest, and each attempt is
// a publish failure; once it accepts, they are published and none wait.
func TestRelayMetrics(t *testing.T) {
	e := newEnv(t, 1)
	refusing := refuseProduce(e.kafka)
	refusing.Store(true)
	e.add(true, e.event("a", "1"), e.event("b", "2"), e.event("", "3"))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e.start(e.relay(outbox.WithMeterProvider(mp), outbox.WithPublishTimeout(300*time.Millisecond), outbox.WithMaxAttempts(1000)))

	metrics := func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		out := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						out[m.Name] += float64(p.Value)
					}
				case metricdata.Gauge[int64]:
					for _, p := range d.DataPoints {
						out[m.Name] = float64(p.Value)
					}
				case metricdata.Gauge[float64]:
					for _, p := range d.DataPoints {
						out[m.Name] = p.Value
					}
				}
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "publish failures counted", func() bool { return metrics()["outbox.publish.failures"] >= 3 })
	m := metrics()
	require.Equal(t, 3.0, m["outbox.pending"])
	require.Positive(t, m["outbox.pending.age"])
	require.Zero(t, m["outbox.events.published"])

	refusing.Store(false)
	waitFor(t, 10*time.Second, "all published", func() bool { return metrics()["outbox.events.published"] == 3 })
	m = metrics()
	require.Equal(t, 0.0, m["outbox.pending"])
	require.Equal(t, 0.0, m["outbox.pending.age"])
	require.Zero(t, m["outbox.events.failed"])
}
