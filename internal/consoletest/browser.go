// Package consoletest drives the console (pkg/console) of the real services in a real browser: Debian's
// chromium, headless, through github.com/chromedp/chromedp. Its tests start one browser for the package; each
// test opens its own browser contexts (own cookies), one per person signed in.
//
// Without a browser the tests fail, saying how to install one (`apt-get install chromium`, as .ci/run does);
// they skip only when RETRYSAFE_SKIP_BROWSER=1 says no browser can be installed on this machine.
// SCREENSHOTS_DIR, when set (make screenshots), makes them save PNGs of the pages the README shows.
package consoletest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// SkipVar is the variable that lets the browser tests skip where no browser can be installed.
const SkipVar = "RETRYSAFE_SKIP_BROWSER"

// ErrNoBrowser means no chromium was found.
var ErrNoBrowser = errors.New("consoletest: no chromium found: install it (apt-get install -y chromium), or set " +
	SkipVar + "=1 where no browser can be installed")

// Browser is one headless chromium.
type Browser struct {
	root   context.Context // the first tab: the browser lives as long as it
	cancel func()
	dir    string
}

// FindChromium returns the path of a chromium: CHROMIUM_PATH, or chromium or chromium-browser on PATH.
func FindChromium() (string, error) {
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoBrowser
}

// Start starts chromium with a fresh profile and nothing that calls home.
func Start() (*Browser, error) {
	path, err := FindChromium()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "retrysafe-chromium-")
	if err != nil {
		return nil, err
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(1280, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	root, cancelRoot := chromedp.NewContext(alloc)
	b := &Browser{root: root, cancel: func() { cancelRoot(); cancelAlloc() }, dir: dir}
	// Start the process now (no deadline: it would end the browser), so a browser that cannot run fails here.
	if err := chromedp.Do(root); err != nil {
		b.Close()
		return nil, fmt.Errorf("consoletest: start %s: %w", path, err)
	}
	return b, nil
}

// Close stops the browser and removes its profile.
func (b *Browser) Close() {
	b.cancel()
	_ = os.RemoveAll(b.dir)
}

// Person returns a tab in a browser context of its own (its own cookies: one signed-in person), closed when the
// test ends. Every action on it is bounded, so a page that never shows what a test waits for fails the test.
func (b *Browser) Person(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithNewBrowserContext())
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		t.Fatalf("consoletest: new browser context: %v", err)
	}
	t.Cleanup(cancel)
	return ctx
}

// Run runs actions on tab, failing the test after 30 s.
func Run(t testing.TB, tab context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	Get(t, tab, chromedp.Steps(actions...))
}

// Get runs one action on tab and returns its value, failing the test after 30 s.
func Get[T any](t testing.TB, tab context.Context, action chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// Screenshot saves the full page as SCREENSHOTS_DIR/name.png when SCREENSHOTS_DIR is set.
func Screenshot(t testing.TB, tab context.Context, name string) {
	t.Helper()
	dir := os.Getenv("SCREENSHOTS_DIR")
	if dir == "" {
		return
	}
	png := Get(t, tab, chromedp.FullScreenshot(100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
