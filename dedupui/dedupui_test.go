package dedupui_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestOverviewNumbersEqualTheTable(t *testing.T) {
	f := newFixture(t, []string{"billing", "orders/charge"}, 4)
	base := f.console(t)
	code, body := get(t, base, "")
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	got := pageCounts(t, body)
	total := got["*"]
	delete(got, "*")
	rows, err := f.pool.Query(context.Background(), `SELECT scope,
		count(*) FILTER (WHERE status = 1), count(*) FILTER (WHERE status = 3), count(*) FILTER (WHERE status = 4),
		count(*) FILTER (WHERE (status = 1 AND lease_until < now()) OR (status = 3 AND updated_at < now() - interval '10 minutes'))
		FROM `+f.table+` WHERE expires_at > now() GROUP BY scope`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	scopes := 0
	for rows.Next() {
		var scope string
		var want [4]int64
		if err := rows.Scan(&scope, &want[0], &want[1], &want[2], &want[3]); err != nil {
			t.Fatal(err)
		}
		scopes++
		for i, col := range []string{"processing", "retryable", "final", "stuck"} {
			if got[scope][col] != want[i] {
				t.Errorf("%s %s: page shows %d, table has %d", scope, col, got[scope][col], want[i])
			}
		}
	}
	if scopes != 2 || len(got) != 2 {
		t.Errorf("table has %d scopes, page shows %v", scopes, got)
	}
	for col, n := range total {
		if n != got["billing"][col]+got["orders/charge"][col] {
			t.Errorf("total %s: %d, not the sum of the scopes'", col, n)
		}
	}
	var succeeded string
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*)::text FROM `+f.table+` WHERE status = 2`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `data-estimated="false">`+succeeded+`<`) {
		t.Errorf("overview does not show the %s succeeded records", succeeded)
	}
	if !strings.Contains(body, `<rect class="r0"`) || !strings.Contains(body, "reason 0: boom") {
		t.Error("overview has no failure chart")
	}

	code, body = get(t, base, "outbox")
	if code != http.StatusOK {
		t.Fatalf("outbox: %d\n%s", code, body)
	}
	var pending, failed string
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'pending')::text,
		count(*) FILTER (WHERE status = 'failed')::text FROM `+f.outboxTable).Scan(&pending, &failed); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `<span id="pending">`+pending+`</span>`) {
		t.Errorf("outbox page does not show the %s pending events", pending)
	}
	if n := strings.Count(body, `<tr data-event=`); fmt.Sprint(n) != failed {
		t.Errorf("outbox page lists %d failed events, the table has %s", n, failed)
	}
	rows, err = f.pool.Query(context.Background(), `SELECT destination, count(*) FROM `+f.outboxTable+` WHERE status = 'pending' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	destinations := 0
	for rows.Next() {
		var dest string
		var n int64
		if err := rows.Scan(&dest, &n); err != nil {
			t.Fatal(err)
		}
		destinations++
		if want := fmt.Sprintf(`<tr data-destination="%s"><td>%s</td><td class="num" data-count="pending">%d</td>`, dest, dest, n); !strings.Contains(body, want) {
			t.Errorf("outbox page does not show %d pending for %s", n, dest)
		}
	}
	if destinations != 2 || strings.Count(body, "<tr data-destination=") != 2 {
		t.Errorf("the table has %d destinations pending, the page %d", destinations, strings.Count(body, "<tr data-destination="))
	}
	var sent string
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*)::text FROM `+f.outboxTable+` WHERE status = 'sent' AND sent_at > now() - interval '1 hour'`).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `<span data-total>`+sent+`</span>`) || sent == "0" {
		t.Errorf("the published chart does not total the %s events sent", sent)
	}
}

// walkPages follows the next links of a list from path, returning the
// keys in the order met.
func walkPages(t *testing.T, base, path string) []string {
	t.Helper()
	var keys []string
	for pages := 0; path != ""; pages++ {
		if pages > 500 {
			t.Fatal("paging does not end")
		}
		code, body := get(t, base, path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		for _, m := range rowKey.FindAllStringSubmatch(body, -1) {
			keys = append(keys, unescape(m[1])+"/"+unescape(m[2]))
		}
		path = ""
		if m := nextLink.FindStringSubmatch(body); m != nil {
			path = unescape(m[1])
		}
	}
	return keys
}

func TestPagingWalksEveryRecordOnce(t *testing.T) {
	f := newFixture(t, []string{"a", "b", "c"}, 7)
	// Ties in the sort key: many records share one update time.
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+f.table+` SET updated_at = date_trunc('minute', now()) - interval '1 hour'
		+ (ascii(right(event_id, 1)) % 3) * interval '1 microsecond'`); err != nil {
		t.Fatal(err)
	}
	base := f.console(t, dedupui.WithPageSize(4))
	for _, c := range []struct{ path, where string }{
		{"failed", "status = 4"},
		{"stuck?older_than=0s", "(status = 1 AND lease_until < now()) OR status = 3"},
		{"stuck", "(status = 1 AND lease_until < now()) OR (status = 3 AND updated_at < now() - interval '10 minutes')"},
		{"failed?scope=b&reason=reason+1%3A+boom", "status = 4 AND scope = 'b' AND last_error = 'reason 1: boom'"},
	} {
		keys := walkPages(t, base, c.path)
		rows, err := f.pool.Query(context.Background(), `SELECT scope || '/' || event_id FROM `+f.table+` WHERE `+c.where)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			want[k] = true
		}
		rows.Close()
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				t.Errorf("%s: %s shown twice", c.path, k)
			}
			if !want[k] {
				t.Errorf("%s: %s shown, not on the list", c.path, k)
			}
			seen[k] = true
		}
		if len(seen) != len(want) || len(want) == 0 {
			t.Errorf("%s: walked %d records, the table has %d", c.path, len(seen), len(want))
		}
	}
}

