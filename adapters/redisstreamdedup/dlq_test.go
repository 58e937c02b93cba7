package redisstreamdedup_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// A poison entry is given back and taken over until its delivery count
// reaches the maximum, then added to the dead-letter stream with its
// fields, its payload and the SDK's metadata, and acknowledged: one letter.
func TestPoisonToTheDeadLetterStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sink := e.sink(t)
	fx := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), fx, func(_ context.Context, m *redisstreamdedup.Message) error {
		fx.Call(eventID(m))
		return errBoom
	}, dedup.WithSink(sink), dedup.WithMaxAttempts(3))
	e.start(t, w)
	entry := e.publish(t, "id", "bad-1", "payload", `{"n":1}`, "trace-id", "t-1")
	adaptertest.WaitFor(t, deadline, "the poison entry dead-lettered", func() bool { return len(e.letters(t)) == 1 })
	e.assertAllAcked(t)

	letter := e.letters(t)[0].Values
	for k, want := range map[string]string{
		"payload":                 `{"n":1}`,
		"id":                      "bad-1",
		"trace-id":                "t-1",
		"dedup-reason":            string(dedup.ReasonHandlerError),
		"dedup-attempts":          "3",
		"dedup-event-id":          "bad-1",
		"dedup-scope":             w.Scope(),
		"dedup-error":             errBoom.Error(),
		"dedup-origin-stream":     e.stream,
		"dedup-origin-message-id": entry,
	} {
		if got := letter[k]; got != want {
			t.Errorf("letter's %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"dedup-first-failure", "dedup-last-failure", redisstreamdedup.LetterIDField} {
		if letter[k] == "" {
			t.Errorf("letter has no %s", k)
		}
	}
	if n := fx.Calls("bad-1"); n != 3 {
		t.Errorf("the handler ran %d times, want 3", n)
	}
}

// An entry without the event ID field is dead-lettered at once with
// reason invalid-id, without running, and acknowledged.
func TestMissingIDFieldDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sink := e.sink(t)
	fx := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), fx, func(_ context.Context, m *redisstreamdedup.Message) error {
		fx.Call(eventID(m))
		return nil
	}, dedup.WithSink(sink))
	e.start(t, w)
	e.publish(t, "payload", "no id here")
	adaptertest.WaitFor(t, deadline, "the entry without an ID dead-lettered", func() bool { return len(e.letters(t)) == 1 })
	e.assertAllAcked(t)
	letter := e.letters(t)[0].Values
	if letter["dedup-reason"] != string(dedup.ReasonInvalidID) || letter["payload"] != "no id here" {
		t.Errorf("letter %v, want reason %s and the payload", letter, dedup.ReasonInvalidID)
	}
	if n := fx.CallCount(); n != 0 {
		t.Errorf("the handler ran %d times, want never", n)
	}
}

// A letter sent again (its recording failed after the XADD) is not added
// twice: the Sink finds it among the stream's last entries.
func TestSinkAddsALetterOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sink := e.sink(t)
	dl := dedup.DeadLetter{Payload: []byte("p"), Origin: dedup.Origin{Stream: e.stream, MessageID: "1-0"},
		Reason: dedup.ReasonHandlerError, EventID: "ev", Scope: "s", Attempts: 3}
	other := dl
	other.EventID = "ev-2"
	for i, l := range []dedup.DeadLetter{dl, other, dl} {
		if err := sink.Send(context.Background(), l); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	letters := e.letters(t)
	if len(letters) != 2 {
		t.Fatalf("%d letters, want 2", len(letters))
	}
	for i, want := range []string{"ev", "ev-2"} {
		if got := letters[i].Values["dedup-event-id"]; got != want {
			t.Errorf("letter %d of %v, want %s", i, got, want)
		}
		if got := letters[i].Values["dedup-attempts"]; got != strconv.Itoa(3) {
			t.Errorf("letter %d attempts %v", i, got)
		}
	}
}
