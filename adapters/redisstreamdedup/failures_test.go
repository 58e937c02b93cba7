package redisstreamdedup_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// An acknowledgement that fails while Redis is unreachable is sent again
// once Redis answers: the settled entry leaves the pending entry list
// without waiting to be taken over (the claim idle time is 30 s, and a
// takeover would answer it as a duplicate, which never happens).
func TestFailedAckSentAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy, rdb := e.proxied(t)
	fx, logs := adaptertest.NewEffects(), &testenv.Logs{}
	started, finish := make(chan struct{}), make(chan struct{})
	w := wrap(t, dedup.NewMemoryStore(), fx, func(_ context.Context, m *redisstreamdedup.Message) error {
		close(started)
		<-finish
		fx.Apply(eventID(m))
		return nil
	})
	c, err := redisstreamdedup.NewConsumer(rdb, e.stream, e.group, w, redisstreamdedup.WithBlock(500*time.Millisecond),
		redisstreamdedup.WithClaimIdle(30*time.Second), redisstreamdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, c.Run)
	e.publish(t, "id", "ev-1", "payload", "p")
	select {
	case <-started:
	case <-time.After(deadline):
		t.Fatal("the event never ran")
	}
	proxy.Cut()
	close(finish)
	adaptertest.WaitFor(t, deadline, "the acknowledgement failing", func() bool {
		return logs.Count(slog.LevelWarn, "redisstreamdedup: acknowledgement failed") > 0
	})
	proxy.Restore()
	e.assertAllAcked(t)
	run.StopClean(t)
	if n, d := fx.Count("ev-1"), fx.Outcomes(dedup.OutcomeDuplicate); n != 1 || d != 0 {
		t.Errorf("applied %d times, %d duplicates; want once, and the acknowledgement sent again, not the entry taken over", n, d)
	}
}
