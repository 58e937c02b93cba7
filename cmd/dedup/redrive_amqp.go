package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/amqpconn"
)

// redriveAMQP sends the dead letters of a RabbitMQ queue back to the queues
// they came from. It reads the letters the queue held when it started, one
// basic.get at a time with manual acknowledgement, and acknowledges a letter
// only once the broker confirmed its copy on the origin queue. The letters
// it skips, and every letter of a dry run, stay unacknowledged until the end
// and are then requeued, in their order; a redrive that stops halfway (or
// dies) leaves them, and the letter in flight, in the queue.
func redriveAMQP(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive amqp")
	url := fs.String("amqp", env("DEDUP_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (DEDUP_RABBITMQ_URL)")
	dlq := fs.String("dlq", "", "the dead-letter queue to drain, such as orders.dlq (required)")
	var r redrive
	if err := r.start(ctx, fs, args, "dlq"); err != nil {
		return err
	}
	defer r.close()
	conn, err := amqpconn.Dial(*url, amqpconn.DefaultConfig(), "dedup redrive")
	if err != nil {
		return fmt.Errorf("cannot reach RabbitMQ: %w", err)
	}
	defer conn.Close()
	get, err := conn.Channel() // reads and settles the letters
	if err != nil {
		return err
	}
	q, err := get.QueueDeclarePassive(*dlq, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("queue %s: %w", *dlq, err)
	}
	pub, err := conn.Channel() // sends them back, confirmed
	if err == nil {
		err = pub.Confirm(false)
	}
	if err != nil {
		return err
	}
	// One message is in flight at a time, and the broker returns an
	// unroutable one before it confirms it: one slot is enough.
	returns := pub.NotifyReturn(make(chan amqp.Return, 1))

	var kept uint64 // the last letter left unacknowledged: every one up to it goes back at the end
	defer func() {
		if kept > 0 {
			_ = get.Nack(kept, true, true)
		}
	}()
	left := q.Messages // letters that come after the start, sent back and parked again among them, wait for the next run
	next := func() ([]amqp.Delivery, error) {
		if left == 0 {
			return nil, nil
		}
		d, ok, err := get.Get(*dlq, false)
		if err != nil || !ok {
			return nil, err
		}
		left--
		return []amqp.Delivery{d}, nil
	}
	return drain(ctx, &r, out, next, func(d amqp.Delivery) error {
		sent, err := r.amqpLetter(ctx, pub, returns, *dlq, d, out)
		if sent {
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("sent %s#%d back but could not remove it from %s (a second redrive sends it again, and the consumer's dedup answers it): %w",
					*dlq, d.DeliveryTag, *dlq, err)
			}
		} else {
			kept = d.DeliveryTag
		}
		return err
	})
}

// amqpLetter redrives or skips one dead letter; sent reports that the broker
// confirmed its copy on the origin queue.
func (r *redrive) amqpLetter(ctx context.Context, pub *amqp.Channel, returns <-chan amqp.Return, dlq string, d amqp.Delivery, out io.Writer) (sent bool, err error) {
	r.sum.read++
	header := func(name string) string { return tableText(d.Headers[name]) }
	l := readLetter(fmt.Sprintf("%s#%d", dlq, d.DeliveryTag), header)
	l.origin = header("dedup-origin-queue")
	if send, err := r.admit(ctx, l, "queue "+l.origin, out); !send {
		return false, err
	}
	// Not the expiration, which could drop the copy, nor the user_id,
	// which the broker checks against the redrive's own user.
	back := amqp.Publishing{
		Headers: amqp.Table{redriveCountHeader: strconv.Itoa(l.redrives + 1)}, Body: d.Body,
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId,
	}
	for name, v := range d.Headers {
		if !strings.HasPrefix(name, dedup.MetadataPrefix) && name != redriveCountHeader && !brokerHeader(name) {
			back.Headers[name] = v
		}
	}
	// The default exchange routes to the queue named: the origin queue
	// alone, whatever other queues the original exchange feeds.
	dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", l.origin, true, false, back)
	if err == nil {
		var acked bool
		if acked, err = dc.WaitContext(ctx); err == nil && !acked {
			err = amqpconn.ErrNacked
		}
	}
	if err != nil {
		return false, fmt.Errorf("send %s back to queue %s: %w", l.key, l.origin, err)
	}
	select {
	case <-returns:
		r.sum.skip("its origin queue does not exist", l.where+" ("+l.origin+")")
		return false, nil
	default:
	}
	r.sum.sent++
	return true, nil
}

// tableText returns an AMQP header value as text: a string as it is, a
// number in decimal (RabbitMQ's tools may write a count as one).
func tableText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int32, int64, int:
		return fmt.Sprint(v)
	}
	return ""
}

// brokerHeader reports whether RabbitMQ owns the header name (it writes it
// on dead-lettering or redelivery): a copy sent back would lie.
func brokerHeader(name string) bool {
	return name == "x-death" || name == "x-delivery-count" ||
		strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}
