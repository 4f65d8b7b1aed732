package adaptive

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// SignalConfig configures an external signal: a health reading that the
// controller does not measure itself but reads from the dependencies behind
// the upstream (a database pool gauge from an exporter, a queue depth from a
// health endpoint), from the upstream's own responses, or from the number of
// requests in flight. It takes part in the decision exactly as the built-in
// signals do: placed on its Warn and Critical thresholds as a pressure, the
// worst pressure of all signals wins, and the dead band, the recovery delay
// and (for sampled values) the smoothing keep it from flapping.
//
// Exactly one of Prometheus, HTTP, ResponseHeader and InFlight is set. Every
// signal needs Warn and Critical, in the signal's own unit, with higher
// values worse:
//
//	{"name": "pg_pool", "warn": 0.7, "critical": 0.9, "on_error": "critical",
//	 "prometheus": {"url": "http://pg-exporter:9187/metrics",
//	                "metric": "pg_pool_in_use{pool=\"main\"}",
//	                "divide_by": "pg_pool_size{pool=\"main\"}"}}
type SignalConfig struct {
	// Name labels the signal in metrics (cascade_adaptive_signal{name})
	// and logs: lower-case letters, digits and underscores, unique, and
	// none of the built-in signals' names.
	Name string `json:"name"`

	// Prometheus reads a gauge, or the ratio of two, from a Prometheus text
	// exposition, every Interval.
	Prometheus *PrometheusSignal `json:"prometheus,omitempty"`

	// HTTP reads a number from a JSON document, every Interval.
	HTTP *HTTPSignal `json:"http,omitempty"`

	// ResponseHeader names a response header in which the upstream reports
	// a number (its queue depth, its pool usage). The value is the average
	// of the numbers seen on the responses recorded over
	// Config.LatencyWindow, and counts once the window holds
	// Config.MinRequests of them, like the latency signal. A response
	// without the header is not counted; one whose header is not a number
	// is counted as a read error.
	ResponseHeader string `json:"response_header,omitempty"`

	// InFlight is a maximum number of requests in flight: the signal is the
	// number of requests the handlers with adaptive tiers have passed to
	// their upstreams and not yet finished, in percent of it (smoothed as
	// CPU is). It needs no outside help and never fails.
	InFlight int `json:"in_flight,omitempty"`

	// Warn and Critical are the signal's thresholds, in its unit (a ratio
	// for "pool in use ÷ pool size", percent of InFlight for InFlight).
	// Both are required, positive, and Warn below Critical.
	Warn     float64 `json:"warn,omitempty"`
	Critical float64 `json:"critical,omitempty"`

	// Interval is how often a Prometheus or HTTP signal is read, by a
	// goroutine of its own, so a slow endpoint never delays the controller.
	// Default 5s. The controller uses the latest reading at each of its
	// samples. ResponseHeader and InFlight are read at every sample.
	Interval time.Duration `json:"interval,omitempty"`

	// Timeout bounds one read of a Prometheus or HTTP signal. Default 2s,
	// or Interval if shorter; at most Interval.
	Timeout time.Duration `json:"timeout,omitempty"`

	// Smoothing is the time constant of the moving average applied to a
	// Prometheus, HTTP or InFlight value (as to CPU). Default
	// Config.Smoothing. A ResponseHeader value is already averaged over the
	// latency window.
	Smoothing time.Duration `json:"smoothing,omitempty"`

	// OnError says what an unreadable signal means: a read that failed
	// (timeout, refused connection, a status other than 2xx, a body that
	// does not parse, a metric or field that is missing or not a number),
	// or a latest reading older than two Intervals and a Timeout; for
	// ResponseHeader, a window of at least MinRequests responses none of
	// which carried a number. Required for every signal but InFlight:
	//
	//   - "ignore": the signal drops out of the decision until it reads
	//     again (as if it were not configured; the others still count);
	//   - "critical": the signal counts as critical (pressure 1) until it
	//     reads again: a dependency that cannot say it is healthy is not.
	//
	// Either way the first failure of a streak is logged, every failed read
	// is counted (cascade_adaptive_signal_errors_total{name}), and a failed
	// read is never taken for a healthy value.
	OnError OnError `json:"on_error,omitempty"`
}

