package amqpdedup

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// x-delivery-count is read only from a quorum queue's redelivery handed
// over by a Consumer.
func TestAttemptsReadsOnlyTheBrokersCount(t *testing.T) {
	c := &Consumer{queue: "orders"}
	quorum, classic := &delivered{c: c, quorum: true}, &delivered{c: c}
	for _, tc := range []struct {
		name        string
		by          amqp.Acknowledger
		redelivered bool
		count       any
		want        int
	}{
		{"quorum, redelivered", quorum, true, int64(2), 3},
		{"quorum, redelivered, int32", quorum, true, int32(1), 2},
		{"quorum, first delivery, forged", quorum, false, int64(99), 0},
		{"quorum, redelivered, no count", quorum, true, nil, 0},
		{"quorum, redelivered, count as text", quorum, true, "99", 0},
		{"classic, redelivered, forged", classic, true, int64(99), 0},
		{"classic, first delivery, forged", classic, false, int64(99), 0},
		{"no consumer, redelivered", nil, true, int64(2), 0},
	} {
		d := amqp.Delivery{Acknowledger: tc.by, Redelivered: tc.redelivered, Headers: amqp.Table{}}
		if tc.count != nil {
			d.Headers[deliveryCountHeader] = tc.count
		}
		if got := attempts(d); got != tc.want {
			t.Errorf("%s: attempts %d, want %d", tc.name, got, tc.want)
		}
	}
}
