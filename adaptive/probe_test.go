package adaptive

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestParseSelector(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"pg_pool_in_use", "pg_pool_in_use", ""},
		{`pg_pool_in_use{pool="main"}`, `pg_pool_in_use{pool="main"}`, ""},
		{` pg_pool_in_use { pool = "main" , db="app", } `, `pg_pool_in_use{pool="main",db="app"}`, ""},
		{`pg_pool_in_use{pool=main,db=app-1.x:y}`, `pg_pool_in_use{pool="main",db="app-1.x:y"}`, ""},
		{`m{path="a \"b\" c,d}"}`, `m{path="a \"b\" c,d}"}`, ""},
		{`m{}`, `m`, ""},
		{`m{x=""}`, `m{x=""}`, ""},
		{"", "", "empty selector"},
		{"1abc", "", `"1abc" is not a metric name`},
		{`m{pool="main"`, "", "missing the closing '}'"},
		{`m{pool!="main"}`, "", "only equality matchers"},
		{`m{pool=~"ma.*"}`, "", "only equality matchers"},
		{`m{pool="main}`, "", "unterminated quoted value"},
		{`m{pool=}`, "", "missing the value of label pool"},
		{`m{pool="a" db="b"}`, "", "want ',' or '}'"},
		{`m{"pool"="a"}`, "", "is not a label name"},
		{`m{pool}`, "", `want label="value"`},
	} {
		s, err := parseSelector(tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case s.String() != tc.want:
			t.Errorf("%q parsed as %s, want %s", tc.in, s, tc.want)
		}
	}
}

// exposition is what a PostgreSQL pool exporter might serve.
const exposition = `# HELP pg_pool_in_use Connections in use.
# TYPE pg_pool_in_use gauge
pg_pool_in_use{pool="main",db="app"} 45
pg_pool_in_use{pool="main",db="reports"} 3
pg_pool_in_use{pool="replica",db="app"} 7
# HELP pg_pool_size Pool size.
# TYPE pg_pool_size gauge
pg_pool_size{pool="main",db="app"} 50
pg_pool_size{pool="main",db="reports"} 0
pg_pool_size{pool="replica",db="app"} 50
# TYPE pg_queries_total counter
pg_queries_total 123456
pg_untyped 2.5
# TYPE pg_latency_seconds histogram
pg_latency_seconds_bucket{le="1"} 3
pg_latency_seconds_bucket{le="+Inf"} 4
pg_latency_seconds_sum 2
pg_latency_seconds_count 4
pg_broken NaN
`

func TestPrometheusEval(t *testing.T) {
	for _, tc := range []struct {
		metric, divideBy string
		body             string
		want             float64
		err              string
	}{
		{`pg_pool_in_use{pool="main",db="app"}`, "", exposition, 45, ""},
		{`pg_pool_in_use{pool="main",db="app"}`, `pg_pool_size{pool="main",db="app"}`, exposition, 0.9, ""},
		{`pg_pool_in_use{pool=replica}`, `pg_pool_size{pool=replica}`, exposition, 0.14, ""},
		{"pg_queries_total", "", exposition, 0, "select a gauge"},
		{"pg_untyped", "", exposition, 2.5, ""},
		{`pg_pool_in_use{pool="main"}`, "", exposition, 0, `matches 2 series of pg_pool_in_use: add labels`},
		{`pg_pool_in_use{pool="other"}`, "", exposition, 0, `no series of pg_pool_in_use matches`},
		{"pg_missing", "", exposition, 0, "metric pg_missing not found"},
		{`pg_pool_in_use{db="reports"}`, `pg_pool_size{db="reports"}`, exposition, 0, `a ratio needs a positive divisor`},
		{`pg_pool_in_use{db="reports"}`, `pg_size_missing`, exposition, 0, `metric pg_size_missing not found`},
		{"pg_latency_seconds", "", exposition, 0, "is a histogram: select a gauge"},
		{"pg_broken", "", exposition, 0, "pg_broken is NaN"},
		{"m", "", "m{ 1\n", 0, "parsing the exposition"},
		{"m", "", "", 0, "metric m not found"},
	} {
		p, err := newPrometheusProbe(nil, &PrometheusSignal{URL: "http://x/metrics", Metric: tc.metric, DivideBy: tc.divideBy})
		if err != nil {
			t.Fatal(err)
		}
		v, err := p.eval([]byte(tc.body))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s / %s: %v, %v; want an error containing %q", tc.metric, tc.divideBy, v, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s / %s: %v", tc.metric, tc.divideBy, err)
		case v != tc.want:
			t.Errorf("%s / %s = %v, want %v", tc.metric, tc.divideBy, v, tc.want)
		}
	}
}

