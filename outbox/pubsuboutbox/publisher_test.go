package pubsuboutbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/pubsuboutbox"
)

func TestMain(m *testing.M) { pubsubenv.RunTests(m) }

const topic = "projects/shop/topics/orders"

// failOnce is a pstest reactor failing, once, the publish request that
// carries the event it names, with PermissionDenied: a failure the client
// does not retry and no Publish could call permanent.
type failOnce struct {
	mu     sync.Mutex
	id     string
	failed bool
}

func (f *failOnce) React(req any) (bool, any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range req.(*pubsubpb.PublishRequest).GetMessages() {
		if m.Attributes[pubsuboutbox.IDAttribute] == f.id && !f.failed {
			f.failed = true
			return true, nil, status.Error(codes.PermissionDenied, "injected: not allowed this once")
		}
	}
	return false, nil, nil
}

// newServer starts a pstest server with the topic and reactor, and
// returns a Publisher on a client of it; all closed when t ends.
func newServer(t *testing.T, r pstest.Reactor) (*pstest.Server, *pubsuboutbox.Publisher) {
	t.Helper()
	var opts []pstest.ServerReactorOption
	if r != nil {
		opts = append(opts, pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	}
	srv, client := pubsubenv.Start(t, "shop", opts...)
	if _, err := client.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	pub, err := pubsuboutbox.NewPublisher(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	return srv, pub
}

// stored returns the IDs of the topic's messages of ordering key key, in
// the order the server stored them.
func stored(srv *pstest.Server, key string) []string {
	var ids []string
	for _, m := range srv.Messages() {
		if m.Topic == topic && m.OrderingKey == key {
			ids = append(ids, m.Attributes[pubsuboutbox.IDAttribute])
		}
	}
	return ids
}

// Each event becomes one message: its payload, its headers as attributes,
// its ID and tenant in theirs, its key as the ordering key (base64 when it
// is not text); the events of one key are stored in the outbox's order.
func TestPublish(t *testing.T) {
	srv, pub := newServer(t, nil)
	var events []outbox.Event
	for i := range 20 {
		key := fmt.Sprintf("k%d", i%3)
		events = append(events, outbox.Event{ID: fmt.Sprintf("%s-%02d", key, i), Destination: "orders", Key: []byte(key),
			Payload: fmt.Appendf(nil, `{"i":%d}`, i), Headers: []outbox.Header{{Key: "trace-id", Value: []byte("t")}}})
	}
	events = append(events,
		outbox.Event{ID: "alone", Destination: topic, Payload: []byte("x"), Tenant: "acme",
			Headers: []outbox.Header{{Key: pubsuboutbox.IDAttribute, Value: []byte("forged")}}},
		outbox.Event{ID: "binary", Destination: topic, Key: []byte{0xff, 0x00}, Payload: []byte("y")})
	for i, err := range pub.Publish(context.Background(), events) {
		if err != nil {
			t.Errorf("event %s: %v", events[i].ID, err)
		}
	}
	for k := range 3 {
		key := fmt.Sprintf("k%d", k)
		var want []string
		for _, e := range events {
			if string(e.Key) == key {
				want = append(want, e.ID)
			}
		}
		if got := stored(srv, key); !slices.Equal(got, want) {
			t.Errorf("key %s stored as %v, want %v", key, got, want)
		}
	}
	byID := map[string]*pstest.Message{}
	for _, m := range srv.Messages() {
		byID[m.Attributes[pubsuboutbox.IDAttribute]] = m
	}
	if m := byID["alone"]; m == nil || m.OrderingKey != "" || m.Attributes[pubsuboutbox.TenantAttribute] != "acme" || string(m.Data) != "x" {
		t.Errorf("event without a key: %+v", m)
	}
	if m := byID["binary"]; m == nil || m.OrderingKey != "/wA=" {
		t.Errorf("event with a binary key: %+v, want its key in base64", m)
	}
	if m := byID["k1-01"]; m == nil || m.Attributes["trace-id"] != "t" || string(m.Data) != `{"i":1}` {
		t.Errorf("event k1-01: %+v", m)
	}
}

// A failed event fails alone: the later events of its key are not
// attempted (and not stored), other keys go on, and the next Publish of
// the failed event and the rest of its key stores them in order (the key
// was resumed). What no retry fixes is permanent, event by event.
func TestFailureSemantics(t *testing.T) {
	srv, pub := newServer(t, &failOnce{id: "a-1"})
	ctx := context.Background()
	ev := func(id, key string) outbox.Event {
		return outbox.Event{ID: id, Destination: topic, Key: []byte(key), Payload: []byte(id)}
	}
	if errs := pub.Publish(ctx, []outbox.Event{ev("a-0", "a")}); errs[0] != nil {
		t.Fatalf("a-0: %v", errs[0])
	}
	tooLong := ev("bad-attr", "")
	tooLong.Headers = []outbox.Header{{Key: "note", Value: []byte(strings.Repeat("x", 1025))}}
	events := []outbox.Event{ev("a-1", "a"), ev("b-0", "b"), ev("a-2", "a"), ev("b-1", "b"),
		{ID: "lost", Destination: "projects/shop/topics/missing", Payload: []byte("z")}, tooLong,
		ev("big-key", strings.Repeat("k", pubsuboutbox.MaxOrderingKey+1))}
	errs := pub.Publish(ctx, events)
	check := func(i int, ok func(error) bool, want string) {
		if !ok(errs[i]) {
			t.Errorf("event %s: %v, want %s", events[i].ID, errs[i], want)
		}
	}
	retryable := func(err error) bool {
		return err != nil && !dedup.IsPermanent(err) && !errors.Is(err, outbox.ErrNotAttempted)
	}
	check(0, retryable, "the injected failure, to retry")
	check(1, func(err error) bool { return err == nil }, "nil")
	check(2, func(err error) bool { return errors.Is(err, outbox.ErrNotAttempted) }, "ErrNotAttempted")
	check(3, func(err error) bool { return err == nil }, "nil")
	for i := 4; i < len(events); i++ {
		check(i, dedup.IsPermanent, "a permanent error")
	}
	if got := stored(srv, "a"); !slices.Equal(got, []string{"a-0"}) {
		t.Errorf("key a stored as %v after the failure, want only a-0", got)
	}

	again, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i, err := range pub.Publish(again, []outbox.Event{ev("a-1", "a"), ev("a-2", "a")}) {
		if err != nil {
			t.Errorf("second pass, event %d: %v", i, err)
		}
	}
	if got := stored(srv, "a"); !slices.Equal(got, []string{"a-0", "a-1", "a-2"}) {
		t.Errorf("key a stored as %v, want a-0, a-1, a-2", got)
	}
	if got := stored(srv, "b"); !slices.Equal(got, []string{"b-0", "b-1"}) {
		t.Errorf("key b stored as %v, want b-0, b-1", got)
	}
}
