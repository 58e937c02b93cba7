package amqpdedup_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The wrapper's retry and dead-letter lines name a RabbitMQ delivery by its
// queue, exchange, routing key, delivery tag and message ID, and the key as
// scope/id without inner quotes; a delivery without an ID, whose key is
// empty, is named by the same coordinates. The letters carry the delivery
// tag the lines name.
func TestLogsNameTheDelivery(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("classic")
	logs := testenv.NewJSONLogs(t)
	var flaky atomic.Int32
	c := b.consumer(q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
		if d.MessageId == "flaky" && flaky.Add(1) == 1 {
			return errPoison
		}
		if d.MessageId == "poison" {
			return dedup.Permanent(errPoison)
		}
		return nil
	}, dedup.WithLogger(logs.Logger(slog.LevelDebug)))
	run(t, c)
	b.publish(q, "flaky", "{}", nil)
	b.publish(q, "poison", "{}", nil)
	b.publish(q, "", "{}", nil)
	adaptertest.WaitFor(t, effectDeadline, "two letters in "+q+".dlq", func() bool { return b.depth(q+".dlq") == 2 })
	adaptertest.WaitFor(t, effectDeadline, "the flaky delivery's second attempt", func() bool { return flaky.Load() >= 2 })

	scope := "amqp-test/" + q
	tag := func(line map[string]any) string {
		t.Helper()
		origin, _ := line["origin"].(map[string]any)
		for k, want := range map[string]any{"queue": q, "exchange": "", "routing_key": q} {
			if origin[k] != want {
				t.Errorf("%s: origin %s = %#v, want %q", line["msg"], k, origin[k], want)
			}
		}
		n, _ := origin["delivery_tag"].(float64)
		if n < 1 {
			t.Errorf("%s: origin delivery_tag %#v, want a delivery tag", line["msg"], origin["delivery_tag"])
		}
		if line["key"] != "" && origin["message_id"] == nil {
			t.Errorf("%s: origin without the message ID: %v", line["msg"], origin)
		}
		return strconv.FormatUint(uint64(n), 10)
	}

	retried := logs.Lines("dedup: attempt failed, will retry")
	if len(retried) != 1 || retried[0]["key"] != scope+"/flaky" {
		t.Fatalf("retry lines %v, want one of key %s/flaky", retried, scope)
	}
	tag(retried[0])
	parked := map[any]map[string]any{}
	for _, l := range logs.Lines("dedup: message dead-lettered") {
		parked[l["reason"]] = l
	}
	poison, invalid := parked[string(dedup.ReasonPermanent)], parked[string(dedup.ReasonInvalidID)]
	if len(parked) != 2 || poison["key"] != scope+"/poison" || invalid["key"] != "" {
		t.Fatalf("dead-letter lines %v, want key %s/poison (permanent) and an invalid-id one", parked, scope)
	}
	tags := map[string]string{"poison": tag(poison), "": tag(invalid)}
	for _, l := range b.letters(q + ".dlq") {
		if got, want := header(l, "dedup-origin-delivery-tag"), tags[header(l, "dedup-event-id")]; got != want {
			t.Errorf("letter of %q: dedup-origin-delivery-tag %q, want %q as logged", header(l, "dedup-event-id"), got, want)
		}
	}
}
