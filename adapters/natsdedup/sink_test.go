package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
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

// A letter over the dead-letter stream's MaxMsgSize is stored with its body
// cut to nothing and dedup-truncated giving the original body's size, its
// headers and metadata kept.
func TestSinkCutsALetterOverTheStreamLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cfg := e.dlq.CachedInfo().Config
	cfg.MaxMsgSize = 2048
	if _, err := e.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	sink, err := natsdedup.NewSink(e.js)
	if err != nil {
		t.Fatal(err)
	}
	dl := letter(e.subject)
	dl.Payload = []byte(strings.Repeat("x", 3000))
	if err := sink.Send(context.Background(), dl); err != nil {
		t.Fatalf("Send of a letter over MaxMsgSize: %v", err)
	}
	letters := e.letters(t)
	if len(letters) != 1 {
		t.Fatalf("%d letters stored, want 1", len(letters))
	}
	h := letters[0].Header
	if len(letters[0].Data) != 0 || h.Get(natsdedup.TruncatedHeader) != "3000" || h.Get("tenant") != "acme" ||
		h.Get("dedup-event-id") != "evt-1" {
		t.Errorf("letter of %d bytes with headers %v; want an empty body, dedup-truncated 3000 and the headers kept", len(letters[0].Data), h)
	}
}

// A poison message just under the server's max_payload, whose letter (its
// metadata added) is over it, is dead-lettered all the same, its letter's
// body cut to what fits and dedup-truncated giving the original size: the
// message is terminated, nothing is retried, and Health stays nil, however
// short the outage threshold.
func TestPoisonOverMaxPayloadIsDeadLetteredCut(t *testing.T) {
	t.Parallel()
	const maxPayload = 4096
	srv := testenv.StartNATSServer(t, fmt.Sprintf("max_payload: %d", maxPayload))
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BIG", Subjects: []string{"big.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := natsdedup.NewSink(js)
	if err != nil {
		t.Fatal(err)
	}
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(context.Context, jetstream.Msg) error {
		return dedup.Permanent(errors.New("this order can never be charged"))
	}, dedup.WithSink(sink), dedup.WithOutageThreshold(100*time.Millisecond))
	body := strings.Repeat("y", maxPayload-200)
	if _, err := js.Publish(ctx, "big.orders", []byte(body), jetstream.WithMsgID("big-1")); err != nil {
		t.Fatalf("publish a message under max_payload: %v", err)
	}
	stop := start(t, cons, w, natsdedup.WithJetStream(js))
	adaptertest.WaitFor(t, deadline, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	assertAllAcked(t, cons)
	stop()
	if err := w.Health(); err != nil {
		t.Errorf("Health: %v, want nil", err)
	}
	if n := rec.Results(); n != 1 {
		t.Errorf("%d results, want 1: the message was handled again", n)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("%d letters, want 1", info.State.Msgs)
	}
	l, err := dlq.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	if l.Header.Get(natsdedup.TruncatedHeader) != strconv.Itoa(len(body)) || len(l.Data) == 0 || len(l.Data) >= len(body) ||
		!strings.HasPrefix(body, string(l.Data)) || l.Header.Get("dedup-reason") != string(dedup.ReasonPermanent) {
		t.Errorf("letter of %d bytes, headers %v; want the body's start, dedup-truncated %d and the metadata", len(l.Data), l.Header, len(body))
	}
	t.Logf("letter body cut from %d to %d bytes", len(body), len(l.Data))
}
