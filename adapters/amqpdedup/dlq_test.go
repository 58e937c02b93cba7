package amqpdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// With the queue's ".dlq" queue missing, Health reports it as soon as Run
// has connected, matching dedup.ErrConfig and naming the queue to declare,
// and an ERROR says so once; good deliveries are handled meanwhile. Once
// the queue is declared, Health is nil again. WithDeadLetterQueue names
// another queue to check, or none.
func TestMissingDeadLetterQueue(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := "dedup-test-" + strings.ToLower(rand.Text()[:12])
	if _, err := b.ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{q, q + ".dlq"} {
			_, _ = b.ch.QueueDelete(name, false, false, false)
		}
	})
	got := adaptertest.NewEffects()
	handle := func(_ context.Context, d amqp.Delivery) error {
		got.Apply(d.MessageId)
		return nil
	}
	logs := &logCount{}
	c := b.consumerAt(b.url, q, dedup.NewMemoryStore(), handle, []amqpdedup.Opt{amqpdedup.WithLogger(slog.New(logs))})
	stop := run(t, c)
	var herr error
	adaptertest.WaitFor(t, effectDeadline, "Health reporting the missing dead-letter queue", func() bool {
		herr = c.Health()
		return herr != nil
	})
	if !errors.Is(herr, dedup.ErrConfig) || !strings.Contains(herr.Error(), `"`+q+`.dlq"`) {
		t.Errorf("Health: %v, want ErrConfig naming %s.dlq", herr, q)
	}
	t.Logf("Health: %v", herr)
	b.publish(q, "good", "{}", nil)
	adaptertest.WaitFor(t, effectDeadline, "a good delivery handled meanwhile", func() bool { return got.Count("good") == 1 })
	if n := logs.count("dedup: invalid configuration: amqpdedup: dead-letter queue"); n != 1 {
		t.Errorf("%d ERRORs of the missing queue, want 1", n)
	}

	if _, err := b.ch.QueueDeclare(q+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, effectDeadline, "Health nil once the queue is declared", func() bool { return c.Health() == nil })
	if n := logs.count("amqpdedup: the dead-letter queue exists now"); n != 1 {
		t.Errorf("%d INFOs of the queue found, want 1", n)
	}
	stop()

	other := b.consumerAt(b.url, q, dedup.NewMemoryStore(), handle, []amqpdedup.Opt{amqpdedup.WithLogger(quiet()),
		amqpdedup.WithDeadLetterQueue(q + ".missing")})
	stop = run(t, other)
	adaptertest.WaitFor(t, effectDeadline, "Health reporting the queue WithDeadLetterQueue names", func() bool {
		err := other.Health()
		return err != nil && strings.Contains(err.Error(), q+".missing")
	})
	stop()

	if _, err := b.ch.QueueDelete(q+".dlq", false, false, false); err != nil {
		t.Fatal(err)
	}
	unchecked := b.consumerAt(b.url, q, dedup.NewMemoryStore(), handle, []amqpdedup.Opt{amqpdedup.WithLogger(quiet()),
		amqpdedup.WithDeadLetterQueue("")})
	stop = run(t, unchecked)
	b.publish(q, "good-2", "{}", nil)
	adaptertest.WaitFor(t, effectDeadline, "a delivery handled by the consumer checking nothing", func() bool { return got.Count("good-2") == 1 })
	if err := unchecked.Health(); err != nil {
		t.Errorf("Health of a consumer checking nothing: %v", err)
	}
	stop()
}
