package main

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// natsStreams is a test's origin stream, capturing "<token>.>" with the
// given duplicate window, and its dead-letter stream, capturing
// "dlq.<token>.>", both deleted when the test ends.
type natsStreams struct {
	js          jetstream.JetStream
	token       string
	origin, dlq jetstream.Stream
}

func newNATSStreams(t *testing.T, dupWindow time.Duration) *natsStreams {
	t.Helper()
	_, js := testenv.NATS(t)
	s := &natsStreams{js: js, token: strings.ToLower(rand.Text()[:10])}
	ctx := context.Background()
	var err error
	s.origin, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "T_" + s.token, Subjects: []string{s.token + ".>"},
		Duplicates: dupWindow, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	s.dlq, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ_" + s.token, Subjects: []string{"dlq." + s.token + ".>"},
		Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, name := range []string{"T_" + s.token, "DLQ_" + s.token} {
			require.NoError(t, js.DeleteStream(context.Background(), name))
		}
	})
	return s
}

// letters returns the event IDs of the dead-letter stream's messages, in
// order.
func (s *natsStreams) letters(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	info, err := s.dlq.Info(ctx)
	require.NoError(t, err)
	var ids []string
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.dlq.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		require.NoError(t, err)
		ids = append(ids, m.Header.Get("dedup-event-id"))
	}
	return ids
}

// park stores a dead letter of subject for id, as the sink does, with its
// record failed for good.
func (s *natsStreams) park(t *testing.T, store dedup.Store, scope, subject, id string, reason dedup.Reason, headers ...dedup.Header) {
	t.Helper()
	sink, err := natsdedup.NewSink(s.js)
	require.NoError(t, err)
	parkedRecord(t, store, dedup.Key{Scope: scope, EventID: id})
	require.NoError(t, sink.Send(context.Background(), dedup.DeadLetter{Payload: []byte("v-" + id), Reason: reason, Error: "bug",
		Attempts: 1, EventID: id, Scope: scope, LastFailure: time.Now(), Headers: headers,
		Origin: dedup.Origin{Topic: subject, Stream: "T_" + s.token, MessageID: id}}))
}

