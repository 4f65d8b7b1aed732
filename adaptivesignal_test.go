package cascade

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/adaptive"
)

// adaptApp adapts a Caddyfile whose global options are given and returns
// its cascade app.
func adaptApp(t *testing.T, global string) (*App, error) {
	t.Helper()
	cfg, err := adapt(t, globalOptions(global)+":0 {\n respond ok\n}\n")
	if err != nil {
		return nil, err
	}
	var c struct {
		Apps struct {
			Cascade json.RawMessage `json:"cascade"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	a := new(App)
	if err := json.Unmarshal(c.Apps.Cascade, a); err != nil {
		t.Fatalf("%s: %v", c.Apps.Cascade, err)
	}
	return a, caddy.Validate(mustConfig(t, cfg))
}

func TestSignalCaddyfile(t *testing.T) {
	a, err := adaptApp(t, `cascade {
		adaptive {
			signal pg_pool {
				prometheus http://pg-exporter:9187/metrics pg_pool_in_use{pool="main"} / pg_pool_size{pool="main"}
				warn      0.7
				critical  0.9
				interval  10s
				timeout   1s
				smoothing 5s
				on_error  critical
			}
			signal queue {
				http http://worker:8080/health queue.depth
				warn 100
				critical 500
				on_error ignore
			}
			signal upstream_pool {
				response_header X-Pool-Usage
				warn 0.8
				critical 0.95
				on_error ignore
			}
			signal concurrency {
				in_flight 500
				warn 80
				critical 100
			}
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	want := []adaptive.SignalConfig{
		{Name: "pg_pool", Prometheus: &adaptive.PrometheusSignal{URL: "http://pg-exporter:9187/metrics", Metric: `pg_pool_in_use{pool="main"}`, DivideBy: `pg_pool_size{pool="main"}`},
			Warn: 0.7, Critical: 0.9, Interval: 10 * time.Second, Timeout: time.Second, Smoothing: 5 * time.Second, OnError: adaptive.OnErrorCritical},
		{Name: "queue", HTTP: &adaptive.HTTPSignal{URL: "http://worker:8080/health", Field: "queue.depth"}, Warn: 100, Critical: 500, OnError: adaptive.OnErrorIgnore},
		{Name: "upstream_pool", ResponseHeader: "X-Pool-Usage", Warn: 0.8, Critical: 0.95, OnError: adaptive.OnErrorIgnore},
		{Name: "concurrency", InFlight: 500, Warn: 80, Critical: 100},
	}
	if got := a.Adaptive.Signals; !reflect.DeepEqual(got, want) {
		t.Fatalf("signals\n%+v\nwant\n%+v", got, want)
	}
}

func TestSignalJSONConfig(t *testing.T) {
	// Caddy's JSON, durations as strings, checked as `caddy validate`
	// checks it.
	raw := `{"adaptive":{"signals":[{"name":"pg_pool","prometheus":{"url":"http://e/metrics","metric":"pg_pool_in_use"},` +
		`"warn":0.7,"critical":0.9,"interval":"10s","timeout":"1s","on_error":"critical"}]}}`
	var a App
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		t.Fatal(err)
	}
	if s := a.Adaptive.Signals[0]; s.Interval != 10*time.Second || s.Timeout != time.Second {
		t.Fatalf("durations: %+v", s)
	}
	if err := json.Unmarshal([]byte(`{"adaptive":{"signals":[{"name":"x","interval":"soon"}]}}`), new(App)); err == nil ||
		!strings.Contains(err.Error(), "adaptive.signals[0].interval") {
		t.Fatalf("a bad duration: %v, want an error naming adaptive.signals[0].interval", err)
	}
	cfg := []byte(`{"admin":{"disabled":true},"apps":{"cascade":{"adaptive":{"signals":[{"name":"pg_pool",` +
		`"prometheus":{"url":"pg-exporter:9187/metrics","metric":"pg_pool_in_use"},"warn":0.9,"critical":0.7}]}}}}`)
	err := caddy.Validate(mustConfig(t, cfg))
	for _, want := range []string{
		`signal pg_pool: prometheus: url "pg-exporter:9187/metrics": want an absolute http:// or https:// URL`,
		"warn (0.9) must be below critical (0.7)",
		"on_error is required",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("caddy validate: %v\nwant an error containing %q", err, want)
		}
	}
}

func TestSignalCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, signal, want string
	}{
		{"no name", "signal {\n warn 1\n}", "signal: give it a name"},
		{"args after the name", "signal a b {\n}", `unexpected "b"`},
		{"unknown option", "signal a {\n treshold 1\n}", `unknown option "treshold": expected prometheus, http`},
		{"prometheus arity", "signal a {\n prometheus http://e/metrics\n}", `want prometheus <url> <metric{label="value"}> [/ <metric{label="value"}>]`},
		{"prometheus bad ratio", "signal a {\n prometheus http://e/metrics m * n\n}", "want prometheus <url>"},
		{"http arity", "signal a {\n http http://e/health\n}", "want http <url> <dotted.json.field>"},
		{"in_flight not a number", "signal a {\n in_flight many\n}", `"many" is not a number`},
		{"in_flight fraction", "signal a {\n in_flight 2.5\n}", "positive whole number"},
		{"warn not a number", "signal a {\n warn high\n}", `adaptive signal a: warn: "high" is not a number`},
		{"bad interval", "signal a {\n interval often\n}", `"often" is not a positive duration`},
		{"missing thresholds", "signal a {\n prometheus http://e/metrics m\n on_error ignore\n}", "signal a: warn and critical are required"},
		{"warn above critical", "signal a {\n prometheus http://e/metrics m\n warn 2\n critical 1\n on_error ignore\n}", "warn (2) must be below critical (1)"},
		{"bad url", "signal a {\n prometheus /metrics m\n warn 1\n critical 2\n on_error ignore\n}", "want an absolute http:// or https:// URL"},
		{"bad selector", "signal a {\n prometheus http://e/metrics m{pool=~\"x\"}\n warn 1\n critical 2\n on_error ignore\n}", "only equality matchers"},
		{"no policy", "signal a {\n http http://e/health q\n warn 1\n critical 2\n}", "on_error is required"},
		{"bad policy", "signal a {\n http http://e/health q\n warn 1\n critical 2\n on_error healthy\n}", `on_error "healthy": use ignore or critical`},
		{"no kind", "signal a {\n warn 1\n critical 2\n}", "give exactly one of prometheus, http, response_header and in_flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adaptApp(t, "cascade {\n adaptive {\n"+tc.signal+"\n }\n}")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestPassFeedsSignals: the handler counts a request in flight while the
// upstream has it, and reads the response header a signal names, only
// when such signals are configured.
func TestPassFeedsSignals(t *testing.T) {
	c, err := adaptive.New(adaptive.Config{MinRequests: 1, CPU: adaptive.Thresholds{Disabled: true}, Signals: []adaptive.SignalConfig{
		{Name: "concurrency", InFlight: 10, Warn: 50, Critical: 90, Smoothing: time.Nanosecond},
		{Name: "upstream_pool", ResponseHeader: "X-Pool-Usage", Warn: 0.7, Critical: 0.9, OnError: adaptive.OnErrorIgnore},
	}}, adaptive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{controller: c, inFlight: c.CountsInFlight(), readHeader: c.ReadsHeaders()}
	now := time.Now()
	c.Sample(now)
	var during float64
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		now = now.Add(time.Second)
		during = c.Sample(now).Signals[0].Value
		w.Header().Set("X-Pool-Usage", "0.8")
		w.WriteHeader(200)
		return nil
	})
	if err := h.pass(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), next); err != nil {
		t.Fatal(err)
	}
	s := c.Sample(now.Add(time.Second))
	if during != 10 || s.Signals[0].Value != 0 {
		t.Errorf("in flight: %v%% during the request, %v%% after; want 10%% (1 of 10), then 0", during, s.Signals[0].Value)
	}
	if sig := s.Signals[1]; !sig.Counts || sig.Value != 0.8 {
		t.Errorf("response header signal %+v, want 0.8", sig)
	}
	// Without those signals the handler does neither.
	h.inFlight, h.readHeader = false, false
	next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		now = now.Add(time.Second)
		during = c.Sample(now).Signals[0].Value
		w.Header().Set("X-Pool-Usage", "0.1")
		return nil
	})
	if err := h.pass(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), next); err != nil {
		t.Fatal(err)
	}
	if s := c.Sample(now.Add(time.Second)); during != 0 || s.Signals[1].Value != 0.8 {
		t.Errorf("unconfigured: in flight %v%%, header average %v; want 0 and 0.8", during, s.Signals[1].Value)
	}
}

