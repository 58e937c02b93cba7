package redisstreamdedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
)

func msg(id string, fields map[string]any) *redisstreamdedup.Message {
	return &redisstreamdedup.Message{XMessage: redis.XMessage{ID: id, Values: fields, DeliveredCount: 2}, Stream: "orders", Group: "billing"}
}

// The event ID comes from the "id" field, another field, or the entry ID
// (the dedup-event-id of a letter moved back); an entry without one, or a
// nil message, is an error the wrapper dead-letters as invalid-id.
func TestMessagesEventID(t *testing.T) {
	m := msg("1700000000000-3", map[string]any{"id": "ev-1", "key": "k-9", "payload": "p"})
	for _, c := range []struct {
		opts []redisstreamdedup.MessagesOpt
		msg  *redisstreamdedup.Message
		want string
		err  error
	}{
		{nil, m, "ev-1", nil},
		{[]redisstreamdedup.MessagesOpt{redisstreamdedup.WithIDField("key")}, m, "k-9", nil},
		{[]redisstreamdedup.MessagesOpt{redisstreamdedup.WithEntryID()}, m, "1700000000000-3", nil},
		{[]redisstreamdedup.MessagesOpt{redisstreamdedup.WithEntryID()}, msg("2-0", map[string]any{"dedup-event-id": "1-0"}), "1-0", nil},
		{nil, msg("1-0", map[string]any{"payload": "p"}), "", redisstreamdedup.ErrNoEventID},
		{nil, msg("1-0", map[string]any{"id": ""}), "", redisstreamdedup.ErrNoEventID},
		{nil, nil, "", redisstreamdedup.ErrNilMessage},
	} {
		got, err := redisstreamdedup.Messages(c.opts...).EventID(c.msg)
		if got != c.want || !errors.Is(err, c.err) {
			t.Errorf("EventID: %q, %v; want %q, %v", got, err, c.want, c.err)
		}
	}
}

// The payload is the payload field, or else the other fields as JSON; the
// attempts the delivery count; the dead letter the entry with its origin.
func TestMessagesPayloadAttemptsDeadLetter(t *testing.T) {
	ms := redisstreamdedup.Messages()
	m := msg("1700000000000-3", map[string]any{"id": "ev-1", "payload": "p", "trace-id": "t"})
	if got := string(ms.Payload(m)); got != "p" {
		t.Errorf("Payload %q, want the payload field", got)
	}
	noPayload := msg("1-0", map[string]any{"id": "ev-1", "b": "2", "a": "1", "dedup-reason": "x"})
	if got := string(ms.Payload(noPayload)); got != `{"a":"1","b":"2","id":"ev-1"}` {
		t.Errorf("Payload without a payload field %q, want the other fields as JSON", got)
	}
	if got := ms.Attempts(m); got != 2 {
		t.Errorf("Attempts %d, want the delivery count 2", got)
	}
	dl := ms.DeadLetter(m)
	want := dedup.Origin{Stream: "orders", Group: "billing", MessageID: "1700000000000-3", Timestamp: time.UnixMilli(1700000000000)}
	if dl.Origin != want || string(dl.Payload) != "p" || len(dl.Headers) != 2 || dl.Headers[0].Key != "id" || dl.Headers[1].Key != "trace-id" {
		t.Errorf("DeadLetter %+v, want origin %+v, the payload and the other fields in order", dl, want)
	}
	if got := ms.TraceCarrier(m).Get("trace-id"); got != "t" {
		t.Errorf("TraceCarrier trace-id %q", got)
	}
	if ms.Payload(nil) != nil || ms.Attempts(nil) != 0 {
		t.Error("a nil message has a payload or attempts")
	}
}
