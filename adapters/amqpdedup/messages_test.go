package amqpdedup_test

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup/adapters/amqpdedup"
)

func TestMessagesReadsTheDelivery(t *testing.T) {
	at := time.Date(2026, 12, 5, 1, 2, 3, 0, time.UTC)
	d := amqp.Delivery{
		MessageId: "order-1", Body: []byte(`{"cents":100}`), Exchange: "orders", RoutingKey: "eu.orders", Timestamp: at,
		Headers: amqp.Table{"x-delivery-count": int64(2), "order-id": []byte("o-9"), "n": int32(7),
			"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	m := amqpdedup.Messages("orders-q")
	if id, err := m.EventID(d); err != nil || id != "order-1" {
		t.Fatalf("EventID = %q, %v", id, err)
	}
	d.Redelivered = true
	if got := m.Attempts(d); got != 0 {
		t.Fatalf("Attempts of a delivery no Consumer handed over, with x-delivery-count 2 = %d, want 0 (a publisher may have written it)", got)
	}
	d.Redelivered = false
	dl := m.DeadLetter(d)
	o := dl.Origin
	if o.Queue != "orders-q" || o.Exchange != "orders" || o.RoutingKey != "eu.orders" || o.MessageID != "order-1" || !o.Timestamp.Equal(at) {
		t.Fatalf("origin %+v", o)
	}
	if string(dl.MessageKey) != "eu.orders" || string(dl.Payload) != `{"cents":100}` {
		t.Fatalf("letter key %q payload %q", dl.MessageKey, dl.Payload)
	}
	headers := map[string]string{}
	for _, h := range dl.Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers["order-id"] != "o-9" || headers["n"] != "7" || headers["x-delivery-count"] != "2" {
		t.Fatalf("letter headers %v", headers)
	}
	if got := m.TraceCarrier(d).Get("traceparent"); got == "" {
		t.Fatal("the carrier does not read traceparent")
	}

	byHeader := amqpdedup.Messages("q", amqpdedup.WithIDHeader("order-id"))
	if id, err := byHeader.EventID(d); err != nil || id != "o-9" {
		t.Fatalf("WithIDHeader: %q, %v", id, err)
	}
	for name, bad := range map[string]amqp.Delivery{
		"no message_id":  {},
		"numeric header": {MessageId: "x", Headers: amqp.Table{"order-id": int64(5)}},
	} {
		src := amqpdedup.Messages("q")
		if name == "numeric header" {
			src = byHeader
		}
		if _, err := src.EventID(bad); !errors.Is(err, amqpdedup.ErrNoEventID) {
			t.Errorf("%s: %v, want ErrNoEventID", name, err)
		}
	}
	byFunc := amqpdedup.Messages("q", amqpdedup.WithIDFunc(func(d amqp.Delivery) (string, error) { return d.RoutingKey + "/" + d.MessageId, nil }))
	if id, _ := byFunc.EventID(d); id != "eu.orders/order-1" {
		t.Fatalf("WithIDFunc: %q", id)
	}
}
