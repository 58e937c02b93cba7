package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

func TestRelayPublishesExactlyTheCommittedEvents(t *testing.T) {
	e := newEnv(t, 3)
	committed := map[string]bool{}
	for i := range 20 {
		ids := e.add(i%2 == 0, e.event(fmt.Sprintf("k%d", i%4), fmt.Sprintf("p%d", i)))
		committed[ids[0]] = i%2 == 0
	}
	many := e.add(true, e.event("k9", "a"), e.event("", "b"), outbox.Event{
		ID: "custom-1", Destination: e.topic, Payload: []byte("c"), Tenant: "acme",
		Headers: []outbox.Header{{Key: "trace", Value: []byte{0, 1}}, {Key: "event-id", Value: []byte("spoof")}},
	})
	require.Equal(t, "custom-1", many[2])
	for _, id := range many {
		committed[id] = true
	}
	e.start(e.relay())

	recs := e.consume(13, 10*time.Second)
	got := map[string]*kgo.Record{}
	for _, r := range recs {
		id := header(r, "event-id")
		require.True(t, committed[id], "published %q, which was rolled back or never written", id)
		got[id] = r
	}
	require.Len(t, got, 13, "each committed event published")
	require.Len(t, recs, 13, "published once each (no relay died)")
	c := got["custom-1"]
	require.Equal(t, "acme", header(c, "tenant"))
	require.Equal(t, "\x00\x01", header(c, "trace"))
	require.Equal(t, "c", string(c.Value))
	require.Nil(t, got[many[1]].Key, "an event without a key gets a null record key")
	waitFor(t, 5*time.Second, "rows marked sent", func() bool { return e.statuses()["sent"] == 13 })
	require.Equal(t, map[string]int{"sent": 13}, e.statuses())
}

func TestNewIDIsUUIDv7(t *testing.T) {
	a, b := outbox.NewID(), outbox.NewID()
	require.NotEqual(t, a, b)
	require.Len(t, a, 36)
	require.Equal(t, byte('7'), a[14], "version 7: %s", a)
	require.Contains(t, "89ab", string(a[19]), "RFC 9562 variant: %s", a)
	time.Sleep(2 * time.Millisecond)
	require.Less(t, a, outbox.NewID(), "a later millisecond sorts later")
}

func TestAddRejectsBadEvents(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	good := e.event("k", "p")
	for name, ev := range map[string]outbox.Event{
		"nil payload":       {Destination: e.topic},
		"empty payload":     {Destination: e.topic, Payload: []byte{}},
		"empty destination": {Payload: []byte("p")},
		"long ID":           {ID: strings.Repeat("x", dedup.MaxIDLen+1), Destination: e.topic, Payload: []byte("p")},
		"control in ID":     {ID: "a\nb", Destination: e.topic, Payload: []byte("p")},
		"invalid UTF-8 ID":  {ID: "\xff", Destination: e.topic, Payload: []byte("p")},
		"empty header name": {Destination: e.topic, Payload: []byte("p"), Headers: []outbox.Header{{Value: []byte("v")}}},
	} {
		tx := e.begin()
		_, err := e.ob.Add(ctx, tx, good, ev)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
		var ee *outbox.EventError
		require.ErrorAs(t, err, &ee, name)
		require.Equal(t, 1, ee.Index, name)
		require.NoError(t, tx.Commit(ctx), "%s: a refused event leaves the transaction usable", name)
	}
	require.Empty(t, e.statuses(), "nothing written by a refused Add")

	e.add(true, outbox.Event{ID: "dup", Destination: e.topic, Payload: []byte("p")})
	tx := e.begin()
	_, err := e.ob.Add(ctx, tx, outbox.Event{ID: "dup", Destination: e.topic, Payload: []byte("q")})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)

	_, err = e.ob.Add(ctx, nil, good)
	require.ErrorIs(t, err, dedup.ErrConfig)
	ids, err := e.ob.Add(ctx, e.begin())
	require.NoError(t, err)
	require.Empty(t, ids)
}

