package main

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A Redis dead letter goes back to its origin stream once the bug is
// fixed, with its fields: a dry run lists it and leaves the dead-letter
// stream as it was; -yes resets its record, the consumer runs it exactly
// once and it is deleted from the dead-letter stream; -reason and the loop
// guard leave the other letters in place until a run chooses them.
func TestRedriveRedis(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	stream := "redrive-test:" + strings.ToLower(rand.Text()[:10])
	dlq := stream + redisstreamdedup.DefaultDLQSuffix
	t.Cleanup(func() { rdb.Del(context.Background(), stream, dlq) })
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "app", "0").Err())
	dsn, table, store, _ := postgresTable(t)
	scope := dedup.Scope("redis-redrive", "apply")

	sink, err := redisstreamdedup.NewSink(rdb)
	require.NoError(t, err)
	h := newRedriven()
	field := func(m *redisstreamdedup.Message, name string) string { v, _ := m.Field(name); return v }
	w, err := dedup.Wrap(store, redisstreamdedup.Messages(), func(_ context.Context, m *redisstreamdedup.Message) error {
		return h.handle(field(m, "id"), field(m, "payload"), field(m, redriveCountHeader))
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithObserver(h.fx.Observe), dedup.WithLogger(quietLog()))
	require.NoError(t, err)
	c, err := redisstreamdedup.NewConsumer(rdb, stream, "app", w, redisstreamdedup.WithLogger(quietLog()),
		redisstreamdedup.WithBlock(500*time.Millisecond), redisstreamdedup.WithClaimIdle(2*time.Second))
	require.NoError(t, err)
	running := adaptertest.Start(t, c.Run)

	// The poison entry, dead-lettered by the consumer.
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", "p1", "payload", "v-p1"}}).Err())
	adaptertest.WaitFor(t, redriveWait, "p1 dead-lettered", func() bool { return h.fx.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	// Two more letters: one redriven thrice already, one of another reason.
	park := func(id string, reason dedup.Reason, headers ...dedup.Header) {
		parkedRecord(t, store, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, sink.Send(ctx, dedup.DeadLetter{Payload: []byte("v-" + id), Reason: reason, Error: "bug",
			Attempts: 1, EventID: id, Scope: scope, LastFailure: time.Now(),
			Headers: append([]dedup.Header{{Key: "id", Value: []byte(id)}}, headers...),
			Origin:  dedup.Origin{Stream: stream, Group: "app", MessageID: "1-" + id}}))
	}
	park("looping", dedup.ReasonPermanent, dedup.Header{Key: redriveCountHeader, Value: []byte("3")})
	park("other", dedup.ReasonHandlerError)
	letters := func() (ids, entries []string) {
		ls, err := rdb.XRange(ctx, dlq, "-", "+").Result()
		require.NoError(t, err)
		for _, l := range ls {
			ids = append(ids, l.Values["dedup-event-id"].(string))
			entries = append(entries, l.ID)
		}
		return ids, entries
	}
	ids, entries := letters()
	require.Equal(t, []string{"p1", "looping", "other"}, ids)

	redrive := func(extra ...string) string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"redrive", "redis", "-redis", rdb.Options().Addr, "-dlq", dlq,
			"-postgres", dsn, "-table", table}, extra...)...)
		require.Equal(t, 0, code, errOut)
		return out
	}
	out := redrive()
	require.Contains(t, out, "3 dead letters read, would send back 2, skipped 1")
	require.Contains(t, out, "p1 (permanent, "+dlq+"@"+entries[0]+") back to stream "+stream)
	require.Contains(t, out, "redriven 3 times already")
	again, _ := letters()
	require.Equal(t, ids, again, "a dry run leaves the dead-letter stream as it was")
	rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: "p1"})
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status, "a dry run resets nothing")

	h.fixed.Store(true) // the bug is fixed and deployed
	out = redrive("-yes", "-reason", "permanent")
	require.Contains(t, out, "3 dead letters read, sent back 1, skipped 2")
	require.Contains(t, out, "redriven 3 times already (-max-redrives): "+dlq+"@"+entries[1])
	require.Contains(t, out, "reason handler-error not chosen (-reason): "+dlq+"@"+entries[2])
	adaptertest.WaitFor(t, redriveWait, "p1 run again", func() bool { return h.fx.Count("p1") == 1 })
	left, _ := letters()
	require.Equal(t, []string{"looping", "other"}, left, "the skipped letters stay")

	out = redrive("-yes")
	require.Contains(t, out, "2 dead letters read, sent back 1, skipped 1")
	adaptertest.WaitFor(t, redriveWait, "other run again", func() bool { return h.fx.Count("other") == 1 })
	out = redrive("-yes", "-max-redrives", "5")
	require.Contains(t, out, "1 dead letters read, sent back 1, skipped 0")
	adaptertest.WaitFor(t, redriveWait, "looping run again", func() bool { return h.fx.Count("looping") == 1 })

	running.StopClean(t)
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	require.Zero(t, groups[0].Pending, "nothing left unacknowledged")
	left, _ = letters()
	require.Empty(t, left, "the dead-letter stream is drained")
	for id, count := range map[string]string{"p1": "1", "other": "1", "looping": "4"} {
		require.Equal(t, 1, h.fx.Calls(id), "%s ran once", id)
		require.Equal(t, [2]string{"v-" + id, count}, h.saw(id), "%s: its payload, and its redrive count", id)
		rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status, id)
	}
	out = redrive("-yes")
	require.Contains(t, out, "0 dead letters read, sent back 0, skipped 0")
}
