package dedupui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
)

// TestNoWholeTableReadWithoutIndexes runs every page of a console, actions
// on, over a table without the console's indexes, through a pool whose
// tracer collects each statement the console sends. The overview and the
// lists answer 200 with the notice naming the missing indexes and how to
// create them, and run none of their queries; the pages by key, a confirmed
// release and the outbox keep working. Then each collected statement is
// explained, sequential scans disabled so that a tiny table's plan is not
// a sequential scan by choice: none reads the records table sequentially or
// through a whole index (an index scan without a condition).
func TestNoWholeTableReadWithoutIndexes(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, []string{"billing", "orders/charge"}, 3)
	indexes := []string{f.table + "_console", f.table + "_created"}
	if _, err := f.pool.Exec(ctx, `DROP INDEX `+strings.Join(indexes, ", ")); err != nil {
		t.Fatal(err)
	}
	tr := &statements{}
	cfg := f.pool.Config()
	cfg.ConnConfig.Tracer = tr
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	store, err := dedup.NewPostgresStore(traced, dedup.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, dedupui.New(store, dedupui.WithOutbox(f.outbox, traced), dedupui.WithActions()))

	for _, path := range []string{"", "?scope=billing&older_than=1m", "stuck", "stuck?scope=billing&reason=try+later",
		"failed", "failed?reason=" + url.QueryEscape("reason 0: boom")} {
		code, body := get(t, base, path)
		if code != http.StatusOK {
			t.Fatalf("%q: %d\n%s", path, code, body)
		}
		for _, want := range append([]string{`id="missing-indexes"`, "store.CreateConsoleIndexes(ctx)", "dedup ui -create-indexes",
			"every claim pays for them"}, indexes...) {
			if !strings.Contains(body, want) {
				t.Errorf("%q: the notice does not say %q\n%s", path, want, body)
			}
		}
		for _, absent := range []string{`id="counts"`, `id="records"`, `data-refresh`} {
			if strings.Contains(body, absent) {
				t.Errorf("%q: shows %s without the indexes", path, absent)
			}
		}
	}
	keyQuery := func(k dedup.Key) string { return url.Values{"scope": {k.Scope}, "id": {k.EventID}}.Encode() }
	for _, c := range []struct{ path, want string }{
		{"record?" + keyQuery(f.final), "reason 2: boom"},
		{"record?scope=billing&id=never-seen", "no live record"},
		{"forget?" + keyQuery(f.final), `action="forget"`},
		{"outbox", `id="pending"`},
	} {
		if code, body := get(t, base, c.path); code != http.StatusOK || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d, without %q\n%s", c.path, code, c.want, body)
		}
	}
	code, body := get(t, base, "release?"+keyQuery(f.stuckRelease))
	if code != http.StatusOK {
		t.Fatalf("release confirmation: %d\n%s", code, body)
	}
	form := url.Values{}
	for _, m := range hiddenIn.FindAllStringSubmatch(body, -1) {
		form.Set(m[1], unescape(m[2]))
	}
	if code, body := post(t, base, "release", form, "Origin", origin(t, base), "Sec-Fetch-Site", "same-origin"); code != http.StatusOK || !strings.Contains(body, "is forgotten") {
		t.Fatalf("release: %d\n%s", code, body)
	}
	if _, err := f.store.Get(ctx, f.stuckRelease); err == nil {
		t.Error("the released record is still there")
	}

	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET enable_seqscan") }()
	reads := 0
	for _, st := range tr.all() {
		n, whole, err := tableReads(ctx, conn.Conn(), f.table, st.sql, st.args...)
		if err != nil {
			t.Errorf("explain %s: %v", st.sql, err)
		}
		for _, w := range whole {
			t.Errorf("the console ran a statement that reads the whole records table (%s):\n%s", w, st.sql)
		}
		reads += n
	}
	if reads == 0 {
		t.Errorf("no statement of the %d collected read the records table: the tracer saw nothing", len(tr.all()))
	}
	// The check sees a whole-table read: the overview's count, run without
	// the indexes, is one.
	if _, whole, err := tableReads(ctx, conn.Conn(), f.table, `SELECT scope, status, count(*) FROM `+f.table+` WHERE status <> 2 GROUP BY 1, 2`); err != nil || len(whole) == 0 {
		t.Errorf("the check misses the count by status read without the index: %v, %v", whole, err)
	}
}

// statement is one the console sent, with its arguments.
type statement struct {
	sql  string
	args []any
}

// statements is a pgx tracer collecting the statements a pool sends.
type statements struct {
	mu   sync.Mutex
	list []statement
}

// TraceQueryStart collects the statement.
func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, statement{d.SQL, d.Args})
	return ctx
}

// TraceQueryEnd does nothing.
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) all() []statement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]statement(nil), s.list...)
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

// tableReads explains sql on conn and returns how many of its plan's nodes
// read table, and those that read it whole: a sequential scan, or an index
// of it scanned without a condition. A transaction's control statements
// are no reads.
func tableReads(ctx context.Context, conn *pgx.Conn, table, sql string, args ...any) (int, []string, error) {
	switch strings.ToLower(strings.Fields(sql + " x")[0]) {
	case "begin", "commit", "rollback", "savepoint", "release", "set", "reset":
		return 0, nil, nil
	}
	var out []struct{ Plan planNode }
	var raw []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		return 0, nil, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, nil, err
	}
	n := 0
	var whole []string
	var walk func(p planNode)
	walk = func(p planNode) {
		onTable := p.Relation == table || strings.HasPrefix(p.Index, table+"_")
		if onTable {
			n++
		}
		switch {
		case onTable && p.Type == "Seq Scan":
			whole = append(whole, "Seq Scan on "+table)
		case onTable && strings.Contains(p.Type, "Index") && p.IndexCond == "":
			whole = append(whole, p.Type+" of "+p.Index+" without a condition")
		}
		for _, c := range p.Plans {
			walk(c)
		}
	}
	for _, o := range out {
		walk(o.Plan)
	}
	return n, whole, nil
}
