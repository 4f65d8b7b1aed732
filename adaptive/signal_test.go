package adaptive

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSignalDefaults(t *testing.T) {
	c := Config{Smoothing: 3 * time.Second, Signals: []SignalConfig{
		poolSignal(OnErrorIgnore),
		{Name: "fast", HTTP: &HTTPSignal{URL: "http://h/", Field: "x"}, Interval: time.Second, Warn: 1, Critical: 2, OnError: OnErrorIgnore},
		{Name: "hdr", ResponseHeader: "X-Q", Warn: 1, Critical: 2, OnError: OnErrorIgnore},
		{Name: "inflight", InFlight: 10, Warn: 1, Critical: 2, Smoothing: time.Second},
	}}.WithDefaults()
	for i, want := range []struct{ interval, timeout, smoothing time.Duration }{
		{5 * time.Second, 2 * time.Second, 3 * time.Second},
		{time.Second, time.Second, 3 * time.Second}, // timeout capped by the interval
		{0, 0, 0},           // read at every sample; already a window average
		{0, 0, time.Second}, // as configured
	} {
		s := c.Signals[i]
		if s.Interval != want.interval || s.Timeout != want.timeout || s.Smoothing != want.smoothing {
			t.Errorf("%s: interval %v timeout %v smoothing %v, want %+v", s.Name, s.Interval, s.Timeout, s.Smoothing, want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSignalValidate(t *testing.T) {
	prom := func(mod func(*SignalConfig)) Config {
		s := poolSignal(OnErrorCritical)
		mod(&s)
		return Config{Signals: []SignalConfig{s}}
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"valid", prom(func(*SignalConfig) {}), ""},
		{"valid http", prom(func(s *SignalConfig) {
			s.Prometheus, s.HTTP = nil, &HTTPSignal{URL: "https://h/health", Field: "a.0.b"}
		}), ""},
		{"valid header", prom(func(s *SignalConfig) { s.Prometheus, s.ResponseHeader = nil, "X-Pool" }), ""},
		{"valid in_flight", prom(func(s *SignalConfig) { s.Prometheus, s.InFlight, s.OnError = nil, 100, "" }), ""},
		{"no name", prom(func(s *SignalConfig) { s.Name = "" }), "signals[0]: name is required"},
		{"bad name", prom(func(s *SignalConfig) { s.Name = "Pg-Pool" }), `name "Pg-Pool": use lower-case letters`},
		{"built-in name", prom(func(s *SignalConfig) { s.Name = "cpu" }), `name "cpu" is a built-in signal's`},
		{"no kind", prom(func(s *SignalConfig) { s.Prometheus = nil }), "signal pg_pool: give exactly one of prometheus, http, response_header and in_flight"},
		{"two kinds", prom(func(s *SignalConfig) { s.ResponseHeader = "X-A" }), "give exactly one of"},
		{"relative url", prom(func(s *SignalConfig) { s.Prometheus.URL = "exporter:9187/metrics" }), "want an absolute http:// or https:// URL"},
		{"no url", prom(func(s *SignalConfig) { s.Prometheus.URL = "" }), "prometheus: url \"\""},
		{"ftp url", prom(func(s *SignalConfig) { s.Prometheus.URL = "ftp://h/m" }), "want an absolute http"},
		{"bad url", prom(func(s *SignalConfig) { s.Prometheus.URL = "http://h/%zz" }), `url "http://h/%zz"`},
		{"bad selector", prom(func(s *SignalConfig) { s.Prometheus.Metric = `m{a!="b"}` }), "prometheus: metric: "},
		{"bad divide_by", prom(func(s *SignalConfig) { s.Prometheus.DivideBy = `m{` }), "prometheus: divide_by: "},
		{"no metric", prom(func(s *SignalConfig) { s.Prometheus.Metric = "" }), "empty selector"},
		{"http no field", prom(func(s *SignalConfig) { s.Prometheus, s.HTTP = nil, &HTTPSignal{URL: "http://h/"} }), "http: field: empty"},
		{"http empty segment", prom(func(s *SignalConfig) { s.Prometheus, s.HTTP = nil, &HTTPSignal{URL: "http://h/", Field: "a..b"} }), "empty segment"},
		{"header with colon", prom(func(s *SignalConfig) { s.Prometheus, s.ResponseHeader = nil, "X-Pool: 1" }), "is not a header name"},
		{"negative in_flight", prom(func(s *SignalConfig) { s.Prometheus, s.InFlight, s.OnError = nil, -1, "" }), "the maximum must be positive"},
		{"missing thresholds", prom(func(s *SignalConfig) { s.Warn, s.Critical = 0, 0 }), "warn and critical are required"},
		{"missing critical", prom(func(s *SignalConfig) { s.Critical = 0 }), "warn and critical are required"},
		{"warn equals critical", prom(func(s *SignalConfig) { s.Warn = 0.9 }), "warn (0.9) must be below critical (0.9)"},
		{"warn above critical", prom(func(s *SignalConfig) { s.Warn = 0.95 }), "warn (0.95) must be below critical (0.9)"},
		{"negative", prom(func(s *SignalConfig) { s.Warn = -1 }), "must be positive"},
		{"NaN", prom(func(s *SignalConfig) { s.Critical = math.NaN() }), "must be numbers"},
		{"no on_error", prom(func(s *SignalConfig) { s.OnError = "" }), "on_error is required: ignore (the signal drops out while unreadable) or critical"},
		{"bad on_error", prom(func(s *SignalConfig) { s.OnError = "healthy" }), `on_error "healthy": use ignore or critical`},
		{"on_error on in_flight", prom(func(s *SignalConfig) { s.Prometheus, s.InFlight = nil, 10 }), "an in_flight signal cannot fail; remove on_error"},
		{"interval too short", prom(func(s *SignalConfig) { s.Interval = time.Millisecond }), "interval 1ms is too short"},
		{"timeout above interval", prom(func(s *SignalConfig) { s.Interval, s.Timeout = time.Second, 2*time.Second }), "timeout 2s must be at least 1ms and at most the interval (1s)"},
		{"interval on a header", prom(func(s *SignalConfig) { s.Prometheus, s.ResponseHeader, s.Interval = nil, "X-A", time.Second }), "interval and timeout apply to prometheus and http signals only"},
		{"negative smoothing", prom(func(s *SignalConfig) { s.Smoothing = -time.Second }), "smoothing -1s must not be negative"},
		{"duplicate names", Config{Signals: []SignalConfig{poolSignal(OnErrorIgnore), poolSignal(OnErrorIgnore)}}, `signals[1]: name "pg_pool" is used twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if tc.want == "" {
				if _, err := New(tc.cfg, Options{CPU: SourceFunc(func(time.Time) (float64, error) { return 0, nil })}); err != nil {
					t.Fatalf("New: %v", err)
				}
			}
		})
	}
}

func TestSignalJSON(t *testing.T) {
	in := `{"signals":[{"name":"pg_pool","prometheus":{"url":"http://e/metrics","metric":"pg_pool_in_use{pool=\"main\"}","divide_by":"pg_pool_size{pool=\"main\"}"},` +
		`"warn":0.7,"critical":0.9,"interval":10000000000,"on_error":"critical"},` +
		`{"name":"queue","http":{"url":"http://w/health","field":"queue.depth"},"warn":100,"critical":500,"on_error":"ignore"},` +
		`{"name":"upstream_pool","response_header":"X-Pool-Usage","warn":0.8,"critical":0.95,"on_error":"ignore"},` +
		`{"name":"concurrency","in_flight":500,"warn":80,"critical":100}]}`
	var c Config
	dec := json.NewDecoder(strings.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := []SignalConfig{
		{Name: "pg_pool", Prometheus: &PrometheusSignal{URL: "http://e/metrics", Metric: `pg_pool_in_use{pool="main"}`, DivideBy: `pg_pool_size{pool="main"}`},
			Warn: 0.7, Critical: 0.9, Interval: 10 * time.Second, OnError: OnErrorCritical},
		{Name: "queue", HTTP: &HTTPSignal{URL: "http://w/health", Field: "queue.depth"}, Warn: 100, Critical: 500, OnError: OnErrorIgnore},
		{Name: "upstream_pool", ResponseHeader: "X-Pool-Usage", Warn: 0.8, Critical: 0.95, OnError: OnErrorIgnore},
		{Name: "concurrency", InFlight: 500, Warn: 80, Critical: 100},
	}
	if !reflect.DeepEqual(c.Signals, want) {
		t.Errorf("decoded %+v\nwant    %+v", c.Signals, want)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	out, _ := json.Marshal(c)
	if string(out) != in {
		t.Errorf("round trip:\n%s\nwant\n%s", out, in)
	}
}
