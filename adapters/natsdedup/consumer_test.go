package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Three copies of each of five events, each copy published with the same
// Nats-Msg-Id once the stream's duplicate window let it in, give one effect
// per event; every copy is acknowledged.
func TestDuplicatesHaveOneEffect(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 200*time.Millisecond)
			cons := e.consumer(t, 5*time.Second)
			rec := adaptertest.NewEffects()
			w := wrap(t, sc.open(t), rec, func(ctx context.Context, m jetstream.Msg) error {
				time.Sleep(50 * time.Millisecond) // let copies overlap
				rec.Apply(eventID(m))
				return nil
			})
			const events, copies = 5, 3
			var ids []string
			for i := range events {
				ids = append(ids, fmt.Sprintf("evt-%d", i))
			}
			for range copies {
				for i, id := range ids {
					e.publishAgain(t, id, fmt.Sprintf("body %d", i))
				}
			}
			stop := start(t, cons, w)
			adaptertest.WaitFor(t, deadline, "every copy settled", func() bool {
				return rec.Outcomes(dedup.OutcomeProcessed) == events && rec.Outcomes(dedup.OutcomeDuplicate) == events*(copies-1)
			})
			stop()
			rec.AssertOnce(t, ids)
			assertAllAcked(t, cons)
		})
	}
}

// A message handled but never acknowledged (a consumer that died before
// its ack) is delivered again once its AckWait runs out; the consumer then
// finds it a duplicate, without a second effect, and acknowledges it.
func TestRedeliveryIsDuplicate(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 0)
			cons := e.consumer(t, 2*time.Second)
			rec := adaptertest.NewEffects()
			w := wrap(t, sc.open(t), rec, func(ctx context.Context, m jetstream.Msg) error {
				rec.Apply(eventID(m))
				return nil
			})
			e.publish(t, "evt-1", "once", nil)

			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(deadline))
			if err != nil {
				t.Fatal(err)
			}
			m := <-batch.Messages()
			if m == nil {
				t.Fatalf("nothing fetched: %v", batch.Error())
			}
			if res, err := w.Handle(context.Background(), m); err != nil || res.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("first delivery: %v, %v", res.Outcome, err)
			} // and no ack: it comes back after AckWait

			stop := start(t, cons, w)
			adaptertest.WaitFor(t, deadline, "the redelivery seen as a duplicate", func() bool { return rec.Outcomes(dedup.OutcomeDuplicate) == 1 })
			stop()
			rec.AssertOnce(t, []string{"evt-1"})
			assertAllAcked(t, cons)
		})
	}
}

// A message that always fails is dead-lettered after MaxAttempts into the
// dead-letter stream, with its data, headers and metadata, and terminated.
func TestPoisonMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 0)
			cons := e.consumer(t, 5*time.Second)
			rec := adaptertest.NewEffects()
			scope := uniqueScope()
			sink, err := natsdedup.NewSink(e.js)
			if err != nil {
				t.Fatal(err)
			}
			w := wrap(t, sc.open(t), rec, func(ctx context.Context, m jetstream.Msg) error {
				rec.Call(eventID(m))
				return errBoom
			}, dedup.WithScope(scope), dedup.WithMaxAttempts(3), dedup.WithSink(sink))
			e.publish(t, "poison-1", `{"poison":true}`, map[string]string{"tenant": "acme"})
			stop := start(t, cons, w)
			adaptertest.WaitFor(t, deadline, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
			stop()
			if n := rec.CallCount(); n != 3 {
				t.Errorf("handler ran %d times, want 3", n)
			}
			assertAllAcked(t, cons)

			letters := e.letters(t)
			if len(letters) != 1 {
				t.Fatalf("dead-letter stream holds %d messages, want 1", len(letters))
			}
			dl := letters[0]
			if dl.Subject != "dlq."+e.subject {
				t.Errorf("letter subject %q, want %q", dl.Subject, "dlq."+e.subject)
			}
			if string(dl.Data) != `{"poison":true}` {
				t.Errorf("letter data %q", dl.Data)
			}
			want := map[string]string{
				"tenant": "acme", "dedup-reason": "handler-error", "dedup-attempts": "3",
				"dedup-event-id": "poison-1", "dedup-scope": scope, "dedup-cause": errBoom.Error(),
				"dedup-origin-topic": e.subject, "dedup-origin-stream": "T_" + e.token, "dedup-origin-offset": "1",
				"dedup-origin-group": cons.CachedInfo().Name, "dedup-origin-message-id": "poison-1",
			}
			for k, v := range want {
				if got := dl.Header.Get(k); got != v {
					t.Errorf("letter header %s = %q, want %q", k, got, v)
				}
			}
			if dl.Header.Get("dedup-first-failure") == "" || dl.Header.Get("dedup-origin-timestamp") == "" {
				t.Errorf("letter lacks failure or origin time: %v", dl.Header)
			}
			if id := dl.Header.Get(jetstream.MsgIDHeader); id == "" || id == "poison-1" {
				t.Errorf("letter Nats-Msg-Id %q, want a letter ID of its own", id)
			}
		})
	}
}

