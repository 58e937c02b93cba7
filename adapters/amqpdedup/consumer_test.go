package amqpdedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

var queueKinds = []string{"classic", "quorum"}

// Every event published two or three times, some copies while the first is
// being handled, has one effect, and every delivery is acknowledged.
func TestDuplicatesHaveOneEffect(t *testing.T) {
	for _, kind := range queueKinds {
		t.Run(kind, func(t *testing.T) {
			b := newBroker(t)
			q := b.queue(kind)
			const events = 200
			for i := range events {
				for copy := range 2 + i%2 {
					_ = copy
					b.publish(q, "order-"+strconv.Itoa(i), `{"order":`+strconv.Itoa(i)+`}`, nil)
				}
			}
			got := adaptertest.NewEffects()
			c := b.consumer(q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
				got.Apply(d.MessageId)
				return nil
			})
			stop := run(t, c)
			adaptertest.WaitFor(t, effectDeadline, "every event applied and every delivery acknowledged", func() bool {
				return got.Applied() == events && b.depth(q) == 0
			})
			stop()
			if twice := got.Twice(); len(twice) > 0 {
				t.Fatalf("applied more than once: %v", twice)
			}
			if n := b.depth(q + ".dlq"); n != 0 {
				t.Fatalf("%d dead letters, want none", n)
			}
		})
	}
}

// A handler that always fails parks its event after MaxAttempts attempts,
// one letter with its metadata, and the original is acknowledged; a
// permanent error parks at once; the good events around them are applied.
func TestPoisonIsDeadLettered(t *testing.T) {
	for _, kind := range queueKinds {
		t.Run(kind, func(t *testing.T) {
			b := newBroker(t)
			q := b.queue(kind)
			var poisonRuns, permanentRuns atomic.Int64
			got := adaptertest.NewEffects()
			c := b.consumer(q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
				switch d.MessageId {
				case "poison":
					poisonRuns.Add(1)
					return errPoison
				case "permanent":
					permanentRuns.Add(1)
					return dedup.Permanent(errors.New("unknown account"))
				}
				got.Apply(d.MessageId)
				return nil
			}, dedup.WithMaxAttempts(3))
			b.publish(q, "good-1", "1", amqp.Table{"trace": "kept"})
			b.publish(q, "poison", "p", amqp.Table{"trace": "kept"})
			b.publish(q, "permanent", "x", nil)
			b.publish(q, "good-2", "2", nil)
			stop := run(t, c)
			adaptertest.WaitFor(t, effectDeadline, "two letters and an empty queue", func() bool {
				return b.depth(q+".dlq") == 2 && b.depth(q) == 0 && got.Applied() == 2
			})
			stop()
			letters := map[string]amqp.Delivery{}
			for _, d := range b.letters(q + ".dlq") {
				letters[d.MessageId] = d
			}
			p := letters["poison"]
			for name, want := range map[string]string{
				"dedup-reason": string(dedup.ReasonHandlerError), "dedup-attempts": "3", "dedup-event-id": "poison",
				"dedup-origin-queue": q, "dedup-origin-routing-key": q, "trace": "kept",
			} {
				if got := header(p, name); got != want {
					t.Errorf("poison letter header %s = %q, want %q", name, got, want)
				}
			}
			if string(p.Body) != "p" {
				t.Errorf("poison letter body %q", p.Body)
			}
			if v, ok := p.Headers["x-delivery-count"]; ok && v != int64(0) {
				t.Errorf("the letter copies the original's x-delivery-count: %v", v)
			}
			if n := poisonRuns.Load(); n != 3 {
				t.Errorf("poison handled %d times, want 3", n)
			}
			perm := letters["permanent"]
			if got := header(perm, "dedup-reason"); got != string(dedup.ReasonPermanent) {
				t.Errorf("permanent letter reason %q", got)
			}
			if n := permanentRuns.Load(); n != 1 {
				t.Errorf("permanent handled %d times, want 1", n)
			}
		})
	}
}

// A second event with an ID already used for another payload is parked as
// a conflict; the first keeps its one effect.
func TestFingerprintConflictIsDeadLettered(t *testing.T) {
	b := newBroker(t)
	q := b.queue("classic")
	got := adaptertest.NewEffects()
	store := dedup.NewMemoryStore()
	c := b.consumer(q, store, func(_ context.Context, d amqp.Delivery) error {
		got.Apply(d.MessageId + "=" + string(d.Body))
		return nil
	})
	b.publish(q, "order-1", `{"cents":100}`, nil)
	stop := run(t, c)
	adaptertest.WaitFor(t, effectDeadline, "the first applied", func() bool { return got.Applied() == 1 && b.depth(q) == 0 })
	b.publish(q, "order-1", `{"cents":999}`, nil)
	adaptertest.WaitFor(t, effectDeadline, "the conflict parked", func() bool { return b.depth(q+".dlq") == 1 && b.depth(q) == 0 })
	stop()
	letters := b.letters(q + ".dlq")
	if got := header(letters[0], "dedup-reason"); got != string(dedup.ReasonConflict) {
		t.Fatalf("letter reason %q, want conflict", got)
	}
	if got.Applied() != 1 || len(got.Twice()) > 0 {
		t.Fatalf("effects %v", got.Counts())
	}
}