func TestActionsRefusedWithoutWithActions(t *testing.T) {
	f := newFixture(t, []string{"s"}, 1)
	base := f.console(t)
	_, body := get(t, base, "record?"+url.Values{"scope": {f.stuckRelease.Scope}, "id": {f.stuckRelease.EventID}}.Encode())
	if strings.Contains(body, `href="release?`) || strings.Contains(body, `href="forget?`) {
		t.Error("a read-only console offers an action")
	}
	if code, _ := get(t, base, "release?scope=s&id="+f.stuckRelease.EventID); code != http.StatusForbidden {
		t.Errorf("confirmation page without WithActions: %d, want 403", code)
	}
	rec, err := f.store.Get(context.Background(), f.stuckRelease)
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"scope": {rec.Key.Scope}, "id": {rec.Key.EventID}, "owner": {rec.Owner}}
	for _, a := range []string{"release", "forget", "requeue"} {
		if code, _ := post(t, base, a, form, "Origin", origin(t, base), "Sec-Fetch-Site", "same-origin"); code != http.StatusForbidden {
			t.Errorf("POST %s without WithActions: %d, want 403", a, code)
		}
	}
	if _, err := f.store.Get(context.Background(), f.stuckRelease); err != nil {
		t.Errorf("the record is gone: %v", err)
	}
}

// The error page's header says what the console offers, as every other
// page's does: "actions on" on a console mounted with WithActions.
func TestRefusalPageShowsTheMode(t *testing.T) {
	store := dedup.NewMemoryStore()
	for _, c := range []struct {
		opts []dedupui.Opt
		mode string
	}{
		{nil, "read-only · payloads hidden"},
		{[]dedupui.Opt{dedupui.WithActions(), dedupui.WithPayloads()}, "actions on · payloads shown"},
	} {
		base := serve(t, dedupui.New(store, c.opts...))
		for name, res := range map[string]func() (int, string){
			"bad query":       func() (int, string) { return get(t, base, "record?scope=s") },
			"unknown param":   func() (int, string) { return get(t, base, "stuck?colour=red") },
			"cross-site POST": func() (int, string) { return post(t, base, "forget", url.Values{}, "Sec-Fetch-Site", "cross-site") },
		} {
			code, body := res()
			if code < 400 || !strings.Contains(body, `data-code=`) {
				t.Fatalf("%s (%s): %d, not an error page\n%s", name, c.mode, code, body)
			}
			if !strings.Contains(body, `<span class="mode" id="mode">`+c.mode+`</span>`) {
				t.Errorf("%s: the refusal's header does not say %q\n%s", name, c.mode, body)
			}
		}
	}
}

func TestCrossSitePostRefused(t *testing.T) {
	f := newFixture(t, []string{"s"}, 1)
	base := f.console(t, dedupui.WithActions())
	rec, err := f.store.Get(context.Background(), f.stuckRelease)
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"scope": {rec.Key.Scope}, "id": {rec.Key.EventID}, "owner": {rec.Owner}}
	for name, headers := range map[string][]string{
		"cross-site fetch":          {"Sec-Fetch-Site", "cross-site"},
		"other origin":              {"Origin", "https://evil.example"},
		"neither header":            nil,
		"same-site, other origin":   {"Sec-Fetch-Site", "same-site", "Origin", "http://sub.127.0.0.1.example"},
		"other origin, no fetch md": {"Origin", "http://127.0.0.1:1"},
	} {
		if code, body := post(t, base, "release", form, headers...); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403\n%s", name, code, body)
		}
	}
	if _, err := f.store.Get(context.Background(), f.stuckRelease); err != nil {
		t.Errorf("a refused POST released the record: %v", err)
	}
}