// A handler error marked permanent dead-letters the message at once.
func TestPermanentErrorIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 5*time.Second)
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Call(eventID(m))
		return dedup.Permanent(errors.New("unknown account"))
	}, dedup.WithSink(sink), dedup.WithMaxAttempts(5))
	e.publish(t, "perm-1", "x", nil)
	stop := start(t, cons, w)
	adaptertest.WaitFor(t, deadline, "the message dead-lettered", func() bool { return len(sink.Letters()) == 1 })
	stop()
	if n := rec.CallCount(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if dl := sink.Letters()[0]; dl.Reason != dedup.ReasonPermanent || dl.Attempts != 1 || dl.EventID != "perm-1" {
		t.Errorf("letter: reason %s, attempts %d, event %s; want permanent, 1, perm-1", dl.Reason, dl.Attempts, dl.EventID)
	}
	assertAllAcked(t, cons)
}

// An event ID used again with another payload is a conflict: the second
// message is not handled but dead-lettered with reason
// fingerprint-conflict, and terminated.
func TestFingerprintConflictIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond)
	cons := e.consumer(t, 5*time.Second)
	rec := adaptertest.NewEffects()
	sink, err := natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	w := wrap(t, dedup.NewMemoryStore(), rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}, dedup.WithSink(sink))
	e.publish(t, "order-7", `{"amount":10}`, nil)
	stop := start(t, cons, w)
	adaptertest.WaitFor(t, deadline, "the first processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 1 })
	e.publishAgain(t, "order-7", `{"amount":99}`)
	adaptertest.WaitFor(t, deadline, "the second found in conflict", func() bool { return rec.Outcomes(dedup.OutcomeConflict) == 1 })
	stop()
	rec.AssertOnce(t, []string{"order-7"})
	letters := e.letters(t)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	if got := letters[0].Header.Get("dedup-reason"); got != string(dedup.ReasonConflict) {
		t.Errorf("reason %q, want %q", got, dedup.ReasonConflict)
	}
	if string(letters[0].Data) != `{"amount":99}` {
		t.Errorf("letter data %q, want the conflicting payload", letters[0].Data)
	}
	assertAllAcked(t, cons)
}

// A message without a Nats-Msg-Id is dead-lettered with reason invalid-id,
// and the messages around it are handled.
func TestMissingIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 5*time.Second)
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}, dedup.WithSink(sink))
	e.publish(t, "a", "a", nil)
	e.publish(t, "", "no id", nil)
	e.publish(t, "b", "b", nil)
	stop := start(t, cons, w)
	adaptertest.WaitFor(t, deadline, "all settled", func() bool { return rec.Results() == 3 })
	stop()
	rec.AssertOnce(t, []string{"a", "b"})
	letters := sink.Letters()
	if len(letters) != 1 || letters[0].Reason != dedup.ReasonInvalidID || string(letters[0].Payload) != "no id" {
		t.Errorf("letters %+v, want the message without ID, reason invalid-id", letters)
	}
	assertAllAcked(t, cons)
}

// A handler taking 5 s on a consumer with a 2 s AckWait keeps its message:
// the heartbeat's InProgress stops the server from delivering it again, and
// it has one effect.
func TestHeartbeatKeepsSlowMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 2*time.Second)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(ctx context.Context, m jetstream.Msg) error {
		time.Sleep(5 * time.Second)
		rec.Apply(eventID(m))
		return nil
	})
	e.publish(t, "slow-1", "slow", nil)
	stop := start(t, cons, w)
	adaptertest.WaitFor(t, deadline, "the slow message processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 1 })
	stop()
	rec.AssertOnce(t, []string{"slow-1"})
	if n := rec.Results(); n != 1 {
		t.Errorf("%d deliveries, want 1 (the message was delivered again while held)", n)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("the server redelivered %d messages, want 0", info.NumRedelivered)
	}
	assertAllAcked(t, cons)
}