// A JetStream dead letter goes back to its origin subject once the bug is
// fixed, with its Nats-Msg-Id, the event ID: a dry run lists it and leaves
// the dead-letter stream as it was; -yes resets its record, the consumer
// runs it exactly once and it is deleted from the dead-letter stream;
// -reason and the loop guard leave the other letters in place until a run
// chooses them.
func TestRedriveNATS(t *testing.T) {
	ctx := context.Background()
	url := testenv.NATSURL(t)
	s := newNATSStreams(t, 200*time.Millisecond)
	subject := s.token + ".orders"
	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("nats-redrive", "apply")

	cons, err := s.origin.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1})
	require.NoError(t, err)
	sink, err := natsdedup.NewSink(s.js)
	require.NoError(t, err)
	h := newRedriven()
	w, err := dedup.Wrap(store, natsdedup.Messages(), func(_ context.Context, m jetstream.Msg) error {
		return h.handle(m.Headers().Get(jetstream.MsgIDHeader), string(m.Data()), m.Headers().Get(redriveCountHeader))
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithObserver(h.fx.Observe), dedup.WithLogger(quietLog()))
	require.NoError(t, err)
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithLogger(quietLog()), natsdedup.WithFetchWait(500*time.Millisecond))
	require.NoError(t, err)
	running := adaptertest.Start(t, c.Run)

	// The poison message, dead-lettered by the consumer.
	_, err = s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("v-p1")}, jetstream.WithMsgID("p1"))
	require.NoError(t, err)
	adaptertest.WaitFor(t, redriveWait, "p1 dead-lettered", func() bool { return h.fx.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	// Two more letters of the same subject: one redriven thrice already,
	// one of another reason.
	s.park(t, store, scope, subject, "looping", dedup.ReasonPermanent, dedup.Header{Key: redriveCountHeader, Value: []byte("3")})
	s.park(t, store, scope, subject, "other", dedup.ReasonHandlerError)
	letters := []string{"p1", "looping", "other"}
	require.Equal(t, letters, s.letters(t))

	dlq := "DLQ_" + s.token
	redrive := func(extra ...string) string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"redrive", "nats", "-nats", url, "-dlq", dlq,
			"-postgres", dsn, "-table", table}, extra...)...)
		require.Equal(t, 0, code, errOut)
		return out
	}
	out := redrive()
	require.Contains(t, out, "3 dead letters read, would send back 2, skipped 1")
	require.Contains(t, out, "p1 (permanent, "+dlq+"@1) back to subject "+subject)
	require.Contains(t, out, "redriven 3 times already")
	require.Equal(t, letters, s.letters(t), "a dry run leaves the dead-letter stream as it was")
	rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: "p1"})
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status, "a dry run resets nothing")

	h.fixed.Store(true) // the bug is fixed and deployed
	// The origin stream drops p1 as a duplicate until its window (200 ms)
	// has passed since p1 was published: the letter stays, and a later
	// run sends it.
	adaptertest.WaitFor(t, redriveWait, "p1 sent back", func() bool {
		out = redrive("-yes", "-reason", "permanent")
		if strings.Contains(out, "drops its message ID as a duplicate") {
			require.Contains(t, out, "3 dead letters read, sent back 0, skipped 3")
			require.Equal(t, letters, s.letters(t))
			return false
		}
		return true
	})
	require.Contains(t, out, "3 dead letters read, sent back 1, skipped 2")
	require.Contains(t, out, "redriven 3 times already (-max-redrives): "+dlq+"@2")
	require.Contains(t, out, "reason handler-error not chosen (-reason): "+dlq+"@3")
	adaptertest.WaitFor(t, redriveWait, "p1 run again", func() bool { return h.fx.Count("p1") == 1 })
	require.Equal(t, []string{"looping", "other"}, s.letters(t), "the skipped letters stay")

	out = redrive("-yes")
	require.Contains(t, out, "2 dead letters read, sent back 1, skipped 1")
	adaptertest.WaitFor(t, redriveWait, "other run again", func() bool { return h.fx.Count("other") == 1 })
	out = redrive("-yes", "-max-redrives", "5")
	require.Contains(t, out, "1 dead letters read, sent back 1, skipped 0")
	adaptertest.WaitFor(t, redriveWait, "looping run again", func() bool { return h.fx.Count("looping") == 1 })

	running.StopClean(t) // every message settled: a second copy would be counted or still pending
	ci, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, ci.NumPending, "nothing left for the consumer")
	require.Zero(t, ci.NumAckPending, "nothing left unacknowledged")
	require.Empty(t, s.letters(t), "the dead-letter stream is drained")
	for id, count := range map[string]string{"p1": "1", "other": "1", "looping": "4"} {
		require.Equal(t, 1, h.fx.Calls(id), "%s ran once", id)
		require.Equal(t, [2]string{"v-" + id, count}, h.saw(id), "%s: its body, and its redrive count", id)
		rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status, id)
	}
	out = redrive("-yes")
	require.Contains(t, out, "0 dead letters read, sent back 0, skipped 0")
}

// A letter whose message ID the origin stream still holds in its duplicate
// window is not stored there: the redrive reports it and leaves it in the
// dead-letter stream rather than deleting a letter JetStream dropped.
// -subject reads only the letters of the subjects it names.
func TestRedriveNATSDuplicateWindow(t *testing.T) {
	ctx := context.Background()
	url := testenv.NATSURL(t)
	s := newNATSStreams(t, 0) // JetStream's default window: 2 minutes
	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("nats-redrive", "window")
	subject := s.token + ".orders"
	_, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("v-w1")}, jetstream.WithMsgID("w1"))
	require.NoError(t, err)
	s.park(t, store, scope, subject, "w1", dedup.ReasonPermanent)
	s.park(t, store, scope, s.token+".refunds", "r1", dedup.ReasonPermanent)

	code, out, errOut := cli(t, "redrive", "nats", "-nats", url, "-dlq", "DLQ_"+s.token, "-subject", "dlq."+subject,
		"-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 dead letters read, sent back 0, skipped 1")
	require.Contains(t, out, "the origin stream T_"+s.token+" drops its message ID as a duplicate")
	require.Equal(t, []string{"w1", "r1"}, s.letters(t), "both letters stay")
	info, err := s.origin.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "the origin stream stored no copy")
}

// A dead-letter stream that does not exist is a clear failure.
func TestRedriveNATSUnknownStream(t *testing.T) {
	url := testenv.NATSURL(t)
	dsn, table, _, _ := postgresTable(t)
	code, _, errOut := cli(t, "redrive", "nats", "-nats", url, "-dlq", "NO_SUCH_DLQ_"+strconv.Itoa(time.Now().Nanosecond()),
		"-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "stream NO_SUCH_DLQ_")
	require.Contains(t, errOut, "stream not found")
}
