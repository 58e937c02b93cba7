package reliability_test

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/base64"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// badInput is one row of TestKafkaBadInput: a record sent between two good
// ones, and what must become of it.
type badInput struct {
	name string
	// bad returns the bad record(s) to send after the good "before" record
	// and ahead of the good "after" one, all on one partition.
	bad func() []*kgo.Record
	// env sets up what the row needs (default: the shared PostgreSQL store
	// and a sink producing to the cluster's dead-letter topic).
	env func(t *testing.T, k *kafka, e *badEnv)
	// reason is the dead letter's reason; "" means the record must be held:
	// never acknowledged, nothing behind it run, and wantErr matched by the
	// error a direct Handle of it returns.
	reason dedup.Reason
	// wantErr is matched by the dead letter's error (Result.Err), or, for a
	// held record, by Handle's error.
	wantErr func(error) bool
	// applied are the event IDs of the bad records that must have had their
	// effect once.
	applied []string
	// holdsAll is set when the good record before the bad one cannot be
	// settled either: it is claimed in the same batch, and the batch claim
	// fails as a whole.
	holdsAll bool
}

// badEnv is what a row runs with.
type badEnv struct {
	store   dedup.Store
	sink    dedup.Sink
	msgs    dedup.Messages[*kgo.Record]
	opts    []dedup.Opt
	handler func(context.Context, *kgo.Record) error // nil: apply the effect
}

func rec(id, value string, hdrs ...kgo.RecordHeader) *kgo.Record {
	r := &kgo.Record{Key: []byte("k"), Value: []byte(value), Headers: hdrs}
	if id != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "event-id", Value: []byte(id)})
	}
	return r
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func as[E error]() func(error) bool {
	return func(err error) bool { var e E; return errors.As(err, &e) }
}

