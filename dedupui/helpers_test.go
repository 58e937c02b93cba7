package dedupui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/dedupui"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
)

// fixture is a PostgreSQL store and outbox on tables of their own, with
// records of every state and events pending, failed and sent.
type fixture struct {
	pool         *pgxpool.Pool
	store        *dedup.PostgresStore
	table        string
	outbox       *outbox.Outbox
	outboxTable  string
	stuckRelease dedup.Key // stuck in flight: its lease ran out
	final        dedup.Key // failed for good
	live         dedup.Key // held by a live lease
	withResult   dedup.Key // succeeded, with a result
}

// secretResult is the result stored with fixture.withResult.
const secretResult = "result-4f1c-do-not-show"

// newFixture seeds a fixture: per scope, n records failed for good (three
// reasons), n stuck in flight, n failed retryably, n in flight, n
// succeeded; and per destination, pending, failed and sent events.
func newFixture(t *testing.T, scopes []string, n int) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	suffix := deduptype.NewOwnerToken()[:10]
	f := &fixture{pool: pool, table: "dedupui_test_" + suffix, outboxTable: "dedupui_outbox_" + suffix}
	var err error
	if f.store, err = dedup.NewPostgresStore(pool, dedup.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	if f.outbox, err = outbox.New(outbox.WithTable(f.outboxTable)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.table+", "+f.outboxTable)
	})
	if err := f.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.store.CreateConsoleIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	claim := func(k dedup.Key, lease time.Duration) dedup.Claim {
		c, err := f.store.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp-" + k.EventID, Lease: lease, TTL: time.Hour})
		if err != nil || c.Status != dedup.ClaimAcquired {
			t.Fatalf("claim %s: %v %v", k, c.Status, err)
		}
		return c
	}
	for _, scope := range scopes {
		for i := range n {
			k := dedup.Key{Scope: scope, EventID: fmt.Sprintf("final-%03d", i)}
			c := claim(k, time.Hour)
			if err := f.store.Fail(ctx, k, c.Record.Owner, dedup.Failure{Final: true, Error: fmt.Sprintf("reason %d: boom", i%3), TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			f.final = k
			k = dedup.Key{Scope: scope, EventID: fmt.Sprintf("lapsed-%03d", i)}
			claim(k, time.Millisecond)
			f.stuckRelease = k
			k = dedup.Key{Scope: scope, EventID: fmt.Sprintf("retry-%03d", i)}
			c = claim(k, time.Hour)
			if err := f.store.Fail(ctx, k, c.Record.Owner, dedup.Failure{Error: "try later", TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			f.live = dedup.Key{Scope: scope, EventID: fmt.Sprintf("live-%03d", i)}
			claim(f.live, time.Hour)
			k = dedup.Key{Scope: scope, EventID: fmt.Sprintf("done-%03d", i)}
			c = claim(k, time.Hour)
			if err := f.store.Complete(ctx, k, c.Record.Owner, []byte(secretResult), time.Hour); err != nil {
				t.Fatal(err)
			}
			f.withResult = k
		}
	}
	// Lapsed leases: wait until the store's clock is past every one.
	waitFor(t, "the short leases to lapse", func() bool {
		var held int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+f.table+` WHERE status = 1 AND lease_until >= now() AND event_id LIKE 'lapsed-%'`).Scan(&held)
		return err == nil && held == 0
	})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var events []outbox.Event
	for _, dest := range []string{"orders", "payments"} {
		for i := range 2 * n {
			events = append(events, outbox.Event{Destination: dest, Key: []byte(fmt.Sprint("k", i)), Payload: []byte("{}")})
		}
	}
	if _, err := f.outbox.Add(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The relay's outcomes, written as the relay writes them: a third of
	// the events failed, a third sent.
	if _, err := pool.Exec(ctx, `UPDATE `+f.outboxTable+` SET status = CASE seq % 3 WHEN 0 THEN 'failed' ELSE 'sent' END,
		attempts = 5, last_error = CASE seq % 3 WHEN 0 THEN 'broker refused' END, sent_at = CASE seq % 3 WHEN 1 THEN now() END
		WHERE seq % 3 <> 2`); err != nil {
		t.Fatal(err)
	}
	return f
}

// waitFor waits, generously, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serve mounts the console under /dedup/ as the package doc says, on an
// httptest server closed when t ends, and returns its base URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/dedup/", http.StripPrefix("/dedup", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/dedup/"
}

// console mounts f's console with opts.
func (f *fixture) console(t *testing.T, opts ...dedupui.Opt) string {
	return serve(t, dedupui.New(f.store, append([]dedupui.Opt{dedupui.WithOutbox(f.outbox, f.pool)}, opts...)...))
}

// get fetches base+path and returns the status and body.
func get(t *testing.T, base, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

// do sends req and returns the status and body of the response.
func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// post posts form to base+path with the headers given as name, value
// pairs, and returns the status and body.
func post(t *testing.T, base, path string, form url.Values, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

// origin is the scheme and host of base, as a browser's Origin header.
func origin(t *testing.T, base string) string {
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Scheme + "://" + u.Host
}

var (
	countCell  = regexp.MustCompile(`(?s)<tr data-scope="([^"]*)">.*?</tr>`)
	countValue = regexp.MustCompile(`data-count="(\w+)">(?:<a [^>]*>)?(\d+)<`)
	rowKey     = regexp.MustCompile(`<tr data-key="[^"]*" data-scope="([^"]*)" data-id="([^"]*)">`)
	nextLink   = regexp.MustCompile(`<a href="([^"]*)" rel="next"`)
	hiddenIn   = regexp.MustCompile(`<input type="hidden" name="(\w+)" value="([^"]*)">`)
)

// pageCounts reads the overview's counts: scope -> column -> count.
func pageCounts(t *testing.T, body string) map[string]map[string]int64 {
	t.Helper()
	out := map[string]map[string]int64{}
	for _, row := range countCell.FindAllStringSubmatch(body, -1) {
		out[row[1]] = map[string]int64{}
		for _, c := range countValue.FindAllStringSubmatch(row[0], -1) {
			n, err := strconv.ParseInt(c[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out[row[1]][c[1]] = n
		}
	}
	return out
}

// unescape undoes html/template's escaping of an attribute.
func unescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'").Replace(s)
}
