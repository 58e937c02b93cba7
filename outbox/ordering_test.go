package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// Watermill's SQL forwarder (issue #311) read rows past an offset: a row with
// a lower ID committing after a relay moved past it was never published.
// Here a transaction holding the lowest IDs commits last, while relays run.
func TestLowerIDCommittingLaterIsNotSkipped(t *testing.T) {
	e := newEnv(t, 1)
	e.start(e.relay(), e.relay())
	ctx := context.Background()
	early := e.begin()
	lowIDs, err := e.ob.Add(ctx, early, e.event("", "early-1"), e.event("", "early-2"))
	require.NoError(t, err)
	later := e.add(true, e.event("", "later"))
	require.Len(t, e.consume(1, 5*time.Second), 1, "the later transaction's event is published while the early one is open")
	require.NoError(t, early.Commit(ctx))

	recs := e.consume(3, 10*time.Second)
	var got []string
	for _, r := range recs {
		got = append(got, header(r, "event-id"))
	}
	require.ElementsMatch(t, append(lowIDs, later...), got)
}

// Two transactions add an event with the same key; the one that added first
// commits first, though its event ID sorts after the other's. Publication
// follows commit order, not ID order. The second transaction tries to
// commit first, and cannot: its Add waits for the first transaction.
func TestSameKeyIsPublishedInCommitOrderNotIDOrder(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	idLow, idHigh := outbox.NewID(), outbox.NewID()
	idLow, idHigh = min(idLow, idHigh), max(idLow, idHigh)

	first := e.begin()
	_, err := e.ob.Add(ctx, first, outbox.Event{ID: idHigh, Destination: e.topic, Key: []byte("k"), Payload: []byte("first")})
	require.NoError(t, err)
	// The second transaction adds its event and commits as soon as it can.
	// Once its Add returns it checks, on the server, whether the first has
	// committed: the witness that it commits second.
	type outcome struct {
		firstVisible int
		err          error
	}
	second := make(chan outcome)
	go func() {
		var o outcome
		tx, err := e.pool.Begin(ctx)
		if err == nil {
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = e.ob.Add(ctx, tx, outbox.Event{ID: idLow, Destination: e.topic, Key: []byte("k"), Payload: []byte("second")})
		}
		if err == nil {
			err = tx.QueryRow(ctx, "SELECT count(*) FROM "+e.table+" WHERE event_id = $1", idHigh).Scan(&o.firstVisible)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		o.err = err
		second <- o
	}()
	time.Sleep(200 * time.Millisecond) // let the second transaction try to overtake
	require.NoError(t, first.Commit(ctx))
	o := <-second
	require.NoError(t, o.err)
	require.Equal(t, 1, o.firstVisible, "the second transaction's Add returned before the first committed")

	e.start(e.relay(), e.relay(), e.relay())
	recs := e.consume(2, 10*time.Second)
	require.Len(t, recs, 2)
	require.Equal(t, []string{idHigh, idLow}, []string{header(recs[0], "event-id"), header(recs[1], "event-id")})
}

// Many writers per key with random pauses inside their transactions, event
// IDs handed out in shuffled order, three relays publishing meanwhile and
// failing some batches: per key, the published order is the commit order.
// The commit order is witnessed by a counter row each transaction updates
// after its Add: the row lock orders the commits of a key, whatever order
// the outbox rows were inserted in.
func TestPerKeyOrderWithConcurrentWritersAndRelays(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	counters := e.table + "_counters"
	_, err := e.pool.Exec(ctx, "CREATE TABLE "+counters+" (k text PRIMARY KEY, n int NOT NULL, ids text[] NOT NULL DEFAULT '{}')")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP TABLE "+counters) })
	const keys, perKey = 8, 25
	for k := range keys {
		_, err := e.pool.Exec(ctx, "INSERT INTO "+counters+" VALUES ($1, 0)", "k"+strconv.Itoa(k))
		require.NoError(t, err)
	}
	ids := make([]string, keys*perKey)
	for i := range ids {
		ids[i] = outbox.NewID()
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })

	refusing := refuseProduce(e.kafka)
	stopFlapping := make(chan struct{})
	var flap sync.WaitGroup
	flap.Go(func() {
		for {
			select {
			case <-stopFlapping:
				refusing.Store(false)
				return
			case <-time.After(time.Duration(rand.IntN(150)) * time.Millisecond):
				refusing.Store(!refusing.Load())
			}
		}
	})
	e.start(
		e.relay(outbox.WithBatchSize(7), outbox.WithMaxAttempts(1000), outbox.WithPublishTimeout(200*time.Millisecond)),
		e.relay(outbox.WithBatchSize(3), outbox.WithMaxAttempts(1000), outbox.WithPublishTimeout(200*time.Millisecond)),
		e.relay(outbox.WithBatchSize(50), outbox.WithMaxAttempts(1000), outbox.WithPublishTimeout(200*time.Millisecond)),
	)

	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(ids); i += 16 {
				key := "k" + strconv.Itoa(i%keys)
				if err := orderedWrite(ctx, e, counters, key, ids[i]); err != nil {
					t.Errorf("write %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stopFlapping)
	flap.Wait()

	commitOrder := map[string][]string{}
	rows, err := e.pool.Query(ctx, "SELECT k, ids FROM "+counters)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var ks []string
		require.NoError(t, rows.Scan(&k, &ks))
		commitOrder[k] = ks
	}
	require.NoError(t, rows.Err())

	// Copies of a batch whose produce failed count toward consume's total:
	// wait until every event is out, so that the count ends the read no
	// earlier than the last original.
	waitFor(t, 60*time.Second, "every event published", func() bool { return pendingRows(t, e, e.table) == 0 })
	recs := e.consume(len(ids), 60*time.Second)
	published := map[string][]string{}
	for _, r := range recs {
		published[string(r.Key)] = appendOnce(published[string(r.Key)], header(r, "event-id"))
	}
	var outOfIDOrder int
	for k, want := range commitOrder {
		require.Len(t, want, perKey, k)
		require.Equal(t, want, published[k], "key %s: published order differs from commit order", k)
		if !slices.IsSorted(want) {
			outOfIDOrder++
		}
	}
	require.Positive(t, outOfIDOrder, "keys whose commit order is not their event ID order")
	t.Logf("%d events on %d keys, %d records published (copies included), %d keys committed out of ID order",
		len(ids), keys, len(recs), outOfIDOrder)
}

// orderedWrite adds one event with its own ID, then records the commit
// order on the key's counter row, pausing at random inside the transaction.
func orderedWrite(ctx context.Context, e *env, counters, key, id string) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	if _, err := e.ob.Add(ctx, tx, outbox.Event{ID: id, Destination: e.topic, Key: []byte(key), Payload: []byte(id)}); err != nil {
		return err
	}
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	if _, err := tx.Exec(ctx, "UPDATE "+counters+" SET n = n + 1, ids = array_append(ids, $2::text) WHERE k = $1", key, id); err != nil {
		return fmt.Errorf("counter: %w", err)
	}
	return tx.Commit(ctx)
}

// appendOnce appends id unless it is the last element already, or earlier:
// a copy published again after a lost acknowledgement is not a new position
// in the order, as the consumer drops it.
func appendOnce(ids []string, id string) []string {
	if slices.Contains(ids, id) {
		return ids
	}
	return append(ids, id)
}

// failOnce fails the first attempt of one event, as a broker refusing one
// request would, and publishes everything else with next.
type failOnce struct {
	next   outbox.Publisher
	id     string
	failed atomic.Bool
}

func (p *failOnce) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	var rest []int
	failedKey := ""
	for i, e := range events {
		switch {
		case e.ID == p.id && p.failed.CompareAndSwap(false, true):
			errs[i], failedKey = errors.New("refused once"), string(e.Key)
		case failedKey != "" && string(e.Key) == failedKey:
			errs[i] = outbox.ErrNotAttempted // as the Publisher contract asks
		default:
			rest = append(rest, i)
		}
	}
	batch := make([]outbox.Event, len(rest))
	for j, i := range rest {
		batch[j] = events[i]
	}
	if len(batch) > 0 {
		for j, err := range p.next.Publish(ctx, batch) {
			errs[rest[j]] = err
		}
	}
	return errs
}