func TestConfirmedReleaseMakesTheRecordClaimable(t *testing.T) {
	f := newFixture(t, []string{"s"}, 1)
	logs := testenv.NewJSONLogs(t)
	base := f.console(t, dedupui.WithActions(), dedupui.WithLogger(logs.Logger(0)),
		dedupui.WithCaller(func(*http.Request) string { return "alice@example.com" }))
	key := f.stuckRelease
	_, body := get(t, base, "record?"+url.Values{"scope": {key.Scope}, "id": {key.EventID}}.Encode())
	if !strings.Contains(body, `href="release?`) {
		t.Fatalf("a stuck record offers no release\n%s", body)
	}
	code, body := get(t, base, "release?"+url.Values{"scope": {key.Scope}, "id": {key.EventID}}.Encode())
	if code != http.StatusOK || !strings.Contains(body, `method="post" action="release"`) {
		t.Fatalf("confirmation page: %d\n%s", code, body)
	}
	form := url.Values{}
	for _, m := range hiddenIn.FindAllStringSubmatch(body, -1) {
		form.Set(m[1], unescape(m[2]))
	}
	if _, err := f.store.Get(context.Background(), key); err != nil {
		t.Fatalf("confirming changed the record: %v", err)
	}
	code, body = post(t, base, "release", form, "Origin", origin(t, base), "Sec-Fetch-Site", "same-origin")
	if code != http.StatusOK || !strings.Contains(body, "is forgotten") {
		t.Fatalf("release: %d\n%s", code, body)
	}
	c, err := f.store.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: "fp-" + key.EventID, Lease: time.Minute, TTL: time.Hour})
	if err != nil || c.Status != dedup.ClaimAcquired || c.Record.Attempts != 1 {
		t.Fatalf("claim after release: %v attempts %d, %v; want acquired as attempt 1", c.Status, c.Record.Attempts, err)
	}
	lines := logs.Lines("dedupui: action done")
	if len(lines) != 1 || lines[0]["caller"] != "alice@example.com" || lines[0]["action"] != "release" {
		t.Errorf("action log: %v", logs)
	}
	// The same form again: the record was claimed since, nothing done.
	if code, _ := post(t, base, "release", form, "Origin", origin(t, base)); code != http.StatusConflict {
		t.Errorf("a stale confirmation: %d, want 409", code)
	}
	if rec, err := f.store.Get(context.Background(), key); err != nil || rec.Owner != c.Record.Owner {
		t.Errorf("a stale confirmation touched the new claim: %v %v", rec, err)
	}
	// A live lease is not released.
	if code, body := get(t, base, "release?"+url.Values{"scope": {f.live.Scope}, "id": {f.live.EventID}}.Encode()); code != http.StatusOK || !strings.Contains(body, `id="refusal"`) {
		t.Errorf("release of a live lease offered: %d\n%s", code, body)
	}
}

