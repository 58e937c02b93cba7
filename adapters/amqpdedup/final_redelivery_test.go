package amqpdedup_test

import (
	"context"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its queue by hand (its body, message ID and
// every header copied, as a shovel or the management UI's move does) while
// its event is FAILED_FINAL is dead-lettered again with reason
// redelivered-after-final, without running and with the record left alone,
// and a WARN names the key and the release command; a plain copy of the
// event is acked with a WARN and no letter. Once released, the letter moved
// back runs. On a classic and a quorum queue.
func TestFinalRedelivery(t *testing.T) {
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			b := newBroker(t)
			q := b.queue(kind)
			store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, adaptertest.NewEffects()
			var mended atomic.Bool
			run(t, b.consumer(q, store, func(_ context.Context, d amqp.Delivery) error {
				fx.Call(d.MessageId)
				if string(d.Body) == "poison" && !mended.Load() {
					return dedup.Permanent(errPoison)
				}
				fx.Apply(d.MessageId)
				return nil
			}, dedup.WithLogger(slog.New(logs)), dedup.WithObserver(fx.Observe)))
			key := dedup.Key{Scope: "amqp-test/" + q, EventID: "bad-1"}

			b.publish(q, "bad-1", "poison", amqp.Table{"trace-id": "t-1"})
			letter := b.takeLetters(q, 1)[0]
			final := adaptertest.WaitFinal(t, store, key)

			// A plain copy, then the letter moved back.
			b.publish(q, "bad-1", "poison", nil)
			b.moveBack(q, letter)
			adaptertest.WaitFor(t, effectDeadline, "the copy and the letter moved back settled", func() bool {
				return fx.Settled("bad-1") == 3 && b.depth(q) == 0
			})
			again := b.takeLetters(q, 1)[0]
			for k, v := range map[string]string{
				"dedup-reason":       string(dedup.ReasonRedeliveredAfterFinal),
				"dedup-event-id":     "bad-1",
				"dedup-scope":        key.Scope,
				"dedup-attempts":     "1",
				"dedup-cause":        errPoison.Error(),
				"dedup-origin-queue": q,
				"trace-id":           "t-1",
			} {
				if got := header(again, k); got != v {
					t.Errorf("second letter's %s = %q, want %q", k, got, v)
				}
			}
			if string(again.Body) != "poison" || again.MessageId != "bad-1" {
				t.Errorf("second letter %s %q, want the original bad-1 poison", again.MessageId, again.Body)
			}
			if n := fx.Calls("bad-1"); n != 1 {
				t.Errorf("the handler ran %d times for bad-1, want its original attempt only", n)
			}
			if rec, err := store.Get(context.Background(), key); err != nil || !reflect.DeepEqual(rec, final) {
				t.Errorf("record after the letter came back: %+v (%v), want it unchanged: %+v", rec, err, final)
			}
			requireFinalWarnings(t, logs, key)

			// Released, the letter moved back once more runs.
			mended.Store(true)
			if done, err := store.Forget(context.Background(), key, final.Owner); err != nil || !done {
				t.Fatalf("release: %v, %v", done, err)
			}
			b.moveBack(q, again)
			adaptertest.WaitFor(t, effectDeadline, "the released event applied", func() bool { return fx.Count("bad-1") == 1 })
		})
	}
}

// takeLetters waits until queue's dead-letter queue holds n letters, takes
// them, and fails t if it held more.
func (b *broker) takeLetters(queue string, n int) []amqp.Delivery {
	b.t.Helper()
	adaptertest.WaitFor(b.t, effectDeadline, "the dead letters", func() bool { return b.depth(queue+".dlq") >= n })
	letters := b.letters(queue + ".dlq")
	if len(letters) != n {
		b.t.Fatalf("%d dead letters, want %d", len(letters), n)
	}
	return letters
}

// moveBack publishes d, a letter taken from a dead-letter queue, to queue
// as a shovel does: its body, properties and every header.
func (b *broker) moveBack(queue string, d amqp.Delivery) {
	b.t.Helper()
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		b.t.Fatal(err)
	}
	if !dc.Wait() {
		b.t.Fatalf("move %s back to %s: not confirmed", d.MessageId, queue)
	}
}

// requireFinalWarnings checks the two WARNs of key's deliveries after it
// failed for good: one for the plain copy, one for the letter moved back,
// each naming the key and the release command.
func requireFinalWarnings(t *testing.T, logs *testenv.Logs, key dedup.Key) {
	t.Helper()
	release := "dedup release -scope " + key.Scope + " -id " + key.EventID + " -yes"
	for _, msg := range []string{
		"dedup: event already dead-lettered; this copy is acknowledged without running",
		"dedup: a dead letter came back to its origin while its event is failed for good; dead-lettered again without running",
	} {
		warned := logs.Attrs(slog.LevelWarn, msg)
		if len(warned) != 1 || warned[0]["key"] != key.String() || warned[0]["release"] != release {
			t.Errorf("WARN %q logged as %v, want once with key %s and release %q", msg, warned, key, release)
		}
	}
}
