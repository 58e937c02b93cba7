package reliability_test

import (
	"context"
	"errors"
	"math/rand/v2"
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
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// notSettled is what a partition worker logs each time it retries a record
// whose outcome could not be made durable.
const notSettled = "kafkadedup: record not settled"

// notRecorded is what the wrapper logs when a write recording an attempt's
// outcome failed and is tried again while the delivery is held: an outage
// may be ridden out there, never reaching the partition worker.
const notRecorded = "outcome not recorded; retrying it while the delivery is held"

// outageEvents sizes the outage campaigns.
func outageEvents() int {
	if soak() {
		return 40_000
	}
	return 3000
}

// A private PostgreSQL server holding the dedup records and the effects is
// stopped (immediate shutdown: every connection drops) while two consumers
// of a group are mid-run, and started again 2 s later. The consumers hold
// their partitions and back off while it is down and carry on when it is
// back: nothing is lost, nothing applied twice, and the group's committed
// offsets never pass a record before its outcome was durable.
//
// In "claim, past the lease" the effects are applied in another database,
// which stays up, and the outage lasts three times the lease: the claims of
// the records whose effects were applied lapse while their completions
// cannot be written. The partitions are still the consumers', so nobody
// else is given those records, and the wrapper's fenced completions land
// once the server is back: nothing applied twice, but for a copy that the
// plan sent to another partition, which may take the lapsed claim over (a
// repeat the wrapper reports, and the test counts apart). (Giving up at the lease, as
// the wrapper did, made the worker claim the record again, take its own
// lapsed claim over and run the handler a second time.)
//
// In the other cases the outage must end within the lease, and the outage is
// more than the 2 s the server is down: stopping and starting it again take
// seconds of their own on a loaded machine (a start of 5 s was seen at a
// load average of 13), and the last heartbeat came up to a third of the
// lease before the stop. withinLease leaves that margin; an outage that a
// loaded machine stretches past it anyway (measured from the stop until the
// server accepts connections again, plus the third of a lease since the last
// heartbeat) is accounted as the case past the lease is, and logged.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		mode          string
		lease, outage time.Duration
		effectsApart  bool // in the machine's PostgreSQL, not the one stopped
	}{
		{modeInbox, modeInbox, withinLease, 2 * time.Second, false},
		{modeClaim, modeClaim, withinLease, 2 * time.Second, false},
		{"claim, past the lease", modeClaim, 2 * time.Second, 6 * time.Second, true},
	} {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			srv := testenv.StartPostgresServer(t)
			pool := privatePool(t, srv.DSN())
			store, err := dedup.NewPostgresStore(pool)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			effectsPool := pool
			if tc.effectsApart {
				effectsPool = testenv.Postgres(t)
			}
			effects := effectsTable(t, effectsPool)
			k := newKafka(t, 4)
			p := newPlan(k.topic, "pg", outageEvents(), 0.30, 0.02, 0, rand.New(rand.NewPCG(rand.Uint64(), 0)))
			k.produce(p.records...)
			group := "pg-outage-" + mode + "-" + tc.lease.String() + "-" + runID()
			st, logs, amb := newSettled(), &logBuffer{}, &ambiguous{}
			logs.dumpOnFailure(t)
			sink := kafkaSink(t, k)
			newWrapper := func(i int) *dedup.Wrapper[*kgo.Record] {
				return pgWrapper(t, mode, store, effectsPool, effects, "c"+strconv.Itoa(i+1), amb,
					wrapOpts(group+"/apply", sink, st, logs.logger(), tc.lease))
			}

			watch, stopWatch := context.WithCancel(context.Background())
			violations := st.watchCommits(watch, k, group, p.records)
			cs := startConsumers(t, k, group, 2, logs.logger(), newWrapper)
			k.await(t, group, st, "progress before the outage", func() bool { return st.count() >= len(p.events)/4 })
			stopped := time.Now()
			srv.Stop()
			time.Sleep(tc.outage)
			during := logs.count(notSettled) + logs.count(notRecorded)
			srv.Start()
			down := time.Since(stopped)
			lapsed := down+tc.lease/3 >= tc.lease
			t.Logf("PostgreSQL down for %v (stop and start included), lease %v, lapsed %v", down.Round(time.Millisecond), tc.lease, lapsed)
			k.await(t, group, st, "the group catching up after the outage", func() bool { return k.caughtUp(group) })
			cs.stop(t)
			stopWatch()

			dlq := k.readAll(k.dlq)
			fig, twice := count(p, effectRows(t, effectsPool, effects), dlq)
			fig.outages, fig.elapsed = 1, time.Since(began)
			twice = amb.explain(t, &fig, twice)
			if lapsed {
				// A copy sent to another partition is a delivery the
				// transport gave another worker: once the first copy's
				// claim lapsed in the outage, that worker could take it
				// over. The wrapper reports each such repeat at ERROR.
				var apart []string
				twice, apart = splitApart(p, twice)
				fig.appliedTwice -= len(apart)
				t.Logf("repeats of events with a copy on another partition: %d %v", len(apart), apart)
				if n := logs.count("lease lost: another worker took this event over while it ran"); n < len(apart) {
					t.Errorf("%d repeats of copies on other partitions, but %d reported", len(apart), n)
				}
			}
			checkEnd(t, "postgres outage ("+tc.name+")", fig, twice, <-violations)
			checkLetters(t, mode, p, dlq, lapsed)
			t.Logf("writes retried in place while PostgreSQL was down: %d", during)
			if during == 0 {
				t.Error("no consumer noticed the outage")
			}
		})
	}
}