func TestTableNeverMigrated(t *testing.T) {
	pool := testenv.Postgres(t)
	ob, err := outbox.New(outbox.WithTable("never_migrated_" + runID()))
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = ob.Add(ctx, tx, outbox.Event{Destination: "t", Payload: []byte("p")})
	require.ErrorIs(t, err, outbox.ErrNotMigrated)

	kc := newEnv(t, 1)
	pub, err := kafkaoutbox.NewPublisher(kc.producer())
	require.NoError(t, err)
	relay, err := outbox.NewRelay(ob, pool.Config(), pub, outbox.WithLogger(quietLogger()))
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.ErrorIs(t, relay.Run(rctx), outbox.ErrNotMigrated, "Run returns at once instead of looping")
	_, err = ob.Requeue(ctx, pool, "x")
	require.ErrorIs(t, err, outbox.ErrNotMigrated)
}

// A relay whose database or role does not exist says so and stops: no
// retry can fix either.
func TestRelayStopsWhenTheServerRefusesItForGood(t *testing.T) {
	e := newEnv(t, 1)
	pub, err := kafkaoutbox.NewPublisher(e.producer())
	require.NoError(t, err)
	for name, code := range map[string]string{"database": "3D000", "role": "28000"} {
		t.Run(name, func(t *testing.T) {
			cfg := e.pool.Config()
			if name == "database" {
				cfg.ConnConfig.Database = "no_such_database_" + runID()
			} else {
				cfg.ConnConfig.User = "no_such_role_" + runID()
			}
			relay, err := outbox.NewRelay(e.ob, cfg, pub, outbox.WithLogger(quietLogger()))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = relay.Run(ctx)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "Run returns instead of retrying until cancelled")
			require.Equal(t, code, pgErr.Code, "%v", err)
			require.NoError(t, ctx.Err())
		})
	}
}

func TestConfigurationErrors(t *testing.T) {
	for _, name := range []string{"", "a.b.c", "1table", "bad-name", "x;drop table y", strings.Repeat("a", 64)} {
		_, err := outbox.New(outbox.WithTable(name))
		var tne *dedup.TableNameError
		require.ErrorAs(t, err, &tne, "%q", name)
		require.ErrorIs(t, err, dedup.ErrConfig, "%q", name)
	}
	ob, err := outbox.New(outbox.WithTable("app.outbox"))
	require.NoError(t, err)

	cfg, err := pgxpool.ParseConfig("postgres://localhost/x")
	require.NoError(t, err)
	var nilPub *kafkaoutbox.Publisher
	pub, err := kafkaoutbox.NewPublisher(&kgo.Client{})
	require.NoError(t, err)
	for name, f := range map[string]func() error{
		"nil outbox":        func() error { _, err := outbox.NewRelay(nil, cfg, pub); return err },
		"nil config":        func() error { _, err := outbox.NewRelay(ob, nil, pub); return err },
		"nil publisher":     func() error { _, err := outbox.NewRelay(ob, cfg, nil); return err },
		"typed nil":         func() error { _, err := outbox.NewRelay(ob, cfg, nilPub); return err },
		"batch 0":           func() error { _, err := outbox.NewRelay(ob, cfg, pub, outbox.WithBatchSize(0)); return err },
		"attempts 0":        func() error { _, err := outbox.NewRelay(ob, cfg, pub, outbox.WithMaxAttempts(0)); return err },
		"nil backoff":       func() error { _, err := outbox.NewRelay(ob, cfg, pub, outbox.WithBackoff(nil)); return err },
		"poll 0":            func() error { _, err := outbox.NewRelay(ob, cfg, pub, outbox.WithPollInterval(0)); return err },
		"publish timeout 0": func() error { _, err := outbox.NewRelay(ob, cfg, pub, outbox.WithPublishTimeout(0)); return err },
		"negative retention": func() error {
			_, err := outbox.NewRelay(ob, cfg, pub, outbox.WithRetention(-time.Second))
			return err
		},
		"nil kgo client": func() error { _, err := kafkaoutbox.NewPublisher(nil); return err },
		"nil migrate DB": func() error { return ob.Migrate(context.Background(), (*pgxpool.Pool)(nil)) },
	} {
		require.ErrorIs(t, f(), dedup.ErrConfig, name)
	}
}

