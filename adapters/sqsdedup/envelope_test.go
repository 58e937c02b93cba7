package sqsdedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// envelopeBody returns the fixture file (a body as SNS or EventBridge
// delivers it to SQS) with the given top-level fields replaced.
func envelopeBody(t *testing.T, file string, set map[string]any) string {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		body[k] = v
	}
	out, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// notification is an SNS notification body with its MessageId, inner
// Message and event-id SNS message attribute.
func notification(t *testing.T, messageID, message, eventID string) string {
	return envelopeBody(t, "sns-notification.json", map[string]any{
		"MessageId": messageID, "Message": message,
		"MessageAttributes": map[string]any{"event-id": map[string]string{"Type": "String", "Value": eventID}},
	})
}

// sendBody sends body to url with no message attributes, as SNS does with
// raw message delivery off.
func sendBody(t *testing.T, c *sqs.Client, url, body string) {
	t.Helper()
	if _, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
}

// Over a real queue: a notification delivered twice by SNS has one effect,
// the handler reads the inner message, a poison notification is parked with
// its envelope's fields, and a body that is no notification is parked with
// the reason, never run and never acknowledged silently.
func TestSNSEnvelopeOverQueue(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, dlq := queue(t, c), queue(t, c)
	rec := adaptertest.NewEffects()
	h := func(_ context.Context, m types.Message) error {
		n, err := sqsdedup.UnwrapSNS(aws.ToString(m.Body))
		if err != nil {
			return err
		}
		rec.Call(n.MessageID)
		if strings.Contains(n.Message, "poison") {
			return dedup.Permanent(errors.New("cannot charge"))
		}
		rec.Apply(n.Message)
		return nil
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.Messages(url, sqsdedup.WithSNSEnvelope()), h,
		dedup.WithScope(uniqueScope()), dedup.WithSink(newSink(t, c, dlq)), dedup.WithObserver(rec.Observe))
	if err != nil {
		t.Fatal(err)
	}
	good := notification(t, "sns-1", `{"order":"o-1"}`, "ignored")
	poison := envelopeBody(t, "sns-notification.json", map[string]any{"MessageId": "sns-2", "Message": `{"order":"poison"}`,
		"Timestamp": "2026-12-06T18:00:00.120Z"}) // kept as written: the signature covers it
	for _, body := range []string{good, good, poison, "not json", `{"Type":"SubscriptionConfirmation","MessageId":"x","Message":"m"}`} {
		sendBody(t, c, url, body)
	}
	start(t, c, url, w)

	letters := map[string]types.Message{}
	adaptertest.WaitFor(t, 60*time.Second, "three letters", func() bool {
		for _, m := range receive(t, c, dlq, time.Second) {
			letters[aws.ToString(m.Body)] = m
			deleteMessage(t, c, dlq, m)
		}
		return len(letters) == 3
	})
	assertDrained(t, c, url)
	if rec.Count(`{"order":"o-1"}`) != 1 || rec.Calls("sns-1") != 1 {
		t.Errorf("effects %v, calls of sns-1 %d: want one each", rec.Counts(), rec.Calls("sns-1"))
	}
	p, ok := letters[poison]
	if !ok {
		t.Fatalf("no letter holds the poison notification as received; letters %v", slices.Collect(maps.Keys(letters)))
	}
	meta, err := sqsdedup.DeadLetterMetadata(p)
	if err != nil {
		t.Fatal(err)
	}
	if meta["dedup-reason"] != string(dedup.ReasonPermanent) || meta["dedup-event-id"] != "sns-2" {
		t.Errorf("poison letter metadata %v", meta)
	}
	var env map[string]string
	if err := json.Unmarshal([]byte(aws.ToString(p.MessageAttributes[sqsdedup.SNSEnvelopeHeader].StringValue)), &env); err != nil {
		t.Fatalf("%s attribute: %v", sqsdedup.SNSEnvelopeHeader, err)
	}
	for _, f := range []string{"Type", "MessageId", "TopicArn", "Timestamp", "SignatureVersion", "Signature", "SigningCertURL", "UnsubscribeURL"} {
		if env[f] == "" {
			t.Errorf("letter's envelope has no %s: %v", f, env)
		}
	}
	if env["Timestamp"] != "2026-12-06T18:00:00.120Z" || env["MessageId"] != "sns-2" {
		t.Errorf("letter's envelope %v", env)
	}
	for _, bad := range []string{"not json", `{"Type":"SubscriptionConfirmation","MessageId":"x","Message":"m"}`} {
		meta, err := sqsdedup.DeadLetterMetadata(letters[bad])
		if err != nil {
			t.Fatal(err)
		}
		if meta["dedup-reason"] != string(dedup.ReasonInvalidID) || !strings.Contains(meta["dedup-error"], "malformed envelope") {
			t.Errorf("letter of %q: metadata %v", bad, meta)
		}
	}
}

