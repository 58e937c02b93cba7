package browsertest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// ScreenshotDirEnv names the directory screenshots go to when go test runs
// without -artifacts.
const ScreenshotDirEnv = "DEDUP_SCREENSHOT_DIR"

// ScreenshotDir returns the directory t's screenshots go to, created if
// needed: t.ArtifactDir() when go test runs with -artifacts (kept under
// -outputdir, or the package directory's _artifacts), else a directory
// named after the test under $DEDUP_SCREENSHOT_DIR, by default
// os.TempDir()/dedupui-screenshots. Without -artifacts, ArtifactDir is a
// temporary directory removed when the test ends, which would lose them.
func ScreenshotDir(t testing.TB) string {
	t.Helper()
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	root := os.Getenv(ScreenshotDirEnv)
	if root == "" {
		root = filepath.Join(os.TempDir(), "dedupui-screenshots")
	}
	dir := filepath.Join(root, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("screenshot directory: %v", err)
	}
	return dir
}

// Screenshot writes a full-page PNG of the tab to ScreenshotDir as
// name.png, logs where, and returns its path.
func (p *Page) Screenshot(name string) string {
	p.t.Helper()
	png := Run(p, chromedp.FullScreenshot(100)) // quality 100 is PNG
	path := filepath.Join(ScreenshotDir(p.t), safeName(name)+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatalf("writing screenshot: %v", err)
	}
	p.t.Logf("screenshot %s", path)
	return path
}

// safeName turns a test or page name into one path element.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