// PrometheusSignal reads a Prometheus text exposition (what every exporter
// serves at /metrics) with the parser of github.com/prometheus/common.
type PrometheusSignal struct {
	// URL of the exposition, http or https.
	URL string `json:"url"`
	// Metric selects one series: a metric name, optionally with label
	// matchers in braces, as PromQL writes an instant vector selector but
	// with equality matchers only: pg_pool_in_use, or
	// pg_pool_in_use{pool="main",db="app"} (the quotes may be left out of
	// values made of letters, digits, '_', '-', '.' and ':'). The selector
	// must match exactly one series of a gauge, counter or untyped metric;
	// add labels until it does.
	Metric string `json:"metric"`
	// DivideBy, when set, selects a second series the same way, and the
	// signal is Metric ÷ DivideBy (pool in use ÷ pool size). A DivideBy of
	// zero is a read error.
	DivideBy string `json:"divide_by,omitempty"`
}

// HTTPSignal reads a number from a JSON document, such as a health
// endpoint's.
type HTTPSignal struct {
	// URL of the document, http or https. A status other than 2xx is a read
	// error.
	URL string `json:"url"`
	// Field is the number's dotted path in the document: "db.pool.in_use",
	// with array elements by index ("pools.0.in_use"). The value must be a
	// JSON number.
	Field string `json:"field"`
}

// OnError is the policy for an unreadable signal: OnErrorIgnore or
// OnErrorCritical.
type OnError string

// The policies; see SignalConfig.OnError.
const (
	OnErrorIgnore   OnError = "ignore"
	OnErrorCritical OnError = "critical"
)

// Defaults of the remote (Prometheus, HTTP) signals.
const (
	DefaultSignalInterval = 5 * time.Second
	DefaultSignalTimeout  = 2 * time.Second
)

// The kinds of external signal.
const (
	kindPrometheus = "prometheus"
	kindHTTP       = "http"
	kindHeader     = "response_header"
	kindInFlight   = "in_flight"
)

// kind returns the signal's kind, "" when none or several are set.
func (s SignalConfig) kind() string {
	var kinds []string
	if s.Prometheus != nil {
		kinds = append(kinds, kindPrometheus)
	}
	if s.HTTP != nil {
		kinds = append(kinds, kindHTTP)
	}
	if s.ResponseHeader != "" {
		kinds = append(kinds, kindHeader)
	}
	if s.InFlight != 0 {
		kinds = append(kinds, kindInFlight)
	}
	if len(kinds) != 1 {
		return ""
	}
	return kinds[0]
}

// remote reports whether the signal is read from another process.
func (s SignalConfig) remote() bool {
	k := s.kind()
	return k == kindPrometheus || k == kindHTTP
}

// withDefaults returns s with its zero fields set to their defaults, the
// controller's smoothing given as smoothing.
func (s SignalConfig) withDefaults(smoothing time.Duration) SignalConfig {
	if s.remote() {
		if s.Interval == 0 {
			s.Interval = DefaultSignalInterval
		}
		if s.Timeout == 0 {
			s.Timeout = min(DefaultSignalTimeout, s.Interval)
		}
	}
	if s.Smoothing == 0 && s.kind() != kindHeader {
		s.Smoothing = smoothing
	}
	return s
}

var signalName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// builtinSignals are the names of the controller's own signals, as the
// pressure gauge labels them.
var builtinSignals = map[string]bool{"cpu": true, "memory": true, "latency_p99": true, "error_rate": true}

