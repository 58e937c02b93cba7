package natsoutbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/natsoutbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's stream, capturing "<token>.>", deleted when it ends.
type env struct {
	js     jetstream.JetStream
	token  string
	stream jetstream.Stream
	pub    *natsoutbox.Publisher
}

func newEnv(t *testing.T, cfg jetstream.StreamConfig) *env {
	t.Helper()
	_, js := testenv.NATS(t)
	e := &env{js: js, token: strings.ToLower(rand.Text()[:10])}
	cfg.Name, cfg.Subjects, cfg.Storage = "O_"+e.token, []string{e.token + ".>"}, jetstream.MemoryStorage
	var err error
	if e.stream, err = js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), cfg.Name); err != nil {
			t.Errorf("delete stream %s: %v", cfg.Name, err)
		}
	})
	if e.pub, err = natsoutbox.NewPublisher(js); err != nil {
		t.Fatal(err)
	}
	return e
}

// messages returns the stream's messages in order.
func (e *env) messages(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := e.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := e.stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func publish(t *testing.T, p *natsoutbox.Publisher, events []outbox.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := p.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("%d errors for %d events", len(errs), len(events))
	}
	return errs
}

// Each event is published to its subject with its ID as Nats-Msg-Id, its
// headers, its tenant and its key (as text in event-key, or in base64 in
// event-key-base64 when a NATS header would not keep it); headers naming
// the ID, the tenant or the key do not override the event's own.
func TestPublishCarriesIDAndHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{})
	events := []outbox.Event{
		{ID: outbox.NewID(), Destination: e.token + ".orders", Key: []byte("k1"), Payload: []byte(`{"n":1}`), Tenant: "acme",
			Headers: []outbox.Header{{Key: "traceparent", Value: []byte("00-abc-def-01")}, {Key: "Nats-Msg-Id", Value: []byte("forged")},
				{Key: "tenant", Value: []byte("other")}, {Key: "event-key", Value: []byte("forged")},
				{Key: "event-key-base64", Value: []byte("Zm9yZ2Vk")}}},
		{ID: "evt-2", Destination: e.token + ".invoices", Payload: []byte("two"), Headers: []outbox.Header{{Key: "event-key", Value: []byte("forged")}}},
		{ID: "evt-3", Destination: e.token + ".invoices", Key: []byte{0xff, 0x00, 'k'}, Payload: []byte("three")},
		{ID: "evt-4", Destination: e.token + ".invoices", Key: []byte(" padded "), Payload: []byte("four")},
		{ID: "evt-5", Destination: e.token + ".invoices", Key: []byte("clé/42"), Payload: []byte("five")},
	}
	for i, err := range publish(t, e.pub, events) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	msgs := e.messages(t)
	if len(msgs) != len(events) {
		t.Fatalf("%d messages stored, want %d", len(msgs), len(events))
	}
	byID := map[string]*jetstream.RawStreamMsg{}
	for _, m := range msgs { // events of different keys are stored in any order
		byID[m.Header.Get(jetstream.MsgIDHeader)] = m
	}
	for i, ev := range events {
		m := byID[ev.ID]
		if m == nil {
			t.Fatalf("event %d (%s) not stored with its ID as Nats-Msg-Id", i, ev.ID)
		}
		if m.Subject != ev.Destination || string(m.Data) != string(ev.Payload) {
			t.Errorf("event %d: subject %s, data %q; want %s, %q", i, m.Subject, m.Data, ev.Destination, ev.Payload)
		}
	}
	if h := byID[events[0].ID].Header; h.Get("traceparent") != "00-abc-def-01" || h.Get("tenant") != "acme" || len(h.Values("tenant")) != 1 {
		t.Errorf("headers %v", h)
	}
	for i, ev := range events {
		h := byID[ev.ID].Header
		var key []byte
		if s := h.Values(natsoutbox.KeyBase64Header); len(s) > 0 {
			var err error
			if key, err = base64.StdEncoding.DecodeString(s[0]); err != nil {
				t.Errorf("event %d: %s %q: %v", i, natsoutbox.KeyBase64Header, s[0], err)
			}
		}
		if s := h.Values(natsoutbox.KeyHeader); len(s) > 0 {
			key = []byte(s[0])
		}
		if n := len(h.Values(natsoutbox.KeyHeader)) + len(h.Values(natsoutbox.KeyBase64Header)); !bytes.Equal(key, ev.Key) || n > 1 {
			t.Errorf("event %d: key %q in %d headers (%v), want %q", i, key, n, h, ev.Key)
		}
	}
	if h := byID["evt-5"].Header; h.Get(natsoutbox.KeyHeader) != "clé/42" {
		t.Errorf("a UTF-8 key is not carried as text: %v", h)
	}
}

