// Package browsertest drives a real headless Chromium from tests, through
// chromedp over the DevTools pipe: it starts the browser with the flags this
// closed network needs, records what goes wrong on a page (console errors,
// uncaught exceptions, failed and refused requests) and writes full-page
// screenshots where the test's output goes (ScreenshotDir). Chromium comes
// from Debian's package chromium, which `make services` installs; a test
// without it is skipped, or fails under CI=true.
package browsertest

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dedupkit/dedup/internal/testenv"
)

// ActionTimeout bounds one browser step (a navigation, a click, a query):
// generous, since the suite runs on a loaded two-core machine; a page that
// works answers in well under a second.
const ActionTimeout = 90 * time.Second

// Viewport is the window size pages are laid out and screenshots taken at.
const (
	ViewportWidth  = 1280
	ViewportHeight = 800
)

// Browser is one headless Chromium process, stopped when the test that
// started it ends.
type Browser struct {
	ctx context.Context // the browser's root chromedp context
}

// chromiumNames are the executables Start looks for on PATH, in order, when
// DEDUP_CHROMIUM does not name one: Debian's first.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome"}

// ChromiumPath returns the Chromium executable tests use: DEDUP_CHROMIUM if
// set, else the first of chromium, chromium-browser, google-chrome on PATH.
func ChromiumPath() (string, error) {
	if p := os.Getenv("DEDUP_CHROMIUM"); p != "" {
		return exec.LookPath(p)
	}
	var errs []error
	for _, name := range chromiumNames {
		p, err := exec.LookPath(name)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// allocatorOptions are Chromium's flags: chromedp's defaults (headless, no
// first run, no background networking, no sync, a fresh temporary
// --user-data-dir removed afterwards) plus what this machine needs. Without
// the background-networking and component-update flags Chromium keeps
// calling out, and this closed network refuses it; QUIC likewise.
func allocatorOptions(path string, out io.Writer) []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(ViewportWidth, ViewportHeight),
		chromedp.CombinedOutput(out),
	)
}

// Start starts headless Chromium for t and stops it when t ends. A missing
// Chromium skips t, or fails it under CI=true; one that does not start fails
// t with its output.
func Start(t testing.TB) *Browser {
	t.Helper()
	path, err := ChromiumPath()
	if err != nil {
		testenv.Unavailable(t, "Chromium", err)
		return nil
	}
	// The browser's output, read if it does not start; the file outlives
	// the process, since cleanups run last registered first.
	out, err := os.Create(filepath.Join(t.TempDir(), "chromium.log"))
	if err != nil {
		t.Fatal(err)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), allocatorOptions(path, out)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	// Cancelling the root context closes the browser; cancelling the
	// allocator then waits for the process to exit and removes its profile.
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		out.Close()
	})
	if err := attach(ctx); err != nil {
		log, _ := os.ReadFile(out.Name())
		t.Fatalf("starting %s: %v\n%s", path, err, log)
	}
	return &Browser{ctx: ctx}
}

// attach makes the first chromedp call on ctx, which starts the browser or
// opens the tab and binds its life to ctx itself: a deadline on that call
// would end the browser or the tab with it (and a tab whose context ended
// stops handling its events, so every later wait times out). The call is
// bounded by ActionTimeout from outside instead.
func attach(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(ActionTimeout):
		_ = chromedp.Cancel(ctx)
		if err := <-done; err != nil {
			return err
		}
		return errors.New("timed out")
	}
}
