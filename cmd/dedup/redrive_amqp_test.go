package main

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// redriveWait bounds the wait for a consumer's effect: long, so that a
// loaded machine slows a test down without failing it.
const redriveWait = 90 * time.Second

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// redriven is a test's handler once its bug is fixed: it counts each
// event's runs and keeps the body and redrive count each run saw.
type redriven struct {
	fixed atomic.Bool
	fx    *adaptertest.Effects
	mu    sync.Mutex
	seen  map[string][2]string // event ID -> body, x-dedup-redrive-count
}

func newRedriven() *redriven {
	return &redriven{fx: adaptertest.NewEffects(), seen: map[string][2]string{}}
}

func (h *redriven) handle(id, body, count string) error {
	if !h.fixed.Load() {
		return dedup.Permanent(errors.New("bug: cannot parse v2 orders"))
	}
	h.fx.Call(id)
	h.fx.Apply(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[id] = [2]string{body, count}
	return nil
}

func (h *redriven) saw(id string) [2]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[id]
}

// parkedRecord claims and fails for good the record of id, as the wrapper
// does before it parks a letter.
func parkedRecord(t *testing.T, store dedup.Store, key dedup.Key) {
	t.Helper()
	ctx := context.Background()
	c, err := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, store.Fail(ctx, key, c.Record.Owner, dedup.Failure{Final: true, Error: "bug", TTL: time.Hour}))
}

// A RabbitMQ dead letter goes back to its origin queue once the bug is
// fixed: a dry run lists it and leaves the dead-letter queue as it was, in
// its order; -yes resets its record, the consumer runs it exactly once and
// it leaves the dead-letter queue; -reason and the loop guard leave the
// other letters in place, in their order, until a run chooses them. Both
// queue types keep the order of the letters a redrive requeues.
func TestRedriveAMQP(t *testing.T) {
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) { testRedriveAMQP(t, kind) })
	}
}

