package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
)

// send sends one request to the routes as adminServer serves them and
// returns the answer and its body.
func send(t *testing.T, addr, method, target string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return res, string(body)
}

// TestUIRoutes: the page and its script and style answer GET with the
// headers that keep them to themselves; other methods, and other names,
// are refused.
func TestUIRoutes(t *testing.T) {
	addr := adminServer(t)
	for _, c := range []struct {
		target, contentType, has string
	}{
		{"/rate_limit/ui", "text/html; charset=utf-8", `<script type="module" src="ui/app.js"></script>`},
		{"/rate_limit/ui/app.js", "text/javascript; charset=utf-8", "const routes = {"},
		{"/rate_limit/ui/app.css", "text/css; charset=utf-8", "table {"},
	} {
		res, body := send(t, addr, "GET", c.target)
		if res.StatusCode != 200 || !strings.Contains(body, c.has) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%s", c.target, res.StatusCode, c.has, body)
		}
		for name, want := range map[string]string{
			"Content-Type":            c.contentType,
			"Content-Security-Policy": uiCSP,
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "same-origin",
		} {
			if got := res.Header.Get(name); got != want {
				t.Errorf("GET %s: %s: %q, want %q", c.target, name, got, want)
			}
		}
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "HEAD"} {
			if res, _ := send(t, addr, m, c.target); res.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, c.target, res.StatusCode)
			}
		}
	}
	for _, target := range []string{"/rate_limit/ui/", "/rate_limit/ui/index.html", "/rate_limit/ui/../admin.go", "/rate_limit/ui/app.js/x"} {
		if res, _ := send(t, addr, "GET", target); res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", target, res.StatusCode)
		}
	}
	if csp := uiCSP; !strings.HasPrefix(csp, "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:") ||
		strings.Contains(csp, "unsafe") {
		t.Errorf("the CSP %q allows more than the page's own files", csp)
	}
}

// TestUIPageHasNoInlineCode: the CSP allows no inline script or style, so
// the page must have none (it would not run, and the test of the page in
// a browser would show why only as a console message).
func TestUIPageHasNoInlineCode(t *testing.T) {
	_, page := send(t, adminServer(t), "GET", "/rate_limit/ui")
	scripts := regexp.MustCompile(`<script[^>]*>[^<]*</script>`).FindAllString(page, -1)
	if len(scripts) != strings.Count(page, "<script") {
		t.Errorf("the page has a script that is not a src'ed empty element:\n%s", page)
	}
	for _, s := range scripts {
		if !regexp.MustCompile(`^<script [^>]*src="[^"]+"[^>]*></script>$`).MatchString(s) {
			t.Errorf("the page has an inline script: %s", s)
		}
	}
	for _, re := range []string{`<style`, `\sstyle=`, `\son[a-z]+=`, `javascript:`} {
		if m := regexp.MustCompile(re).FindString(page); m != "" {
			t.Errorf("the page has inline code (%s: %q)", re, m)
		}
	}
}

