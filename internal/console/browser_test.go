package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/sim"
)

// The browser tests drive the console in headless Chromium from Debian's
// packages (scripts/test.sh installs it), never a downloaded browser:
// MCPGATE_TEST_CHROMIUM names the binary, else chromium, chromium-browser
// or google-chrome on PATH. Without one they skip, and fail under CI.

// chromium returns the browser's path, skipping or failing the test when
// there is none.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MCPGATE_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install chromium, or set MCPGATE_TEST_CHROMIUM): the console's browser tests cannot run"
	if os.Getenv("CI") != "" {
		t.Fatal(msg) // CI must not pass by skipping
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context; it ends with the test.
func browser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // tests run as root in CI containers
		chromedp.WindowSize(width, height),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start %s: %v", chromium(t), err)
	}
	return ctx
}

// run runs browser actions with a deadline, failing the test with what.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise), failing the
// test on an error.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// do runs a JavaScript statement for its effects.
func do(t *testing.T, ctx context.Context, js string) {
	t.Helper()
	eval[any](t, ctx, "(() => { "+js+" })()")
}

// waitJS polls a JavaScript expression until it is true.
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		if err != nil {
			t.Fatalf("%s: evaluate %s: %v", what, expr, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 1500)`))
			t.Fatalf("timed out waiting for %s (%s); the page shows:\n%s", what, expr, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// jsString returns s as a JavaScript string literal.
func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}

// screenshotDir is where the tests leave a screenshot of each page for
// people to look at (CI keeps it as an artefact): $MCPGATE_SCREENSHOTS,
// else testdata/screenshots in this package (ignored by git).
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("MCPGATE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join("testdata", "screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	time.Sleep(200 * time.Millisecond) // let the last render settle
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(screenshotDir(t), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// startGateway runs a real gateway on a random loopback port until the test ends.
func startGateway(t *testing.T, cfg gateway.Config) *gateway.Gateway {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.AuditFlushInterval = time.Millisecond
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	select {
	case <-gw.Ready():
	case err := <-done:
		t.Fatalf("gateway did not start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway run: %v", err)
		}
	})
	return gw
}

// simDevice connects the index-th simulated device of profile until stop
// or the test's end.
func simDevice(t *testing.T, gw *gateway.Gateway, profile device.Profile, index int) (d *sim.Device, stop func()) {
	t.Helper()
	d, err := sim.NewDevice(sim.Config{Profile: profile, URL: "ws://" + gw.Addr() + "/xiaozhi/v1/", MACPrefix: 0x0c}, index)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return d, stop
}

func waitState(t *testing.T, gw *gateway.Gateway, id string, want hub.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if d, err := gw.Hub().Device(id); err == nil && d.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become %s", id, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rowState is the expression of a device row's state in the Devices table.
func rowState(id string) string {
	return fmt.Sprintf(`document.querySelector('#devices tr[data-id="%s"]')?.dataset.state`, id)
}

// checkPage checks what every page must hold to: each table has one body
// and rows as wide as its header, and every form control has a label.
func checkPage(t *testing.T, ctx context.Context, page string) {
	t.Helper()
	problems := eval[[]string](t, ctx, `(() => {
		const out = [];
		for (const tb of document.querySelectorAll('main table')) {
			const heads = tb.tHead ? tb.tHead.rows[0].cells.length : 0;
			if (tb.tBodies.length !== 1 || tb.querySelector('tbody tbody')) out.push('table #' + tb.id + ': not one body');
			for (const r of tb.tBodies[0]?.rows || []) {
				const cells = [...r.cells].reduce((n, c) => n + c.colSpan, 0);
				if (cells !== heads) { out.push('table #' + tb.id + ': a row of ' + cells + ' cells under ' + heads + ' headers'); break; }
			}
		}
		for (const el of document.querySelectorAll('main input, main select, main textarea')) {
			if (el.type === 'hidden') continue;
			const named = el.labels?.length || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
			if (!named) out.push('unlabelled ' + el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.name ? '[name=' + el.name + ']' : ''));
		}
		return out;
	})()`)
	for _, p := range problems {
		t.Errorf("%s page: %s", page, p)
	}
}
