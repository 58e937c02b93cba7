package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// outboxTable is a migrated outbox in a table of its own.
type outboxTable struct {
	t     *testing.T
	dsn   string
	table string
	ob    *outbox.Outbox
	pool  *pgxpool.Pool
}

func newOutboxTable(t *testing.T) *outboxTable {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := "cli_outbox_" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	ob, err := outbox.New(outbox.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(ctx, pool))
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	return &outboxTable{t: t, dsn: testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN), table: table, ob: ob, pool: pool}
}

// add commits events and returns their IDs.
func (o *outboxTable) add(events ...outbox.Event) []string {
	o.t.Helper()
	ctx := context.Background()
	tx, err := o.pool.Begin(ctx)
	require.NoError(o.t, err)
	ids, err := o.ob.Add(ctx, tx, events...)
	require.NoError(o.t, err)
	require.NoError(o.t, tx.Commit(ctx))
	return ids
}

// exec runs a statement on the table, written with %s for its name.
func (o *outboxTable) exec(sql string, args ...any) {
	o.t.Helper()
	_, err := o.pool.Exec(context.Background(), fmt.Sprintf(sql, o.table), args...)
	require.NoError(o.t, err)
}

// fail makes the event failed, as the relay does when it gives up.
func (o *outboxTable) fail(id string, attempts int, lastError string) {
	o.t.Helper()
	o.exec(`UPDATE %s SET status = 'failed', attempts = $2, last_error = $3 WHERE event_id = $1`, id, attempts, lastError)
}

// rows returns the table's rows in publication order as "ID status attempts".
func (o *outboxTable) rows() []string {
	o.t.Helper()
	rows, err := o.pool.Query(context.Background(), `SELECT event_id, status, attempts FROM `+o.table+` ORDER BY seq`)
	require.NoError(o.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, status string
		var attempts int
		require.NoError(o.t, rows.Scan(&id, &status, &attempts))
		out = append(out, fmt.Sprintf("%s %s %d", id, status, attempts))
	}
	require.NoError(o.t, rows.Err())
	return out
}

// cli runs dedup outbox sub on the table.
func (o *outboxTable) cli(sub string, args ...string) (int, string, string) {
	o.t.Helper()
	return cli(o.t, append([]string{"outbox", sub, "-postgres", o.dsn, "-table", o.table}, args...)...)
}

// outbox status counts the events by state and lists the failed ones;
// requeue lists what it would do, then makes them pending again.
func TestOutboxStatusAndRequeue(t *testing.T) {
	o := newOutboxTable(t)
	ids := o.add(outbox.Event{Destination: "orders", Payload: []byte("a")},
		outbox.Event{Destination: "orders", Payload: []byte("b")}, outbox.Event{Destination: "orders", Payload: []byte("c")})
	// The relay gave up on one of them (as after WithMaxAttempts).
	o.fail(ids[1], 5, "broker refused")

	code, out, errOut := o.cli("status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "pending 2")
	require.Contains(t, out, "failed 1")
	require.Contains(t, out, ids[1])
	require.Contains(t, out, "broker refused")

	code, out, errOut = o.cli("requeue", "-all")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "would requeue 1 events: "+ids[1]+"; run with -yes\n", out)
	code, out, errOut = o.cli("requeue", "-id", ids[1], "-yes")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "requeued 1 of 1 events: "+ids[1]+"\n", out)
	require.Equal(t, []string{ids[0] + " pending 0", ids[1] + " pending 0", ids[2] + " pending 0"}, o.rows())
	code, out, _ = o.cli("status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "pending 3")
	require.Contains(t, out, "failed 0")
	code, out, _ = o.cli("requeue", "-all", "-yes")
	require.Equal(t, 0, code)
	require.Equal(t, "requeued 0 events\n", out)
}

// outboxStatusJSON is what outbox status -json promises to print.
type outboxStatusJSON struct {
	Pending              int64   `json:"pending"`
	Failed               int64   `json:"failed"`
	Sent                 int64   `json:"sent"`
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	FailedEvents         []struct {
		EventID     string          `json:"event_id"`
		Destination string          `json:"destination"`
		Key         json.RawMessage `json:"key"`
		Attempts    int             `json:"attempts"`
		LastError   string          `json:"last_error"`
		CreatedAt   time.Time       `json:"created_at"`
		DueAt       time.Time       `json:"due_at"`
	} `json:"failed_events"`
}

// statusJSON runs outbox status -json and decodes its one JSON object,
// refusing fields it does not know.
func (o *outboxTable) statusJSON(args ...string) (outboxStatusJSON, string) {
	o.t.Helper()
	code, out, errOut := o.cli("status", append([]string{"-json"}, args...)...)
	require.Equal(o.t, 0, code, errOut)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var st outboxStatusJSON
	require.NoError(o.t, dec.Decode(&st), out)
	require.ErrorIs(o.t, dec.Decode(new(any)), io.EOF, "one JSON object: %s", out)
	return st, out
}

