package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// placeOrder writes an order row and its events in one transaction, then
// commits or rolls back. It returns the events' IDs.
func placeOrder(ctx context.Context, e *env, orders string, commit bool, events map[*outbox.Outbox]outbox.Event) (map[*outbox.Outbox]string, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	order := outbox.NewID()
	if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES ($1)", order); err != nil {
		return nil, err
	}
	ids := map[*outbox.Outbox]string{}
	for ob, ev := range events {
		ev.Payload = []byte(`{"order":"` + order + `"}`)
		got, err := ob.Add(ctx, tx, ev)
		if err != nil {
			return nil, err
		}
		ids[ob] = got[0]
	}
	if commit {
		return ids, tx.Commit(ctx)
	}
	return ids, tx.Rollback(ctx)
}

func createOrders(t *testing.T, e *env) string {
	orders := e.table + "_orders"
	_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+orders+" (id text PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP TABLE "+orders) })
	return orders
}

// Proof (a): 50 goroutines place orders at once, half of the transactions
// rolled back; exactly the committed orders' events are published.
func TestConcurrentOrdersExactlyTheCommittedArePublished(t *testing.T) {
	e := newEnv(t, 4)
	orders := createOrders(t, e)
	e.start(e.relay(), e.relay())
	ctx := context.Background()
	var mu sync.Mutex
	committed, rolledBack := map[string]bool{}, map[string]bool{}
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 4 {
				commit := (g+i)%2 == 0
				ids, err := placeOrder(ctx, e, orders, commit, map[*outbox.Outbox]outbox.Event{
					e.ob: {Destination: e.topic, Key: fmt.Appendf(nil, "customer-%d", g%7)},
				})
				if err != nil {
					t.Errorf("order: %v", err)
					return
				}
				mu.Lock()
				if commit {
					committed[ids[e.ob]] = true
				} else {
					rolledBack[ids[e.ob]] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, committed, 100)
	require.Len(t, rolledBack, 100)

	published := map[string]int{}
	for _, r := range e.consume(100, 20*time.Second) {
		id := header(r, "event-id")
		require.False(t, rolledBack[id], "a rolled-back order's event was published")
		published[id]++
	}
	require.Len(t, published, 100)
	for id := range committed {
		require.Equal(t, 1, published[id], "event %s", id)
	}
}

// Proof (b), the end-to-end campaign: orders are placed for a while with
// some rolled back, each with an event to Kafka and some with one to SQS,
// while three relay processes publish them; one relay is SIGKILLed over and
// over, kfake refuses some produce requests and SQS requests fail through
// awsfault. Downstream a kafkadedup consumer applies each event with WrapTx,
// writing one effect row. At the end every committed event reached its
// broker, no rolled-back one did, and there is exactly one effect per
// committed Kafka event.
func TestEndToEndCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("the campaign runs for about half a minute")
	}
	e := newEnv(t, 4)
	ctx := context.Background()
	orders := createOrders(t, e)
	sqsOB, sqsTable := migratedOutbox(t, e)
	client := testenv.SQS(t)
	queue := testenv.SQSQueue(t, client, nil)

	var produceRequests, refused atomic.Int64
	e.kafka.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if produceRequests.Add(1); rand.IntN(100) >= 15 {
			return nil, nil, false
		}
		refused.Add(1)
		return refusal(kreq.(*kmsg.ProduceRequest), kerr.NotEnoughReplicas), nil, true
	})

	// Downstream: the consumer of the Kafka topic, one effect row per event
	// applied, in the dedup record's transaction.
	effects := e.table + "_effects"
	_, err := e.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP TABLE "+effects) })
	var handled atomic.Int64
	stopConsumer := startConsumer(t, e, effects, &handled)

	fleet := newRelayFleet(t, relayWorkerConfig{
		DSN:        testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		KafkaTable: e.table, SQSTable: sqsTable,
		Brokers: e.addrs, SQSEndpoint: testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		SQSFaultEvery: 300 * time.Millisecond,
	}, 3)
	chaosDone := make(chan struct{})
	stopChaos := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for sleepCtx(ctx, time.Duration(200+rand.IntN(600))*time.Millisecond) {
			select {
			case <-stopChaos:
				return
			default:
			}
			_ = fleet.stop(0, syscall.SIGKILL)
			fleet.start(0)
		}
	}()

	// Writers: 8 goroutines placing about 25 orders a second each; 30% roll
	// back; every third order also has an SQS event.
	var mu sync.Mutex
	committed := map[*outbox.Outbox]map[string]bool{e.ob: {}, sqsOB: {}}
	rolledBack := map[string]bool{}
	var rolledBackOrders int
	deadline := time.Now().Add(12 * time.Second)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				evs := map[*outbox.Outbox]outbox.Event{e.ob: {Destination: e.topic, Key: fmt.Appendf(nil, "customer-%d", rand.IntN(20))}}
				if i%3 == w%3 {
					evs[sqsOB] = outbox.Event{Destination: queue}
				}
				commit := rand.IntN(10) >= 3
				ids, err := placeOrder(ctx, e, orders, commit, evs)
				if err != nil {
					t.Errorf("order: %v", err)
					return
				}
				mu.Lock()
				if !commit {
					rolledBackOrders++
				}
				for ob, id := range ids {
					if commit {
						committed[ob][id] = true
					} else {
						rolledBack[id] = true
					}
				}
				mu.Unlock()
				time.Sleep(40 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	waitFor(t, 90*time.Second, "every committed event published", func() bool {
		return pendingRows(t, e, e.table)+pendingRows(t, e, sqsTable) == 0
	})
	close(stopChaos)
	<-chaosDone
	for i := range 3 {
		require.NoError(t, fleet.stop(i, syscall.SIGTERM), "relay %d stops gracefully", i+1)
	}
	for _, table := range []string{e.table, sqsTable} {
		var failed int
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE status <> 'sent'").Scan(&failed))
		require.Zero(t, failed, "rows of %s not sent", table)
	}

	// Kafka: what reached the broker, and what the consumer applied.
	kafkaCommitted := committed[e.ob]
	recs := e.consume(len(kafkaCommitted), 60*time.Second)
	published := map[string]int{}
	for _, r := range recs {
		published[header(r, "event-id")]++
	}
	waitFor(t, 60*time.Second, "the consumer handled every record", func() bool { return handled.Load() >= int64(len(recs)) })
	stopConsumer()
	applied := map[string]int{}
	rows, err := e.pool.Query(ctx, "SELECT event_id, count(*) FROM "+effects+" GROUP BY event_id")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		applied[id] = n
	}
	require.NoError(t, rows.Err())

	var lost, publishedRolledBack, appliedTwice, republished int
	for id := range kafkaCommitted {
		if published[id] == 0 {
			lost++
		}
		if published[id] > 1 {
			republished++
		}
		if applied[id] > 1 {
			appliedTwice++
		}
	}
	var effectsLost int
	for id := range kafkaCommitted {
		if applied[id] == 0 {
			effectsLost++
		}
	}
	for id := range published {
		if rolledBack[id] {
			publishedRolledBack++
		}
	}

	// SQS: every committed event received at least once.
	sqsCommitted := committed[sqsOB]
	received := map[string]int{}
	msgs := sqsdedup.Messages(queue)
	var sqsMessages int
	for _, m := range receiveUntil(t, client, queue, func(got []types.Message) bool {
		ids := map[string]bool{}
		for _, m := range got {
			id, _ := msgs.EventID(m)
			ids[id] = true
		}
		return len(ids) >= len(sqsCommitted)
	}) {
		id, err := msgs.EventID(m)
		require.NoError(t, err)
		received[id]++
		sqsMessages++
	}
	var sqsLost, sqsRolledBack int
	for id := range sqsCommitted {
		if received[id] == 0 {
			sqsLost++
		}
	}
	for id := range received {
		if rolledBack[id] {
			sqsRolledBack++
		}
	}

	t.Logf("outbox campaign: orders committed %d, rolled back %d; relay SIGKILLs %d; kfake produce requests %d, refused %d",
		len(kafkaCommitted), rolledBackOrders, fleet.kills, produceRequests.Load(), refused.Load())
	t.Logf("kafka: committed events %d, records published %d (%d events published more than once), lost %d, rolled back published %d; effects: %d rows, lost %d, applied twice %d",
		len(kafkaCommitted), len(recs), republished, lost, publishedRolledBack, sumValues(applied), effectsLost, appliedTwice)
	t.Logf("sqs: committed events %d, messages received %d, lost %d, rolled back received %d; SendMessageBatch fault bursts %d; relay passes with failed publishes (Kafka and SQS) %d",
		len(sqsCommitted), sqsMessages, sqsLost, sqsRolledBack, fleet.countLines(sqsFaultLine), fleet.countLines("outbox publish failed"))

	require.Zero(t, lost, "committed Kafka events never published")
	require.Zero(t, publishedRolledBack, "rolled-back events published to Kafka")
	require.Zero(t, effectsLost, "committed events without an effect")
	require.Zero(t, appliedTwice, "events applied twice")
	require.Equal(t, len(kafkaCommitted), len(applied), "effects only for committed events")
	require.Zero(t, sqsLost, "committed SQS events never received")
	require.Zero(t, sqsRolledBack, "rolled-back events sent to SQS")
	require.Positive(t, fleet.kills)
}

