package lambdastreamdedup_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// The aws-lambda-go fixture, as Lambda sends it: two records of one
// partition key with the same data are two events (two sequence numbers);
// the same event again answers both as duplicates.
func TestKinesisFixture(t *testing.T) {
	rec := adaptertest.NewEffects()
	var seen []string
	w, err := dedup.Wrap(dedup.NewMemoryStore(), lambdastreamdedup.KinesisMessages(),
		func(_ context.Context, r events.KinesisEventRecord) error {
			seen = append(seen, string(r.Kinesis.Data))
			rec.Apply(r.Kinesis.SequenceNumber)
			return nil
		}, dedup.WithScope(uniqueScope()), dedup.WithSink(dedup.NewMemorySink()), dedup.WithObserver(rec.Observe))
	if err != nil {
		t.Fatal(err)
	}
	h := lambdastreamdedup.KinesisHandler(w)
	ev := kinesisEvent(t, "kinesis-event.json")
	for range 2 {
		resp, err := h(context.Background(), ev)
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("response %+v, %v", resp, err)
		}
	}
	if !slices.Equal(seen, []string{"Hello World", "Hello World"}) || rec.Applied() != 2 || rec.Outcomes(dedup.OutcomeDuplicate) != 2 {
		t.Errorf("handled %q, %d effects, %d duplicates; want two records once, then two duplicates",
			seen, rec.Applied(), rec.Outcomes(dedup.OutcomeDuplicate))
	}
}

// A record that fails stops its shard: its sequence number is the one
// failure reported and the records after it are not run; Lambda retries
// from it and the stream goes on in order, each record applied once.
func TestKinesisStopsAtFirstUnsettled(t *testing.T) {
	h := &testHandler{rec: adaptertest.NewEffects(), fail: map[string]int{"o-2": 1}}
	s := &shardStream{t: t, recs: kinesisRecords(t, "o", 6),
		handler: lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, dedup.NewMemorySink()))}
	if failed := s.step(6); failed != 2 {
		t.Fatalf("failed record %d, want 2", failed)
	}
	if got := h.rec.CallOrder(); !slices.Equal(got, []string{"o-0", "o-1", "o-2"}) {
		t.Fatalf("calls %v: the records after the failed one ran", got)
	}
	s.drain(6, 3)
	want := []string{"o-0", "o-1", "o-2", "o-2", "o-3", "o-4", "o-5"}
	if got := h.rec.CallOrder(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2", "o-3", "o-4", "o-5"})
}

