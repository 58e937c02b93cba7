package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// The relay's connection is killed while the broker holds its batch: the
// broker then acknowledges records the relay can no longer mark sent. The
// rows stay pending and go out again; nothing is lost and the relay goes on.
func TestPostgresGoneMidPassLosesNothing(t *testing.T) {
	e := newEnv(t, 1)
	held := make(chan struct{})
	release := make(chan struct{})
	e.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.DropControl()
		close(held)
		<-release
		return nil, nil, false // then handled as usual
	})
	ids := e.add(true, e.event("a", "1"), e.event("a", "2"), e.event("b", "3"))
	// A name of its own, so that only this test's relay is killed, whatever
	// else runs against the database.
	app := "outbox-pgfault-" + runID()
	cfg := e.pool.Config()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pub, err := kafkaoutbox.NewPublisher(e.producer())
	require.NoError(t, err)
	r, err := outbox.NewRelay(e.ob, cfg, pub, outbox.WithPollInterval(50*time.Millisecond), outbox.WithLogger(quietLogger()))
	require.NoError(t, err)
	e.start(r)

	<-held
	ctx := context.Background()
	var killed int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND state = 'idle in transaction'`,
		app).Scan(&killed))
	require.Equal(t, 1, killed, "the relay's pass connection, idle in its transaction while the broker works")
	close(release)

	waitFor(t, 15*time.Second, "all sent after reconnecting", func() bool { return e.statuses()["sent"] == 3 })
	recs := e.consume(6, 10*time.Second)
	count := map[string]int{}
	for _, r := range recs {
		count[header(r, "event-id")]++
	}
	for _, id := range ids {
		require.Equal(t, 2, count[id], "event %s: published, unrecorded, published again", id)
	}
}

// A database whose idle_in_transaction_session_timeout is shorter than a
// slow broker's answer does not end the relay's pass: the pass is exempt,
// and each event is published once.
func TestIdleInTransactionTimeoutDoesNotEndAPass(t *testing.T) {
	e := newEnv(t, 1)
	e.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.DropControl()
		time.Sleep(time.Second)
		return nil, nil, false // then handled as usual
	})
	ids := e.add(true, e.event("a", "1"), e.event("a", "2"), e.event("b", "3"))
	cfg := e.pool.Config()
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "200ms"
	pub, err := kafkaoutbox.NewPublisher(e.producer())
	require.NoError(t, err)
	r, err := outbox.NewRelay(e.ob, cfg, pub, outbox.WithPollInterval(50*time.Millisecond), outbox.WithLogger(quietLogger()))
	require.NoError(t, err)
	e.start(r)

	waitFor(t, 15*time.Second, "all sent", func() bool { return e.statuses()["sent"] == 3 })
	recs := e.consume(len(ids)+1, 3*time.Second) // all of them, second copies included
	count := map[string]int{}
	for _, r := range recs {
		count[header(r, "event-id")]++
	}
	for _, id := range ids {
		require.Equal(t, 1, count[id], "event %s published once", id)
	}
}
