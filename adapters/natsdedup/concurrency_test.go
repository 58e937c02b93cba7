package natsdedup_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// bind returns the durable consumer name of stream on a connection of its
// own, as another process would.
func bind(t *testing.T, stream, name string) jetstream.Consumer {
	t.Helper()
	_, js := testenv.NATS(t)
	c, err := js.Consumer(context.Background(), stream, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Three consumers, each on a connection of its own, pull from one durable
// consumer: 200 events, a third of them published twice, are each applied
// once, and every message is acknowledged.
func TestConcurrentConsumersApplyOnce(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 100*time.Millisecond)
			durable := e.consumer(t, 5*time.Second).CachedInfo().Name
			store := sc.open(t)
			rec := adaptertest.NewEffects()
			scope := dedup.WithScope(uniqueScope())
			h := func(ctx context.Context, m jetstream.Msg) error {
				time.Sleep(5 * time.Millisecond)
				rec.Apply(eventID(m))
				return nil
			}
			const events = 200
			var ids []string
			for i := range events {
				ids = append(ids, "evt-"+strconv.Itoa(i))
				e.publish(t, ids[i], ids[i], nil)
			}
			for i := 0; i < events; i += 3 {
				e.publishAgain(t, ids[i], ids[i])
			}
			for range 3 {
				start(t, bind(t, "T_"+e.token, durable), wrap(t, store, rec, h, scope),
					natsdedup.WithWorkers(20), natsdedup.WithBatchSize(10))
			}
			adaptertest.WaitFor(t, deadline, "every copy settled", func() bool {
				return rec.Outcomes(dedup.OutcomeProcessed) == events &&
					rec.Outcomes(dedup.OutcomeDuplicate) >= (events+2)/3
			})
			rec.AssertOnce(t, ids)
			assertAllAcked(t, bind(t, "T_"+e.token, durable))
		})
	}
}

// Twenty copies of one failing event, pulled by three consumers at once:
// the handler starts at most MaxAttempts times, the event is dead-lettered
// once, and every copy is acknowledged or terminated.
func TestConsumersRaceOnFailingEvent(t *testing.T) {
	t.Parallel()
	const copies, maxAttempts = 20, 3
	e := newEnv(t, 100*time.Millisecond)
	durable := e.consumer(t, 5*time.Second).CachedInfo().Name
	store, sink := dedup.NewMemoryStore(), dedup.NewMemorySink()
	var starts atomic.Int32
	rec := adaptertest.NewEffects()
	scope := uniqueScope()
	h := func(ctx context.Context, m jetstream.Msg) error {
		starts.Add(1)
		time.Sleep(5 * time.Millisecond)
		return errors.New("downstream refused")
	}
	for range copies {
		e.publishAgain(t, "poison", "same body")
	}
	for range 3 {
		start(t, bind(t, "T_"+e.token, durable), wrap(t, store, rec, h, dedup.WithScope(scope),
			dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts)))
	}
	assertAllAcked(t, bind(t, "T_"+e.token, durable))
	r, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("handler starts %d, dead letters %d, record attempts %d", starts.Load(), len(sink.Letters()), r.Attempts)
	if n := starts.Load(); n > maxAttempts {
		t.Errorf("handler started %d times, want at most %d", n, maxAttempts)
	}
	if n := len(sink.Letters()); n != 1 || r.Status != dedup.StatusFailedFinal {
		t.Errorf("%d dead letters, record %s; want 1, FAILED_FINAL", n, r.Status)
	}
}

// The consumer's connection to NATS is cut mid-run (a TCP proxy between
// them closes every connection and refuses new ones) for longer than the
// AckWait, then restored: the client reconnects, the server delivers again
// what was held, and every event is applied exactly once and acknowledged.
func TestConnectionLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	durable := e.consumer(t, 2*time.Second).CachedInfo().Name
	u, err := url.Parse(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(context.Background(), "T_"+e.token, durable)
	if err != nil {
		t.Fatal(err)
	}
	store := dedup.NewMemoryStore()
	rec := adaptertest.NewEffects()
	w := wrap(t, store, rec, func(ctx context.Context, m jetstream.Msg) error {
		time.Sleep(10 * time.Millisecond)
		rec.Apply(eventID(m))
		return nil
	})
	const events = 300
	var ids []string
	for i := range events {
		ids = append(ids, "evt-"+strconv.Itoa(i))
		e.publish(t, ids[i], ids[i], nil)
	}
	stop := start(t, cons, w, natsdedup.WithWorkers(20), natsdedup.WithBatchSize(10), natsdedup.WithAckTimeout(2*time.Second))
	adaptertest.WaitFor(t, deadline, "a sixth applied", func() bool { return rec.Applied() >= events/6 })
	proxy.Cut()
	cutAt := rec.Applied()
	time.Sleep(3 * time.Second) // past the AckWait: the server gives the held messages out again
	proxy.Restore()
	adaptertest.WaitFor(t, deadline, "all applied", func() bool { return rec.Applied() == events })
	assertAllAcked(t, bind(t, "T_"+e.token, durable))
	stop()
	t.Logf("applied %d before the cut; %d deliveries in all, %d duplicates", cutAt, rec.Results(), rec.Outcomes(dedup.OutcomeDuplicate))
	rec.AssertOnce(t, ids)
	for _, id := range ids {
		r, err := store.Get(context.Background(), dedup.Key{Scope: w.Scope(), EventID: id})
		if err != nil || r.Status != dedup.StatusSucceeded {
			t.Errorf("%s: record %v, %v; want SUCCEEDED", id, r.Status, err)
		}
	}
}

// While the store refuses every claim, nothing is handled and nothing
// acknowledged: the messages are naked with a backoff and come back; once
// the store answers again, every event is applied once.
func TestStoreOutageAcksNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 5*time.Second)
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	store.SetDown(true)
	rec := adaptertest.NewEffects()
	w := wrap(t, store, rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	})
	ids := []string{"a", "b", "c", "d", "e"}
	for _, id := range ids {
		e.publish(t, id, id, nil)
	}
	stop := start(t, cons, w)
	adaptertest.WaitFor(t, deadline, "claims refused twice", func() bool { return store.Refused() >= 2 })
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 || rec.Applied() != 0 {
		t.Errorf("during the outage: ack floor %d, %d applied; want nothing", info.AckFloor.Stream, rec.Applied())
	}
	if w.Stats().LastFailure.IsZero() {
		t.Error("the wrapper's stats show no failure")
	}
	store.SetDown(false)
	adaptertest.WaitFor(t, deadline, "all applied", func() bool { return rec.Applied() == len(ids) })
	stop()
	rec.AssertOnce(t, ids)
	assertAllAcked(t, cons)
}
