package amqpdedup

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
)

// dlqRecheck is how often a missing dead-letter queue is looked for again.
const dlqRecheck = 10 * time.Second

// checkDLQ looks for the dead-letter queue on conn, records and logs what
// it found, and reports whether it is done: the queue found, or nothing to
// check. An error other than the queue not found (the connection lost)
// leaves the record as it was.
func (c *Consumer) checkDLQ(conn *amqp.Connection) (done bool) {
	if c.dlq == "" {
		return true
	}
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(c.dlq, true, false, false, false, nil)
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		c.dlqMissing.Fixed(c.log, "amqpdedup: the dead-letter queue exists now", slog.String("dead_letter_queue", c.dlq))
		return true
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
		missing := fmt.Errorf("%w: amqpdedup: dead-letter queue %q of queue %q does not exist: declare it (durable, of the type of %q), "+
			"or name the queue the Sink routes to with WithDeadLetterQueue; a poison delivery is retried until it exists",
			dedup.ErrConfig, c.dlq, c.queue, c.queue)
		c.dlqMissing.Found(c.log, missing, slog.String("dead_letter_queue", c.dlq))
	}
	return false
}
