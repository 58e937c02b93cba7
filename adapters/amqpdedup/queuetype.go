package amqpdedup

import (
	"errors"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/amqpconn"
)

// probeQuorum finds out whether queue is a quorum queue, the only kind
// whose deliveries carry a delivery count the broker wrote. AMQP 0-9-1 has
// no way to read a queue's type (a passive declare returns its counts only,
// and a declare with an x-queue-type argument fails on any other argument
// the queue was declared with), but RabbitMQ refuses a consumer on a channel
// whose prefetch is global for a quorum (or stream) queue, with
// NOT_IMPLEMENTED, and accepts it for a classic one. So probeQuorum asks, on
// a connection of its own, which the refusal closes: a classic queue's
// probe consumer is cancelled and its connection closed at once (a message
// sent to it in that instant returns to the queue, marked redelivered). An
// error is any other answer (the broker unreachable, the queue missing);
// when the broker refuses the global prefetch itself, the queue is taken
// as classic: the store alone counts attempts.
func probeQuorum(url string, cfg amqp.Config, queue string) (bool, error) {
	conn, err := amqpconn.Dial(url, cfg, "amqpdedup probe "+queue)
	if err != nil {
		return false, fmt.Errorf("amqpdedup: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("amqpdedup: open a channel: %w", err)
	}
	if err := ch.Qos(1, 0, true); err != nil {
		return false, nil // no global prefetch: nothing tells a quorum queue
	}
	const tag = "amqpdedup-probe"
	_, err = ch.Consume(queue, tag, false, false, false, false, nil)
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		_ = ch.Cancel(tag, false)
		return false, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotImplemented:
		return true, nil
	}
	return false, fmt.Errorf("amqpdedup: consume queue %q: %w", queue, err)
}

// delivered is the Acknowledger of a delivery a [Consumer] hands to its
// wrapper: the channel's, with what the Consumer knows of its queue, which
// [Messages] reads.
type delivered struct {
	amqp.Acknowledger
	c      *Consumer
	quorum bool // whether the queue writes x-delivery-count
}

// deliveredBy returns what the Consumer that delivered d knows of its
// queue, or nil when no Consumer did.
func deliveredBy(d amqp.Delivery) *delivered {
	x, _ := d.Acknowledger.(*delivered)
	return x
}

// queueOf returns the queue d came from: its Consumer's, when a Consumer
// delivered it, else named, the queue given to [Messages]. A Consumer
// whose queue is not named (nor "") is told so.
func queueOf(d amqp.Delivery, named string) string {
	by := deliveredBy(d)
	if by == nil {
		return named
	}
	if named != by.c.queue && named != "" {
		by.c.misnamed(named)
	}
	return by.c.queue
}

// misnamed records that the wrapper reads c's deliveries with the Messages
// of another queue, named: the first time, it logs it at ERROR and Health
// reports it from then on.
func (c *Consumer) misnamed(named string) {
	if c.mismatch.Err() != nil {
		return
	}
	err := fmt.Errorf("%w: amqpdedup: the wrapper reads deliveries with Messages(%q) but the Consumer consumes queue %q: "+
		"give both the same name (letters go to the consumed queue's dead-letter queue meanwhile)", dedup.ErrConfig, named, c.queue)
	c.mismatch.Found(c.log, err, slog.String("messages_queue", named))
}