// TestAdaptiveExternalSignal: Caddy in front of an upstream whose database
// pool an exporter reports. The test raises the pool gauge: the effective
// quota in RateLimit-Policy drops (batch traffic first; how long it took
// is logged), and recovers once the gauge falls. An
// exporter that cannot be read follows the declared policy: with
// on_error critical the quota drops again; with on_error ignore it does
// not, and the failures are counted.
func TestAdaptiveExternalSignal(t *testing.T) {
	var inUse atomic.Int64 // connections in use of a pool of 100
	inUse.Store(10)
	var mode atomic.Value // "ok", "garbage", "hang"
	mode.Store("ok")
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "garbage":
			w.Write([]byte("<html>bad gateway</html>\n"))
			return
		case "hang":
			<-r.Context().Done()
			return
		}
		fmt.Fprintf(w, "# TYPE pg_pool_in_use gauge\npg_pool_in_use{pool=\"main\"} %d\npg_pool_in_use{pool=\"reports\"} 99\n"+
			"# TYPE pg_pool_size gauge\npg_pool_size{pool=\"main\"} 100\npg_pool_size{pool=\"reports\"} 100\n", inUse.Load())
	}))
	defer exporter.Close()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer upstream.Close()
	port, name := freePort(t), testSeq.Add(1)
	up := strings.TrimPrefix(upstream.URL, "http://")
	sites := fmt.Sprintf(`
(api_limits) {
	tree api {
		tier all fixed {
			limit 1000/s
			adaptive
		}
	}
	store memory {
		name external%d
	}
}
http://127.0.0.1:%d {
	handle /batch {
		rate_limit {
			import api_limits
			priority batch
		}
		reverse_proxy %s
	}
	handle {
		rate_limit {
			import api_limits
		}
		reverse_proxy %s
	}
}
`, name, port, up, up)
	const interval = 300 * time.Millisecond
	global := func(policy string) string {
		return fmt.Sprintf(`cascade {
		adaptive {
			interval 50ms
			floor 0.2
			cpu off
			latency off
			error_rate off
			recovery_delay 200ms
			recovery_time 1s
			signal pg_pool {
				prometheus %s/metrics pg_pool_in_use{pool="main"} / pg_pool_size{pool="main"}
				warn 0.7
				critical 0.9
				interval %v
				timeout 100ms
				smoothing 10ms
				on_error %s
			}
		}
	}`, exporter.URL, interval, policy)
	}
	startCaddy(t, sites, global("critical"))
	base := fmt.Sprintf("http://127.0.0.1:%d/", port)
	quota := func(path string) int {
		r := do(t, "GET", base+path)
		var q int
		if _, err := fmt.Sscanf(r.header.Get("RateLimit-Policy"), `"all";q=%d`, &q); err != nil {
			t.Fatalf("RateLimit-Policy %q (status %d): %v", r.header.Get("RateLimit-Policy"), r.status, err)
		}
		return q
	}
	// waitFor polls the interactive quota until cond holds and returns how
	// long that took.
	waitFor := func(what string, within time.Duration, cond func(q int) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			q := quota("")
			if cond(q) {
				return time.Since(start)
			}
			if time.Since(start) > within {
				t.Fatalf("%s: effective quota still %d after %v", what, q, within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	healthy := func(q int) bool { return q == 1000 }
	dropped := func(q int) bool { return q < 1000 }
	waitFor("healthy pool", 5*time.Second, healthy)

	// The pool fills: the quota drops (within two sampling intervals on a
	// quiet machine: logged; the bound is what a slow one cannot miss).
	inUse.Store(95)
	took := waitFor("pool at 95%", 10*time.Second, dropped)
	t.Logf("pool at 95%%: quota dropped after %v", took.Round(time.Millisecond))
	// Batch traffic is throttled first (factor², floored): while the pool
	// stays full the factor only falls, so the batch quota read after an
	// interactive one above the floor is below it, however late.
	var b, i int
	waitFor("pool at 95%", 10*time.Second, func(q int) bool {
		if q > 500 {
			return false
		}
		i, b = q, quota("batch")
		return true
	})
	if i <= 200 {
		t.Logf("interactive quota %d already at the floor when read: batch and interactive cannot be told apart", i)
	} else if b >= i {
		t.Errorf("batch quota %d, interactive %d: batch traffic must be throttled first", b, i)
	}
	// It drains: the quota recovers (recovery_delay 200ms + recovery_time 1s).
	inUse.Store(20)
	took = waitFor("pool drained", 10*time.Second, healthy)
	t.Logf("pool at 20%%: quota back to 1000 after %v", took.Round(time.Millisecond))

	// The exporter answers garbage: on_error critical throttles, once the
	// failures outlast the last good reading's grace (two intervals and a
	// timeout: one failed read is no streak).
	mode.Store("garbage")
	took = waitFor("unreadable exporter, on_error critical", 10*time.Second, dropped)
	t.Logf("unreadable exporter (critical): quota dropped after %v", took.Round(time.Millisecond))
	mode.Store("ok")
	waitFor("exporter readable again", 10*time.Second, healthy)

	// With on_error ignore, an exporter that does not answer within its
	// timeout changes nothing, but is counted: the quota stays whole while
	// more reads fail than on_error critical needed to throttle.
	if err := reload(t, sites, global("ignore")); err != nil {
		t.Fatal(err)
	}
	signalErrors := func() float64 {
		for _, m := range runningMetrics(t, "cascade_adaptive_signal_errors_total") {
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" && l.GetValue() == "pg_pool" {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	before := signalErrors()
	mode.Store("hang")
	start := time.Now()
	for {
		n := signalErrors()
		if q := quota(""); q != 1000 {
			t.Fatalf("unreadable exporter with on_error ignore: quota %d after %v failed reads, want 1000", q, n-before)
		}
		if n >= before+5 {
			t.Logf("on_error ignore: %v failed reads in %v, the quota whole", n-before, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("on_error ignore: %v failed reads of a hanging exporter in %v, want 5", n-before, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	a, err := caddy.ActiveContext().App("cascade")
	if err != nil {
		t.Fatal(err)
	}
	c := a.(*App).Controller()
	if s := c.Status(); s.Signals[0].Err == nil || !strings.Contains(s.Signals[0].Err.Error(), "timeout") || s.Signals[0].Counts {
		t.Errorf("hanging exporter with on_error ignore: %+v; want unreadable (a timeout), not counting", s.Signals[0])
	}
	mode.Store("ok")
}

// BenchmarkPassSignals is what the signals that need the request path add
// to a request an adaptive handler lets through: nothing unless one is
// configured (BenchmarkHandler, without adaptive tiers, never calls them).
func BenchmarkPassSignals(b *testing.B) {
	for _, bc := range []struct {
		name    string
		signals []adaptive.SignalConfig
	}{
		{"none", nil},
		{"remote-only", []adaptive.SignalConfig{{Name: "pg_pool", Prometheus: &adaptive.PrometheusSignal{URL: "http://127.0.0.1:1/metrics", Metric: "m"},
			Warn: 1, Critical: 2, OnError: adaptive.OnErrorIgnore}}},
		{"in_flight", []adaptive.SignalConfig{{Name: "concurrency", InFlight: 100, Warn: 80, Critical: 100}}},
		{"response_header", []adaptive.SignalConfig{{Name: "upstream_pool", ResponseHeader: "X-Pool-Usage", Warn: 0.7, Critical: 0.9, OnError: adaptive.OnErrorIgnore}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := adaptive.New(adaptive.Config{CPU: adaptive.Thresholds{Disabled: true}, Signals: bc.signals}, adaptive.Options{})
			if err != nil {
				b.Fatal(err)
			}
			h := &Handler{controller: c, inFlight: c.CountsInFlight(), readHeader: c.ReadsHeaders()}
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				w.Header()["X-Pool-Usage"] = []string{"0.42"}
				w.WriteHeader(200)
				return nil
			})
			r := httptest.NewRequest("GET", "/", nil)
			w := &headerWriter{hdr: http.Header{}}
			b.ReportAllocs()
			for range b.N {
				if err := h.pass(w, r, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSignalReadmeExample: the worked example of docs/adaptive.md, its
// Caddyfile and its JSON, are valid as written.
func TestSignalReadmeExample(t *testing.T) {
	b, err := os.ReadFile("docs/adaptive.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### Health from the dependencies that fail first")
	if !ok {
		t.Fatal("README: no section on external signals")
	}
	block := func(lang string) string {
		_, rest, ok := strings.Cut(section, "```"+lang+"\n")
		body, _, ok2 := strings.Cut(rest, "```")
		if !ok || !ok2 {
			t.Fatalf("README: no %s block in the section", lang)
		}
		return body
	}
	cf := strings.Replace(block("caddyfile"), "{\n", "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n", 1)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("README Caddyfile: %v", err)
	}
	if err := caddy.Validate(mustConfig(t, cfg)); err != nil {
		t.Fatalf("README Caddyfile: %v", err)
	}
	if !strings.Contains(string(cfg), `"divide_by":"pgbouncer_databases_pool_size{name=\"app\"}"`) {
		t.Errorf("README Caddyfile adapted without its divisor: %s", cfg)
	}
	js := `{"admin":{"disabled":true},` + block("json") + `}`
	if err := caddy.Validate(mustConfig(t, []byte(js))); err != nil {
		t.Fatalf("README JSON: %v\n%s", err, js)
	}
}
