package sqsdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A dead letter moved back to its queue by hand (its body and every
// attribute copied, the packed dedup-metadata included, as a console's
// redrive would) while its event is FAILED_FINAL is dead-lettered again
// with reason redelivered-after-final, without running and with the record
// left alone, and a WARN names the key and the release command; a plain
// copy of the event is deleted with a WARN and no letter. Once released,
// the letter moved back runs.
func TestFinalRedelivery(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, dlq := queue(t, c), queue(t, c)
	store, logs, fx := dedup.NewMemoryStore(), &testenv.Logs{}, adaptertest.NewEffects()
	var mended atomic.Bool
	w := wrap(t, store, url, fx, func(_ context.Context, m types.Message) error {
		fx.Call(eventID(m))
		if aws.ToString(m.Body) == "poison" && !mended.Load() {
			return dedup.Permanent(errors.New("malformed refund"))
		}
		fx.Apply(eventID(m))
		return nil
	}, dedup.WithSink(newSink(t, c, dlq)), dedup.WithLogger(slog.New(logs)))
	start(t, c, url, w)
	key := dedup.Key{Scope: w.Scope(), EventID: "bad-1"}

	send(t, c, url, "bad-1", "poison", map[string]types.MessageAttributeValue{"trace-id": stringAttr("t-1")})
	letter := receiveLetters(t, c, dlq, 1)[0]
	final := adaptertest.WaitFinal(t, store, key)

	// A plain copy, then the letter moved back.
	send(t, c, url, "bad-1", "poison", nil)
	moveBack(t, c, url, letter)
	adaptertest.WaitFor(t, adaptertest.Deadline, "the copy and the letter moved back settled", func() bool {
		return fx.Settled("bad-1") == 3
	})
	assertDrained(t, c, url)
	again := receiveLetters(t, c, dlq, 1)[0]
	meta, err := sqsdedup.DeadLetterMetadata(again)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"dedup-reason":       string(dedup.ReasonRedeliveredAfterFinal),
		"dedup-event-id":     "bad-1",
		"dedup-scope":        w.Scope(),
		"dedup-attempts":     "1",
		"dedup-cause":        "malformed refund",
		"dedup-origin-queue": url,
	} {
		if meta[k] != v {
			t.Errorf("second letter's %s = %q, want %q", k, meta[k], v)
		}
	}
	if got := aws.ToString(again.MessageAttributes["trace-id"].StringValue); got != "t-1" || aws.ToString(again.Body) != "poison" {
		t.Errorf("second letter: body %q, trace-id %q; want the original's", aws.ToString(again.Body), got)
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
	moveBack(t, c, url, again)
	adaptertest.WaitFor(t, adaptertest.Deadline, "the released event applied", func() bool { return fx.Count("bad-1") == 1 })
}

// receiveLetters receives and deletes n letters from the dead-letter queue
// dlq, waiting for each, and fails t if more are there.
func receiveLetters(t *testing.T, c *sqs.Client, dlq string, n int) []types.Message {
	t.Helper()
	var out []types.Message
	adaptertest.WaitFor(t, adaptertest.Deadline, "the dead letters", func() bool {
		for _, m := range receive(t, c, dlq, 1) {
			deleteMessage(t, c, dlq, m)
			out = append(out, m)
		}
		return len(out) >= n
	})
	if len(out) != n {
		t.Fatalf("%d dead letters, want %d", len(out), n)
	}
	return out
}

// moveBack sends m, a letter received from the dead-letter queue, to url
// as it is: its body and every attribute.
func moveBack(t *testing.T, c *sqs.Client, url string, m types.Message) {
	t.Helper()
	if _, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url),
		MessageBody: m.Body, MessageAttributes: m.MessageAttributes}); err != nil {
		t.Fatal(err)
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