// TestUIScriptFetchesOnlyAdminRoutes: the script reads only this module's
// JSON routes, named relative to the page, and builds its DOM with text
// nodes only.
func TestUIScriptFetchesOnlyAdminRoutes(t *testing.T) {
	addr := adminServer(t)
	_, js := send(t, addr, "GET", "/rate_limit/ui/app.js")
	block := regexp.MustCompile(`(?s)const routes = \{(.*?)\n\};`).FindStringSubmatch(js)
	if block == nil {
		t.Fatal("app.js has no `const routes = {…};`")
	}
	page, _ := url.Parse("http://127.0.0.1:2019/rate_limit/ui")
	entries := regexp.MustCompile(`(?m)^\t\w+: "([^"]*)",$`).FindAllStringSubmatch(block[1], -1)
	if len(entries) != strings.Count(block[1], ":") || len(entries) < 5 {
		t.Fatalf("app.js's routes are not each a name and a string (%d read):\n%s", len(entries), block[1])
	}
	for _, e := range entries {
		ref, err := url.Parse(e[1])
		if err != nil || ref.Scheme != "" || ref.Host != "" || strings.HasPrefix(e[1], "/") || strings.Contains(e[1], "..") {
			t.Errorf("route %q: want a path relative to the page", e[1])
			continue
		}
		abs := page.ResolveReference(ref)
		if !strings.HasPrefix(abs.Path, "/rate_limit/") {
			t.Errorf("route %q resolves to %s, outside the module", e[1], abs.Path)
		}
		res, body := send(t, addr, "GET", abs.RequestURI())
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("route %q: GET %s: %d %s, want 200 with JSON: %s", e[1], abs.RequestURI(), res.StatusCode, res.Header.Get("Content-Type"), body)
		}
	}
	if n := strings.Count(js, "fetch("); n != 1 || !strings.Contains(js, "await fetch(route, ") {
		t.Errorf("app.js calls fetch %d times, want once, in load(route)", n)
	}
	code := regexp.MustCompile(`(?m)^\s*//.*$`).ReplaceAllString(js, "") // comments may say anything
	for _, bad := range []string{"://", `"//`, "'//", "`//", "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
		"eval(", "Function(", "XMLHttpRequest", "WebSocket", "EventSource", "import(", "setAttribute", "location."} {
		if strings.Contains(code, bad) {
			t.Errorf("app.js has %q: it may only read its relative routes and build text nodes", bad)
		}
	}
}

// TestUIStatusRoute: GET /rate_limit/status describes the adaptive
// controller of the running engines with their adaptive trees, in JSON
// (a signal not yet measured included).
func TestUIStatusRoute(t *testing.T) {
	tr := &hierarchy.Tree{Name: "edge", Tiers: []*hierarchy.Tier{
		{Name: "all", Key: "fixed", Adaptive: true, Limits: []*hierarchy.Limit{{Count: 10, Per: "s"}}},
	}}
	if err := tr.Compile(); err != nil {
		t.Fatal(err)
	}
	c, err := adaptive.New(adaptive.Config{}, adaptive.Options{CPU: adaptive.SourceFunc(func(time.Time) (float64, error) { return 50, nil })})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	c.Sample(time.Now())
	e := engine.New(engine.Config{Trees: []*engine.Tree{{Tree: tr}}, Runtime: runtimeOf(t), Controller: c, Priority: adaptive.PriorityBatch})
	t.Cleanup(e.Close)
	t.Cleanup(running.Register(e, make(chan struct{})))

	addr := adminServer(t)
	res, body := send(t, addr, "GET", "/rate_limit/status")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); res.StatusCode != 200 || err != nil {
		t.Fatalf("GET /rate_limit/status: %d %v\n%s", res.StatusCode, err, body)
	}
	if len(st.Adaptive) != 1 {
		t.Fatalf("%d controllers, want 1:\n%s", len(st.Adaptive), body)
	}
	a := st.Adaptive[0]
	if len(a.Trees) != 1 || a.Trees[0].Tree != "edge" || a.Trees[0].Priority != "batch" || a.Floor != adaptive.DefaultFloor {
		t.Errorf("the controller's trees %+v, floor %v: want edge (batch), floor %v", a.Trees, a.Floor, adaptive.DefaultFloor)
	}
	if len(a.Signals) != 4 || a.Signals[0].Name != "cpu" || a.Signals[0].Unit != "%" || a.Level == "" {
		t.Errorf("signals %+v, level %q: want cpu, memory, latency_p99 and error_rate, and a level", a.Signals, a.Level)
	}
	if st.Stores == nil {
		t.Errorf("stores: null, want a list (of the pooled stores the engines use: none here)")
	}
	if res, _ := send(t, addr, "POST", "/rate_limit/status"); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /rate_limit/status: %d, want 405", res.StatusCode)
	}
}