// Three consumers of one queue, sharing a store, apply each event once.
func TestConcurrentConsumers(t *testing.T) {
	b := newBroker(t)
	q := b.queue("quorum")
	store := dedup.NewMemoryStore()
	got := adaptertest.NewEffects()
	const events = 300
	for i := range events {
		b.publish(q, "e-"+strconv.Itoa(i), "x", nil)
		b.publish(q, "e-"+strconv.Itoa(i), "x", nil)
	}
	for range 3 {
		c := b.consumer(q, store, func(_ context.Context, d amqp.Delivery) error {
			time.Sleep(time.Millisecond)
			got.Apply(d.MessageId)
			return nil
		})
		run(t, c)
	}
	adaptertest.WaitFor(t, effectDeadline, "every event applied and acknowledged", func() bool { return got.Applied() == events && b.depth(q) == 0 })
	if twice := got.Twice(); len(twice) > 0 {
		t.Fatalf("applied more than once: %v", twice)
	}
}

// A consumer stopped mid-stream returns what it holds; the next one applies
// the rest, each event once.
func TestShutdownLosesNothing(t *testing.T) {
	b := newBroker(t)
	q := b.queue("classic")
	store := dedup.NewMemoryStore()
	got := adaptertest.NewEffects()
	const events = 300
	for i := range events {
		b.publish(q, "e-"+strconv.Itoa(i), "x", nil)
	}
	h := func(_ context.Context, d amqp.Delivery) error {
		time.Sleep(2 * time.Millisecond)
		got.Apply(d.MessageId)
		return nil
	}
	stop := run(t, b.consumer(q, store, h))
	adaptertest.WaitFor(t, effectDeadline, "a third applied", func() bool { return got.Applied() >= events/3 })
	stop()
	if n := got.Applied(); n == events {
		t.Logf("the first consumer applied all %d before it stopped", n)
	}
	stop = run(t, b.consumer(q, store, h))
	adaptertest.WaitFor(t, effectDeadline, "every event applied and acknowledged", func() bool { return got.Applied() == events && b.depth(q) == 0 })
	stop()
	if twice := got.Twice(); len(twice) > 0 {
		t.Fatalf("applied more than once: %v", twice)
	}
}

// The connection is cut twice mid-run: the consumer connects again, nothing
// is lost, nothing applied twice, and every delivery ends acknowledged.
func TestConnectionLoss(t *testing.T) {
	b := newBroker(t)
	q := b.queue("quorum")
	proxy := testenv.StartProxy(t, "127.0.0.1:5672")
	u, err := amqp.ParseURI(b.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host, u.Port = "127.0.0.1", mustPort(t, proxy.Addr())
	store := dedup.NewMemoryStore()
	got := adaptertest.NewEffects()
	const events = 400
	for i := range events {
		b.publish(q, "e-"+strconv.Itoa(i), "x", nil)
	}
	logs := &logCount{}
	c := b.consumerAt(u.String(), q, store, func(_ context.Context, d amqp.Delivery) error {
		time.Sleep(2 * time.Millisecond)
		got.Apply(d.MessageId)
		return nil
	}, []amqpdedup.Opt{amqpdedup.WithLogger(slog.New(logs))})
	stop := run(t, c)
	// Each cut comes once the consumer consumes (again) and has applied
	// more events.
	for cut := range 2 {
		adaptertest.WaitFor(t, effectDeadline, "consuming again", func() bool { return logs.count("amqpdedup: consuming the queue again") >= cut })
		at := min(got.Applied()+20, events) // on a quick run every event may be in already
		adaptertest.WaitFor(t, effectDeadline, fmt.Sprintf("%d applied", at), func() bool { return got.Applied() >= at })
		proxy.Cut()
		time.Sleep(500 * time.Millisecond)
		proxy.Restore()
	}
	adaptertest.WaitFor(t, effectDeadline, "every event applied and acknowledged", func() bool { return got.Applied() == events && b.depth(q) == 0 })
	stop()
	if twice := got.Twice(); len(twice) > 0 {
		t.Fatalf("applied more than once: %v", twice)
	}
	if n := logs.count("amqpdedup: consuming stopped"); n < 2 {
		t.Fatalf("%d connections lost, want 2 (the cuts did not reach the consumer)", n)
	}
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(p); err == nil {
			return n
		}
	}
	t.Fatal(err)
	return 0
}