func TestHTTPEval(t *testing.T) {
	const doc = `{"db":{"pool":{"in_use":45,"size":50}},"pools":[{"in_use":1},{"in_use":2.5}],"name":"x","ok":true,"none":null}`
	for _, tc := range []struct {
		field, body string
		want        float64
		err         string
	}{
		{"db.pool.in_use", doc, 45, ""},
		{"pools.1.in_use", doc, 2.5, ""},
		{"db.pool.missing", doc, 0, "no field db.pool.missing"},
		{"pools.2.in_use", doc, 0, `pools is an array of 2: "2" is not an index`},
		{"pools.x", doc, 0, `"x" is not an index`},
		{"name", doc, 0, `the string "x", not a number`},
		{"ok", doc, 0, "true, not a number"},
		{"none", doc, 0, "null, not a number"},
		{"db", doc, 0, "an object, not a number"},
		{"name.first", doc, 0, "name is not an object"},
		{"a", "<html>down</html>", 0, "not JSON"},
		{"a", "", 0, "not JSON"},
	} {
		p, err := newHTTPProbe(nil, &HTTPSignal{URL: "http://x/health", Field: tc.field})
		if err != nil {
			t.Fatal(err)
		}
		v, err := p.eval([]byte(tc.body))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, %v; want an error containing %q", tc.field, v, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.field, err)
		case v != tc.want:
			t.Errorf("%s = %v, want %v", tc.field, v, tc.want)
		}
	}
}

func TestProbesOverHTTP(t *testing.T) {
	// The probes over a real connection: a page that is served, a status
	// other than 2xx, an endpoint slower than the timeout.
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
			t.Errorf("Accept %q, want the text format", r.Header.Get("Accept"))
		}
		w.Write([]byte(exposition))
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"queue":{"depth":12}}`))
	})
	mux.HandleFunc("/down", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"queue":{"depth":0}}`, http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	// A probe's context: a timeout a served page never reaches on a busy
	// machine, or (the slow endpoint) one it reaches.
	ctx := func(timeout time.Duration) context.Context {
		c, cancel := context.WithTimeout(context.Background(), timeout)
		t.Cleanup(cancel)
		return c
	}
	const served = 20 * time.Second
	prom, _ := newPrometheusProbe(client, &PrometheusSignal{URL: srv.URL + "/metrics", Metric: `pg_pool_in_use{pool="main",db="app"}`, DivideBy: `pg_pool_size{pool="main",db="app"}`})
	if v, err := prom.Probe(ctx(served)); err != nil || v != 0.9 {
		t.Errorf("prometheus: %v, %v; want 0.9", v, err)
	}
	health, _ := newHTTPProbe(client, &HTTPSignal{URL: srv.URL + "/health", Field: "queue.depth"})
	if v, err := health.Probe(ctx(served)); err != nil || v != 12 {
		t.Errorf("http: %v, %v; want 12", v, err)
	}
	down, _ := newHTTPProbe(client, &HTTPSignal{URL: srv.URL + "/down", Field: "queue.depth"})
	if v, err := down.Probe(ctx(served)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("503 with a healthy-looking body: %v, %v; want an error (never a healthy 0)", v, err)
	}
	slow, _ := newPrometheusProbe(client, &PrometheusSignal{URL: srv.URL + "/slow", Metric: "m"})
	start := time.Now()
	_, err := slow.Probe(ctx(100 * time.Millisecond))
	t.Logf("slow endpoint: %v after %v", err, time.Since(start))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow endpoint: %v, want the probe's context's deadline", err)
	}
}

// FuzzParseSelector: the selector parser never panics, and what it accepts
// prints as a selector that parses back to itself.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"m", `m{a="b"}`, `m{a=b,c="d\"e"}`, `m{a!="b"}`, `m{`, `m{a="\xff"}`, "{}", `m{a="b",}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := parseSelector(in)
		if err != nil {
			return
		}
		back, err := parseSelector(s.String())
		if err != nil || back.String() != s.String() {
			t.Fatalf("%q → %s → %v, %v", in, s, back, err)
		}
	})
}