// withinLease is the lease of the PostgreSQL outage cases whose outage must
// not outlast it (see TestPostgresOutage).
const withinLease = 20 * time.Second

// ddbLease is the lease of the DynamoDB outage campaign. A fresh DynamoDB
// Local on a busy machine answers slowly, tens of milliseconds a write, and
// a short lease would lapse while a batch is still being processed: the
// takeovers would count attempts for messages that never ran.
const ddbLease = 20 * time.Second

// A private DynamoDB Local holding the dedup records is killed with SIGKILL
// while two consumers are mid-run and started again: the consumers hold and
// back off while it is down and carry on when it is back, with nothing
// lost, nothing applied twice and no offset committed before its record's
// outcome was durable. Its data is on disk, so it survives the restart as a
// real service's would. The effects are applied in memory.
func TestDynamoDBOutage(t *testing.T) {
	t.Parallel()
	began := time.Now()
	srv := testenv.StartDynamoDBLocal(t)
	client := srv.Client()
	table := "rel-" + runID()
	ctx := context.Background()
	if err := dedup.CreateDynamoDBTable(ctx, client, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	k := newKafka(t, 4)
	p := newPlan(k.topic, "ddb", outageEvents()/5, 0.30, 0.02, 0, rand.New(rand.NewPCG(rand.Uint64(), 0)))
	k.produce(p.records...)
	group := "ddb-outage-" + runID()
	st, logs := newSettled(), &logBuffer{}
	logs.dumpOnFailure(t)
	sink := kafkaSink(t, k)
	var effects memEffects
	watch, stopWatch := context.WithCancel(context.Background())
	violations := st.watchCommits(watch, k, group, p.records)
	cs := startConsumers(t, k, group, 2, logs.logger(), func(i int) *dedup.Wrapper[*kgo.Record] {
		name := "c" + strconv.Itoa(i+1)
		w, err := dedup.Wrap(store, kafkadedup.Messages(), func(ctx context.Context, r *kgo.Record) error {
			if isPoison(r) {
				return errPoison
			}
			effects.apply(header(r, "event-id"), name)
			return nil
		}, wrapOpts(group+"/apply", sink, st, logs.logger(), ddbLease)...)
		if err != nil {
			t.Fatal(err)
		}
		return w
	})
	started := time.Since(began)
	// A fresh DynamoDB Local on a loaded machine may take minutes for a
	// quarter of the events: wait while they keep settling.
	k.await(t, group, st, "progress before the outage", func() bool { return st.count() >= len(p.events)/4 })
	srv.Kill()
	killed := time.Now()
	time.Sleep(time.Second)
	srv.Start()
	down := time.Since(killed)
	during := logs.count(notSettled) + logs.count(notRecorded)
	k.await(t, group, st, "the group catching up after the outage", func() bool { return k.caughtUp(group) })
	t.Logf("phases: started in %v, killed at %v, down for %v, caught up %v after it came back",
		started.Round(time.Millisecond), killed.Sub(began).Round(time.Millisecond), down.Round(time.Millisecond),
		time.Since(killed.Add(down)).Round(time.Millisecond))
	cs.stop(t)
	stopWatch()

	dlq := k.readAll(k.dlq)
	fig, twice := count(p, effects.snapshot(), dlq)
	fig.outages, fig.elapsed = 1, time.Since(began)
	checkEnd(t, "dynamodb outage", fig, twice, <-violations)
	checkLetters(t, modeClaim, p, dlq, false)
	t.Logf("writes retried in place while DynamoDB Local was down: %d", during)
	if during == 0 {
		t.Error("no consumer noticed the outage")
	}
}

// The dead-letter topic refuses every write for the first 3 s while poison
// events (5%) arrive: the consumers hold each poison record's partition,
// acknowledge nothing behind it, and once the topic accepts writes every
// poison event is dead-lettered, each letter carrying its event ID.
//
// In claim mode exactly once: one attempt holds the event's lease at a time,
// and nothing crashes here (a crash between the letter's write and the
// record's final update writes a second letter: the crash campaign counts
// those). Through the transactional inbox at least once: the inbox holds an
// event only inside a transaction, so two copies of a poison event on two
// partitions can each be parked; an extra letter must belong to such an
// event.
func TestDLQOutage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{modeClaim, modeInbox} {
		t.Run(mode, func(t *testing.T) {
			began := time.Now()
			pool := testenv.Postgres(t)
			store, err := dedup.NewPostgresStore(pool, dedup.WithTable(recordsTable(t, pool)))
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			effects := effectsTable(t, pool)
			k := newKafka(t, 4)
			var refused atomic.Int32
			var down atomic.Bool
			down.Store(true)
			refuseDLQ(k, &down, &refused)
			p := newPlan(k.topic, "dlq", outageEvents()*2/3, 0.30, 0.05, 0, rand.New(rand.NewPCG(rand.Uint64(), 0)))
			k.produce(p.records...)
			group := "dlq-outage-" + mode + "-" + runID()
			st, logs, amb := newSettled(), &logBuffer{}, &ambiguous{}
			logs.dumpOnFailure(t)
			sink := kafkaSink(t, k)
			watch, stopWatch := context.WithCancel(context.Background())
			violations := st.watchCommits(watch, k, group, p.records)
			cs := startConsumers(t, k, group, 2, logs.logger(), func(i int) *dedup.Wrapper[*kgo.Record] {
				return pgWrapper(t, mode, store, pool, effects, "c"+strconv.Itoa(i+1), amb,
					wrapOpts(group+"/apply", sink, st, logs.logger(), 5*time.Second))
			})
			// The topic refuses until poison events have been refused a
			// few times and for at least 3 s: on a loaded machine the first
			// poison event reaches its last attempt later than 3 s in.
			time.Sleep(3 * time.Second)
			moved := k.moved(group, st)
			crashtest.Await(t, "dead-letter writes refused", func() bool { return refused.Load() >= 10 },
				func() int { return int(refused.Load()) + moved() }, k.progress(group, st))
			if len(k.readAll(k.dlq)) != 0 {
				t.Fatal("the dead-letter topic took letters while it refused writes")
			}
			held := 0
			for _, r := range p.records {
				if isPoison(r) && !st.has(header(r, "event-id")) {
					held++
				}
			}
			down.Store(false)
			k.await(t, group, st, "the group catching up after the outage", func() bool { return k.caughtUp(group) })
			cs.stop(t)
			stopWatch()

			dlq := k.readAll(k.dlq)
			fig, twice := count(p, effectRows(t, pool, effects), dlq)
			fig.outages, fig.elapsed = 1, time.Since(began)
			twice = amb.explain(t, &fig, twice)
			checkEnd(t, "dead-letter topic outage ("+mode+")", fig, twice, <-violations)
			t.Logf("dead-letter writes refused: %d; poison records held while refused: %d", refused.Load(), held)
			if refused.Load() == 0 || held == 0 {
				t.Error("no dead letter was refused: the outage missed the poison events")
			}
			checkLetters(t, mode, p, dlq, false)
		})
	}
}

