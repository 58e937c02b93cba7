package redisstreamoutbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/redisstreamoutbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stream returns a stream key of its own, deleted when t ends.
func stream(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	key := "rso-test:" + strings.ToLower(rand.Text()[:10])
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	return key
}

func publish(t *testing.T, p *redisstreamoutbox.Publisher, events []outbox.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := p.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("%d errors for %d events", len(errs), len(events))
	}
	return errs
}

// Each event is added to its stream with its ID, payload, key, tenant and
// headers as fields, read back by redisstreamdedup's Messages; headers
// naming one of the event's own fields do not override it.
func TestPublishCarriesIDAndFields(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	orders, invoices := stream(t, rdb), stream(t, rdb)
	pub, err := redisstreamoutbox.NewPublisher(rdb)
	if err != nil {
		t.Fatal(err)
	}
	events := []outbox.Event{
		{ID: outbox.NewID(), Destination: orders, Key: []byte{0xff, 0x00, 'k'}, Payload: []byte(`{"n":1}`), Tenant: "acme",
			Headers: []outbox.Header{{Key: "traceparent", Value: []byte("00-abc-def-01")}, {Key: "id", Value: []byte("forged")},
				{Key: "payload", Value: []byte("forged")}, {Key: "tenant", Value: []byte("other")}}},
		{ID: "evt-2", Destination: invoices, Payload: []byte("two")},
	}
	for i, err := range publish(t, pub, events) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	for _, ev := range events {
		entries, err := rdb.XRange(context.Background(), ev.Destination, "-", "+").Result()
		if err != nil || len(entries) != 1 {
			t.Fatalf("stream %s: %d entries (%v), want 1", ev.Destination, len(entries), err)
		}
		m := &redisstreamdedup.Message{XMessage: entries[0], Stream: ev.Destination}
		msgs := redisstreamdedup.Messages()
		if id, err := msgs.EventID(m); err != nil || id != ev.ID || string(msgs.Payload(m)) != string(ev.Payload) {
			t.Errorf("entry %v read as %q (%v), payload %q; want %s, %q", entries[0].Values, id, err, msgs.Payload(m), ev.ID, ev.Payload)
		}
	}
	first, _ := rdb.XRange(context.Background(), orders, "-", "+").Result()
	v := first[0].Values
	if v["traceparent"] != "00-abc-def-01" || v["tenant"] != "acme" || v[redisstreamoutbox.KeyField] != "\xff\x00k" {
		t.Errorf("fields %q", v)
	}
}

// Events of three keys, interleaved, with events without a key among them,
// are added in their order within each key.
func TestPublishKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	dest := stream(t, rdb)
	pub, err := redisstreamoutbox.NewPublisher(rdb)
	if err != nil {
		t.Fatal(err)
	}
	var events []outbox.Event
	for n := range 30 {
		for _, k := range []string{"a", "b", "c", ""} {
			events = append(events, outbox.Event{
				ID: fmt.Sprintf("%s-%d", k, n), Destination: dest, Key: []byte(k), Payload: []byte(strconv.Itoa(n)),
			})
		}
	}
	for i, err := range publish(t, pub, events) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	entries, err := rdb.XRange(context.Background(), dest, "-", "+").Result()
	if err != nil || len(entries) != len(events) {
		t.Fatalf("%d entries (%v), want %d", len(entries), err, len(events))
	}
	last := map[string]int{"a": -1, "b": -1, "c": -1}
	for _, e := range entries {
		k, _ := e.Values[redisstreamoutbox.KeyField].(string)
		if k == "" {
			continue
		}
		n, _ := strconv.Atoi(e.Values["payload"].(string))
		if n != last[k]+1 {
			t.Errorf("key %s: event %d added after %d", k, n, last[k])
		}
		last[k] = n
	}
}

// A destination holding something other than a stream fails its event
// for good, and only it: the later events of its key are added.
func TestWrongTypeIsPermanent(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	notStream, dest := stream(t, rdb), stream(t, rdb)
	if err := rdb.Set(context.Background(), notStream, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pub, err := redisstreamoutbox.NewPublisher(rdb)
	if err != nil {
		t.Fatal(err)
	}
	errs := publish(t, pub, []outbox.Event{
		{ID: "1", Destination: notStream, Key: []byte("k"), Payload: []byte("x")},
		{ID: "2", Destination: "", Key: []byte("k"), Payload: []byte("x")},
		{ID: "3", Destination: dest, Key: []byte("k"), Payload: []byte("x")},
	})
	if !dedup.IsPermanent(errs[0]) || !dedup.IsPermanent(errs[1]) || errs[2] != nil {
		t.Errorf("errors %v, want the first two permanent, the third nil", errs)
	}
}

// Redis unreachable: the first event of each key fails for a reason worth
// retrying, and the later ones of its key are left unsent.
func TestFailureHoldsLaterEventsOfItsKey(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	pub, err := redisstreamoutbox.NewPublisher(rdb)
	if err != nil {
		t.Fatal(err)
	}
	errs := publish(t, pub, []outbox.Event{
		{ID: "a1", Destination: "s", Key: []byte("a"), Payload: []byte("x")},
		{ID: "b1", Destination: "s", Key: []byte("b"), Payload: []byte("x")},
		{ID: "a2", Destination: "s", Key: []byte("a"), Payload: []byte("x")},
	})
	for i, want := range []bool{false, false, true} {
		notAttempted := errors.Is(errs[i], outbox.ErrNotAttempted)
		if errs[i] == nil || dedup.IsPermanent(errs[i]) || notAttempted != want {
			t.Errorf("event %d: %v, want a retryable error (not attempted: %t)", i, errs[i], want)
		}
	}
}
