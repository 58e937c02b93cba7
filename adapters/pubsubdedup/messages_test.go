package pubsubdedup_test

import (
	"errors"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupkit/dedup/adapters/pubsubdedup"
)

// Messages reads the ID from the message ID (or, in a letter moved back,
// the original's), an attribute or a function; the delivery attempt when
// Pub/Sub sets it; and the message with its ordering key and origin as a
// dead letter.
func TestMessages(t *testing.T) {
	five := 5
	published := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	m := &pubsub.Message{ID: "m-1", Data: []byte("payload"), OrderingKey: "k-1", PublishTime: published, DeliveryAttempt: &five,
		Attributes: map[string]string{"event-id": "e-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	msgs := pubsubdedup.Messages()
	if id, err := msgs.EventID(m); err != nil || id != "m-1" {
		t.Errorf("default ID: %q, %v; want the message ID", id, err)
	}
	if id, err := pubsubdedup.Messages(pubsubdedup.WithIDAttribute("event-id")).EventID(m); err != nil || id != "e-1" {
		t.Errorf("WithIDAttribute: %q, %v", id, err)
	}
	if _, err := pubsubdedup.Messages(pubsubdedup.WithIDAttribute("other")).EventID(m); !errors.Is(err, pubsubdedup.ErrNoEventID) {
		t.Errorf("missing attribute: %v, want ErrNoEventID", err)
	}
	byFunc := pubsubdedup.Messages(pubsubdedup.WithIDFunc(func(m *pubsub.Message) (string, error) { return "f-" + string(m.Data), nil }))
	if id, err := byFunc.EventID(m); err != nil || id != "f-payload" {
		t.Errorf("WithIDFunc: %q, %v", id, err)
	}
	if _, err := msgs.EventID(nil); !errors.Is(err, pubsubdedup.ErrNilMessage) {
		t.Errorf("nil message: %v, want ErrNilMessage", err)
	}
	if _, err := msgs.EventID(&pubsub.Message{}); !errors.Is(err, pubsubdedup.ErrNoEventID) {
		t.Errorf("no message ID: %v, want ErrNoEventID", err)
	}
	if n := msgs.Attempts(m); n != 5 {
		t.Errorf("attempts %d, want the delivery attempt 5", n)
	}
	if n := msgs.Attempts(&pubsub.Message{ID: "m-2"}); n != 0 {
		t.Errorf("attempts without a dead-letter policy %d, want 0 (the store counts)", n)
	}
	if got := msgs.TraceCarrier(m).Get("traceparent"); got != m.Attributes["traceparent"] {
		t.Errorf("trace carrier traceparent %q", got)
	}
	msgs.TraceCarrier(&pubsub.Message{}).Set("traceparent", "x") // no attributes: nothing, no panic

	dl := msgs.DeadLetter(m)
	if string(dl.Payload) != "payload" || string(dl.MessageKey) != "k-1" || dl.Origin.MessageID != "m-1" || !dl.Origin.Timestamp.Equal(published) {
		t.Errorf("dead letter %+v", dl)
	}
	if len(dl.Headers) != 2 || dl.Headers[0].Key != "event-id" || dl.Headers[1].Key != "traceparent" {
		t.Errorf("dead letter's headers %+v, want the attributes by name", dl.Headers)
	}

	// A letter moved back has a message ID of its own and the original's
	// in dedup-origin-message-id.
	back := &pubsub.Message{ID: "m-9", Attributes: map[string]string{pubsubdedup.OriginMessageIDAttribute: "m-1"}}
	if id, err := msgs.EventID(back); err != nil || id != "m-1" {
		t.Errorf("letter moved back: %q, %v; want the original's message ID", id, err)
	}
	if dl := msgs.DeadLetter(back); dl.Origin.MessageID != "m-1" {
		t.Errorf("letter moved back, dead-lettered again: origin message ID %q, want m-1", dl.Origin.MessageID)
	}
}