// validate reports what is wrong with s (defaults applied), each problem
// saying how to fix it.
func (s SignalConfig) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	kind := s.kind()
	switch kind {
	case "":
		bad("give exactly one of prometheus, http, response_header and in_flight")
	case kindPrometheus:
		if err := checkURL(s.Prometheus.URL); err != nil {
			bad("prometheus: %v", err)
		}
		if _, err := parseSelector(s.Prometheus.Metric); err != nil {
			bad("prometheus: metric: %v", err)
		}
		if s.Prometheus.DivideBy != "" {
			if _, err := parseSelector(s.Prometheus.DivideBy); err != nil {
				bad("prometheus: divide_by: %v", err)
			}
		}
	case kindHTTP:
		if err := checkURL(s.HTTP.URL); err != nil {
			bad("http: %v", err)
		}
		if _, err := parseField(s.HTTP.Field); err != nil {
			bad("http: field: %v", err)
		}
	case kindHeader:
		if strings.ContainsAny(s.ResponseHeader, " \t:\r\n") {
			bad("response_header %q is not a header name", s.ResponseHeader)
		}
	case kindInFlight:
		if s.InFlight < 0 {
			bad("in_flight %d: the maximum must be positive", s.InFlight)
		}
	}
	switch {
	case math.IsNaN(s.Warn) || math.IsNaN(s.Critical) || math.IsInf(s.Warn, 0) || math.IsInf(s.Critical, 0):
		bad("warn and critical must be numbers")
	case s.Warn == 0 || s.Critical == 0:
		bad("warn and critical are required (e.g. warn 0.7, critical 0.9 for a ratio)")
	case s.Warn < 0 || s.Critical < 0:
		bad("warn (%v) and critical (%v) must be positive", s.Warn, s.Critical)
	case s.Warn >= s.Critical:
		bad("warn (%v) must be below critical (%v): higher values are worse", s.Warn, s.Critical)
	}
	switch s.OnError {
	case OnErrorIgnore, OnErrorCritical:
		if kind == kindInFlight {
			bad("on_error: an in_flight signal cannot fail; remove on_error")
		}
	case "":
		if kind != kindInFlight && kind != "" {
			bad("on_error is required: ignore (the signal drops out while unreadable) or critical (it counts as critical while unreadable)")
		}
	default:
		bad("on_error %q: use ignore or critical", s.OnError)
	}
	if s.remote() {
		switch {
		case s.Interval < 10*time.Millisecond:
			bad("interval %v is too short (minimum 10ms)", s.Interval)
		case s.Timeout < time.Millisecond || s.Timeout > s.Interval:
			bad("timeout %v must be at least 1ms and at most the interval (%v)", s.Timeout, s.Interval)
		}
	} else if kind != "" && (s.Interval != 0 || s.Timeout != 0) {
		bad("interval and timeout apply to prometheus and http signals only (a %s signal is read at every sample)", kind)
	}
	if s.Smoothing < 0 {
		bad("smoothing %v must not be negative", s.Smoothing)
	}
	return errs
}

// checkURL accepts an absolute http or https URL with a host.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("url %q: want an absolute http:// or https:// URL, such as http://exporter:9187/metrics", raw)
	}
	return nil
}

// validateSignals checks the signals of a config, defaults applied: each on
// its own, and their names together.
func validateSignals(signals []SignalConfig) []error {
	var errs []error
	seen := map[string]bool{}
	for i, s := range signals {
		label := fmt.Sprintf("signals[%d]", i)
		switch {
		case s.Name == "":
			errs = append(errs, fmt.Errorf("%s: name is required", label))
		case !signalName.MatchString(s.Name):
			errs = append(errs, fmt.Errorf("%s: name %q: use lower-case letters, digits and '_', starting with a letter", label, s.Name))
		case builtinSignals[s.Name]:
			errs = append(errs, fmt.Errorf("%s: name %q is a built-in signal's; choose another", label, s.Name))
		case seen[s.Name]:
			errs = append(errs, fmt.Errorf("%s: name %q is used twice", label, s.Name))
		default:
			label = "signal " + s.Name
		}
		seen[s.Name] = true
		for _, err := range s.validate() {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
		}
	}
	return errs
}