// A failed event waiting out its backoff holds back the later events of its
// key, and only those: they go out after it, in order.
func TestFailedHeadHoldsBackItsKey(t *testing.T) {
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			e := newEnv(t, 1)
			ids := e.add(true, e.event("k", "1"), e.event("k", "2"), e.event("k", "3"), e.event("other", "4"))
			pub, err := kafkaoutbox.NewPublisher(e.producer())
			require.NoError(t, err)
			r, err := outbox.NewRelay(e.ob, e.pool.Config(), &failOnce{next: pub, id: ids[0]},
				outbox.WithBatchSize(batch), outbox.WithPollInterval(10*time.Millisecond),
				outbox.WithBackoff(func(int) time.Duration { return 2 * time.Second }), outbox.WithLogger(quietLogger()))
			require.NoError(t, err)
			e.start(r)
			var order []string
			for _, rec := range e.consume(4, 10*time.Second) {
				order = append(order, string(rec.Value))
			}
			require.Equal(t, []string{"4", "1", "2", "3"}, order, "the other key is not held back; key k keeps its order")
		})
	}
}

// Per-key order needs no lock of the application's: transactions of one key
// run concurrently, each opened while the previous one is still open and
// holding its event ID below the previous one's, so that they commit in the
// opposite order of their IDs; a fifth roll back. Four keys at once, three
// relays publishing meanwhile. Each transaction's position in its key's
// commit order is witnessed without a lock: once Add returns, the committed
// events of its key visible to its next statement are exactly those
// committed before it (Add waited for them, and the later ones wait for
// it). Per key, the published order is the commit order.
func TestPerKeyOrderWithoutTheApplicationsLock(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	const keys, perKey = 4, 40
	e.start(e.relay(outbox.WithBatchSize(5)), e.relay(outbox.WithBatchSize(11)), e.relay())

	commitOrder := make([][]string, keys)
	var wg sync.WaitGroup
	for k := range keys {
		key := "key-" + strconv.Itoa(k)
		ids := make([]string, perKey)
		for i := range ids {
			ids[i] = outbox.NewID()
		}
		slices.Sort(ids)
		slices.Reverse(ids) // the first to commit holds the highest ID
		positions := make([]int, perKey)
		wg.Go(func() {
			var open sync.WaitGroup
			for i, id := range ids {
				added := make(chan struct{})
				open.Go(func() {
					positions[i] = -1
					err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
						if _, err := e.ob.Add(ctx, tx, outbox.Event{ID: id, Destination: e.topic, Key: []byte(key), Payload: []byte(id)}); err != nil {
							close(added)
							return err
						}
						close(added)
						if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+e.table+" WHERE key = $1 AND event_id <> $2", []byte(key), id).Scan(&positions[i]); err != nil {
							return err
						}
						time.Sleep(time.Duration(rand.IntN(4)) * time.Millisecond)
						if rand.IntN(5) == 0 {
							positions[i] = -1
							return errRollBack
						}
						return nil
					})
					if err != nil && !errors.Is(err, errRollBack) {
						t.Errorf("%s: %v", key, err)
					}
				})
				<-added // the next transaction opens while this one is open
			}
			open.Wait()
			order := make([]string, 0, perKey)
			for pos := 0; ; pos++ {
				i := slices.Index(positions, pos)
				if i < 0 {
					break
				}
				order = append(order, ids[i])
			}
			commitOrder[k] = order
		})
	}
	wg.Wait()

	var committed int
	for k, order := range commitOrder {
		require.True(t, slices.IsSortedFunc(order, func(a, b string) int { return strings.Compare(b, a) }),
			"key %d: the transactions did not commit in the opposite order of their IDs", k)
		committed += len(order)
	}
	waitFor(t, 60*time.Second, "every event published", func() bool { return pendingRows(t, e, e.table) == 0 })
	recs := e.consume(committed, 60*time.Second)
	published := map[string][]string{}
	for _, r := range recs {
		published[string(r.Key)] = appendOnce(published[string(r.Key)], header(r, "event-id"))
	}
	for k, order := range commitOrder {
		require.Equal(t, order, published["key-"+strconv.Itoa(k)], "key %d: published order differs from commit order", k)
	}
	require.Equal(t, map[string]int{"sent": committed}, e.statuses(), "exactly the committed events")
}

var errRollBack = errors.New("roll back")
