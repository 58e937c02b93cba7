package dedupui_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
	"github.com/dedupkit/dedup/internal/browsertest"
)

// TestBrowser drives the console in headless Chromium, mounted under
// /dedup/ as the package doc shows, on a PostgreSQL table with records of
// every state and an outbox with pending and failed events (newFixture).
// Every page it opens must load with no console error, no uncaught
// exception and no failed request, except the refusals it provokes; each
// page's full-page screenshot goes to browsertest.ScreenshotDir.
func TestBrowser(t *testing.T) {
	b := browsertest.Start(t)
	f := newFixture(t, []string{"billing", "orders/charge"}, 4)

	t.Run("every page loads and its numbers equal the table's", func(t *testing.T) {
		p := b.NewPage(t)
		base := f.console(t)
		open(t, p, base, "overview")
		// Every other page through the navigation bar's links, as a person
		// gets there: the links must work under the /dedup/ mount.
		for _, name := range []string{"stuck", "failed", "outbox"} {
			if status := p.Click(`nav a[href="` + name + `"]`); status != http.StatusOK {
				t.Fatalf("%s: HTTP %d", name, status)
			}
			settle(t, p, name)
		}
		open(t, p, base+"record?"+keyQuery(f.final), "record")
		open(t, p, base+"record?scope=billing&id=never-seen", "record-missing")

		// With actions on: each action's confirmation page, reached by its
		// link or by the outbox's requeue button; none is confirmed here.
		act := f.console(t, dedupui.WithActions())
		open(t, p, act+"record?"+keyQuery(f.final), "record-with-actions")
		if status := p.Click(`a[href^="forget?"]`); status != http.StatusOK {
			t.Fatalf("forget link: HTTP %d", status)
		}
		settle(t, p, "forget-confirm")
		open(t, p, act+"outbox", "outbox-with-actions")
		p.Do(chromedp.Click(chromedp.CSS(`#failed-events input[type="checkbox"]`), chromedp.NodeVisible))
		if status := p.Click(`form[action="requeue"] button[type="submit"]`); status != http.StatusOK {
			t.Fatalf("requeue button: HTTP %d", status)
		}
		settle(t, p, "requeue-confirm")
		if !p.Exists(`form[action="requeue"] input[name="id"]`) {
			t.Error("the requeue confirmation posts no event")
		}

		p.Open(base)
		checkOverviewCounts(t, p, f)
		checkLegendLines(t, p)
		p.Open(base + "outbox")
		checkOutboxCounts(t, p, f)
		p.NoProblems("counts")
		// Nothing is fetched from the network: every asset is the console's.
		for _, u := range p.Requested() {
			if !strings.HasPrefix(u, base) && !strings.HasPrefix(u, act) {
				t.Errorf("the console's pages requested %s, outside the console", u)
			}
		}
		if !slices.ContainsFunc(p.Requested(), func(u string) bool { return strings.HasSuffix(u, "static/style.css") }) {
			t.Errorf("no stylesheet requested: %q", p.Requested())
		}
	})

	t.Run("paging walks every record once", func(t *testing.T) {
		p := b.NewPage(t)
		base := f.console(t, dedupui.WithPageSize(3))
		for _, list := range []struct{ path, where string }{
			{"failed", "status = 4"},
			{"stuck", stuckWhere(dedupui.DefaultOlderThan)},
			{"stuck?older_than=0s", stuckWhere(0)},
		} {
			want := tableKeys(t, f, list.where)
			seen := map[string]bool{}
			open(t, p, base+list.path, list.path+"-page-1")
			for pages := 1; ; pages++ {
				for _, k := range browsertest.Run(p, chromedp.Evaluate[[]string](
					`[...document.querySelectorAll("#records tr[data-key]")].map(r => r.dataset.key)`)) {
					if seen[k] {
						t.Errorf("%s: %s shown twice", list.path, k)
					}
					if !want[k] {
						t.Errorf("%s: %s shown, not on the list", list.path, k)
					}
					seen[k] = true
				}
				if !p.Exists("#next") {
					break
				}
				if pages > len(want) {
					t.Fatalf("%s: paging does not end", list.path)
				}
				if status := p.Click("#next"); status != http.StatusOK {
					t.Fatalf("%s page %d: HTTP %d", list.path, pages+1, status)
				}
				settle(t, p, fmt.Sprintf("%s-page-%d", list.path, pages+1))
			}
			if len(seen) != len(want) || len(want) <= 3 {
				t.Errorf("%s: walked %d records, the table has %d (more than a page expected)", list.path, len(seen), len(want))
			}
		}
	})

	t.Run("an action without WithActions is refused", func(t *testing.T) {
		p := b.NewPage(t)
		posts := &postLog{}
		base := serveRecorded(t, dedupui.New(f.store, dedupui.WithOutbox(f.outbox, f.pool)), posts)
		key := f.stuckRelease
		before := get1(t, f, key)
		open(t, p, base+"record?"+keyQuery(key), "read-only-record")
		if p.Exists(`a[href^="release?"]`) || p.Exists(`a[href^="forget?"]`) {
			t.Error("a read-only console offers an action")
		}
		if status := p.Open(base + "release?" + keyQuery(key)); status != http.StatusForbidden {
			t.Errorf("confirmation page without WithActions: HTTP %d, want 403", status)
		}
		p.Screenshot("read-only-confirm-refused")
		expectRefusal(t, p, "release confirmation page")
		// A same-origin form, the one the confirmation page would show, put
		// on a console page and submitted by a click: the browser sends
		// Sec-Fetch-Site same-origin, so only the missing WithActions
		// refuses it.
		p.Open(base + "record?" + keyQuery(key))
		p.Do(chromedp.Evaluate[chromedp.Void](formHTML("release", before, "document.body")))
		if status := p.Click("#forged"); status != http.StatusForbidden {
			t.Errorf("POST release without WithActions: HTTP %d, want 403", status)
		}
		p.Screenshot("read-only-post-refused")
		expectRefusal(t, p, "release POST")
		if got := posts.last(); got.fetchSite != "same-origin" {
			t.Errorf("the browser's POST carried Sec-Fetch-Site %q, want same-origin", got.fetchSite)
		}
		if after := get1(t, f, key); after.Owner != before.Owner || after.Status != before.Status {
			t.Errorf("a refused POST changed the record: %+v", after)
		}
	})

	t.Run("a cross-site POST is refused", func(t *testing.T) {
		p := b.NewPage(t)
		posts := &postLog{}
		base := serveRecorded(t, dedupui.New(f.store, dedupui.WithOutbox(f.outbox, f.pool), dedupui.WithActions()), posts)
		key := f.stuckRelease
		before := get1(t, f, key)
		// The attacker's page: another origin whose form posts the fields
		// of a real confirmation form to the console.
		attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, `<!doctype html><html><head><title>win a prize</title><link rel="icon" href="data:,"></head><body><script>`+
				formHTML(base+"release", before, "document.body")+`</script></body></html>`)
		}))
		t.Cleanup(attacker.Close)
		attackerURL, err := url.Parse(attacker.URL)
		if err != nil {
			t.Fatal(err)
		}
		// 127.0.0.1 on another port is the same site, another origin;
		// localhost is another site altogether.
		for _, origin := range []string{attacker.URL, "http://localhost:" + attackerURL.Port()} {
			p.Open(origin)
			if status := p.Click("#forged"); status != http.StatusForbidden {
				t.Errorf("POST from %s: HTTP %d, want 403", origin, status)
			}
			got := posts.last()
			if got.origin != origin || got.fetchSite == "same-origin" || got.fetchSite == "" {
				t.Errorf("the browser's POST from %s carried Origin %q, Sec-Fetch-Site %q", origin, got.origin, got.fetchSite)
			}
			p.Screenshot("cross-site-refused-" + got.fetchSite)
			expectRefusal(t, p, "cross-site POST from "+origin)
		}
		if after := get1(t, f, key); after.Owner != before.Owner || after.Status != before.Status {
			t.Errorf("a cross-site POST changed the record: %+v", after)
		}
	})

	t.Run("without JavaScript, a stuck record is found and released", func(t *testing.T) {
		p := b.NewPage(t)
		p.DisableJavaScript()
		base := f.console(t, dedupui.WithActions())
		open(t, p, base, "no-js-overview")
		var key dedup.Key
		for _, step := range []struct{ selector, name string }{
			{`nav a[href="stuck"]`, "no-js-stuck"},
			{`#records tr[data-key^="billing/lapsed-"] a`, "no-js-record"},
			{`a[href^="release?"]`, "no-js-release-confirm"},
			{"#confirm", "no-js-release-done"},
		} {
			if status := p.Click(step.selector); status != http.StatusOK {
				t.Fatalf("%s: HTTP %d", step.selector, status)
			}
			settle(t, p, step.name)
			if step.name == "no-js-record" {
				key = dedup.Key{Scope: p.Text(`[data-field="scope"]`), EventID: p.Text(`[data-field="event_id"]`)}
			}
		}
		done := p.Text("#done")
		c, err := f.store.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: "fp-" + key.EventID, Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Status != dedup.ClaimAcquired || c.Record.Attempts != 1 {
			t.Fatalf("claim of %s after a release without JavaScript (done page: %q): %v attempt %d, %v", key, done, c.Status, c.Record.Attempts, err)
		}
	})

	t.Run("a confirmed release makes the record claimable", func(t *testing.T) {
		p := b.NewPage(t)
		base := f.console(t, dedupui.WithActions())
		key := f.stuckRelease
		open(t, p, base+"record?"+keyQuery(key), "stuck-record")
		if status := p.Click(`a[href^="release?"]`); status != http.StatusOK {
			t.Fatalf("release link: HTTP %d", status)
		}
		settle(t, p, "release-confirm")
		if _, err := f.store.Get(context.Background(), key); err != nil {
			t.Fatalf("the confirmation page changed the record: %v", err)
		}
		if status := p.Click("#confirm"); status != http.StatusOK {
			t.Fatalf("confirm: HTTP %d", status)
		}
		settle(t, p, "release-done")
		if done := p.Text("#done"); !strings.Contains(done, key.EventID) {
			t.Errorf("done page says %q", done)
		}
		c, err := f.store.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: "fp-" + key.EventID, Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Status != dedup.ClaimAcquired || c.Record.Attempts != 1 {
			t.Fatalf("claim after release: %v attempt %d, %v; want acquired as attempt 1", c.Status, c.Record.Attempts, err)
		}
	})

	// The README's picture: DEDUP_CONSOLE_PNG=docs/images/console.png
	// writes the overview at a small window size.
	if path := os.Getenv("DEDUP_CONSOLE_PNG"); path != "" {
		t.Run("README screenshot", func(t *testing.T) {
			p := b.NewPage(t)
			p.Do(chromedp.EmulateViewport(1280, 720))
			p.Open(f.console(t))
			if err := os.WriteFile(path, browsertest.Run(p, chromedp.CaptureScreenshot()), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// open loads url in p, which must answer 200 with no problem, and takes its
// screenshot as name.
func open(t *testing.T, p *browsertest.Page, url, name string) {
	t.Helper()
	if status := p.Open(url); status != http.StatusOK {
		t.Fatalf("%s: HTTP %d", url, status)
	}
	settle(t, p, name)
}

// settle checks the page p is on loaded cleanly and takes its screenshot.
func settle(t *testing.T, p *browsertest.Page, name string) {
	t.Helper()
	if !p.Exists("main h1") {
		t.Errorf("%s (%s): no heading: not a console page", name, p.Location())
	}
	p.Screenshot(name)
	p.NoProblems(name)
}

// expectRefusal checks that the problems p recorded are the 403 provoked
// on purpose, and that the page says why.
func expectRefusal(t *testing.T, p *browsertest.Page, what string) {
	t.Helper()
	problems := p.TakeProblems()
	if !slices.ContainsFunc(problems, func(s string) bool { return strings.HasPrefix(s, "HTTP 403") }) {
		t.Errorf("%s: no 403 recorded: %q", what, problems)
	}
	for _, s := range problems {
		if !strings.Contains(s, "403") {
			t.Errorf("%s: %s", what, s)
		}
	}
	if msg := p.Text("main"); !strings.Contains(msg, "refused") && !strings.Contains(msg, "disabled") {
		t.Errorf("%s: the page does not say why: %q", what, msg)
	}
}

// formHTML is JavaScript that appends to parent a form posting rec's
// release fields to action, with a submit button #forged.
func formHTML(action string, rec dedup.Record, parent string) string {
	field := func(name, value string) string {
		return `<input type="hidden" name="` + name + `" value="` + html.EscapeString(value) + `">`
	}
	form := `<form method="post" action="` + html.EscapeString(action) + `">` +
		field("scope", rec.Key.Scope) + field("id", rec.Key.EventID) + field("owner", rec.Owner) +
		`<button type="submit" id="forged">Go</button></form>`
	return fmt.Sprintf("%s.insertAdjacentHTML('beforeend', %q)", parent, form)
}

// keyQuery is k as the console's scope and id parameters.
func keyQuery(k dedup.Key) string {
	return url.Values{"scope": {k.Scope}, "id": {k.EventID}}.Encode()
}

// get1 reads k's record, which must exist.
func get1(t *testing.T, f *fixture, k dedup.Key) dedup.Record {
	t.Helper()
	rec, err := f.store.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("get %s: %v", k, err)
	}
	return rec
}

// postHeaders is what a POST to the console carried.
type postHeaders struct{ origin, fetchSite string }

// postLog records the cross-site headers of the POSTs a console gets, to
// show that the refusals answer what a real browser sends.
type postLog struct {
	mu    sync.Mutex
	posts []postHeaders
}

func (l *postLog) last() postHeaders {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.posts) == 0 {
		return postHeaders{}
	}
	return l.posts[len(l.posts)-1]
}

// serveRecorded serves h like serve, recording the headers of each POST.
func serveRecorded(t *testing.T, h http.Handler, l *postLog) string {
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			l.mu.Lock()
			l.posts = append(l.posts, postHeaders{r.Header.Get("Origin"), r.Header.Get("Sec-Fetch-Site")})
			l.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
}

// checkLegendLines checks that each entry of the failure chart's legend
// keeps its colour swatch on the line of its reason: the swatch's box
// overlaps the reason's first line box, as laid out by the browser.
func checkLegendLines(t *testing.T, p *browsertest.Page) {
	t.Helper()
	entries := browsertest.Run(p, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".legend li")].map(li => {
		const s = li.querySelector("svg").getBoundingClientRect(), r = li.querySelector("a").getClientRects()[0];
		return (s.top < r.bottom && s.bottom > r.top ? "" : "apart: ") + li.textContent.trim();
	})`))
	if len(entries) == 0 {
		t.Error("the overview's failure chart has no legend")
	}
	for _, e := range entries {
		if strings.HasPrefix(e, "apart: ") {
			t.Errorf("legend entry %q: its swatch is not on its reason's line", strings.TrimPrefix(e, "apart: "))
		}
	}
}

// checkOverviewCounts compares the overview's table, read from the DOM,
// with a count of the records table.
func checkOverviewCounts(t *testing.T, p *browsertest.Page, f *fixture) {
	t.Helper()
	shown := browsertest.Run(p, chromedp.Evaluate[map[string]map[string]string](`Object.fromEntries(
		[...document.querySelectorAll("#counts tr[data-scope]")].map(r => [r.dataset.scope,
			Object.fromEntries([...r.querySelectorAll("[data-count]")].map(c => [c.dataset.count, c.textContent.trim()]))]))`))
	rows, err := f.pool.Query(context.Background(), `SELECT scope,
		count(*) FILTER (WHERE status = 1), count(*) FILTER (WHERE status = 3), count(*) FILTER (WHERE status = 4),
		count(*) FILTER (WHERE `+stuckWhere(dedupui.DefaultOlderThan)+`)
		FROM `+f.table+` WHERE expires_at > now() GROUP BY scope
		UNION ALL SELECT '*', count(*) FILTER (WHERE status = 1), count(*) FILTER (WHERE status = 3), count(*) FILTER (WHERE status = 4),
		count(*) FILTER (WHERE `+stuckWhere(dedupui.DefaultOlderThan)+`)
		FROM `+f.table+` WHERE expires_at > now()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var scope string
		var want [4]int64
		if err := rows.Scan(&scope, &want[0], &want[1], &want[2], &want[3]); err != nil {
			t.Fatal(err)
		}
		n++
		for i, col := range []string{"processing", "retryable", "final", "stuck"} {
			if got := shown[scope][col]; got != fmt.Sprint(want[i]) {
				t.Errorf("overview, %s %s: page shows %q, table has %d", scope, col, got, want[i])
			}
		}
	}
	if n != 3 || len(shown) != 3 {
		t.Errorf("overview rows %v, table has %d scopes and the total", shown, n-1)
	}
	var succeeded string
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*)::text FROM `+f.table+` WHERE status = 2`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	if got := p.Text("#succeeded"); got != succeeded {
		t.Errorf("overview shows %q succeeded, table has %s", got, succeeded)
	}
}

// checkOutboxCounts compares the outbox page with a count of the outbox
// table: pending per destination and in all, and the failed events.
func checkOutboxCounts(t *testing.T, p *browsertest.Page, f *fixture) {
	t.Helper()
	ctx := context.Background()
	shown := browsertest.Run(p, chromedp.Evaluate[map[string]string](`Object.fromEntries(
		[...document.querySelectorAll("#backlog tr[data-destination]")].map(r => [r.dataset.destination, r.querySelector('[data-count="pending"]').textContent.trim()]))`))
	rows, err := f.pool.Query(ctx, `SELECT destination, count(*)::text FROM `+f.outboxTable+` WHERE status = 'pending' GROUP BY destination`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for rows.Next() {
		var dest, n string
		if err := rows.Scan(&dest, &n); err != nil {
			t.Fatal(err)
		}
		want[dest] = n
	}
	rows.Close()
	if fmt.Sprint(shown) != fmt.Sprint(want) || len(want) == 0 {
		t.Errorf("outbox pending by destination: page shows %v, table has %v", shown, want)
	}
	var pending, failed int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed') FROM `+f.outboxTable).Scan(&pending, &failed); err != nil {
		t.Fatal(err)
	}
	if got := p.Text("#pending"); got != fmt.Sprint(pending) {
		t.Errorf("outbox page shows %q pending, table has %d", got, pending)
	}
	shownFailed := browsertest.Run(p, chromedp.Evaluate[int](`document.querySelectorAll("#failed-events tr[data-event]").length`))
	if shownFailed != failed || failed == 0 {
		t.Errorf("outbox page lists %d failed events, table has %d", shownFailed, failed)
	}
}

// stuckWhere is the SQL condition of a stuck record: in flight past its
// lease, or failed retryably and left longer than olderThan.
func stuckWhere(olderThan time.Duration) string {
	return fmt.Sprintf("(status = 1 AND lease_until < now()) OR (status = 3 AND updated_at < now() - interval '%d microseconds')", olderThan.Microseconds())
}

// tableKeys returns the keys of the records that match where, written as
// the pages write them (dedup.Key.String).
func tableKeys(t *testing.T, f *fixture, where string) map[string]bool {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT scope, event_id FROM `+f.table+` WHERE `+where)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	keys := map[string]bool{}
	for rows.Next() {
		var k dedup.Key
		if err := rows.Scan(&k.Scope, &k.EventID); err != nil {
			t.Fatal(err)
		}
		keys[k.String()] = true
	}
	return keys
}
