package dedupui

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"time"

	"github.com/dedupkit/dedup"
)

//go:embed templates
var templateFiles embed.FS

//go:embed static
var assets embed.FS

// pages are the console's templates, each with the layout.
var pages = func() map[string]*template.Template {
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		name := n[len("templates/") : len(n)-len(".html")]
		if name == "layout" {
			continue
		}
		out[name] = template.Must(template.New("").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", n))
	}
	return out
}()

var funcs = template.FuncMap{
	"ago":   ago,
	"stamp": func(t time.Time) string { return stamp(t) },
	"query": query,
}

// view is what every page's template gets.
type view struct {
	Title    string
	Nav      string // the navigation entry of the page
	Actions  bool   // actions are enabled
	Payloads bool   // payloads are shown
	Browse   bool   // the store has the overview and the lists
	Outbox   bool   // an outbox is shown
	Data     any
}

// view is what the layout shows of the console around a page's data,
// the same on every page, the error page included.
func (c *console) view(title, nav string, data any) view {
	return view{Title: title, Nav: nav, Actions: c.cfg.actions, Payloads: c.cfg.payloads, Browse: c.browse != nil,
		Outbox: c.cfg.outbox != nil, Data: data}
}

// render writes the page name with data, or the error page if it fails.
func (c *console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	c.renderAs(w, r, name, name, title, data)
}

// renderAs is render for a template that serves several pages, nav
// naming the one it serves.
func (c *console) renderAs(w http.ResponseWriter, r *http.Request, name, nav, title string, data any) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", c.view(title, nav, data)); err != nil {
		c.fail(w, r, fmt.Errorf("render %s: %w", name, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = buf.WriteTo(w)
}

// fail writes the error page for err: 400 with the reason for a bad
// query, 404 for an absent record, 500 (logged) for the rest, its text
// shown only when it is the store's configuration's (dedup.ErrConfig: a
// table of record v1, say), which says what to do.
func (c *console) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	msg := err.Error()
	if code == http.StatusInternalServerError {
		c.cfg.logger.ErrorContext(r.Context(), "dedupui: page failed", "path", r.URL.Path, "err", err)
		if !errors.Is(err, dedup.ErrConfig) {
			msg = "the console could not read the store; the service's log has the error"
		}
	}
	c.refuse(w, code, msg)
}

// refuse writes the error page with code and msg.
func (c *console) refuse(w http.ResponseWriter, code int, msg string) {
	var buf bytes.Buffer
	v := c.view(http.StatusText(code), "error", struct {
		Code int
		Msg  string
	}{code, msg})
	if err := pages["error"].ExecuteTemplate(&buf, "layout", v); err != nil {
		http.Error(w, msg, code)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

// ago says how long before now t was, or how long after now it is.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + round(-d).String()
	}
	return round(d).String() + " ago"
}

// round rounds d to what a reader compares: seconds, or milliseconds
// under a second.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// stamp formats t in UTC, or says it is unset.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// query builds a relative link: path and its parameters as name, value
// pairs, the empty values left out.
func query(path string, pairs ...string) template.URL {
	q := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			q.Add(pairs[i], pairs[i+1])
		}
	}
	if len(q) == 0 {
		return template.URL(path)
	}
	return template.URL(path + "?" + q.Encode())
}

// keyLink is the link to a record's page.
func keyLink(k dedup.Key) template.URL { return query("record", "scope", k.Scope, "id", k.EventID) }