// Stopped mid-stream, a consumer leaves nothing behind: what it did not
// settle is delivered again to the next one, and every event is applied
// once.
func TestShutdownLosesNothing(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 0)
			cons := e.consumer(t, 5*time.Second)
			store := sc.open(t)
			rec := adaptertest.NewEffects()
			scope := dedup.WithScope(uniqueScope())
			h := func(ctx context.Context, m jetstream.Msg) error {
				time.Sleep(20 * time.Millisecond)
				rec.Apply(eventID(m))
				return nil
			}
			const events = 150
			var ids []string
			for i := range events {
				id := "evt-" + strconv.Itoa(i)
				ids = append(ids, id)
				e.publish(t, id, id, nil)
			}
			opts := []natsdedup.Opt{natsdedup.WithWorkers(20), natsdedup.WithBatchSize(10)}
			stop := start(t, cons, wrap(t, store, rec, h, scope), opts...)
			adaptertest.WaitFor(t, deadline, "a third applied", func() bool { return rec.Applied() >= events/3 })
			stop()
			first := rec.Applied()

			stop = start(t, cons, wrap(t, store, rec, h, scope), opts...)
			adaptertest.WaitFor(t, deadline, "all applied", func() bool { return rec.Applied() == events })
			stop()
			t.Logf("first consumer applied %d of %d", first, events)
			rec.AssertOnce(t, ids)
			assertAllAcked(t, cons)
		})
	}
}

// Run refuses a consumer without explicit acks, and NewConsumer bad
// arguments, with dedup.ErrConfig.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	w := wrap(t, dedup.NewMemoryStore(), adaptertest.NewEffects(), func(context.Context, jetstream.Msg) error { return nil })
	ackAll, err := e.stream.CreateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "all_" + token(), AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	c, err := natsdedup.NewConsumer(ackAll, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("Run on an AckAll consumer: %v, want dedup.ErrConfig", err)
	}
	cons := e.consumer(t, 2*time.Second)
	c, err = natsdedup.NewConsumer(cons, w, natsdedup.WithAckWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("Run with WithAckWait above the consumer's: %v, want dedup.ErrConfig", err)
	}
	short := wrap(t, dedup.NewMemoryStore(), adaptertest.NewEffects(), func(context.Context, jetstream.Msg) error { return nil },
		dedup.WithTTL(40*time.Second))
	c, err = natsdedup.NewConsumer(e.consumer(t, time.Minute), short)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, dedup.ErrConfig) || !strings.Contains(err.Error(), "AckWait") {
		t.Errorf("Run with a TTL under the consumer's AckWait, the lease: %v, want dedup.ErrConfig naming the AckWait", err)
	}
	for name, f := range map[string]func() error{
		"nil consumer":  func() error { _, err := natsdedup.NewConsumer(nil, w); return err },
		"nil wrapper":   func() error { _, err := natsdedup.NewConsumer(cons, nil); return err },
		"zero workers":  func() error { _, err := natsdedup.NewConsumer(cons, w, natsdedup.WithWorkers(0)); return err },
		"nil logger":    func() error { _, err := natsdedup.NewConsumer(cons, w, natsdedup.WithLogger(nil)); return err },
		"nil js":        func() error { _, err := natsdedup.NewSink(nil); return err },
		"nil subject f": func() error { _, err := natsdedup.NewSink(e.js, natsdedup.WithDLQSubject(nil)); return err },
	} {
		if err := f(); !errors.Is(err, dedup.ErrConfig) {
			t.Errorf("%s: %v, want dedup.ErrConfig", name, err)
		}
	}
}

// A handler still running after the shutdown timeout is cancelled and its
// message naked for immediate redelivery, not left to its AckWait: the next
// consumer applies it once, well within the AckWait of 30 s.
func TestShutdownTimeoutGivesBackAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 30*time.Second)
	store := dedup.NewMemoryStore()
	rec := adaptertest.NewEffects()
	scope := dedup.WithScope(uniqueScope())
	started := make(chan struct{}, 1)
	stuck := wrap(t, store, rec, func(ctx context.Context, m jetstream.Msg) error {
		started <- struct{}{}
		<-ctx.Done() // until the shutdown timeout cancels it
		return ctx.Err()
	}, scope)
	e.publish(t, "evt-1", "x", nil)
	stop := start(t, cons, stuck, natsdedup.WithShutdownTimeout(500*time.Millisecond))
	select {
	case <-started:
	case <-time.After(deadline):
		t.Fatal("the handler never started")
	}
	stop()
	stoppedAt := time.Now()

	stop = start(t, cons, wrap(t, store, rec, func(ctx context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}, scope))
	adaptertest.WaitFor(t, deadline, "the message applied by the next consumer", func() bool { return rec.Applied() == 1 })
	if d := time.Since(stoppedAt); d > 20*time.Second {
		t.Errorf("redelivered after %v: the message was left to its AckWait instead of naked", d)
	}
	stop()
	rec.AssertOnce(t, []string{"evt-1"})
	assertAllAcked(t, cons)
}