// An invocation that dies mid-batch (a timeout, a crash: Lambda gets no
// response) is retried whole from the checkpoint: the records done before
// it answer as duplicates, not run again, on PostgreSQL.
func TestKinesisCrashMidBatchRetriesAsDuplicates(t *testing.T) {
	ctx, die := context.WithCancel(context.Background())
	h := &testHandler{rec: adaptertest.NewEffects()}
	h.hook = func(hctx context.Context, id string) error {
		if id == "o-3" && h.rec.Calls(id) == 1 {
			die() // the invocation times out here
			<-hctx.Done()
			return hctx.Err()
		}
		return nil
	}
	s := &shardStream{t: t, recs: kinesisRecords(t, "o", 6),
		handler: lambdastreamdedup.KinesisHandler(wrapKinesis(t, postgresStore(t), h, dedup.NewMemorySink()))}
	_, _ = s.handler(ctx, events.KinesisEvent{Records: s.recs}) // its response never reaches Lambda
	s.drain(6, 3)
	for i, id := range []string{"o-0", "o-1", "o-2"} {
		if h.rec.Calls(id) != 1 {
			t.Errorf("record %d (%s) ran %d times, want once", i, id, h.rec.Calls(id))
		}
	}
	if h.rec.Outcomes(dedup.OutcomeDuplicate) != 3 {
		t.Errorf("%d duplicates, want the 3 records done before the crash", h.rec.Outcomes(dedup.OutcomeDuplicate))
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2", "o-3", "o-4", "o-5"})
}

// Lambda's BisectBatchOnFunctionError: a batch whose invocation failed is
// split in halves, each retried; the half already done answers as
// duplicates, and a poison record in the other is retried from its own
// sequence number until its last attempt parks it, with its shard and
// sequence number in the letter, once.
func TestKinesisBisectedRetries(t *testing.T) {
	ctx, timeout := context.WithCancel(context.Background())
	h := &testHandler{rec: adaptertest.NewEffects(), fail: map[string]int{"o-5": -1}}
	h.hook = func(hctx context.Context, id string) error {
		if id == "o-4" && h.rec.Calls(id) == 1 {
			timeout()
			<-hctx.Done()
			return hctx.Err()
		}
		return nil
	}
	sink := dedup.NewMemorySink()
	s := &shardStream{t: t, recs: kinesisRecords(t, "o", 8),
		handler: lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, sink))}
	_, _ = s.handler(ctx, events.KinesisEvent{Records: s.recs}) // the function error Lambda bisects on
	if first := s.invoke(context.Background(), s.recs[:4]); first != 4 {
		t.Fatalf("first half: record %d failed", first)
	}
	second := &shardStream{t: t, recs: s.recs[4:], handler: s.handler}
	second.drain(4, 5)

	for _, id := range []string{"o-0", "o-1", "o-2", "o-3"} {
		if h.rec.Calls(id) != 1 {
			t.Errorf("%s ran %d times: the retried half must answer it as a duplicate", id, h.rec.Calls(id))
		}
	}
	if h.rec.Calls("o-5") != 3 || h.rec.Count("o-5") != 0 {
		t.Errorf("poison ran %d times with %d effects, want 3 attempts and none", h.rec.Calls("o-5"), h.rec.Count("o-5"))
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2", "o-3", "o-4", "o-6", "o-7"})
	letters := sink.Letters()
	if len(letters) != 1 {
		t.Fatalf("%d letters, want 1", len(letters))
	}
	l := letters[0]
	header := func(name string) string {
		for _, h := range l.HeadersWithMetadata() {
			if h.Key == name {
				return string(h.Value)
			}
		}
		return ""
	}
	poison := s.recs[5]
	if l.Reason != dedup.ReasonHandlerError || l.Attempts != 3 || header(lambdastreamdedup.HeaderShard) != "shardId-000000000003" ||
		header(lambdastreamdedup.HeaderSequence) != poison.Kinesis.SequenceNumber ||
		header("dedup-origin-stream") != poison.EventSourceArn || string(l.MessageKey) != poison.Kinesis.PartitionKey ||
		!bytes.Equal(l.Payload, poison.Kinesis.Data) {
		t.Errorf("letter %+v, metadata %+v", l, l.HeadersWithMetadata())
	}
}

