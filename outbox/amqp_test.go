package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/amqpoutbox"
)

// amqpRelay returns a relay of e's outbox publishing to the test RabbitMQ.
func amqpRelay(t *testing.T, e *env) *outbox.Relay {
	t.Helper()
	pub, err := amqpoutbox.NewPublisher(testenv.RabbitMQURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := outbox.NewRelay(e.ob, e.pool.Config(), pub,
		outbox.WithPollInterval(50*time.Millisecond),
		outbox.WithBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 100*time.Millisecond)),
		outbox.WithLogger(quietLogger()))
	require.NoError(t, err)
	return r
}

// rabbitQueue declares a queue of the test's own, deleted when it ends.
func rabbitQueue(t *testing.T, ch *amqp.Channel) string {
	t.Helper()
	q := "outbox-test-" + runID()
	_, err := ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	return q
}

// Committed events reach their queue once each, in commit order per key,
// with their ID, headers and tenant; a rolled-back one never; an event the
// broker can route nowhere fails for good, naming why, without holding the
// others back.
func TestAMQPRelay(t *testing.T) {
	e := newEnv(t, 1)
	ch, err := testenv.RabbitMQ(t).Channel()
	require.NoError(t, err)
	q := rabbitQueue(t, ch)
	var ids []string
	for i := range 30 {
		ids = append(ids, e.add(true, outbox.Event{Destination: q, Key: []byte(fmt.Sprint("k", i%3)),
			Payload: []byte(fmt.Sprint(i)), Tenant: "acme", Headers: []outbox.Header{{Key: "trace", Value: []byte("t1")}}})...)
	}
	e.add(false, outbox.Event{Destination: q, Payload: []byte("rolled back")})
	lost := e.add(true, outbox.Event{Destination: "no-such-queue-" + runID(), Payload: []byte("p")})[0]
	e.start(amqpRelay(t, e), amqpRelay(t, e))

	waitFor(t, 60*time.Second, "all sent or failed", func() bool {
		s := e.statuses()
		return s["sent"] == 30 && s["failed"] == 1
	})
	var got []amqp.Delivery
	for {
		d, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if !ok {
			break
		}
		got = append(got, d)
	}
	require.Len(t, got, 30)
	perKey := map[string][]string{}
	for _, d := range got {
		require.Equal(t, "acme", d.Headers["tenant"])
		require.Equal(t, "t1", d.Headers["trace"])
		var i int
		_, err := fmt.Sscan(string(d.Body), &i)
		require.NoError(t, err)
		require.Equal(t, ids[i], d.MessageId)
		k := fmt.Sprint("k", i%3)
		perKey[k] = append(perKey[k], d.MessageId)
	}
	for k := range 3 {
		var want []string
		for i := k; i < 30; i += 3 {
			want = append(want, ids[i])
		}
		require.Equal(t, want, perKey[fmt.Sprint("k", k)], "commit order of key k%d", k)
	}
	failed, err := e.ob.Failed(context.Background(), e.pool, 10)
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, lost, failed[0].ID)
	require.True(t, strings.Contains(failed[0].LastError, "unroutable"), "reason: %s", failed[0].LastError)
}
