package natsdedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
)

func letter(subject string) dedup.DeadLetter {
	return dedup.DeadLetter{
		Payload: []byte("data"),
		Headers: []dedup.Header{
			{Key: "tenant", Value: []byte("acme")},
			{Key: "Nats-Expected-Last-Sequence", Value: []byte("41")}, // would fail the publish
			{Key: "dedup-reason", Value: []byte("from an earlier dead-lettering")},
		},
		Origin:   dedup.Origin{Topic: subject, Offset: 42, Stream: "ORDERS", Group: "billing", Timestamp: time.Now()},
		Reason:   dedup.ReasonHandlerError,
		Error:    "wrapped: boom",
		Cause:    "boom",
		Attempts: 5,
		EventID:  "evt-1",
		Scope:    "billing/charge",
	}
}

// A letter sent twice (a retry after the wrapper failed to record the
// first) is stored once: its Nats-Msg-Id is derived from its origin. The
// Nats-* headers the original carried are dropped, an earlier dedup-*
// metadata replaced.
func TestSinkSendsOnceWithItsHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	sink, err := natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	dl := letter(e.subject)
	for range 2 {
		if err := sink.Send(context.Background(), dl); err != nil {
			t.Fatal(err)
		}
	}
	letters := e.letters(t)
	if len(letters) != 1 {
		t.Fatalf("%d letters stored, want 1", len(letters))
	}
	h := letters[0].Header
	if h.Get("tenant") != "acme" || h.Get("dedup-reason") != "handler-error" || len(h.Values("dedup-reason")) != 1 ||
		h.Get("dedup-origin-offset") != "42" || h.Get("dedup-attempts") != "5" {
		t.Errorf("letter headers %v", h)
	}
	if h.Get("Nats-Expected-Last-Sequence") != "" {
		t.Errorf("the original's Nats-Expected-Last-Sequence was kept")
	}
	// Another delivery of the event (another stream sequence) is a letter
	// of its own.
	dl.Origin.Offset = 43
	if err := sink.Send(context.Background(), dl); err != nil {
		t.Fatal(err)
	}
	if n := len(e.letters(t)); n != 2 {
		t.Errorf("%d letters, want 2", n)
	}
}

// With no stream capturing the dead-letter subject, Send fails with an
// error naming it and matching ErrNoDLQStream and
// jetstream.ErrNoStreamResponse; WithDLQSubject names another subject, and
// one returning "" refuses the letter.
func TestSinkSubjects(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	sink, err := natsdedup.NewSink(e.js, natsdedup.WithDLQSubject(func(origin string) string { return "nowhere." + origin }))
	if err != nil {
		t.Fatal(err)
	}
	err = sink.Send(context.Background(), letter(e.subject))
	if !errors.Is(err, natsdedup.ErrNoDLQStream) || !errors.Is(err, jetstream.ErrNoStreamResponse) ||
		!strings.Contains(err.Error(), "nowhere."+e.subject) {
		t.Errorf("Send without a stream: %v", err)
	}

	sink, err = natsdedup.NewSink(e.js, natsdedup.WithDLQSubject(func(origin string) string { return "dlq." + e.token + ".all" }))
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Send(context.Background(), letter(e.subject)); err != nil {
		t.Fatal(err)
	}
	if l := e.letters(t); len(l) != 1 || l[0].Subject != "dlq."+e.token+".all" {
		t.Errorf("letters %v, want one on dlq.%s.all", l, e.token)
	}

	sink, err = natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Send(context.Background(), letter("")); !errors.Is(err, natsdedup.ErrNoDLQSubject) {
		t.Errorf("Send of a letter without an origin subject: %v, want ErrNoDLQSubject", err)
	}
}