func TestUndeliverableEventsFailWithReasonAndRequeue(t *testing.T) {
	e := newEnv(t, 1)
	big := e.event("big", strings.Repeat("x", 2<<20))
	nowhere := outbox.Event{Destination: "no-such-topic-" + runID(), Payload: []byte("p")}
	ids := e.add(true, big, nowhere, e.event("ok", "fine"))
	e.start(e.relay())

	waitFor(t, 20*time.Second, "two failed rows", func() bool { return e.statuses()["failed"] == 2 })
	failed, err := e.ob.Failed(context.Background(), e.pool, 10)
	require.NoError(t, err)
	require.Len(t, failed, 2)
	require.Equal(t, ids[0], failed[0].ID)
	require.Contains(t, failed[0].LastError, "MESSAGE_TOO_LARGE")
	require.Equal(t, 1, failed[0].Attempts, "failed at the first attempt, not retried")
	require.Equal(t, ids[1], failed[1].ID)
	require.Contains(t, failed[1].LastError, "UNKNOWN_TOPIC_OR_PARTITION")
	require.Len(t, e.consume(1, 5*time.Second), 1, "the deliverable event went out")

	// The operator creates the topic, then requeues.
	adm := e.producer()
	_, err = kgoCreateTopic(adm, nowhere.Destination)
	require.NoError(t, err)
	n, err := e.ob.Requeue(context.Background(), e.pool, ids[1], ids[2], "unknown")
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only failed rows are requeued")
	waitFor(t, 10*time.Second, "the requeued event sent", func() bool { return e.statuses()["sent"] == 2 })
}

func TestBrokerRefusingWritesForAWhileLosesNothing(t *testing.T) {
	e := newEnv(t, 2)
	refusing := refuseProduce(e.kafka)
	refusing.Store(true)
	var ids []string
	for i := range 30 {
		ids = append(ids, e.add(true, e.event(fmt.Sprintf("k%d", i%3), fmt.Sprint(i)))...)
	}
	e.start(e.relay(outbox.WithMaxAttempts(1000), outbox.WithPublishTimeout(300*time.Millisecond)))
	waitFor(t, 10*time.Second, "failed attempts recorded", func() bool {
		var attempts int
		err := e.pool.QueryRow(context.Background(), "SELECT COALESCE(max(attempts), 0) FROM "+e.table).Scan(&attempts)
		return err == nil && attempts >= 3
	})
	var errText string
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT last_error FROM "+e.table+" WHERE attempts > 0 LIMIT 1").Scan(&errText))
	require.NotEmpty(t, errText)
	require.Equal(t, 30, e.statuses()["pending"], "nothing sent, nothing failed while the broker refuses")
	refusing.Store(false)

	recs := e.consume(30, 20*time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[header(r, "event-id")] = true
	}
	for _, id := range ids {
		require.True(t, seen[id], "event %s lost", id)
	}
	waitFor(t, 5*time.Second, "all sent", func() bool { return e.statuses()["sent"] == 30 })
}

