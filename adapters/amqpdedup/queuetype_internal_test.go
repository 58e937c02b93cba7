package amqpdedup

import (
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup/internal/amqpconn"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The probe tells a quorum queue from a classic one, with or without
// arguments of their own, and says when the queue is missing; it takes
// no message from a classic queue for good.
func TestProbeQuorum(t *testing.T) {
	t.Parallel()
	url := testenv.RabbitMQURL(t)
	ch, err := testenv.RabbitMQ(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind string
		args amqp.Table
	}{
		{"classic", nil},
		{"classic", amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "", "x-max-length": int64(1000)}},
		{"quorum", amqp.Table{"x-queue-type": "quorum"}},
		{"quorum", amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-delivery-limit": int64(10)}},
	} {
		q := "dedup-probe-" + strings.ToLower(rand.Text()[:12])
		if _, err := ch.QueueDeclare(q, true, false, false, false, tc.args); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
		if err := ch.PublishWithContext(t.Context(), "", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		quorum, err := probeQuorum(url, amqpconn.DefaultConfig(), q)
		if err != nil || quorum != (tc.kind == "quorum") {
			t.Errorf("%s queue %v: quorum %v, %v", tc.kind, tc.args, quorum, err)
		}
		// A message the probe of a classic queue was sent returns to the
		// queue as its connection closes.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.Messages == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s queue after the probe: %d messages ready, want the 1 published", tc.kind, st.Messages)
			}
		}
	}
	_, err = probeQuorum(url, amqpconn.DefaultConfig(), "dedup-probe-missing-"+strings.ToLower(rand.Text()[:12]))
	if amqpErr := (*amqp.Error)(nil); !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound {
		t.Errorf("probe of a missing queue: %v, want the broker's 404", err)
	}
}