// Events of three keys, interleaved, are stored in their order within each
// key; a batch published again (a relay that died before marking it sent)
// within the duplicate window is acknowledged and stored once.
func TestPublishKeepsKeyOrderAndAbsorbsRepublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{})
	var events []outbox.Event
	for n := range 30 {
		for _, k := range []string{"a", "b", "c"} {
			events = append(events, outbox.Event{
				ID: fmt.Sprintf("%s-%d", k, n), Destination: e.token + ".orders", Key: []byte(k), Payload: []byte(strconv.Itoa(n)),
			})
		}
	}
	for range 2 {
		for i, err := range publish(t, e.pub, events) {
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	}
	msgs := e.messages(t)
	if len(msgs) != len(events) {
		t.Fatalf("%d messages stored, want %d (the republish stored again?)", len(msgs), len(events))
	}
	last := map[string]int{"a": -1, "b": -1, "c": -1}
	for _, m := range msgs {
		k := strings.Split(m.Header.Get(jetstream.MsgIDHeader), "-")[0]
		n, _ := strconv.Atoi(string(m.Data))
		if n != last[k]+1 {
			t.Errorf("key %s: event %d stored after %d", k, n, last[k])
		}
		last[k] = n
	}
}

// Once an event fails for a reason worth retrying (the stream is full),
// the later events of its key are left unsent with outbox.ErrNotAttempted.
func TestFailureHoldsLaterEventsOfItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{MaxMsgs: 2, Discard: jetstream.DiscardNew})
	var events []outbox.Event
	for n := range 4 {
		events = append(events, outbox.Event{ID: fmt.Sprintf("k-%d", n), Destination: e.token + ".orders", Key: []byte("k"), Payload: []byte("x")})
	}
	errs := publish(t, e.pub, events)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("first two: %v, %v", errs[0], errs[1])
	}
	if errs[2] == nil || dedup.IsPermanent(errs[2]) {
		t.Errorf("third (stream full): %v, want a retryable error", errs[2])
	}
	if !errors.Is(errs[3], outbox.ErrNotAttempted) {
		t.Errorf("fourth: %v, want ErrNotAttempted", errs[3])
	}
}

// Errors no retry fixes are permanent, and fail their event alone: a
// subject no stream captures, a message over the stream's max size, a
// wildcard subject, a header name NATS cannot carry.
func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.StreamConfig{MaxMsgSize: 512})
	ok := outbox.Event{ID: "ok", Destination: e.token + ".orders", Key: []byte("k"), Payload: []byte("fine")}
	events := []outbox.Event{
		{ID: "nostream", Destination: "nowhere-" + e.token + ".x", Key: []byte("k"), Payload: []byte("x")},
		{ID: "large", Destination: e.token + ".orders", Key: []byte("k"), Payload: make([]byte, 4096)},
		{ID: "wild", Destination: e.token + ".*", Payload: []byte("x")},
		{ID: "header", Destination: e.token + ".orders", Payload: []byte("x"), Headers: []outbox.Header{{Key: "a b", Value: []byte("x")}}},
		ok,
	}
	errs := publish(t, e.pub, events)
	for i, err := range errs[:4] {
		if !dedup.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error", events[i].ID, err)
		}
	}
	if !errors.Is(errs[0], natsoutbox.ErrNoStream) || !strings.Contains(errs[0].Error(), events[0].Destination) {
		t.Errorf("no stream: %v, want ErrNoStream naming the subject", errs[0])
	}
	if errs[4] != nil {
		t.Errorf("the valid event after permanent failures of its key: %v", errs[4])
	}
	if msgs := e.messages(t); len(msgs) != 1 || msgs[0].Header.Get(jetstream.MsgIDHeader) != "ok" {
		t.Errorf("stored %d messages, want the valid one alone", len(msgs))
	}
}

// NewPublisher refuses a nil JetStream and a concurrency under 1.
func TestNewPublisherConfig(t *testing.T) {
	t.Parallel()
	if _, err := natsoutbox.NewPublisher(nil); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("nil JetStream: %v", err)
	}
	_, js := testenv.NATS(t)
	if _, err := natsoutbox.NewPublisher(js, natsoutbox.WithConcurrency(0)); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("WithConcurrency(0): %v", err)
	}
}