// Without an envelope option, a body that happens to be a notification is
// read as raw delivery always was: the ID from the event-id attribute, the
// payload the whole body.
func TestRawDeliveryUnchanged(t *testing.T) {
	body := notification(t, "sns-1", "inner", "from-sns")
	m := types.Message{Body: aws.String(body), MessageId: aws.String("sqs-1"),
		MessageAttributes: map[string]types.MessageAttributeValue{"event-id": stringAttr("from-sqs")}}
	msgs := sqsdedup.Messages("url")
	if id, err := msgs.EventID(m); err != nil || id != "from-sqs" {
		t.Errorf("event ID %q, %v; want from-sqs", id, err)
	}
	if string(msgs.Payload(m)) != body {
		t.Errorf("payload %q, want the body", msgs.Payload(m))
	}
	if dl := msgs.DeadLetter(m); string(dl.Payload) != body || len(dl.Headers) != 1 {
		t.Errorf("dead letter %+v", dl)
	}
}

// lambdaEnvelopeWrapper records the effects of records whose bodies unwrap
// with unwrap into the event ID and payload it returns.
func lambdaEnvelopeWrapper(t *testing.T, rec *adaptertest.Effects, sink dedup.Sink, unwrap func(string) (string, string, error),
	opts ...sqsdedup.MessagesOpt,
) *dedup.Wrapper[events.SQSMessage] {
	t.Helper()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.LambdaMessages(opts...),
		func(_ context.Context, m events.SQSMessage) error {
			id, payload, err := unwrap(m.Body)
			if err != nil {
				return err
			}
			rec.Call(id)
			rec.Apply(payload)
			return nil
		}, dedup.WithScope(uniqueScope()), dedup.WithSink(sink))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func lambdaRecords(bodies ...string) events.SQSEvent {
	var ev events.SQSEvent
	for i, b := range bodies {
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: "m" + string(rune('0'+i)), Body: b, EventSourceARN: "arn:aws:sqs:us-east-1:123456789012:orders",
			Attributes: map[string]string{"ApproximateReceiveCount": "1"},
		})
	}
	return ev
}

// Through Lambda, WithSNSIDAttribute: two publishes of one event (two SNS
// MessageIds, one event-id attribute) have one effect; a notification
// without the attribute and a body cut short are parked, not failed.
func TestLambdaSNSIDAttribute(t *testing.T) {
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	h := sqsdedup.LambdaHandler(lambdaEnvelopeWrapper(t, rec, sink, func(body string) (string, string, error) {
		n, err := sqsdedup.UnwrapSNS(body)
		return n.MessageID, n.Message, err
	}, sqsdedup.WithSNSIDAttribute("event-id")))
	noAttr := envelopeBody(t, "sns-notification.json", map[string]any{"MessageId": "sns-3", "MessageAttributes": map[string]any{}})
	cut := notification(t, "sns-4", "x", "order-4")[:40]
	resp, err := h(context.Background(), lambdaRecords(
		notification(t, "sns-1", "charge o-1", "order-1"), notification(t, "sns-2", "charge o-1", "order-1"), noAttr, cut))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %+v, %v; want no failures", resp, err)
	}
	if rec.Count("charge o-1") != 1 || rec.CallCount() != 1 {
		t.Errorf("effects %v, %d calls; want one", rec.Counts(), rec.CallCount())
	}
	letters := sink.Letters()
	if len(letters) != 2 {
		t.Fatalf("%d letters, want 2", len(letters))
	}
	if !strings.Contains(letters[0].Error, `no "event-id" SNS message attribute`) || !strings.Contains(letters[1].Error, "malformed envelope") {
		t.Errorf("letters' errors %q, %q", letters[0].Error, letters[1].Error)
	}
	for _, l := range letters {
		if l.Reason != dedup.ReasonInvalidID {
			t.Errorf("letter reason %s, want %s", l.Reason, dedup.ReasonInvalidID)
		}
	}
}

