package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// A relay pass reads a backlog with the same plan whatever the table's
// statistics say: analyzed in the steady state (only sent rows) or while
// empty, and then a backlog arrives. Statistics of either kind make the
// indexes of pending rows look empty; the planner then ran the read's
// per-key check once per claimed row, scanning the backlog each time (800 ms
// a pass of 500 here, against 2 ms). The plans are read with EXPLAIN
// (ANALYZE, FORMAT JSON) under the pass's own settings: every read of the
// table goes through the index meant for it, and the per-key scan runs once
// per key of the batch. The pass's rows are checked too: the key whose
// first event waits out a backoff is held back, the others come in order.
func TestPassPlanWhateverTheStatistics(t *testing.T) {
	const sent, backlog, keys, batch = 50_000, 10_000, 50, 500
	pool := testenv.Postgres(t)
	ctx := context.Background()
	for _, analyzed := range []string{"steady state", "empty"} {
		t.Run("analyzed "+analyzed, func(t *testing.T) {
			table := "outbox_plan_" + runID()
			ob, err := outbox.New(outbox.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
			exec := func(sql string, args ...any) {
				t.Helper()
				if _, err := pool.Exec(ctx, sql, args...); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			addSent := func() {
				exec(`INSERT INTO `+table+` (event_id, destination, key, payload, status, sent_at)
					SELECT 's' || g, 'orders', convert_to('old-' || (g % $2), 'UTF8'), 'x', 'sent', now()
					FROM generate_series(1, $1) g`, sent, keys)
			}
			if analyzed == "steady state" {
				addSent()
				exec("ANALYZE " + table)
			} else {
				exec("ANALYZE " + table)
				addSent()
			}
			// The backlog: keys new to the statistics; key k0's first
			// event failed once and waits out its backoff.
			exec(`INSERT INTO `+table+` (event_id, destination, key, payload)
				SELECT 'p' || g, 'orders', convert_to('k' || (g % $2), 'UTF8'), 'x'
				FROM generate_series(0, $1 - 1) g`, backlog, keys)
			exec(`UPDATE ` + table + ` SET attempts = 1, due_at = now() + interval '1 hour'
				WHERE seq = (SELECT min(seq) FROM ` + table + ` WHERE status = 'pending' AND key = 'k0')`)

			settings, claim, read, namespace := outbox.PassStatements(ob)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, settings); err != nil {
				t.Fatal(err)
			}

			plan := explain(t, tx, claim, batch, namespace)
			plan.only(t, table, map[string]string{"_pending": "the claimed rows", "_backoff": "the held keys"})
			if s := plan.nodes("Sort"); len(s) > 0 {
				t.Errorf("the claim sorts: %v", s)
			}

			rows, err := tx.Query(ctx, claim, batch, namespace)
			if err != nil {
				t.Fatal(err)
			}
			claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			if len(claimed) != batch {
				t.Fatalf("claimed %d rows, want %d", len(claimed), batch)
			}

			plan = explain(t, tx, read, claimed)
			plan.only(t, table, map[string]string{"_pending": "the batch", "_pkey": "the batch", "_pending_key": "each key's head"})
			for _, scan := range plan.scans(table + "_pending_key") {
				if scan.Loops > keys {
					t.Errorf("the per-key scan ran %d times for %d keys", scan.Loops, keys)
				}
			}
			if s := plan.nodes("Sort"); len(s) != 1 || s[0] != plan.Plan.NodeType {
				t.Errorf("the read sorts other than its result: %v", s)
			}

			rows, err = tx.Query(ctx, read, claimed)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var seq int64
				var id, dest string
				var key, headers, payload []byte
				var tenant *string
				var attempts int
				err := r.Scan(&seq, &id, &dest, &key, &headers, &payload, &tenant, &attempts)
				return string(key), err
			})
			if err != nil {
				t.Fatal(err)
			}
			// The first 500 pending rows but k0's, all publishable.
			if len(got) != batch {
				t.Errorf("read %d events, want %d", len(got), batch)
			}
			for i, k := range got {
				if k == "k0" {
					t.Fatalf("event %d of key k0 is published while k0's first event waits out its backoff", i)
				}
			}
		})
	}
}

// plan is the root of EXPLAIN (FORMAT JSON)'s answer.
type plan struct {
	Plan planNode `json:"Plan"`
}

type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Loops    int        `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

func explain(t *testing.T, tx pgx.Tx, sql string, args ...any) plan {
	t.Helper()
	var out []byte
	if err := tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plans []plan
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN: %v: %s", err, out)
	}
	return plans[0]
}

func (p plan) walk(f func(n planNode)) {
	var walk func(n planNode)
	walk = func(n planNode) {
		f(n)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(p.Plan)
}

// only fails the test unless every read of table goes through one of the
// indexes named by their suffix.
func (p plan) only(t *testing.T, table string, indexes map[string]string) {
	t.Helper()
	p.walk(func(n planNode) {
		if n.Relation != table {
			return
		}
		if _, ok := indexes[strings.TrimPrefix(n.Index, table)]; !ok || n.Index == "" {
			t.Errorf("the table is read by a %s %s; want only %v", n.NodeType, n.Index, indexes)
		}
	})
}

func (p plan) scans(index string) []planNode {
	var out []planNode
	p.walk(func(n planNode) {
		if n.Index == index {
			out = append(out, n)
		}
	})
	return out
}

func (p plan) nodes(nodeType string) []string {
	var out []string
	p.walk(func(n planNode) {
		if n.NodeType == nodeType {
			out = append(out, fmt.Sprint(n.NodeType))
		}
	})
	return out
}