func testRedriveAMQP(t *testing.T, kind string) {
	ctx := context.Background()
	url := testenv.RabbitMQURL(t)
	ch, err := testenv.RabbitMQ(t).Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	queue := "dedup-redrive-" + strings.ToLower(rand.Text()[:12])
	dlq := queue + ".dlq"
	for _, q := range []string{queue, dlq} {
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}
	depth := func(q string) int {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		require.NoError(t, err)
		return info.Messages
	}
	// peek returns the message IDs the dead-letter queue holds, in order,
	// and leaves them there.
	peek := func() []string {
		var ids []string
		var last uint64
		for {
			d, ok, err := ch.Get(dlq, false)
			require.NoError(t, err)
			if !ok {
				break
			}
			ids, last = append(ids, d.MessageId), d.DeliveryTag
		}
		if last > 0 {
			require.NoError(t, ch.Nack(last, true, true))
		}
		return ids
	}

	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("amqp-redrive", "apply")
	sink, err := amqpdedup.NewSink(url)
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	h := newRedriven()
	w, err := dedup.Wrap(store, amqpdedup.Messages(queue), func(_ context.Context, d amqp.Delivery) error {
		return h.handle(d.MessageId, string(d.Body), tableText(d.Headers[redriveCountHeader]))
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithObserver(h.fx.Observe), dedup.WithLogger(quietLog()))
	require.NoError(t, err)
	c, err := amqpdedup.NewConsumer(url, queue, w, amqpdedup.WithLogger(quietLog()))
	require.NoError(t, err)
	running := adaptertest.Start(t, c.Run)

	// The poison message, dead-lettered by the consumer.
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{MessageId: "p1", Body: []byte("v-p1"), DeliveryMode: amqp.Persistent})
	require.NoError(t, err)
	require.True(t, dc.Wait())
	adaptertest.WaitFor(t, redriveWait, "p1 dead-lettered", func() bool { return h.fx.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	// Two more letters of the same queue: one redriven thrice already, one
	// of another reason.
	for _, l := range []struct {
		id     string
		reason dedup.Reason
		count  string
	}{{"looping", dedup.ReasonPermanent, "3"}, {"other", dedup.ReasonHandlerError, ""}} {
		key := dedup.Key{Scope: scope, EventID: l.id}
		parkedRecord(t, store, key)
		dl := dedup.DeadLetter{Payload: []byte("v-" + l.id), Reason: l.reason, Error: "bug", Attempts: 1, EventID: l.id,
			Scope: scope, LastFailure: time.Now(), Origin: dedup.Origin{Queue: queue, MessageID: l.id}}
		if l.count != "" {
			dl.Headers = []dedup.Header{{Key: redriveCountHeader, Value: []byte(l.count)}}
		}
		require.NoError(t, sink.Send(ctx, dl))
	}
	letters := []string{"p1", "looping", "other"}
	require.Equal(t, letters, peek())

	redrive := func(extra ...string) string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"redrive", "amqp", "-amqp", url, "-dlq", dlq,
			"-postgres", dsn, "-table", table}, extra...)...)
		require.Equal(t, 0, code, errOut)
		return out
	}
	out := redrive()
	require.Contains(t, out, "3 dead letters read, would send back 2, skipped 1")
	require.Contains(t, out, "p1 (permanent, "+dlq+"#1) back to queue "+queue)
	require.Contains(t, out, "redriven 3 times already")
	require.Equal(t, letters, peek(), "a dry run leaves the dead-letter queue as it was")
	rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: "p1"})
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status, "a dry run resets nothing")

	h.fixed.Store(true) // the bug is fixed and deployed
	out = redrive("-yes", "-reason", "permanent")
	require.Contains(t, out, "3 dead letters read, sent back 1, skipped 2")
	require.Contains(t, out, "redriven 3 times already (-max-redrives): "+dlq+"#2")
	require.Contains(t, out, "reason handler-error not chosen (-reason): "+dlq+"#3")
	adaptertest.WaitFor(t, redriveWait, "p1 run again", func() bool { return h.fx.Count("p1") == 1 })
	require.Equal(t, []string{"looping", "other"}, peek(), "the skipped letters stay, in their order")

	out = redrive("-yes")
	require.Contains(t, out, "2 dead letters read, sent back 1, skipped 1")
	adaptertest.WaitFor(t, redriveWait, "other run again", func() bool { return h.fx.Count("other") == 1 })
	out = redrive("-yes", "-max-redrives", "5")
	require.Contains(t, out, "1 dead letters read, sent back 1, skipped 0")
	adaptertest.WaitFor(t, redriveWait, "looping run again", func() bool { return h.fx.Count("looping") == 1 })

	running.StopClean(t) // every delivery settled: a second copy would be counted or still queued
	require.Equal(t, 0, depth(queue))
	require.Equal(t, 0, depth(dlq), "the dead-letter queue is drained")
	for id, count := range map[string]string{"p1": "1", "other": "1", "looping": "4"} {
		require.Equal(t, 1, h.fx.Calls(id), "%s ran once", id)
		require.Equal(t, [2]string{"v-" + id, count}, h.saw(id), "%s: its body, and its redrive count", id)
		rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status, id)
	}
	out = redrive("-yes")
	require.Contains(t, out, "0 dead letters read, sent back 0, skipped 0")
}

// A dead-letter queue that does not exist is a clear failure.
func TestRedriveAMQPUnknownQueue(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	dsn, table, _, _ := postgresTable(t)
	code, _, errOut := cli(t, "redrive", "amqp", "-amqp", url, "-dlq", "no-such-queue.dlq", "-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "queue no-such-queue.dlq")
	require.Contains(t, errOut, "NOT_FOUND")
}

// The new redrives are used as the others: -dlq is required.
func TestRedriveAMQPNATSUsage(t *testing.T) {
	for _, args := range [][]string{
		{"redrive", "amqp", "-postgres", "postgres://x"},
		{"redrive", "nats", "-postgres", "postgres://x"},
		{"redrive", "nats", "-dlq", "DLQ", "-postgres", "postgres://x", "-max-redrives", "0"},
	} {
		code, _, errOut := cli(t, args...)
		require.Equal(t, 2, code, "%q", args)
		require.Contains(t, errOut, "dedup redrive: usage", "%q", args)
	}
}