// outbox status -json has the counts, the oldest pending event's age, and
// each failed event with the fields the table holds.
func TestOutboxStatusJSON(t *testing.T) {
	o := newOutboxTable(t)
	st, out := o.statusJSON()
	require.Equal(t, outboxStatusJSON{FailedEvents: st.FailedEvents}, st, "an empty outbox")
	require.Contains(t, out, `"failed_events":[]`, "an empty list, not null")

	ids := o.add(outbox.Event{Destination: "orders", Key: []byte("order-42"), Payload: []byte("a")},
		outbox.Event{Destination: "payments", Payload: []byte("b")},
		outbox.Event{Destination: "orders", Payload: []byte("c")},
		outbox.Event{Destination: "orders", Payload: []byte("d")})
	o.fail(ids[0], 5, "broker refused")
	o.fail(ids[1], 1, "MESSAGE_TOO_LARGE")
	o.exec(`UPDATE %s SET status = 'sent', sent_at = now() WHERE event_id = $1`, ids[2])
	o.exec(`UPDATE %s SET created_at = now() - interval '1 hour' WHERE event_id = $1`, ids[3])

	type times struct{ created, due time.Time }
	want := map[string]times{}
	for _, id := range ids[:2] {
		var tm times
		require.NoError(t, o.pool.QueryRow(context.Background(), `SELECT created_at, due_at FROM `+o.table+` WHERE event_id = $1`, id).Scan(&tm.created, &tm.due))
		want[id] = tm
	}

	st, _ = o.statusJSON()
	require.EqualValues(t, 1, st.Pending)
	require.EqualValues(t, 2, st.Failed)
	require.EqualValues(t, 1, st.Sent)
	require.InDelta(t, 3600, st.OldestPendingSeconds, 60, "the age of the oldest pending event, in seconds")
	require.Len(t, st.FailedEvents, 2)
	f := st.FailedEvents[0]
	require.Equal(t, ids[0], f.EventID)
	require.Equal(t, "orders", f.Destination)
	var key []byte
	require.NoError(t, json.Unmarshal(f.Key, &key))
	require.Equal(t, "order-42", string(key), "the key, in base64")
	require.Equal(t, 5, f.Attempts)
	require.Equal(t, "broker refused", f.LastError)
	require.True(t, want[ids[0]].created.Equal(f.CreatedAt), "created_at %s, want %s", f.CreatedAt, want[ids[0]].created)
	require.True(t, want[ids[0]].due.Equal(f.DueAt), "due_at %s, want %s", f.DueAt, want[ids[0]].due)
	f = st.FailedEvents[1]
	require.Equal(t, ids[1], f.EventID)
	require.Equal(t, "payments", f.Destination)
	require.Equal(t, "null", string(f.Key), "no key")
	require.Equal(t, 1, f.Attempts)
	require.Equal(t, "MESSAGE_TOO_LARGE", f.LastError)
	require.True(t, want[ids[1]].created.Equal(f.CreatedAt))
	require.True(t, want[ids[1]].due.Equal(f.DueAt))

	// -limit bounds the list, not the counts.
	st, _ = o.statusJSON("-limit", "1")
	require.EqualValues(t, 2, st.Failed)
	require.Len(t, st.FailedEvents, 1)
	require.Equal(t, ids[0], st.FailedEvents[0].EventID)
}

// requeue counts only the failed events among those named, and names the
// others (unknown, pending, sent) the same way in the dry run and with -yes;
// the dry run changes nothing.
func TestOutboxRequeueOnlyFailed(t *testing.T) {
	o := newOutboxTable(t)
	ids := o.add(outbox.Event{Destination: "orders", Payload: []byte("a")},
		outbox.Event{Destination: "orders", Payload: []byte("b")}, outbox.Event{Destination: "orders", Payload: []byte("c")})
	pending, failed, sent := ids[0], ids[1], ids[2]
	o.fail(failed, 5, "broker refused")
	o.exec(`UPDATE %s SET status = 'sent', sent_at = now() WHERE event_id = $1`, sent)
	before := []string{pending + " pending 0", failed + " failed 5", sent + " sent 0"}
	require.Equal(t, before, o.rows())

	// None of them failed: nothing to requeue, either way.
	others := "not failed, left as they are: " + pending + " (pending), " + sent + " (sent), unknown-id (unknown)\n"
	code, out, errOut := o.cli("requeue", "-id", pending, "-id", sent, "-id", "unknown-id")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "would requeue 0 events\n"+others, out)
	code, out, errOut = o.cli("requeue", "-id", pending, "-id", sent, "-id", "unknown-id", "-yes")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "requeued 0 events\n"+others, out)
	require.Equal(t, before, o.rows())

	// One of them failed (named twice): it alone is counted and requeued.
	args := []string{"-id", "unknown-id", "-id", failed, "-id", pending, "-id", failed}
	others = "not failed, left as they are: unknown-id (unknown), " + pending + " (pending)\n"
	code, out, errOut = o.cli("requeue", args...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "would requeue 1 events: "+failed+"; run with -yes\n"+others, out)
	require.Equal(t, before, o.rows(), "a dry run changes nothing")
	code, out, errOut = o.cli("requeue", append(args, "-yes")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "requeued 1 of 1 events: "+failed+"\n"+others, out)
	require.Equal(t, []string{pending + " pending 0", failed + " pending 0", sent + " sent 0"}, o.rows())

	// Requeued, it is pending: asked again, the answer says so.
	code, out, errOut = o.cli("requeue", "-id", failed)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "would requeue 0 events\nnot failed, left as they are: "+failed+" (pending)\n", out)
	code, out, errOut = o.cli("requeue", "-id", failed, "-yes")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "requeued 0 events\nnot failed, left as they are: "+failed+" (pending)\n", out)
}

// A table that was never migrated is a failure, not an empty outbox.
func TestOutboxNotMigrated(t *testing.T) {
	testenv.Postgres(t)
	dsn := testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	table := "cli_never_" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	for _, args := range [][]string{{"status", "-json"}, {"requeue", "-id", "x"}, {"requeue", "-all"}} {
		code, out, errOut := cli(t, append([]string{"outbox", args[0], "-postgres", dsn, "-table", table}, args[1:]...)...)
		require.Equal(t, 1, code, "%q", args)
		require.Contains(t, errOut, "table does not exist (run Migrate)", "%q", args)
		require.Empty(t, out, "%q", args)
	}
}