// migratedOutbox creates a second outbox table for e's test.
func migratedOutbox(t *testing.T, e *env) (*outbox.Outbox, string) {
	table := e.table + "_sqs"
	ob, err := outbox.New(outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(context.Background(), e.pool))
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return ob, table
}

func pendingRows(t *testing.T, e *env, table string) int {
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE status = 'pending'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startConsumer runs a kafkadedup consumer of e's topic whose handler
// inserts one effect row per event in the dedup record's transaction.
func startConsumer(t *testing.T, e *env, effects string, handled *atomic.Int64) (stop func()) {
	store, err := dedup.NewPostgresStore(e.pool, dedup.WithTable(e.table+"_dedup"))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+e.table+"_dedup") })
	_, err = kgoCreateTopic(e.producer(), e.topic+".dlq")
	require.NoError(t, err)
	sink, err := kafkadedup.NewSink(e.producer())
	require.NoError(t, err)
	w, err := dedup.WrapTx(store, kafkadedup.Messages(), func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (event_id) VALUES ($1)", header(r, "event-id"))
		return err
	}, dedup.WithScope(dedup.Scope("shipping", "reserve-stock")), dedup.WithLogger(quietLogger()),
		dedup.WithSink(sink), dedup.WithObserver(func(_ context.Context, res dedup.Result) {
			if res.Outcome == dedup.OutcomeDeadLettered {
				t.Errorf("event %s dead-lettered", res.Key.EventID)
			}
			handled.Add(1)
		}))
	require.NoError(t, err)
	c, err := kafkadedup.NewConsumer(w, kafkadedup.WithLogger(quietLogger()), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(e.addrs...), kgo.ConsumerGroup("shipping-"+e.topic), kgo.ConsumeTopics(e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consumer: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// refusal answers a produce request with code for every partition.
func refusal(req *kmsg.ProduceRequest, code *kerr.Error) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// receiveUntil receives and deletes messages from url until done says so
// and a second more brought nothing, or a minute passed.
func receiveUntil(t *testing.T, client *sqs.Client, url string, done func([]types.Message) bool) []types.Message {
	t.Helper()
	var got []types.Message
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		batch := receiveAll(t, client, url, 10, 2*time.Second)
		got = append(got, batch...)
		if len(batch) == 0 && done(got) {
			break
		}
	}
	return got
}

func sumValues(m map[string]int) int {
	var n int
	for _, v := range m {
		n += v
	}
	return n
}