// Through Lambda, WithEventBridgeEnvelope: id is the event ID and detail
// the payload, so the same id with another detail is a conflict, parked;
// an event without detail is parked as bad input.
func TestLambdaEventBridgeEnvelope(t *testing.T) {
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	h := sqsdedup.LambdaHandler(lambdaEnvelopeWrapper(t, rec, sink, func(body string) (string, string, error) {
		e, err := sqsdedup.UnwrapEventBridge(body)
		return e.ID, string(e.Detail), err
	}, sqsdedup.WithEventBridgeEnvelope()))
	first := envelopeBody(t, "eventbridge-event.json", nil)
	other := envelopeBody(t, "eventbridge-event.json", map[string]any{"detail": map[string]any{"order": "o-2"}})
	noDetail := envelopeBody(t, "eventbridge-event.json", map[string]any{"id": "e-9", "detail": nil})
	resp, err := h(context.Background(), lambdaRecords(first, first, other, noDetail))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %+v, %v; want no failures", resp, err)
	}
	if rec.CallCount() != 1 || rec.Count(`{"amount":42,"order":"o-1"}`) != 1 {
		t.Errorf("effects %v, %d calls; want the first detail once", rec.Counts(), rec.CallCount())
	}
	letters := sink.Letters()
	if len(letters) != 2 || letters[0].Reason != dedup.ReasonConflict || letters[1].Reason != dedup.ReasonInvalidID {
		t.Fatalf("letters %+v; want a conflict and an invalid ID", letters)
	}
	if h := letters[0].Headers; len(h) != 1 || h[0].Key != sqsdedup.EventBridgeEnvelopeHeader ||
		!strings.Contains(string(h[0].Value), `"detail-type":"Order Placed"`) || string(letters[0].Payload) != other {
		t.Errorf("conflict letter payload %q headers %+v", letters[0].Payload, h)
	}
}

// Over a real queue: an EventBridge event sent twice (a rule's retried
// delivery) has one effect on its detail; an event with no id is parked
// with the reason and its body.
func TestEventBridgeEnvelopeOverQueue(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, dlq := queue(t, c), queue(t, c)
	rec := adaptertest.NewEffects()
	h := func(_ context.Context, m types.Message) error {
		e, err := sqsdedup.UnwrapEventBridge(aws.ToString(m.Body))
		if err != nil {
			return err
		}
		rec.Call(e.ID)
		rec.Apply(string(e.Detail))
		return nil
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.Messages(url, sqsdedup.WithEventBridgeEnvelope()), h,
		dedup.WithScope(uniqueScope()), dedup.WithSink(newSink(t, c, dlq)), dedup.WithObserver(rec.Observe))
	if err != nil {
		t.Fatal(err)
	}
	event := envelopeBody(t, "eventbridge-event.json", nil)
	noID := envelopeBody(t, "eventbridge-event.json", map[string]any{"id": ""})
	for _, body := range []string{event, event, noID} {
		sendBody(t, c, url, body)
	}
	start(t, c, url, w)
	var letters []types.Message
	adaptertest.WaitFor(t, 60*time.Second, "one letter", func() bool {
		for _, m := range receive(t, c, dlq, time.Second) {
			letters = append(letters, m)
			deleteMessage(t, c, dlq, m)
		}
		return len(letters) > 0
	})
	assertDrained(t, c, url)
	letters = append(letters, receive(t, c, dlq, time.Second)...) // none more
	if rec.CallCount() != 1 || rec.Count(`{"amount":42,"order":"o-1"}`) != 1 {
		t.Errorf("effects %v, %d calls; want the detail once", rec.Counts(), rec.CallCount())
	}
	meta, err := sqsdedup.DeadLetterMetadata(letters[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || aws.ToString(letters[0].Body) != noID || meta["dedup-reason"] != string(dedup.ReasonInvalidID) ||
		!strings.Contains(meta["dedup-error"], "EventBridge event without id") {
		t.Errorf("%d letters; first: body %q, metadata %v", len(letters), aws.ToString(letters[0].Body), meta)
	}
}
