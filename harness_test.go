package cascade

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-cascade/cascade/internal/freeport"
)

// freePort returns a loopback port nobody listens on, outside the range
// the kernel gives outgoing connections (see package freeport).
func freePort(t testing.TB) int {
	t.Helper()
	return freeport.Get(t)
}

// propagation bounds how long a change made through one instance (an
// override, a mode, a factor) may take to reach another through the
// store: under a second on a quiet machine; the bound is what a slow one
// cannot miss, and the time it took is logged.
const propagation = 10 * time.Second

// adapt turns a Caddyfile into Caddy JSON, failing on errors and warnings
// that are not expected.
func adapt(t testing.TB, caddyfile string) ([]byte, error) {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	return cfg, err
}

// globals are the global options of a test Caddyfile, without their
// braces: off ACME, the trust store and persisted config, and off the
// admin endpoint unless adminPort is given (then on 127.0.0.1:adminPort).
func globals(adminPort int) string {
	admin := "off"
	if adminPort > 0 {
		admin = "127.0.0.1:" + strconv.Itoa(adminPort)
	}
	return "\tadmin " + admin + "\n\tskip_install_trust\n\tauto_https off\n\tpersist_config off\n"
}

// globalOptions is the global options block of a test Caddyfile with the
// admin endpoint off, extra options (lines) inside it.
func globalOptions(extra ...string) string {
	return "{\n" + globals(0) + "\t" + strings.Join(extra, "\n") + "\n}\n"
}

// startCaddy runs Caddy in this process with the given site blocks and
// stops it when the test ends. Extra global options may be given.
func startCaddy(t testing.TB, sites string, global ...string) {
	t.Helper()
	cf := globalOptions(global...) + sites
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cf)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v\n%s", err, cfg)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// testClients holds each running test's HTTP client (testing.TB →
// *http.Client).
var testClients sync.Map

// httpClient is t's own HTTP client: no test shares a client, its
// connections or its transport's idle pool with another, and its idle
// connections are closed when t ends. Its timeout is a backstop against a
// hang that a slow machine cannot reach; tests that wait on purpose bound
// their waits themselves.
func httpClient(t testing.TB) *http.Client {
	if c, ok := testClients.Load(t); ok {
		return c.(*http.Client)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	if prev, loaded := testClients.LoadOrStore(t, c); loaded {
		return prev.(*http.Client)
	}
	t.Cleanup(func() {
		testClients.Delete(t)
		c.CloseIdleConnections()
	})
	return c
}

type resp struct {
	status int
	header http.Header
	body   string
}

func (r resp) problem(t testing.TB) map[string]any {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json (body %s)", ct, r.body)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	return p
}

// do sends a request with headers given as "Name: value" strings, a
// header named twice sent with its last value.
func do(t testing.TB, method, url string, headers ...string) resp {
	t.Helper()
	return request(t, http.Header.Set, method, url, headers...)
}

// request is do with each header put in the request by put (Set, or Add
// to send a header named twice on two lines).
func request(t testing.TB, put func(http.Header, string, string), method, url string, headers ...string) resp {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		put(req.Header, strings.TrimSpace(k), strings.TrimSpace(v))
	}
	res, err := httpClient(t).Do(req)
	if err != nil && method == http.MethodGet && time.Since(time.Unix(0, lastReload.Load())) < 2*time.Second &&
		(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		// Caddy's reload waits for the old servers' shutdowns to start, not
		// to finish: for a moment an old server may still accept a
		// connection on the shared listener, then close it unanswered.
		res, err = httpClient(t).Do(req)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, string(b)}
}

// lastReload is when reload last loaded a configuration (Unix ns).
var lastReload atomic.Int64

// admitN sends n requests and returns how many got 200.
func admitN(t testing.TB, n int, url string, headers ...string) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if do(t, "GET", url, headers...).status == http.StatusOK {
			ok++
		}
	}
	return ok
}

// admitUntilRefused sends requests to urls in turn until refusals in a
// row are refused (429), and returns how many were admitted; any other
// status fails the test.
func admitUntilRefused(t testing.TB, refusals int, urls []string, headers ...string) int {
	t.Helper()
	admitted := 0
	for i, refused := 0, 0; refused < refusals; i++ {
		switch r := do(t, "GET", urls[i%len(urls)], headers...); r.status {
		case http.StatusOK:
			admitted++
			refused = 0
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	return admitted
}

// loadJSON runs Caddy with a JSON config and stops it when the test ends.
func loadJSON(t testing.TB, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v\n%s", err, cfg)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// reload loads new site blocks (and global options) into the Caddy that
// startCaddy runs, as `caddy reload` does, and returns the error of a
// config that fails to load.
func reload(t testing.TB, sites string, global ...string) error {
	t.Helper()
	cfg, err := adapt(t, globalOptions(strings.Join(global, "\n"))+sites)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, sites)
	}
	err = caddy.Load(cfg, true)
	reloaded()
	return err
}

// reloaded is said after a configuration replaced a running one. Connections
// kept alive to the old configuration's servers are closed by them as they
// stop: a request sent on one just then would fail with EOF or a reset, so
// they are closed here, and do retries a GET that meets one soon after.
func reloaded() {
	lastReload.Store(time.Now().UnixNano())
	testClients.Range(func(_, c any) bool {
		c.(*http.Client).CloseIdleConnections()
		return true
	})
}

// metricTotal is the sum of the running Caddy's metrics of the family
// name, counters' and gauges' values alike (0 when there is none).
func metricTotal(t *testing.T, name string) float64 {
	t.Helper()
	n := 0.0
	for _, m := range runningMetrics(t, name) {
		n += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return n
}

// runningMetrics is the metrics of the family name in the running Caddy's
// registry (none when it has no such family).
func runningMetrics(t *testing.T, name string) []*dto.Metric {
	t.Helper()
	active := caddy.ActiveContext()
	families, err := active.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()
		}
	}
	return nil
}
