package lambdastreamdedup_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func uniqueScope() string { return "stream-test-" + strings.ToLower(rand.Text()[:10]) }

// kinesisEvent reads a Lambda Kinesis event from testdata.
func kinesisEvent(t *testing.T, file string) events.KinesisEvent {
	t.Helper()
	var ev events.KinesisEvent
	readJSON(t, file, &ev)
	return ev
}

func readJSON(t *testing.T, file string, v any) {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// kinesisRecords returns n records of one shard as Lambda delivers them,
// made from the fixture's first record: increasing sequence numbers, the
// shard in the eventID, data {"id":"<prefix>-<i>"} and partition keys
// spread over four values.
func kinesisRecords(t *testing.T, prefix string, n int) []events.KinesisEventRecord {
	t.Helper()
	tmpl := kinesisEvent(t, "kinesis-event.json").Records[0]
	recs := make([]events.KinesisEventRecord, n)
	for i := range recs {
		r := tmpl
		r.Kinesis.SequenceNumber = fmt.Sprintf("4959033827149025660855969253836157109592157598913658%04d", i)
		r.Kinesis.PartitionKey = fmt.Sprintf("customer-%d", i%4)
		r.Kinesis.Data = fmt.Appendf(nil, `{"id":%q}`, dataID(prefix, i))
		r.EventID = "shardId-000000000003:" + r.Kinesis.SequenceNumber
		recs[i] = r
	}
	return recs
}

func dataID(prefix string, i int) string { return fmt.Sprintf("%s-%d", prefix, i) }

// idOf returns the "id" field of a record's data, the test's business key.
func idOf(r events.KinesisEventRecord) string {
	var d struct{ ID string }
	_ = json.Unmarshal(r.Kinesis.Data, &d)
	return d.ID
}

// testHandler records effects by data ID; it fails the IDs in fail for as
// many calls as fail says (-1: always), and calls hook first if set.
type testHandler struct {
	rec  *adaptertest.Effects
	mu   sync.Mutex
	fail map[string]int
	hook func(ctx context.Context, id string) error
}

func (h *testHandler) handle(ctx context.Context, r events.KinesisEventRecord) error {
	id := idOf(r)
	n := h.rec.Call(id)
	if h.hook != nil {
		if err := h.hook(ctx, id); err != nil {
			return err
		}
	}
	h.mu.Lock()
	left := h.fail[id]
	h.mu.Unlock()
	if left < 0 || n <= left {
		return fmt.Errorf("call %d of %s fails", n, id)
	}
	h.rec.Apply(id)
	return nil
}

// holdFirstCall makes h's first call for id wait until release is closed;
// started is closed when that call begins.
func (h *testHandler) holdFirstCall(id string) (started, release chan struct{}) {
	started, release = make(chan struct{}), make(chan struct{})
	h.hook = func(_ context.Context, got string) error {
		if got == id && h.rec.Calls(got) == 1 {
			close(started)
			<-release
		}
		return nil
	}
	return started, release
}

// invokeAsync invokes handler with recs in a goroutine of its own; its
// response comes on the channel returned.
func invokeAsync(ctx context.Context, handler func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error),
	recs []events.KinesisEventRecord,
) <-chan events.KinesisEventResponse {
	out := make(chan events.KinesisEventResponse, 1)
	go func() {
		resp, _ := handler(ctx, events.KinesisEvent{Records: recs})
		out <- resp
	}()
	return out
}

// wrapKinesis wraps h over store with test defaults (unique scope, sink,
// three attempts, no backoff); opts come after them.
func wrapKinesis(t *testing.T, store dedup.Store, h *testHandler, sink dedup.Sink, opts ...dedup.Opt) *dedup.Wrapper[events.KinesisEventRecord] {
	t.Helper()
	base := []dedup.Opt{dedup.WithScope(uniqueScope()), dedup.WithSink(sink), dedup.WithMaxAttempts(3),
		dedup.WithBackoff(func(int) time.Duration { return 0 }), dedup.WithObserver(h.rec.Observe)}
	w, err := dedup.Wrap(store, lambdastreamdedup.KinesisMessages(), h.handle, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// shardStream plays the Lambda service for one shard: it invokes the
// handler with batches from its checkpoint and moves the checkpoint as
// Lambda does with ReportBatchItemFailures: past the batch when no item
// failed, else to the reported sequence number.
type shardStream struct {
	t       *testing.T
	recs    []events.KinesisEventRecord
	pos     int
	handler func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error)
}

// invoke calls the handler with recs and returns the index in recs of the
// record Lambda retries from, len(recs) when none failed. A response naming
// a record not in recs, or more than one, fails the test: Lambda would
// retry the whole batch.
func (s *shardStream) invoke(ctx context.Context, recs []events.KinesisEventRecord) int {
	s.t.Helper()
	resp, err := s.handler(ctx, events.KinesisEvent{Records: recs})
	if err != nil {
		s.t.Fatalf("handler error %v: Lambda retries the whole batch", err)
	}
	switch len(resp.BatchItemFailures) {
	case 0:
		return len(recs)
	case 1:
	default:
		s.t.Fatalf("%d batch item failures for one shard: %+v", len(resp.BatchItemFailures), resp)
	}
	seq := resp.BatchItemFailures[0].ItemIdentifier
	i := slices.IndexFunc(recs, func(r events.KinesisEventRecord) bool { return r.Kinesis.SequenceNumber == seq })
	if i < 0 {
		s.t.Fatalf("batch item failure %q is no record of the batch", seq)
	}
	return i
}

// step invokes the handler with up to size records from the checkpoint and
// moves the checkpoint; it returns the failed record's index in the
// stream, or -1.
func (s *shardStream) step(size int) int {
	s.t.Helper()
	batch := s.recs[s.pos:min(s.pos+size, len(s.recs))]
	i := s.invoke(context.Background(), batch)
	s.pos += i
	if i < len(batch) {
		return s.pos
	}
	return -1
}

// drain steps until the checkpoint is past the last record, at most max
// invocations.
func (s *shardStream) drain(size, max int) {
	s.t.Helper()
	for n := 0; s.pos < len(s.recs); n++ {
		if n == max {
			s.t.Fatalf("stream not drained after %d invocations: checkpoint %d of %d", max, s.pos, len(s.recs))
		}
		s.step(size)
	}
}

// postgresStore is a PostgreSQL store on a table of its own.
func postgresStore(t *testing.T) dedup.Store {
	pool := testenv.Postgres(t)
	table := "lambdastream_test_" + strings.ToLower(rand.Text()[:12])
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return s
}
