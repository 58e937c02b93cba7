package browsertest_test

import (
	"bytes"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dedupkit/dedup/internal/browsertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// site is a tiny site with one page of each kind the helper must tell
// apart: a clean one, one that logs an error, one that throws, one whose
// image is missing, and a form that posts.
func site(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	page := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, "<!doctype html><html><head><title>t</title><link rel=icon href=data:,></head><body>%s</body></html>", body)
		}
	}
	mux.HandleFunc("GET /clean", page(`<h1 id=title>Clean</h1><a id=next href="form">next</a>`))
	mux.HandleFunc("GET /scripted", page(`<p id=js>off</p><script>document.getElementById("js").textContent = "on"</script>`))
	mux.HandleFunc("GET /logs", page(`<script>console.error("bad thing", 42)</script>`))
	mux.HandleFunc("GET /throws", page(`<script>null.x</script>`))
	mux.HandleFunc("GET /broken-image", page(`<img src="/missing.png">`))
	mux.HandleFunc("GET /form", page(`<form method=post action="posted"><input name=v value=7><button id=go>Go</button></form>`))
	mux.HandleFunc("POST /posted", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Sec-Fetch-Site") != "same-origin" {
			http.Error(w, "cross-site", http.StatusForbidden)
			return
		}
		page(`<p id=got>`+r.FormValue("v")+`</p>`)(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestPageRecordsProblems(t *testing.T) {
	b := browsertest.Start(t)
	srv := site(t)
	p := b.NewPage(t)

	if status := p.Open(srv.URL + "/clean"); status != http.StatusOK {
		t.Fatalf("clean page: status %d", status)
	}
	if got := p.Text("#title"); got != "Clean" {
		t.Errorf("title text %q, want Clean", got)
	}
	if got := p.Problems(); len(got) != 0 {
		t.Errorf("clean page: problems %q", got)
	}
	if got := p.Requested(); !slices.Equal(got, []string{srv.URL + "/clean"}) {
		t.Errorf("clean page requested %q, want only itself", got)
	}

	for _, tc := range []struct{ path, want string }{
		{"/logs", "console.error: bad thing 42"},
		{"/throws", "uncaught exception"},
		{"/broken-image", "HTTP 404 for GET " + srv.URL + "/missing.png"},
	} {
		p.Open(srv.URL + tc.path)
		// A console call or an exception reaches the listener after the load
		// event; a query round trip to the tab is ordered after it.
		p.Exists("body")
		got := p.TakeProblems()
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", tc.path, got, tc.want)
		}
	}
}

func TestClickFollowsLinksAndForms(t *testing.T) {
	b := browsertest.Start(t)
	srv := site(t)
	p := b.NewPage(t)

	p.Open(srv.URL + "/clean")
	if status := p.Click("#next"); status != http.StatusOK {
		t.Fatalf("link: status %d", status)
	}
	if loc := p.Location(); loc != srv.URL+"/form" {
		t.Errorf("after the link: at %s", loc)
	}
	if status := p.Click("#go"); status != http.StatusOK {
		t.Fatalf("form: status %d (the browser sends Sec-Fetch-Site same-origin)", status)
	}
	if got := p.Text("#got"); got != "7" {
		t.Errorf("posted value %q, want 7", got)
	}
	p.NoProblems("form")
}

func TestCrossSiteFormIsSeenAsCrossSite(t *testing.T) {
	b := browsertest.Start(t)
	target := site(t)
	// A second origin (another port) whose form posts to the first.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><link rel=icon href=data:,><form method=post action="%s/posted"><input name=v value=1><button id=go>Go</button></form>`, target.URL)
	}))
	t.Cleanup(other.Close)
	p := b.NewPage(t)
	p.Open(other.URL)
	if status := p.Click("#go"); status != http.StatusForbidden {
		t.Errorf("cross-site post: status %d, want 403", status)
	}
	if got := p.TakeProblems(); len(got) == 0 {
		t.Error("a 403 document was not recorded as a problem")
	}
}

func TestDisableJavaScript(t *testing.T) {
	b := browsertest.Start(t)
	srv := site(t)
	p := b.NewPage(t)
	p.Open(srv.URL + "/scripted")
	if got := p.Text("#js"); got != "on" {
		t.Fatalf("with JavaScript: %q, want on", got)
	}
	p.DisableJavaScript()
	p.Open(srv.URL + "/scripted")
	if got := p.Text("#js"); got != "off" {
		t.Errorf("without JavaScript: %q, want off", got)
	}
	p.NoProblems("scripted")
}

func TestScreenshotIsAPNGOfThePage(t *testing.T) {
	t.Setenv(browsertest.ScreenshotDirEnv, t.TempDir())
	b := browsertest.Start(t)
	srv := site(t)
	p := b.NewPage(t)
	p.Open(srv.URL + "/clean")
	path := p.Screenshot("clean")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if w := img.Bounds().Dx(); w != browsertest.ViewportWidth {
		t.Errorf("screenshot width %d, want the viewport's %d", w, browsertest.ViewportWidth)
	}
}
