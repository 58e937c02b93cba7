package browsertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Page is one browser tab. From its start it records the problems a person
// would see in the developer tools: console errors, uncaught exceptions,
// browser log errors, requests that failed or were blocked, and responses
// with an HTTP status of 400 or more.
type Page struct {
	t   testing.TB
	ctx context.Context

	mu       sync.Mutex
	problems []string
	requests map[network.RequestID]string // method and URL, to name a failed request
	urls     []string                     // every URL requested, in order
}

// NewPage opens a tab in b, closed when t ends.
func (b *Browser) NewPage(t testing.TB) *Page {
	t.Helper()
	p := &Page{t: t, requests: map[network.RequestID]string{}}
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithListener(p.record))
	t.Cleanup(cancel)
	p.ctx = ctx
	if err := attach(ctx); err != nil { // from here on every event is recorded
		t.Fatalf("opening a tab: %v", err)
	}
	return p
}

// Context returns the tab's context, for chromedp calls the helpers do not
// cover; bound it with ActionTimeout like Do does.
func (p *Page) Context() context.Context { return p.ctx }

// Do runs steps in the tab, in order, each batch bounded by ActionTimeout,
// and fails the test on an error.
func (p *Page) Do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, ActionTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.t.Fatalf("browser: %v", err)
	}
}

// Run runs one action that returns a value, bounded by ActionTimeout, and
// fails the test on an error.
func Run[T any](p *Page, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, ActionTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.t.Fatalf("browser: %v", err)
	}
	return v
}

// DisableJavaScript turns the page's scripts off from the next navigation
// on, as a visitor with JavaScript disabled has them; the helpers, which
// work through the DevTools protocol, keep working.
func (p *Page) DisableJavaScript() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, ActionTimeout)
	defer cancel()
	if _, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		p.t.Fatalf("browser: disabling JavaScript: %v", err)
	}
}

// Open navigates to url, waits for the page to load and returns the HTTP
// status of its document.
func (p *Page) Open(url string) int64 {
	p.t.Helper()
	resp := Run(p, chromedp.NavigateResponse(url))
	return resp.Status
}

// Click clicks the element that matches the CSS selector, waits for the
// navigation it starts to load and returns the HTTP status of the new
// document. Use it for a link or a form's submit button.
func (p *Page) Click(selector string) int64 {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, ActionTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible))
	if err != nil {
		p.t.Fatalf("browser: clicking %s: %v", selector, err)
	}
	return resp.Status
}

// Text returns the visible text of the first element that matches the CSS
// selector.
func (p *Page) Text(selector string) string {
	p.t.Helper()
	return Run(p, chromedp.Text(chromedp.CSS(selector)))
}

// Exists reports whether an element matches the CSS selector, without
// waiting for one to appear.
func (p *Page) Exists(selector string) bool {
	p.t.Helper()
	return Run(p, chromedp.Evaluate[bool](fmt.Sprintf("document.querySelector(%q) !== null", selector)))
}

// Location returns the URL of the tab's document.
func (p *Page) Location() string {
	p.t.Helper()
	return Run(p, chromedp.Location())
}

// Problems returns the problems recorded since the page opened or since the
// last TakeProblems.
func (p *Page) Problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.problems...)
}

// TakeProblems returns the problems recorded so far and forgets them: for a
// test that provoked some on purpose (a refused request) and checked them.
func (p *Page) TakeProblems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	taken := p.problems
	p.problems = nil
	return taken
}

// Requested returns the URL of every request the page made since it
// opened, in order: documents, scripts, styles, images, fetches.
func (p *Page) Requested() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.urls...)
}

// NoProblems fails the test if the page recorded a problem, naming each,
// with what for context (the page's name).
func (p *Page) NoProblems(what string) {
	p.t.Helper()
	for _, problem := range p.TakeProblems() {
		p.t.Errorf("%s: %s", what, problem)
	}
}

// record is the tab's listener: it runs on chromedp's read loop, so it only
// files what it sees.
func (p *Page) record(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			p.problems = append(p.problems, fmt.Sprintf("console.%s: %s", ev.Type, argsText(ev.Args)))
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		text := d.Text
		if d.Exception != nil {
			text += " " + d.Exception.Description
		}
		p.problems = append(p.problems, fmt.Sprintf("uncaught exception at %s:%d: %s", d.URL, d.LineNumber+1, text))
	case *log.EventEntryAdded:
		if e := ev.Entry; e.Level == log.EntryLevelError {
			p.problems = append(p.problems, fmt.Sprintf("browser log (%s): %s %s", e.Source, e.Text, e.URL))
		}
	case *network.EventRequestWillBeSent:
		p.requests[ev.RequestID] = ev.Request.Method + " " + ev.Request.URL
		p.urls = append(p.urls, ev.Request.URL)
	case *network.EventResponseReceived:
		if r := ev.Response; r.Status >= 400 {
			p.problems = append(p.problems, fmt.Sprintf("HTTP %d for %s", r.Status, p.requests[ev.RequestID]))
		}
	case *network.EventLoadingFailed:
		// A request the page itself abandoned (a navigation away) is no
		// failure; one the browser blocked is.
		if ev.Canceled && ev.BlockedReason == "" {
			return
		}
		reason := ev.ErrorText
		if ev.BlockedReason != "" {
			reason += " (blocked: " + string(ev.BlockedReason) + ")"
		}
		p.problems = append(p.problems, fmt.Sprintf("request failed: %s: %s", p.requests[ev.RequestID], reason))
	}
}

// argsText renders a console call's arguments: a primitive by its value,
// an object by its description.
func argsText(args []*runtime.RemoteObject) string {
	parts := make([]string, 0, len(args))
	for _, a := range args {
		switch {
		case a.Type == runtime.RemoteObjectTypeString && len(a.Value) > 0:
			parts = append(parts, strings.Trim(string(a.Value), `"`))
		case len(a.Value) > 0:
			parts = append(parts, string(a.Value))
		case a.UnserializableValue != "":
			parts = append(parts, string(a.UnserializableValue))
		default:
			parts = append(parts, a.Description)
		}
	}
	return strings.Join(parts, " ")
}