// A letter the broker can route nowhere is an error naming where it went,
// not a silent drop; so the original is not acknowledged.
func TestSinkUnroutable(t *testing.T) {
	b := newBroker(t)
	sink, err := amqpdedup.NewSink(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	err = sink.Send(context.Background(), dedup.DeadLetter{Payload: []byte("x"), EventID: "e", Scope: "s",
		Origin: dedup.Origin{Queue: "no-such-queue-" + strconv.FormatInt(time.Now().UnixNano(), 36)}})
	var unroutable *amqpdedup.UnroutableError
	if !errors.As(err, &unroutable) {
		t.Fatalf("Send to a missing queue: %v, want an UnroutableError", err)
	}
	// The sink stays usable.
	q := b.queue("classic")
	if err := sink.Send(context.Background(), dedup.DeadLetter{Payload: []byte("y"), EventID: "e", Scope: "s",
		Origin: dedup.Origin{Queue: q}}); err != nil {
		t.Fatalf("Send after a return: %v", err)
	}
	if n := b.depth(q + ".dlq"); n != 1 {
		t.Fatalf("%d letters, want 1", n)
	}
}

func TestNewConsumerRejectsBadConfiguration(t *testing.T) {
	w, err := dedup.Wrap(dedup.NewMemoryStore(), amqpdedup.Messages("q"), func(context.Context, amqp.Delivery) error { return nil },
		dedup.WithScope("config-test"), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	for name, build := range map[string]func() error{
		"bad url":     func() error { _, err := amqpdedup.NewConsumer("http://x", "q", w); return err },
		"empty queue": func() error { _, err := amqpdedup.NewConsumer(testenv.DefaultRabbitMQURL, "", w); return err },
		"nil wrapper": func() error { _, err := amqpdedup.NewConsumer(testenv.DefaultRabbitMQURL, "q", nil); return err },
		"prefetch 0": func() error {
			_, err := amqpdedup.NewConsumer(testenv.DefaultRabbitMQURL, "q", w, amqpdedup.WithPrefetch(0))
			return err
		},
		"batch size 0": func() error {
			_, err := amqpdedup.NewConsumer(testenv.DefaultRabbitMQURL, "q", w, amqpdedup.WithBatchSize(0))
			return err
		},
		"negative linger": func() error {
			_, err := amqpdedup.NewConsumer(testenv.DefaultRabbitMQURL, "q", w, amqpdedup.WithLinger(-time.Millisecond))
			return err
		},
		"nil routing key": func() error {
			_, err := amqpdedup.NewSink(testenv.DefaultRabbitMQURL, amqpdedup.WithRoutingKey(nil))
			return err
		},
	} {
		if !errors.Is(build(), dedup.ErrConfig) {
			t.Errorf("%s: want ErrConfig", name)
		}
	}
}

// A consumer of a queue that does not exist says so, at WARN and in
// Health, until the queue appears; then it consumes, and Health clears. A
// clean shutdown logs no lost connection.
func TestHealthReportsAMissingQueue(t *testing.T) {
	b := newBroker(t)
	q := "dedup-test-missing-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	got := adaptertest.NewEffects()
	logs := &logCount{}
	c := b.consumerAt(b.url, q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
		got.Apply(d.MessageId)
		return nil
	}, []amqpdedup.Opt{amqpdedup.WithLogger(slog.New(logs))})
	stop := run(t, c)
	adaptertest.WaitFor(t, effectDeadline, "Health to report the missing queue", func() bool { return c.Health() != nil })
	var amqpErr *amqp.Error
	if err := c.Health(); !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound {
		t.Fatalf("Health = %v, want an error wrapping the broker's 404", err)
	}
	if logs.count("amqpdedup: cannot consume the queue") == 0 {
		t.Fatal("no WARN about the missing queue")
	}
	for _, name := range []string{q, q + ".dlq"} {
		if _, err := b.ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = b.ch.QueueDelete(name, false, false, false) })
	}
	b.publish(q, "e-1", "x", nil)
	adaptertest.WaitFor(t, effectDeadline, "the event applied once the queue exists", func() bool { return got.Applied() == 1 })
	if err := c.Health(); err != nil {
		t.Fatalf("Health after consuming: %v", err)
	}
	stop()
	if n := logs.count("amqpdedup: consuming stopped"); n != 0 {
		t.Fatalf("a clean shutdown logged %d lost connections", n)
	}
}