// Every bad input of DESIGN §9 that applies to Kafka, sent through a
// kafkadedup.Consumer between two good records: each ends as a dead letter
// with its reason, or holds its partition with a typed error; none panics,
// none is acknowledged before it is settled, and the good records around it
// are processed (the one behind a held record is not).
func TestKafkaBadInput(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	pgStore, err := dedup.NewPostgresStore(pool, dedup.WithTable(recordsTable(t, pool)))
	if err != nil {
		t.Fatal(err)
	}
	if err := pgStore.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	jsonValue := `{"id":"x","n":1}`
	rows := []badInput{
		{name: "missing event ID header", bad: func() []*kgo.Record { return []*kgo.Record{rec("", jsonValue)} },
			reason: dedup.ReasonInvalidID, wantErr: is(kafkadedup.ErrNoEventID)},
		{name: "empty event ID", bad: func() []*kgo.Record { return []*kgo.Record{rec("", jsonValue, kgo.RecordHeader{Key: "event-id"})} },
			reason: dedup.ReasonInvalidID, wantErr: is(dedup.ErrInvalidKey)},
		{name: "event ID over 255 bytes", bad: func() []*kgo.Record { return []*kgo.Record{rec(strings.Repeat("i", 256), jsonValue)} },
			reason: dedup.ReasonInvalidID, wantErr: is(dedup.ErrInvalidKey)},
		{name: "event ID with a control character", bad: func() []*kgo.Record { return []*kgo.Record{rec("bad\nid", jsonValue)} },
			reason: dedup.ReasonInvalidID, wantErr: is(dedup.ErrInvalidKey)},
		{name: "event ID not UTF-8", bad: func() []*kgo.Record { return []*kgo.Record{rec("bad\xffid", jsonValue)} },
			reason: dedup.ReasonInvalidID, wantErr: is(dedup.ErrInvalidKey)},
		{name: "two different event ID headers", bad: func() []*kgo.Record {
			return []*kgo.Record{rec("one", jsonValue, kgo.RecordHeader{Key: "event-id", Value: []byte("two")})}
		}, reason: dedup.ReasonInvalidID, wantErr: is(kafkadedup.ErrAmbiguousEventID)},
		{name: "tenant missing where required", bad: func() []*kgo.Record { return []*kgo.Record{rec("no-tenant", jsonValue)} },
			env: func(t *testing.T, k *kafka, e *badEnv) {
				e.msgs.Tenant = func(r *kgo.Record) (string, error) { return header(r, "tenant"), nil }
			}, reason: dedup.ReasonInvalidID, wantErr: func(err error) bool { return err != nil && strings.Contains(err.Error(), "no tenant") }},
		{name: "payload the JSON fingerprint cannot read", bad: func() []*kgo.Record { return []*kgo.Record{rec("not-json", "{not json")} },
			env: func(t *testing.T, k *kafka, e *badEnv) {
				e.opts = append(e.opts, dedup.WithFingerprint(dedup.JSONFingerprint("v1", "id", "n")))
			}, reason: dedup.ReasonInvalidPayload, wantErr: is(dedup.ErrInvalidPayload)},
		{name: "payload with a number past the JSON fingerprint's bounds", bad: func() []*kgo.Record {
			return []*kgo.Record{rec("huge-number", `{"id":"huge-number","n":1e999999999}`)}
		}, env: func(t *testing.T, k *kafka, e *badEnv) {
			e.opts = append(e.opts, dedup.WithFingerprint(dedup.JSONFingerprint("v1", "id", "n")))
		}, reason: dedup.ReasonInvalidPayload, wantErr: is(dedup.ErrInvalidPayload)},
		{name: "same event ID, other payload", bad: func() []*kgo.Record {
			return []*kgo.Record{rec("reused", `{"id":"reused","n":1}`), rec("reused", `{"id":"reused","n":2}`)}
		}, reason: dedup.ReasonConflict, wantErr: is(dedup.ErrFingerprintConflict), applied: []string{"reused"}},
		{name: "store unreachable (PostgreSQL)", holdsAll: true, bad: poison("pg-down"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+testenv.ClosedPort(t)+"/test?connect_timeout=2")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				e.store = mustPostgresStore(t, pool, "dedup_records")
			}, wantErr: as[*pgconn.ConnectError]()},
		{name: "store unreachable (DynamoDB)", holdsAll: true, bad: poison("ddb-down"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				store, err := dedup.NewDynamoDBStore(closedDynamoDB(t), dedup.WithTable("dedup-records"))
				if err != nil {
					t.Fatal(err)
				}
				e.store = store
			}, wantErr: as[*smithy.OperationError]()},
		{name: "table missing (PostgreSQL)", holdsAll: true, bad: poison("pg-no-table"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				e.store = mustPostgresStore(t, pool, "rel_missing_"+runID())
			}, wantErr: func(err error) bool {
				var pgErr *pgconn.PgError
				return errors.As(err, &pgErr) && pgErr.Code == "42P01" && strings.Contains(err.Error(), "run Migrate")
			}},
		{name: "table missing (DynamoDB)", holdsAll: true, bad: poison("ddb-no-table"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				store, err := dedup.NewDynamoDBStore(testenv.DynamoDB(t), dedup.WithTable("rel-missing-"+runID()))
				if err != nil {
					t.Fatal(err)
				}
				e.store = store
			}, wantErr: as[*types.ResourceNotFoundException]()},
		{name: "malformed record in the store (PostgreSQL)", holdsAll: true, bad: poison("pg-malformed"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				table := "rel_malformed_" + runID()
				e.store = mustPostgresStore(t, pool, table)
				if err := e.store.(*dedup.PostgresStore).Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
				// A SUCCEEDED record with another fingerprint, whose lease
				// and expiry never end: no time a record may hold.
				_, err := pool.Exec(context.Background(), `INSERT INTO `+table+` (scope, event_id, status, fingerprint,
					attempts, owner, lease_until, created_at, updated_at, expires_at)
					VALUES ($1, 'pg-malformed', 2, '\x00'::bytea || convert_to('other', 'UTF8'), 1,
						'\x00'::bytea || convert_to('o', 'UTF8'), 'infinity', now(), now(), 'infinity')`,
					badScope(t))
				if err != nil {
					t.Fatal(err)
				}
			}, wantErr: is(dedup.ErrMalformedRecord)},
		{name: "malformed record in the store (DynamoDB)", holdsAll: true, bad: poison("ddb-malformed"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				client := testenv.DynamoDB(t)
				table := "rel-malformed-" + runID()
				if err := dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(table)); err != nil {
					t.Fatal(err)
				}
				store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				e.store = store
				ms := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
				n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
				_, err = client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
					"pk":             &types.AttributeValueMemberS{Value: badScope(t) + "#ddb-malformed"},
					"scope":          &types.AttributeValueMemberS{Value: badScope(t)},
					"event_id":       &types.AttributeValueMemberS{Value: "ddb-malformed"},
					"status":         &types.AttributeValueMemberS{Value: "SUCCEEDED"},
					"fp":             &types.AttributeValueMemberS{Value: "other"},
					"attempts":       &types.AttributeValueMemberS{Value: "one"}, // a number is expected
					"owner":          &types.AttributeValueMemberS{Value: "o"},
					"lease_until_ms": n(ms), "created_ms": n(ms), "updated_ms": n(ms), "expires_ms": n(ms),
					"expires_at": n(ms[:len(ms)-3]),
				}})
				if err != nil {
					t.Fatal(err)
				}
			}, wantErr: is(dedup.ErrMalformedRecord)},
		{name: "dead-letter topic unreachable", bad: poison("dlq-down"),
			env: func(t *testing.T, k *kafka, e *badEnv) {
				cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.ClosedPort(t)), kgo.RecordDeliveryTimeout(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cl.Close)
				if e.sink, err = kafkadedup.NewSink(cl); err != nil {
					t.Fatal(err)
				}
			}, wantErr: is(kgo.ErrRecordTimeout)},
		{name: "payload too large for the dead-letter topic", bad: func() []*kgo.Record {
			pad := make([]byte, 6144) // random, so that compression cannot shrink it under the limit
			_, _ = cryptorand.Read(pad)
			return []*kgo.Record{rec("too-large", `{"poison":true,"pad":"`+base64.StdEncoding.EncodeToString(pad)+`"}`)}
		}, env: func(t *testing.T, k *kafka, e *badEnv) {
			k.setTopicConfig(k.dlq, "max.message.bytes", "1024")
		}, wantErr: is(kerr.MessageTooLarge)},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			runBadInput(t, row, pgStore)
		})
	}
	t.Run("nil record", func(t *testing.T) {
		t.Parallel()
		testNilRecord(t, pgStore)
	})
	t.Run("handler returns nil after its context was cancelled", func(t *testing.T) {
		t.Parallel()
		testNilAfterCancel(t, pgStore)
	})
}

