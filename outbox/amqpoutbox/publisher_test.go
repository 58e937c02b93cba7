package amqpoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/amqpoutbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A batch published twice, as a relay that died before marking it sent
// would, reaches the queue twice, and an amqpdedup consumer applies each
// event once; an event routed nowhere is a permanent error and the others
// of its batch go out. The consumer sees each event's key in the
// event-key header: text as a string, other bytes as a byte array.
func TestPublishedTwiceAppliedOnce(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	ch, err := testenv.RabbitMQ(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := "amqpoutbox-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, name := range []string{q, q + ".dlq"} {
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(name, false, false, false) })
	}
	pub, err := amqpoutbox.NewPublisher(url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var events []outbox.Event
	for i := range 50 {
		ev := outbox.Event{ID: fmt.Sprint("ev-", i), Destination: q, Payload: []byte(fmt.Sprint(i)),
			Headers: []outbox.Header{{Key: amqpoutbox.KeyHeader, Value: []byte("forged")}}}
		switch i % 3 {
		case 0:
			ev.Key = []byte(fmt.Sprint("customer-", i%7))
		case 1:
			ev.Key = []byte{0xff, byte(i), 0x00}
		}
		events = append(events, ev)
	}
	events = append(events, outbox.Event{ID: "lost", Destination: q + "-missing", Payload: []byte("x")})
	for range 2 {
		errs := pub.Publish(context.Background(), events)
		for i, err := range errs[:50] {
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
		var unroutable *amqpdedup.UnroutableError
		if err := errs[50]; !errors.As(err, &unroutable) || !dedup.IsPermanent(err) {
			t.Fatalf("unroutable event: %v, want a permanent UnroutableError", err)
		}
	}

	var mu sync.Mutex
	applied := map[string]int{}
	keys := map[string]any{}
	sink, err := amqpdedup.NewSink(url)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), amqpdedup.Messages(q), func(_ context.Context, d amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		applied[d.MessageId]++
		keys[d.MessageId] = d.Headers[amqpoutbox.KeyHeader]
		return nil
	}, dedup.WithScope("amqpoutbox-test"), dedup.WithSink(sink), dedup.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	c, err := amqpdedup.NewConsumer(url, q, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		n := len(applied)
		mu.Unlock()
		if n == 50 && st.Messages == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 50 applied, %d messages left", n, st.Messages)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for id, n := range applied {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	for _, ev := range events[:50] {
		var want any // no key, no header: the event's headers do not forge one
		switch {
		case ev.Key == nil:
		case utf8.Valid(ev.Key):
			want = string(ev.Key)
		default:
			want = ev.Key
		}
		if got := keys[ev.ID]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the consumer saw %s %#v, want %#v", ev.ID, amqpoutbox.KeyHeader, got, want)
		}
	}
}
