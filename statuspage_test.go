//go:build unix

package cascade

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/admin"
)

// chromiumTimeout bounds one run of headless Chromium: a few seconds on a
// quiet machine, far more on two busy cores.
const chromiumTimeout = 60 * time.Second

// TestStatusPage loads the admin API's status page in headless Chromium
// against a running Caddy, and checks what it shows: the trees, the
// stores, the adaptive factor, and a denied key holding markup shown as
// text. It saves a screenshot (under $CASCADE_ARTIFACTS when set).
func TestStatusPage(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("headless Chromium is needed (Debian package chromium, which scripts/test.sh installs): %v", err)
	}
	site, api := adminSite(t, `
		tree acme {
			tier org {header.X-Org} {
				limit 100/min
			}
			tier user {header.X-User} {
				limit 2/min
				value vip {
					limit 7/min
				}
			}
		}
		tree edge {
			tier all fixed {
				limit 1000/s
				adaptive
			}
		}
		`+memoryStore().block(t))
	const evil = "<script>alert(1)</script>"
	denied := 0
	for range 4 {
		if do(t, "GET", site, "X-Org: org-1", "X-User: "+evil).status == http.StatusTooManyRequests {
			denied++
		}
	}
	if denied == 0 {
		t.Fatal("4 requests against a limit of 2/min: none was denied")
	}
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/acme/user/vip", `{"limits":[{"count":9,"per":"min"}],"note":"ticket <b>42</b>"}`, nil); code != 200 {
		t.Fatalf("setting an override: %d %s", code, body)
	}
	var top admin.Top
	if code, body := call(t, "GET", api+"/rate_limit/top", nil, &top); code != 200 || len(top.Keys) == 0 {
		t.Fatalf("GET /rate_limit/top: %d %s", code, body)
	}

	proxy := &adminProxy{origin: api}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	page := api + "/rate_limit/ui"

	dom, stderr := runChromium(t, chromium, srv.URL, "--dump-dom", page)
	for _, want := range []string{
		"<h3>acme</h3>", "<h3>edge</h3>", // the trees
		"user=&lt;script&gt;alert(1)&lt;/script&gt;", // the denied key, as text
		"ticket &lt;b&gt;42&lt;/b&gt;",               // the override's note, as text
		`<span class="value">vip</span></td><td>9/min</td>`,
		`<div id="errors" role="alert"></div>`, // every route answered
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page does not show %s:\n%s", want, dom)
		}
	}
	// The store, and the adaptive factor (which a busy machine lowers).
	for _, want := range []string{`<span class="value">memory/t\d+</span></td><td>memory</td><td>acme, edge</td>`,
		`level <span class="[a-z]+">[a-z]+</span> · factor \d\.\d{3}`} {
		if !regexp.MustCompile(want).MatchString(dom) {
			t.Errorf("the page does not show %s:\n%s", want, dom)
		}
	}
	if strings.Contains(dom, "<script>alert") || strings.Contains(dom, "<b>42") || strings.Count(dom, "<script") != 1 {
		t.Errorf("the page holds markup of the data as elements (want only its own <script>):\n%s", dom)
	}
	if lines := consoleLines(stderr); len(lines) > 0 {
		t.Errorf("the page logged to the console:\n%s", strings.Join(lines, "\n"))
	}
	proxy.check(t, "/rate_limit/ui", "/rate_limit/ui/app.js", "/rate_limit/ui/app.css", "/rate_limit/trees",
		"/rate_limit/top", "/rate_limit/overrides", "/rate_limit/entitlements", "/rate_limit/status")

	dir := os.Getenv("CASCADE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "statuspage.png")
	_, stderr = runChromium(t, chromium, srv.URL, "--screenshot="+shot, "--window-size=1280,1600", page)
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("no screenshot at %s (%v); Chromium said:\n%s", shot, err, stderr)
	}
	t.Logf("screenshot of the status page: %s", shot)
}

// runChromium loads url in headless Chromium through the HTTP proxy at
// proxyURL, with args (what to do with the page), and returns its
// standard output and error. It kills Chromium and its children when the
// time is up, and in any case before returning.
func runChromium(t *testing.T, chromium, proxyURL string, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, append([]string{
		"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=8000", "--enable-logging=stderr", "--v=0",
		"--no-first-run", "--proxy-server=" + strings.TrimPrefix(proxyURL, "http://"),
		"--proxy-bypass-list=<-loopback>", // loopback through the proxy too
	}, args...)...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its renderers, if any outlived it
	}
	if err != nil {
		t.Fatalf("chromium %s: %v after %v\n%s", strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), errs.String())
	}
	t.Logf("chromium %s: %v", args[0], time.Since(start).Round(time.Millisecond))
	return out.String(), errs.String()
}

// consoleRE matches the lines Chromium logs for the page's console: its
// messages (CONSOLE(n) or CONSOLE:n, by version) and uncaught exceptions.
var consoleRE = regexp.MustCompile(`CONSOLE[(:]|Uncaught`)

func consoleLines(stderr string) []string {
	var out []string
	for line := range strings.Lines(stderr) {
		if consoleRE.MatchString(line) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// adminProxy is the HTTP proxy Chromium goes through to the admin
// endpoint (origin). It passes every request on as the browser sent it but
// one: a navigation with no Referer, which Caddy's admin endpoint refuses
// from a browser (it sends Sec-Fetch-Mode, and neither Origin nor
// Referer), gets the endpoint's own origin as Referer, as a link there
// would give it. It records each request's path and status.
type adminProxy struct {
	origin string

	mu   sync.Mutex
	seen []string // "GET /rate_limit/ui 200"
}

func (p *adminProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Scheme+"://"+r.URL.Host != p.origin {
		// Chromium's own background requests, if any: not the page's.
		http.Error(w, "this proxy reaches only the admin endpoint", http.StatusForbidden)
		return
	}
	record := func(status int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.seen = append(p.seen, r.Method+" "+r.URL.Path+" "+http.StatusText(status))
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if pr.In.Header.Get("Sec-Fetch-Mode") == "navigate" && pr.In.Header.Get("Referer") == "" {
				pr.Out.Header.Set("Referer", p.origin+"/")
			}
		},
		ModifyResponse: func(res *http.Response) error {
			record(res.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			record(http.StatusBadGateway)
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// check fails t unless every request the proxy passed on was answered
// 200 and each of paths was asked for.
func (p *adminProxy) check(t *testing.T, paths ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.seen {
		if !strings.HasSuffix(s, " OK") {
			t.Errorf("the page's request %s was not answered 200 (all: %s)", s, strings.Join(p.seen, "; "))
		}
	}
	for _, path := range paths {
		if !slices.ContainsFunc(p.seen, func(s string) bool { return strings.HasPrefix(s, "GET "+path+" ") }) {
			t.Errorf("the page did not ask for %s (it asked for %s)", path, strings.Join(p.seen, "; "))
		}
	}
}
