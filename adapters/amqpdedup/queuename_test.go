package amqpdedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// The queue's name is given once, to NewConsumer: with Messages("") the
// letter of a poison message goes to the consumed queue's ".dlq" with that
// queue as its origin. With Messages of another queue, the letter goes
// there too, and Health reports the mismatch as a configuration error
// naming both queues.
func TestQueueNameGivenOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, messagesQueue string }{
		{"empty", ""},
		{"mismatch", "another-queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			q := b.queue("classic")
			sink, err := amqpdedup.NewSink(b.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sink.Close() })
			w, err := dedup.Wrap(dedup.NewMemoryStore(), amqpdedup.Messages(tc.messagesQueue),
				func(context.Context, amqp.Delivery) error { return dedup.Permanent(errPoison) },
				dedup.WithSink(sink), dedup.WithScope("amqp-test/"+q), dedup.WithLogger(quiet()))
			if err != nil {
				t.Fatal(err)
			}
			c, err := amqpdedup.NewConsumer(b.url, q, w, amqpdedup.WithLogger(quiet()))
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			b.publish(q, "poison", "{}", nil)
			adaptertest.WaitFor(t, effectDeadline, "the letter in "+q+".dlq", func() bool { return b.depth(q+".dlq") > 0 })
			letters := b.letters(q + ".dlq")
			if len(letters) != 1 {
				t.Fatalf("%d letters, want 1", len(letters))
			}
			if got := header(letters[0], "dedup-origin-queue"); got != q {
				t.Fatalf("letter from queue %q, want %q", got, q)
			}
			err = c.Health()
			if tc.messagesQueue == "" {
				if err != nil {
					t.Fatalf("Health: %v", err)
				}
				return
			}
			if !errors.Is(err, dedup.ErrConfig) || !strings.Contains(err.Error(), `"another-queue"`) || !strings.Contains(err.Error(), `"`+q+`"`) {
				t.Fatalf("Health = %v, want a dedup.ErrConfig naming both queues", err)
			}
		})
	}
}