// checkLetters fails t if a dead letter lacks its event ID, or if an event
// has more than one letter where that is not allowed: in claim mode at all,
// through the inbox unless its copies were on two partitions.
//
// lapsed says the outage outlasted the lease: a letter sent while the
// record's final write could not land then looks, once the lease lapsed,
// like a worker that crashed between the two, and the event's next attempt
// parks it again for a crash loop (the documented window of a crash between
// a letter's write and the record's final update); such a second letter,
// with reason crash-loop, is counted, not failed.
func checkLetters(t *testing.T, mode string, p *plan, dlq []*kgo.Record, lapsed bool) {
	t.Helper()
	partitions := map[string]map[int32]bool{}
	for _, r := range p.records {
		id := header(r, "event-id")
		if partitions[id] == nil {
			partitions[id] = map[int32]bool{}
		}
		partitions[id][r.Partition] = true
	}
	letters := map[string]int{}
	crashLoop := map[string]bool{}
	for _, r := range dlq {
		id := header(r, "dedup-event-id")
		if id == "" || id != header(r, "event-id") {
			t.Errorf("dead letter at %d@%d lacks its event ID", r.Partition, r.Offset)
		}
		letters[id]++
		crashLoop[id] = crashLoop[id] || header(r, "dedup-reason") == string(dedup.ReasonCrashLoop)
	}
	extra := 0
	for id, n := range letters {
		if n == 1 {
			continue
		}
		extra += n - 1
		if lapsed && crashLoop[id] {
			t.Logf("event %s dead-lettered %d times: its final write did not land within the lease", id, n)
			continue
		}
		if mode == modeClaim || len(partitions[id]) < 2 {
			t.Errorf("event %s dead-lettered %d times (%s mode, on %d partitions), want once", id, n, mode, len(partitions[id]))
		}
	}
	if extra > 0 {
		t.Logf("%d extra dead letters, from poison events with copies on two partitions", extra)
	}
}