// poison returns a record whose handler fails for good: it must reach the
// dead-letter topic, or hold its partition when that is impossible.
func poison(id string) func() []*kgo.Record {
	return func() []*kgo.Record { return []*kgo.Record{rec(id, `{"poison":true}`)} }
}

// badScope is the dedup scope of a row: unique to the row and the run.
var badScopes sync.Map

func badScope(t *testing.T) string {
	s, _ := badScopes.LoadOrStore(t.Name(), "bad/"+runID())
	return s.(string)
}

func mustPostgresStore(t *testing.T, pool *pgxpool.Pool, table string) *dedup.PostgresStore {
	t.Helper()
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// closedDynamoDB returns a DynamoDB client pointed at a port where nothing
// listens.
func closedDynamoDB(t *testing.T) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint:     aws.String("http://" + testenv.ClosedPort(t)),
		Region:           "us-east-1",
		Credentials:      credentials.NewStaticCredentialsProvider("local", "local", ""),
		RetryMaxAttempts: 1,
	})
}

// defaultEnv is a row's environment before its own setup.
func defaultEnv(t *testing.T, k *kafka, store dedup.Store) *badEnv {
	return &badEnv{store: store, sink: kafkaSink(t, k), msgs: kafkadedup.Messages()}
}

func (e *badEnv) wrap(t *testing.T, scope string, fx *memEffects, st *settled, results *resultLog, log *logBuffer) *dedup.Wrapper[*kgo.Record] {
	t.Helper()
	h := e.handler
	if h == nil {
		h = func(_ context.Context, r *kgo.Record) error {
			if isPoison(r) {
				return dedup.Permanent(errPoison)
			}
			fx.apply(header(r, "event-id"), "c1")
			return nil
		}
	}
	opts := append([]dedup.Opt{
		dedup.WithScope(scope),
		dedup.WithSink(e.sink),
		dedup.WithLogger(log.logger()),
		dedup.WithObserver(func(ctx context.Context, res dedup.Result) {
			st.observe(ctx, res)
			results.add(res)
		}),
	}, e.opts...)
	w, err := dedup.Wrap(e.store, e.msgs, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// resultLog keeps the wrapper's results, in order.
type resultLog struct {
	mu  sync.Mutex
	all []dedup.Result
}

func (l *resultLog) add(res dedup.Result) {
	l.mu.Lock()
	l.all = append(l.all, res)
	l.mu.Unlock()
}

func (l *resultLog) deadLettered() []dedup.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []dedup.Result
	for _, r := range l.all {
		if r.Outcome == dedup.OutcomeDeadLettered || r.Outcome == dedup.OutcomeConflict {
			out = append(out, r)
		}
	}
	return out
}

func runBadInput(t *testing.T, row badInput, pgStore *dedup.PostgresStore) {
	k := newKafka(t, 1)
	e := defaultEnv(t, k, pgStore)
	if row.env != nil {
		row.env(t, k, e)
	}
	bad := row.bad()
	tenant := kgo.RecordHeader{Key: "tenant", Value: []byte("t1")}
	recs := append(append([]*kgo.Record{rec("before", `{"id":"before","n":0}`, tenant)}, bad...), rec("after", `{"id":"after","n":9}`, tenant))
	for _, r := range recs {
		r.Topic = k.topic
	}
	k.produce(recs...)
	group := "bad-" + runID()
	fx, st, results, logs := &memEffects{}, newSettled(), &resultLog{}, &logBuffer{}
	logs.dumpOnFailure(t)
	w := e.wrap(t, badScope(t), fx, st, results, logs)
	cs := startConsumers(t, k, group, 1, logs.logger(), func(int) *dedup.Wrapper[*kgo.Record] { return w })

	end := k.endOffsets(k.topic)[0]
	badAt := recs[1].Offset
	if row.reason != "" {
		k.await(t, group, st, "the group catching up", func() bool { return k.caughtUp(group) })
		cs.stop(t)
		letters := k.readAll(k.dlq)
		if len(letters) != 1 || header(letters[0], "dedup-reason") != string(row.reason) {
			t.Fatalf("dead letters %v, want one with reason %s", reasonsOf(letters), row.reason)
		}
		if got, want := string(letters[0].Value), string(bad[len(bad)-1].Value); got != want {
			t.Errorf("dead letter payload %q, want the original %q", got, want)
		}
		dl := results.deadLettered()
		if len(dl) != 1 || dl[0].Reason != row.reason || !row.wantErr(dl[0].Err) {
			t.Errorf("dead-letter results %+v, want one with reason %s and the expected error", dl, row.reason)
		}
	} else {
		crashtest.Await(t, "the bad record being retried", func() bool { return logs.count(notSettled) >= 3 },
			func() int { return logs.count(notSettled) }, k.progress(group, st))
		cs.stop(t)
		committed, err := k.committed(group)
		if err != nil {
			t.Fatal(err)
		}
		if committed[0] > badAt {
			t.Errorf("committed offset %d passes the held record at %d", committed[0], badAt)
		}
		if n := len(k.readAll(k.dlq)); n != 0 {
			t.Errorf("%d dead letters, want none", n)
		}
		_, err = w.Handle(context.Background(), bad[0])
		if err == nil || !row.wantErr(err) {
			t.Errorf("Handle of the held record: %v (%T), want the expected error", err, err)
		}
		t.Logf("held at offset %d of %d; Handle: %v", badAt, end, err)
	}

	effects := fx.snapshot()
	want := map[string]int{"after": 1}
	if row.reason == "" {
		want = map[string]int{} // nothing behind the held record ran
	}
	if !row.holdsAll {
		want["before"] = 1
	}
	for _, id := range row.applied {
		want[id] = 1
	}
	got := map[string]int{}
	for id, by := range effects {
		got[id] = len(by)
	}
	if !maps.Equal(got, want) {
		t.Errorf("effects %v, want %v", got, want)
	}
}

func reasonsOf(letters []*kgo.Record) []string {
	var out []string
	for _, l := range letters {
		out = append(out, header(l, "dedup-reason"))
	}
	return out
}

// A nil record through the Kafka Messages: no panic; a dead letter with
// reason invalid-id and ErrNilRecord where the sink can take one, an error
// (nothing to acknowledge) with the Kafka sink, which has no topic for it;
// in a batch, the records around it are processed.
func testNilRecord(t *testing.T, store dedup.Store) {
	ctx := context.Background()
	k := newKafka(t, 1)
	mem := dedup.NewMemorySink()
	runs := 0
	h := func(context.Context, *kgo.Record) error { runs++; return nil }
	w, err := dedup.Wrap(store, kafkadedup.Messages(), h, dedup.WithScope(badScope(t)), dedup.WithSink(mem))
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Handle(ctx, nil)
	if err != nil || res.Outcome != dedup.OutcomeDeadLettered || res.Reason != dedup.ReasonInvalidID || !errors.Is(res.Err, kafkadedup.ErrNilRecord) {
		t.Errorf("Handle(nil) = %+v, %v; want dead-lettered with reason invalid-id and ErrNilRecord", res, err)
	}
	var outcomes []dedup.Outcome
	good := func(id string) *kgo.Record { r := rec(id, "v"); r.Topic = k.topic; return r }
	err = w.HandleBatch(ctx, []*kgo.Record{good("n-1"), nil, good("n-2")}, func(_ int, res dedup.Result, err error) bool {
		if err != nil {
			t.Errorf("HandleBatch: %v", err)
		}
		outcomes = append(outcomes, res.Outcome)
		return true
	})
	if want := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDeadLettered, dedup.OutcomeProcessed}; err != nil || !equalOutcomes(outcomes, want) {
		t.Errorf("HandleBatch of good, nil, good = %v, %v; want %v", outcomes, err, want)
	}
	if letters := mem.Letters(); len(letters) != 2 || runs != 2 {
		t.Errorf("%d dead letters and %d handler runs, want 2 and 2", len(letters), runs)
	}

	kw, err := dedup.Wrap(store, kafkadedup.Messages(), h, dedup.WithScope(badScope(t)), dedup.WithSink(kafkaSink(t, k)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kw.Handle(ctx, nil); !errors.Is(err, kafkadedup.ErrNoDLQTopic) {
		t.Errorf("Handle(nil) with the Kafka sink: %v, want ErrNoDLQTopic", err)
	}
}

func equalOutcomes(a, b []dedup.Outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A handler that returns nil after its context was cancelled (the consumer
// stopping, its drain time over) is trusted: the event is recorded as
// processed, the warning is logged, the offset committed, and the event not
// run again by the next consumer.
func testNilAfterCancel(t *testing.T, store dedup.Store) {
	k := newKafka(t, 1)
	recs := []*kgo.Record{rec("before", "b"), rec("slow", "s"), rec("after", "a")}
	for _, r := range recs {
		r.Topic = k.topic
	}
	k.produce(recs...)
	group, scope := "bad-"+runID(), badScope(t)
	fx, logs := &memEffects{}, &logBuffer{}
	logs.dumpOnFailure(t)
	started := make(chan struct{})
	var once sync.Once
	w, err := dedup.Wrap(store, kafkadedup.Messages(), func(ctx context.Context, r *kgo.Record) error {
		if header(r, "event-id") == "slow" && fx.count("slow") == 0 {
			once.Do(func() { close(started) })
			<-ctx.Done()
		}
		fx.apply(header(r, "event-id"), "c1")
		return nil // whatever the context says
	}, dedup.WithScope(scope), dedup.WithSink(kafkaSink(t, k)), dedup.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kafkadedup.NewConsumer(w, kafkadedup.WithLogger(logs.logger()), kafkadedup.WithDrainTimeout(100*time.Millisecond),
		kafkadedup.WithClientOpts(k.clientOpts(group)...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-started:
	case <-time.After(crashtest.Stall):
		t.Fatalf("the slow record did not run within %v", crashtest.Stall)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if logs.count("handler returned nil after its context was cancelled") != 1 {
		t.Error("no warning about the handler's nil after cancellation")
	}
	rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "slow"})
	if err != nil || rec.Status != dedup.StatusSucceeded {
		t.Errorf("record of the slow event: %v, %v; want succeeded", rec.Status, err)
	}
	if committed, _ := k.committed(group); committed[0] != recs[2].Offset {
		t.Errorf("committed %v, want offset %d: the slow record settled, the one after it not run", committed, recs[2].Offset)
	}
	cs := startConsumers(t, k, group, 1, logs.logger(), func(int) *dedup.Wrapper[*kgo.Record] { return w })
	k.await(t, group, nil, "the group catching up", func() bool { return k.caughtUp(group) })
	cs.stop(t)
	if got := fx.snapshot(); len(got["before"]) != 1 || len(got["slow"]) != 1 || len(got["after"]) != 1 {
		t.Errorf("effects %v, want each event once", got)
	}
}

// count returns how many effects id has.
func (m *memEffects) count(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows[id])
}

// setTopicConfig sets a topic's config on the cluster.
func (k *kafka) setTopicConfig(topic, name, value string) {
	k.t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = name, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(context.Background(), k.admin)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		k.t.Fatalf("set %s=%s on %s: %v", name, value, topic, err)
	}
}
