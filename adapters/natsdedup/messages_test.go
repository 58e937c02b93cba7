package natsdedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup/adapters/natsdedup"
)

// fetchOne publishes msg to the env's subject and fetches it back through
// a consumer of its own, from the stream's last message.
func (e *env) fetchOne(t *testing.T, msg *nats.Msg) jetstream.Msg {
	t.Helper()
	msg.Subject = e.subject
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	c, err := e.stream.CreateConsumer(context.Background(), jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverLastPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Fetch(1, jetstream.FetchMaxWait(deadline))
	if err != nil {
		t.Fatal(err)
	}
	m := <-b.Messages()
	if m == nil {
		t.Fatalf("nothing fetched: %v", b.Error())
	}
	return m
}

// Messages reads the ID from Nats-Msg-Id, another header or a function,
// the data as payload, NumDelivered as attempts, and the message with its
// origin as a dead letter.
func TestMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, "id-1")
	h.Set("event-id", "custom-1")
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	m := e.fetchOne(t, &nats.Msg{Data: []byte("payload"), Header: h})

	msgs := natsdedup.Messages()
	if id, err := msgs.EventID(m); err != nil || id != "id-1" {
		t.Errorf("default ID: %q, %v", id, err)
	}
	if id, err := natsdedup.Messages(natsdedup.WithIDHeader("event-id")).EventID(m); err != nil || id != "custom-1" {
		t.Errorf("WithIDHeader: %q, %v", id, err)
	}
	byFunc := natsdedup.Messages(natsdedup.WithIDFunc(func(m jetstream.Msg) (string, error) { return "f-" + string(m.Data()), nil }))
	if id, err := byFunc.EventID(m); err != nil || id != "f-payload" {
		t.Errorf("WithIDFunc: %q, %v", id, err)
	}
	if _, err := natsdedup.Messages(natsdedup.WithIDHeader("absent")).EventID(m); !errors.Is(err, natsdedup.ErrNoEventID) {
		t.Errorf("absent header: %v, want ErrNoEventID", err)
	}
	if _, err := msgs.EventID(nil); !errors.Is(err, natsdedup.ErrNilMessage) {
		t.Errorf("nil message: %v, want ErrNilMessage", err)
	}
	if string(msgs.Payload(m)) != "payload" || msgs.Attempts(m) != 1 {
		t.Errorf("payload %q, attempts %d", msgs.Payload(m), msgs.Attempts(m))
	}
	if got := msgs.TraceCarrier(m).Get("traceparent"); got != h.Get("traceparent") {
		t.Errorf("trace carrier: %q", got)
	}
	dl := msgs.DeadLetter(m)
	o := dl.Origin
	if string(dl.Payload) != "payload" || o.Topic != e.subject || o.Offset != 1 || o.Stream != "T_"+e.token ||
		o.Group == "" || o.MessageID != "id-1" || o.Timestamp.IsZero() {
		t.Errorf("dead letter %+v", dl)
	}
	if len(dl.Headers) != 3 {
		t.Errorf("dead letter headers %v, want the 3 of the message", dl.Headers)
	}

	h2 := nats.Header{}
	h2.Add("event-id", "a")
	h2.Add("event-id", "b")
	m2 := e.fetchOne(t, &nats.Msg{Data: []byte("x"), Header: h2})
	if _, err := natsdedup.Messages(natsdedup.WithIDHeader("event-id")).EventID(m2); !errors.Is(err, natsdedup.ErrAmbiguousEventID) {
		t.Errorf("conflicting headers: %v, want ErrAmbiguousEventID", err)
	}
}