func TestDeleteSentAndRetention(t *testing.T) {
	e := newEnv(t, 1)
	e.add(true, e.event("a", "1"), e.event("b", "2"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.relay(outbox.WithDeleteSent()).Run(ctx) }()
	waitFor(t, 10*time.Second, "rows deleted once published", func() bool { return len(e.statuses()) == 0 })
	cancel()
	require.NoError(t, <-done)
	require.Len(t, e.consume(2, 5*time.Second), 2)

	e.add(true, e.event("c", "3"))
	e.start(e.relay(outbox.WithRetention(200 * time.Millisecond)))
	waitFor(t, 10*time.Second, "the sent row purged after its retention", func() bool { return len(e.statuses()) == 0 })

	kept := newEnv(t, 1) // the default retention: sent rows stay
	kept.start(kept.relay())
	kept.add(true, kept.event("d", "4"))
	waitFor(t, 10*time.Second, "sent", func() bool { return kept.statuses()["sent"] == 1 })
	n, err := kept.ob.Purge(context.Background(), kept.pool, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "a row younger than the retention is kept")
	n, err = kept.ob.Purge(context.Background(), kept.pool, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func TestWithoutNotifyRelaysFindEventsByPolling(t *testing.T) {
	e := newEnv(t, 1)
	quiet, err := outbox.New(outbox.WithTable(e.table), outbox.WithNotify(false))
	require.NoError(t, err)
	e.start(e.relay(outbox.WithPollInterval(20 * time.Millisecond)))
	tx := e.begin()
	ids, err := quiet.Add(context.Background(), tx, e.event("k", "polled"))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	recs := e.consume(1, 10*time.Second)
	require.Len(t, recs, 1)
	require.Equal(t, ids[0], header(recs[0], "event-id"))
}

// With WithNotify, a commit wakes the relays: this relay would otherwise
// not pass again for an hour.
func TestNotifyWakesRelays(t *testing.T) {
	e := newEnv(t, 1)
	loud, err := outbox.New(outbox.WithTable(e.table), outbox.WithNotify(true))
	require.NoError(t, err)
	e.start(e.relay(outbox.WithPollInterval(time.Hour), outbox.WithBusyPollInterval(time.Hour)))
	for i := range 3 {
		tx := e.begin()
		ids, err := loud.Add(context.Background(), tx, e.event("k", fmt.Sprint("woke ", i)))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(context.Background()))
		waitFor(t, 30*time.Second, "the notified event sent", func() bool { return e.statuses()["sent"] == i+1 })
		recs := e.consume(i+1, 10*time.Second)
		require.Len(t, recs, i+1)
		require.Equal(t, ids[0], header(recs[i], "event-id"))
	}
}

// Services starting together each migrate the same table: the migrations
// take turns and every one succeeds.
func TestConcurrentMigrate(t *testing.T) {
	pool := testenv.Postgres(t)
	for round := range 5 {
		ob, err := outbox.New(outbox.WithTable(fmt.Sprintf("migrate_%s_%d", runID(), round)))
		require.NoError(t, err)
		errs := make(chan error, 10)
		for range cap(errs) {
			go func() { errs <- ob.Migrate(context.Background(), pool) }()
		}
		for range cap(errs) {
			require.NoError(t, <-errs)
		}
	}
}

// A row whose headers are not the outbox's (written by hand, or by a
// future version) fails alone with its reason; the rest are published.
func TestUnreadableRowFailsAlone(t *testing.T) {
	e := newEnv(t, 1)
	bad := e.add(true, e.event("k", "bad"))[0]
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table+` SET headers = '{"not": "a list"}' WHERE event_id = $1`, bad)
	require.NoError(t, err)
	good := e.add(true, e.event("", "good"))[0]
	e.start(e.relay())

	recs := e.consume(1, 10*time.Second)
	require.Len(t, recs, 1, "the good event is published past the unreadable one")
	require.Equal(t, good, header(recs[0], "event-id"))
	waitFor(t, 10*time.Second, "the unreadable row failed", func() bool { return e.statuses()["failed"] == 1 })
	failed, err := e.ob.Failed(context.Background(), e.pool, 10)
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, bad, failed[0].ID)
	require.Contains(t, failed[0].LastError, "unreadable headers")
	require.Equal(t, map[string]int{"sent": 1, "failed": 1}, e.statuses())
}
