package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/deduptype"
)

// runAMQPNone consumes a queue of kind ("classic" or "quorum") on RabbitMQ
// with manual acknowledgements and the adapter's prefetch, acknowledging
// each delivery as it arrives, as the adapter does, with no dedup: what
// RabbitMQ and amqp091-go cost on their own.
func runAMQPNone(kind string) rowRun {
	return func(ctx context.Context, cfg config, m *meter) error {
		queue, drop, err := openAMQPQueue(ctx, cfg, m, kind)
		if err != nil {
			return err
		}
		defer drop()
		conn, err := amqp.Dial(cfg.AMQP)
		if err != nil {
			return fmt.Errorf("RabbitMQ at %s: %w", cfg.AMQP, err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Qos(amqpdedup.DefaultPrefetch, 0, false); err != nil {
			return err
		}
		m.begin()
		m.started()
		deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
		if err != nil {
			return ctxOr(ctx, err)
		}
		for d := range deliveries {
			if err := d.Ack(false); err != nil {
				return ctxOr(ctx, err)
			}
			m.settle(dedup.OutcomeProcessed, 1)
		}
		return ctxOr(ctx, errors.New("RabbitMQ stopped the deliveries"))
	}
}

// runAMQP consumes a queue of kind on RabbitMQ through amqpdedup.Consumer
// with its defaults over PostgreSQL: deliveries that arrive together (up to
// half the prefetch) claimed in one store call and completed together.
// Its letters would go to a memory sink, so no dead-letter queue is checked;
// and a duplicate whose original is still running in another batch comes
// back after 200 ms rather than the default 5 s, as in the SQS rows.
func runAMQP(name, kind string) rowRun {
	return func(ctx context.Context, cfg config, m *meter) error {
		queue, drop, err := openAMQPQueue(ctx, cfg, m, kind)
		if err != nil {
			return err
		}
		defer drop()
		w, closeStore, err := wrapPostgres(ctx, cfg, m, name, amqpdedup.Messages(queue))
		if err != nil {
			return err
		}
		defer closeStore()
		c, err := amqpdedup.NewConsumer(cfg.AMQP, queue, w,
			amqpdedup.WithDeadLetterQueue(""),
			amqpdedup.WithInFlightDelay(200*time.Millisecond))
		if err != nil {
			return err
		}
		m.begin()
		m.started()
		return c.Run(ctx)
	}
}

// openAMQPQueue declares a durable queue of kind under a name of its own,
// fills it with the row's events and returns its name and a function that
// deletes it.
func openAMQPQueue(ctx context.Context, cfg config, m *meter, kind string) (string, func(), error) {
	conn, err := amqp.Dial(cfg.AMQP)
	if err != nil {
		return "", nil, fmt.Errorf("RabbitMQ at %s: %w (run `make services`)", cfg.AMQP, err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return "", nil, err
	}
	queue := "dedupbench-" + deduptype.NewOwnerToken()[:12]
	m.queue = queue
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": kind}); err != nil {
		conn.Close()
		return "", nil, fmt.Errorf("declare %s queue %s: %w", kind, queue, err)
	}
	drop := func() {
		// On a channel of its own: an error closes the one it happens on.
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
		conn.Close()
	}
	if err := publishEvents(ctx, ch, queue, cfg); err != nil {
		drop()
		return "", nil, err
	}
	return queue, drop, nil
}

// publishWindow is how many events a row's fill publishes before it waits
// for the broker to acknowledge them: a bounded number in flight.
const publishWindow = 1000

// publishAll publishes the events with publish, which returns a wait for
// the broker's acknowledgement of the event, and waits for them every
// publishWindow events and at the end.
func publishAll(events []int, publish func(event int) (wait func() error, err error)) error {
	waits := make([]func() error, 0, publishWindow)
	acked := func() error {
		for _, wait := range waits {
			if err := wait(); err != nil {
				return err
			}
		}
		waits = waits[:0]
		return nil
	}
	for _, i := range events {
		wait, err := publish(i)
		if err != nil {
			return err
		}
		if waits = append(waits, wait); len(waits) == publishWindow {
			if err := acked(); err != nil {
				return err
			}
		}
	}
	return acked()
}

// publishEvents publishes the row's events in eventOrder to queue, each
// with its ID as message_id, persistent, and waits until the broker has
// confirmed them all and the queue holds them.
func publishEvents(ctx context.Context, ch *amqp.Channel, queue string, cfg config) error {
	err := publishAll(eventOrder(cfg.Records, cfg.Unique), func(i int) (func() error, error) {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: eventID(i), Body: eventBody(i), ContentType: "application/json", DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			return nil, fmt.Errorf("publish events to %s: %w", queue, err)
		}
		return func() error {
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("publish events to %s: the broker refused one", queue)
			}
			return err
		}, nil
	})
	if err != nil {
		return err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return err
	}
	if q.Messages != cfg.Records {
		return fmt.Errorf("queue %s holds %d messages, want %d", queue, q.Messages, cfg.Records)
	}
	return nil
}
