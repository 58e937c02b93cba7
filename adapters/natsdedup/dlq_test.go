package natsdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// With no stream capturing the dead-letter subjects, Health reports it at
// the start of Run, matching dedup.ErrConfig and naming the subjects to
// capture, and an ERROR says so once; good messages are handled meanwhile.
// Once a stream captures them, Health is nil again. A consumer whose
// letters go elsewhere (WithDeadLetterSubjects(nil)) checks nothing.
func TestMissingDeadLetterStream(t *testing.T) {
	t.Parallel()
	_, js := testenv.NATS(t)
	ctx := context.Background()
	tok := token()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T_" + tok, Subjects: []string{tok + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"T_" + tok, "DLQ_" + tok} {
			_ = js.DeleteStream(context.Background(), name)
		}
	})
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), rec, func(_ context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	})
	logs := &keptLogs{}
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js), natsdedup.WithFetchWait(time.Second),
		natsdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	var herr error
	adaptertest.WaitFor(t, deadline, "Health reporting the missing dead-letter stream", func() bool {
		herr = c.Health()
		return herr != nil
	})
	if !errors.Is(herr, dedup.ErrConfig) || !strings.Contains(herr.Error(), `"dlq.`+tok+`.>"`) {
		t.Errorf("Health: %v, want ErrConfig naming dlq.%s.>", herr, tok)
	}
	t.Logf("Health: %v", herr)
	if _, err := js.Publish(ctx, tok+".orders", []byte("{}"), jetstream.WithMsgID("good")); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, deadline, "a good message handled meanwhile", func() bool { return rec.Count("good") == 1 })
	if n := len(logs.find(slog.LevelError, "no stream captures the dead-letter subject")); n != 1 {
		t.Errorf("%d ERRORs of the missing stream, want 1", n)
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ_" + tok, Subjects: []string{"dlq." + tok + ".>"},
		Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, deadline, "Health nil once a stream captures the letters", func() bool { return c.Health() == nil })
	if n := len(logs.find(slog.LevelInfo, "a stream captures the dead-letter subjects now")); n != 1 {
		t.Errorf("%d INFOs of the stream found, want 1", n)
	}
	run.StopClean(t)

	elsewhere, err := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js), natsdedup.WithFetchWait(time.Second),
		natsdedup.WithDeadLetterSubjects(func(string) string { return "nowhere.at.all" }), natsdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run = adaptertest.Start(t, elsewhere.Run)
	adaptertest.WaitFor(t, deadline, "Health reporting nowhere.at.all", func() bool { return elsewhere.Health() != nil })
	run.StopClean(t)
	unchecked, err := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js), natsdedup.WithFetchWait(time.Second),
		natsdedup.WithDeadLetterSubjects(nil), natsdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run = adaptertest.Start(t, unchecked.Run)
	if _, err := js.Publish(ctx, tok+".orders", []byte("{}"), jetstream.WithMsgID("good-2")); err != nil {
		t.Fatal(err)
	}
	adaptertest.WaitFor(t, deadline, "a message handled by the consumer checking nothing", func() bool { return rec.Count("good-2") == 1 })
	if err := unchecked.Health(); err != nil {
		t.Errorf("Health of a consumer checking nothing: %v", err)
	}
	run.StopClean(t)
}