// FAILED_FINAL: a record whose event is already dead-lettered, delivered
// again (a replay, an invocation whose response was lost), is not run and
// not parked twice; it is acknowledged with a WARN naming the command that
// makes the event claimable again, and the stream goes on.
func TestKinesisFailedFinalAnsweredOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	h := &testHandler{rec: adaptertest.NewEffects(), fail: map[string]int{"o-1": -1}}
	sink := dedup.NewMemorySink()
	w := wrapKinesis(t, dedup.NewMemoryStore(), h, sink, dedup.WithMaxAttempts(1),
		dedup.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	recs := kinesisRecords(t, "o", 3)
	s := &shardStream{t: t, recs: recs, handler: lambdastreamdedup.KinesisHandler(w)}
	s.drain(3, 2)
	replay := &shardStream{t: t, recs: recs, handler: s.handler}
	replay.drain(3, 1)
	if h.rec.Calls("o-1") != 1 || len(sink.Letters()) != 1 {
		t.Errorf("poison ran %d times, %d letters; want once and one", h.rec.Calls("o-1"), len(sink.Letters()))
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "already dead-lettered") || !strings.Contains(logs.String(), "dedup release") {
		t.Errorf("no WARN for the replayed dead-lettered event; logs:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Two invocations for one shard at once (a timed-out one still running
// while Lambda retries): the second finds the event held, reports it
// without running it or anything after it, and the retry after the first
// finished answers it as a duplicate.
func TestKinesisHeldEventReported(t *testing.T) {
	h := &testHandler{rec: adaptertest.NewEffects()}
	started, release := h.holdFirstCall("o-0")
	recs := kinesisRecords(t, "o", 3)
	handler := lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, dedup.NewMemorySink(), dedup.WithLease(time.Minute)))
	first := invokeAsync(context.Background(), handler, recs)
	<-started
	s := &shardStream{t: t, recs: recs, handler: handler}
	if failed := s.step(3); failed != 0 {
		t.Fatalf("failed record %d, want 0 (held by the first invocation)", failed)
	}
	close(release)
	if resp := <-first; len(resp.BatchItemFailures) != 0 {
		t.Errorf("first invocation: %+v", resp)
	}
	s.drain(3, 1)
	if got := h.rec.CallOrder(); !slices.Equal(got, []string{"o-0", "o-1", "o-2"}) {
		t.Errorf("calls %v, want each record once", got)
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2"})
}

// WithIDField reads the event ID from the data, so that a producer's
// retried put (a new sequence number) is a duplicate; data without the field
// is parked as bad input and the shard goes on.
func TestKinesisIDField(t *testing.T) {
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), lambdastreamdedup.KinesisMessages(lambdastreamdedup.WithIDField("id")),
		func(_ context.Context, r events.KinesisEventRecord) error { rec.Apply(idOf(r)); return nil },
		dedup.WithScope(uniqueScope()), dedup.WithSink(sink))
	if err != nil {
		t.Fatal(err)
	}
	recs := kinesisRecords(t, "o", 4)
	recs[1].Kinesis.Data = recs[0].Kinesis.Data // put again by the producer
	recs[2].Kinesis.Data = []byte("not json")
	resp, err := lambdastreamdedup.KinesisHandler(w)(context.Background(), events.KinesisEvent{Records: recs})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %+v, %v", resp, err)
	}
	if rec.Count("o-0") != 1 || rec.Count("o-3") != 1 || rec.Applied() != 2 {
		t.Errorf("effects %v", rec.Counts())
	}
	if l := sink.Letters(); len(l) != 1 || l[0].Reason != dedup.ReasonInvalidID || !strings.Contains(l[0].Error, "no JSON object") {
		t.Errorf("letters %+v", l)
	}
}

// A store that cannot be reached settles nothing: the first record is
// reported, nothing runs, and the batch comes back.
func TestKinesisStoreDownReportsFirst(t *testing.T) {
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	store.SetDown(true)
	h := &testHandler{rec: adaptertest.NewEffects()}
	s := &shardStream{t: t, recs: kinesisRecords(t, "o", 3),
		handler: lambdastreamdedup.KinesisHandler(wrapKinesis(t, store, h, dedup.NewMemorySink()))}
	if failed := s.step(3); failed != 0 || h.rec.CallCount() != 0 {
		t.Fatalf("failed record %d after %d calls; want 0 and none", failed, h.rec.CallCount())
	}
	store.SetDown(false)
	s.drain(3, 1)
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2"})
}

// A handler given no wrapper fails every invocation with dedup.ErrConfig.
func TestNilWrapper(t *testing.T) {
	if _, err := lambdastreamdedup.KinesisHandler(nil)(context.Background(), events.KinesisEvent{}); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("Kinesis: %v", err)
	}
	if _, err := lambdastreamdedup.DynamoDBHandler(nil)(context.Background(), events.DynamoDBEvent{}); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("DynamoDB: %v", err)
	}
}

// A partition key too long for the default event ID is bad input: the
// record is parked with the reason, never run, and the shard goes on.
func TestKinesisLongPartitionKeyParked(t *testing.T) {
	h := &testHandler{rec: adaptertest.NewEffects()}
	sink := dedup.NewMemorySink()
	recs := kinesisRecords(t, "o", 3)
	recs[1].Kinesis.PartitionKey = strings.Repeat("k", 250)
	s := &shardStream{t: t, recs: recs, handler: lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, sink))}
	s.drain(3, 1)
	h.rec.AssertOnce(t, []string{"o-0", "o-2"})
	if h.rec.Calls("o-1") != 0 {
		t.Error("the record with no usable ID ran")
	}
	if l := sink.Letters(); len(l) != 1 || l[0].Reason != dedup.ReasonInvalidID || string(l[0].MessageKey) != recs[1].Kinesis.PartitionKey {
		t.Errorf("letters %+v", l)
	}
}