func TestRequeueFailedEvents(t *testing.T) {
	f := newFixture(t, []string{"s"}, 2)
	base := f.console(t, dedupui.WithActions())
	var id string
	if err := f.pool.QueryRow(context.Background(), `SELECT event_id FROM `+f.outboxTable+` WHERE status = 'failed' LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, base, "requeue?id="+url.QueryEscape(id))
	if code != http.StatusOK {
		t.Fatalf("confirmation: %d\n%s", code, body)
	}
	if code, body = post(t, base, "requeue", url.Values{"id": {id}}, "Origin", origin(t, base)); code != http.StatusOK || !strings.Contains(body, "1 of 1 events requeued") {
		t.Fatalf("requeue: %d\n%s", code, body)
	}
	states, err := f.outbox.States(context.Background(), f.pool, id)
	if err != nil || states[id] != "pending" {
		t.Errorf("after requeue: %v %v", states, err)
	}
}

func TestPayloadsHiddenUnlessWithPayloads(t *testing.T) {
	f := newFixture(t, []string{"s"}, 1)
	path := "record?" + url.Values{"scope": {f.withResult.Scope}, "id": {f.withResult.EventID}}.Encode()
	code, body := get(t, f.console(t), path)
	if code != http.StatusOK || strings.Contains(body, secretResult) || !strings.Contains(body, `data-size="23"`) {
		t.Errorf("without WithPayloads: %d, result shown or its size missing\n%s", code, body)
	}
	if _, body := get(t, f.console(t, dedupui.WithPayloads()), path); !strings.Contains(body, secretResult) {
		t.Error("WithPayloads does not show the result")
	}
}

func TestBadQueriesAre400(t *testing.T) {
	f := newFixture(t, []string{"s"}, 1)
	base := f.console(t, dedupui.WithActions())
	long := strings.Repeat("x", 300)
	for _, path := range []string{
		"record", "record?scope=s", "record?id=x", "record?scope=s&id=" + long, "record?scope=s&id=a%00b",
		"?scope=" + long, "?older_than=-1s", "?older_than=soon", "?nope=1",
		"stuck?after=garbage", "stuck?after=" + "eyJ0IjoieCJ9", "stuck?older_than=99999h", "stuck?reason=" + strings.Repeat("r", 81),
		"failed?scope=a&scope=b", "failed?older_than=1s", "outbox?x=1", "record?scope=s&id=a&id=b",
		"release", "forget?scope=s", "requeue", "requeue?id=", "requeue?id=a%01",
	} {
		if code, body := get(t, base, path); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400\n%s", path, code, body)
		}
	}
	for _, form := range []url.Values{{}, {"scope": {"s"}}, {"scope": {"s"}, "id": {long}}, {"scope": {"s"}, "id": {"a", "b"}, "owner": {"o"}}, {"scope": {"s"}, "id": {"a"}, "extra": {"1"}}} {
		if code, body := post(t, base, "forget", form, "Origin", origin(t, base)); code != http.StatusBadRequest {
			t.Errorf("POST forget %v: %d, want 400\n%s", form, code, body)
		}
	}
	if code, _ := get(t, base, "nowhere"); code != http.StatusNotFound {
		t.Errorf("an unknown page: %d, want 404", code)
	}
}

// keyOnlyStore is a store with none of the optional interfaces.
type keyOnlyStore struct{ dedup.Store }

func TestStoreWithoutBrowser(t *testing.T) {
	s := dedup.NewMemoryStore()
	base := serve(t, dedupui.New(keyOnlyStore{s}, dedupui.WithActions()))
	for _, path := range []string{"", "stuck", "failed"} {
		if code, body := get(t, base, path); code != http.StatusOK || !strings.Contains(body, "unsupported by this store") {
			t.Errorf("%q: %d, no unsupported message\n%s", path, code, body)
		}
	}
	if code, _ := get(t, base, "record?scope=s&id=x"); code != http.StatusOK {
		t.Errorf("record page: %d", code)
	}
	if code, _ := get(t, base, "forget?scope=s&id=x"); code != http.StatusBadRequest {
		t.Errorf("forget on a store without Admin: %d, want 400", code)
	}
}

// A store whose table is missing is a 500 whose page says nothing of the
// database, and the error is logged.
func TestStoreErrorIs500AndLogged(t *testing.T) {
	store, err := dedup.NewPostgresStore(testenv.Postgres(t), dedup.WithTable("dedupui_never_created"))
	if err != nil {
		t.Fatal(err)
	}
	logs := testenv.NewJSONLogs(t)
	base := serve(t, dedupui.New(store, dedupui.WithLogger(logs.Logger(0))))
	for _, path := range []string{"", "failed", "record?scope=s&id=x"} {
		if code, body := get(t, base, path); code != http.StatusInternalServerError || strings.Contains(body, "dedupui_never_created") {
			t.Errorf("%q: %d\n%s", path, code, body)
		}
	}
	if n := len(logs.Lines("dedupui: page failed")); n != 3 {
		t.Errorf("%d errors logged, want 3\n%s", n, logs)
	}
}

func TestNilStore(t *testing.T) {
	var s *dedup.MemoryStore
	base := serve(t, dedupui.New(s))
	if code, body := get(t, base, ""); code != http.StatusInternalServerError || !strings.Contains(body, "without a store") {
		t.Errorf("nil store: %d %s", code, body)
	}
}

// Whatever the query, a page answers 200, 400 or 404: never a 500, never
// a panic (which the server would turn into a dropped connection).
func TestArbitraryQueriesNever500(t *testing.T) {
	store := dedup.NewMemoryStore()
	base := serve(t, dedupui.New(store, dedupui.WithActions()))
	rnd := rand.New(rand.NewPCG(1, 2))
	names := []string{"scope", "id", "reason", "after", "older_than", "x"}
	values := []string{"", "s", "a/b", "%00", "%ff%fe", "-1s", "1h", "99999999h", "eyJ0IjoiMjAyNi0wMS0wMVQwMDowMDowMFoiLCJzIjoicyIsImkiOiJpIn0",
		"eyJ0IjoxfQ", strings.Repeat("z", 300), "%22%3E%3Cscript%3E", "+"}
	for range 400 {
		path := []string{"", "record", "stuck", "failed", "outbox", "release", "forget", "requeue"}[rnd.IntN(8)]
		var q []string
		for range rnd.IntN(4) {
			q = append(q, names[rnd.IntN(len(names))]+"="+values[rnd.IntN(len(values))])
		}
		code, body := get(t, base, path+"?"+strings.Join(q, "&"))
		if code != http.StatusOK && code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Fatalf("%s?%s: %d\n%s", path, strings.Join(q, "&"), code, body)
		}
	}
}