// pgWrapper returns a wrapper whose handler writes its effect row to effects
// in pool: in the record's transaction (modeInbox), or on its own (claim
// mode), noting in amb the events whose write failed without saying whether
// it committed.
func pgWrapper(t *testing.T, mode string, store *dedup.PostgresStore, pool *pgxpool.Pool, effects, name string, amb *ambiguous, opts []dedup.Opt) *dedup.Wrapper[*kgo.Record] {
	t.Helper()
	insert := `INSERT INTO ` + effects + ` (event_id, worker) VALUES ($1, $2)`
	var w *dedup.Wrapper[*kgo.Record]
	var err error
	if mode == modeInbox {
		w, err = dedup.WrapTx(store, kafkadedup.Messages(), func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if isPoison(r) {
				return errPoison
			}
			_, err := tx.Exec(ctx, insert, header(r, "event-id"), name)
			return err
		}, opts...)
	} else {
		w, err = dedup.Wrap(store, kafkadedup.Messages(), func(ctx context.Context, r *kgo.Record) error {
			if isPoison(r) {
				return errPoison
			}
			_, err := pool.Exec(ctx, insert, header(r, "event-id"), name)
			amb.note(header(r, "event-id"), err)
			return err
		}, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// kafkaSink returns a dead-letter sink producing to the cluster's DLQ topic.
func kafkaSink(t *testing.T, k *kafka) *kafkadedup.Sink {
	t.Helper()
	s, err := kafkadedup.NewSink(k.producer())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// refuseDLQ makes the cluster refuse produce requests to the dead-letter
// topic while down is set (as an unauthorized or unavailable topic does),
// counting the refusals.
func refuseDLQ(k *kafka, down *atomic.Bool, refused *atomic.Int32) {
	dlqID := k.topicID(k.dlq)
	k.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		toDLQ := slices.ContainsFunc(req.Topics, func(t kmsg.ProduceRequestTopic) bool { return t.Topic == k.dlq || t.TopicID == dlqID })
		if !toDLQ || !down.Load() {
			return nil, nil, false
		}
		refused.Add(1)
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
}

// topicID returns a topic's ID, for matching requests of versions that name
// topics by ID.
func (k *kafka) topicID(topic string) [16]byte {
	k.t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), k.admin)
	if err != nil || len(resp.Topics) != 1 {
		k.t.Fatalf("metadata for %s: %v", topic, err)
	}
	return resp.Topics[0].TopicID
}

// splitApart splits the events applied twice (as count lists them, "id[workers]")
// into those whose copies all went to one partition, and those with a copy
// on another.
func splitApart(p *plan, twice []string) (together, apart []string) {
	keys := map[string]map[string]bool{}
	for _, r := range p.records {
		id := header(r, "event-id")
		if keys[id] == nil {
			keys[id] = map[string]bool{}
		}
		keys[id][string(r.Key)] = true
	}
	for _, s := range twice {
		if id, _, _ := strings.Cut(s, "["); len(keys[id]) > 1 {
			apart = append(apart, s)
		} else {
			together = append(together, s)
		}
	}
	return together, apart
}

// ambiguous records the events whose claim-mode handler saw its effect
// write fail without learning whether it committed: the server went away
// after the statement was sent (a commit whose answer was lost). The
// handler then returns an error, the wrapper records a failed attempt and
// the event runs again: a second effect that the handler, not the wrapper,
// made, as any at-least-once handler whose own write is not idempotent
// would. The transactional inbox has no such window.
type ambiguous struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (a *ambiguous) note(id string, err error) {
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
		return // it committed, or the server refused it, or it was never sent
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]bool{}
	}
	a.ids[id] = true
}

// explain removes from twice, and from fig's count, the events applied
// twice after an ambiguous write, logging them, and returns the rest.
func (a *ambiguous) explain(t *testing.T, fig *figures, twice []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var rest, explained []string
	for _, s := range twice {
		if id, _, _ := strings.Cut(s, "["); a.ids[id] {
			explained = append(explained, s)
		} else {
			rest = append(rest, s)
		}
	}
	fig.appliedTwice -= len(explained)
	t.Logf("events whose handler's effect write failed ambiguously: %d; applied again after it: %d %v", len(a.ids), len(explained), explained)
	return rest
}
