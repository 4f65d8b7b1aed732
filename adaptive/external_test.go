package adaptive

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// pool is an injected remote reading: the value the next read returns, or
// the error it fails with.
type pool struct {
	v     float64
	err   error
	reads int
}

func (p *pool) Probe(context.Context) (float64, error) {
	p.reads++
	return p.v, p.err
}

// poolSignal is a Prometheus signal read every 5s (the default) with the
// thresholds of a connection pool's usage ratio.
func poolSignal(onError OnError) SignalConfig {
	return SignalConfig{Name: "pg_pool", Warn: 0.7, Critical: 0.9, OnError: onError,
		Prometheus: &PrometheusSignal{URL: "http://exporter/metrics", Metric: "pg_pool_in_use", DivideBy: "pg_pool_size"}}
}

// extHarness is the harness with remote signals polled as their goroutines
// would, each every Interval of the injected clock, just before the
// controller's sample at the same time.
type extHarness struct {
	*harness
	polled map[*signal]time.Time
}

func newExtHarness(t *testing.T, cfg Config, probes map[string]Probe) *extHarness {
	t.Helper()
	cfg.CPU.Disabled = true
	h := &extHarness{harness: newHarness(t, cfg, Options{Probes: probes}), polled: map[*signal]time.Time{}}
	return h
}

// tick advances the clock by one controller interval, polls the remote
// signals that are due and samples.
func (h *extHarness) tick() Status {
	h.now = h.now.Add(h.c.cfg.Interval)
	for _, x := range h.c.signals {
		if last, ok := h.polled[x]; x.probe != nil && (!ok || h.now.Sub(last) >= x.cfg.Interval) {
			h.c.poll(x)
			h.polled[x] = h.now
		}
	}
	return h.c.Sample(h.now)
}

func TestExternalStep(t *testing.T) {
	// A pool gauge jumps from 30% to 95% of the pool: the factor falls
	// within two of the signal's sampling intervals, as fast as a
	// critical CPU does once the smoothing (2s) has caught up, and comes
	// back after the pool drains.
	p := &pool{v: 0.3}
	h := newExtHarness(t, Config{Signals: []SignalConfig{poolSignal(OnErrorCritical)}}, map[string]Probe{"pg_pool": p})
	for range 20 {
		if s := h.tick(); s.Factor != 1 || s.Level != LevelHealthy || !s.Signals[0].Counts {
			t.Fatalf("healthy pool: factor %v level %v signal %+v", s.Factor, s.Level, s.Signals[0])
		}
	}
	p.v = 0.95
	var first time.Duration
	start := h.now
	for range 30 {
		s := h.tick()
		if s.Factor < 1 && first == 0 {
			first = h.now.Sub(start)
		}
	}
	interval := h.c.signals[0].cfg.Interval
	if first == 0 || first > 2*interval {
		t.Fatalf("factor fell %v after the step, want within two sampling intervals (%v)", first, 2*interval)
	}
	if s := h.c.Status(); s.Factor != h.c.cfg.Floor || s.Level != LevelFloor || math.Abs(s.Signals[0].Value-0.95) > 0.01 {
		t.Fatalf("after 30s at 95%%: factor %v level %v value %v; want the floor", s.Factor, s.Level, s.Signals[0].Value)
	}
	p.v = 0.3
	var back time.Duration
	start = h.now
	for range 120 {
		if s := h.tick(); s.Factor == 1 && back == 0 {
			back = h.now.Sub(start)
		}
	}
	// Relief is seen within one signal interval plus the smoothing, then
	// recovery_delay (5s) and recovery_time (60s).
	if back == 0 || back > 75*time.Second {
		t.Fatalf("factor back to 1 after %v, want within 75s", back)
	}
	if h.c.Level() != LevelHealthy {
		t.Fatalf("level %v after recovery", h.c.Level())
	}
}

func TestExternalRampLevelsInOrder(t *testing.T) {
	// The gauge ramps from 0 to 1.2 over 120s: the factor holds until the
	// smoothed reading crosses warn, then only falls; the levels only
	// worsen, each change logged once, naming the signal and its value.
	p := &pool{}
	sc := poolSignal(OnErrorCritical)
	sc.Interval = time.Second
	h := newExtHarness(t, Config{Signals: []SignalConfig{sc}}, map[string]Probe{"pg_pool": p})
	var levels []Level
	prev := 1.0
	for i := range 120 {
		p.v = 1.2 * float64(i) / 120
		s := h.tick()
		if s.Factor > prev || (s.Signals[0].Value < 0.7 && s.Factor != 1) {
			t.Fatalf("sample %d (pool %.3f): factor %.3f after %.3f", i, s.Signals[0].Value, s.Factor, prev)
		}
		prev = s.Factor
		if len(levels) == 0 || levels[len(levels)-1] != s.Level {
			levels = append(levels, s.Level)
		}
	}
	if levels[0] != LevelHealthy || levels[1] != LevelWarn || levels[len(levels)-1] != LevelFloor {
		t.Fatalf("levels %v, want healthy, warn, …, floor", levels)
	}
	for i := 1; i < len(levels); i++ {
		if levels[i] < levels[i-1] {
			t.Fatalf("levels %v went back during a ramp up", levels)
		}
	}
	entries := h.logs.FilterMessage("adaptive: level changed").All()
	if len(entries) != len(levels)-1 {
		t.Fatalf("%d level-change lines, want %d", len(entries), len(levels)-1)
	}
	f := entries[0].ContextMap()
	sigs, _ := f["signals"].(map[string]any)
	if v, ok := sigs["pg_pool"].(float64); !ok || v < 0.7 || v > 0.8 || f["worst"] != "pg_pool" || f["to"] != "warn" {
		t.Errorf("first level change: %v; want to warn, worst pg_pool, signals.pg_pool just above 0.7", f)
	}
}

func TestExternalNoiseDoesNotFlap(t *testing.T) {
	// Steady noisy readings the factor does not influence, read every
	// second: as for the built-in signals, the level changes at most as
	// often as it may, and the factor never goes back up.
	for _, tc := range []struct {
		name      string
		mean, std float64
		maxLevels int
	}{
		{"around warn", 0.70, 0.04, 2},
		{"around critical", 0.90, 0.04, 3},
		{"just under warn", 0.66, 0.02, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pool{}
			sc := poolSignal(OnErrorCritical)
			sc.Interval = time.Second
			h := newExtHarness(t, Config{Signals: []SignalConfig{sc}}, map[string]Probe{"pg_pool": p})
			r := rand.New(rand.NewPCG(7, 11))
			prev, changes, level := 1.0, 0, LevelHealthy
			for i := range 600 {
				p.v = tc.mean + tc.std*r.NormFloat64()
				s := h.tick()
				if s.Factor > prev {
					t.Fatalf("sample %d: factor rose from %.3f to %.3f on steady input", i, prev, s.Factor)
				}
				prev = s.Factor
				if s.Level != level {
					changes++
					level = s.Level
				}
			}
			t.Logf("%d level changes, final factor %.3f, level %v", changes, prev, level)
			if changes > tc.maxLevels {
				t.Errorf("%d level changes over 600 samples, want ≤ %d", changes, tc.maxLevels)
			}
		})
	}
}

func TestExternalClosedLoopSettles(t *testing.T) {
	// The pool's usage follows the admitted load (demand × factor) with
	// noise, read every 2s: the factor settles and stays put, the pool
	// just under warn.
	for _, demand := range []float64{0.9, 1.5, 3} {
		p := &pool{}
		sc := poolSignal(OnErrorCritical)
		sc.Interval = 2 * time.Second
		h := newExtHarness(t, Config{Signals: []SignalConfig{sc}}, map[string]Probe{"pg_pool": p})
		r := rand.New(rand.NewPCG(uint64(demand*10), 5))
		var factors, values []float64
		for range 600 {
			p.v = demand*h.c.Factor() + 0.02*r.NormFloat64()
			s := h.tick()
			factors = append(factors, s.Factor)
			values = append(values, s.Signals[0].Value)
		}
		lo, hi := slicesMinMax(factors[300:])
		vlo, vhi := slicesMinMax(values[300:])
		t.Logf("demand %v: last 300s factor [%.3f, %.3f], smoothed pool [%.3f, %.3f]", demand, lo, hi, vlo, vhi)
		if hi-lo > 0.02 {
			t.Errorf("demand %v: factor still moving over the last 300s: [%.3f, %.3f]", demand, lo, hi)
		}
		if vhi >= 0.75 || vlo < 0.58 {
			t.Errorf("demand %v: pool over the last 300s in [%.3f, %.3f], want within [0.58, 0.75)", demand, vlo, vhi)
		}
	}
}

func TestExternalUnreadable(t *testing.T) {
	for _, tc := range []struct {
		policy     OnError
		wantFactor func(f float64) bool
		wantLevel  Level
		counts     bool
	}{
		// ignore: the only signal drops out, and the limits recover.
		{OnErrorIgnore, func(f float64) bool { return f == 1 }, LevelHealthy, false},
		// critical: an exporter that cannot answer throttles to the floor.
		{OnErrorCritical, func(f float64) bool { return f == 0.1 }, LevelFloor, true},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			p := &pool{v: 0.8} // warn: the factor is falling
			sc := poolSignal(tc.policy)
			sc.Interval = time.Second
			h := newExtHarness(t, Config{Signals: []SignalConfig{sc}}, map[string]Probe{"pg_pool": p})
			for range 5 {
				h.tick()
			}
			if f := h.c.Factor(); f >= 1 {
				t.Fatalf("factor %v at warn", f)
			}
			p.err = errors.New("connection refused")
			var s Status
			for i := range 90 {
				s = h.tick()
				sig := s.Signals[0]
				if i < 4 && sig.Err == nil && sig.Measured {
					// Two intervals and a timeout (4s) after the last
					// good reading: it stands, a single failure is no
					// streak.
					continue
				}
				if sig.Err == nil || sig.Measured || sig.Counts != tc.counts || (tc.counts && sig.Pressure != 1) {
					t.Fatalf("tick %d: unreadable signal reported as %+v", i, sig)
				}
			}
			if !tc.wantFactor(s.Factor) || s.Level != tc.wantLevel {
				t.Errorf("after 90s unreadable: factor %v level %v, want level %v", s.Factor, s.Level, tc.wantLevel)
			}
			if n := h.logs.FilterMessage("adaptive: signal unreadable").Len(); n != 1 {
				t.Errorf("logged the failure %d times, want once per streak", n)
			}
			if n := h.c.signals[0].errors.Load(); n != 90 {
				t.Errorf("counted %d failed reads, want 90", n)
			}
			p.err = nil
			h.tick()
			p.err = errors.New("again")
			for range 5 { // past the grace of one interval and a timeout
				h.tick()
			}
			if n := h.logs.FilterMessage("adaptive: signal unreadable").Len(); n != 2 {
				t.Errorf("a second streak logged %d failures in all, want 2", n)
			}
			if n := h.logs.FilterMessage("adaptive: signal readable again").Len(); n != 1 {
				t.Errorf("logged the recovery %d times, want once", n)
			}
		})
	}
}

func TestExternalStaleReading(t *testing.T) {
	// A reading that stops coming (a probe stuck beyond its timeout, a
	// dead goroutine) is unreadable once older than two intervals and a
	// timeout, never the last good value forever.
	p := &pool{v: 0.3}
	h := newExtHarness(t, Config{Signals: []SignalConfig{poolSignal(OnErrorCritical)}}, map[string]Probe{"pg_pool": p})
	h.tick()
	x := h.c.signals[0]
	h.polled[x] = h.now.Add(time.Hour) // no more polls
	var at time.Duration
	for i := range 20 {
		if s := h.tick(); s.Signals[0].Err != nil {
			at = time.Duration(i+1) * time.Second
			if !strings.Contains(s.Signals[0].Err.Error(), "no reading since") || s.Signals[0].Pressure != 1 {
				t.Fatalf("stale: %+v", s.Signals[0])
			}
			break
		}
	}
	if want := 2*x.cfg.Interval + x.cfg.Timeout + time.Second; at != want {
		t.Errorf("stale after %v, want %v", at, want)
	}
}

func TestExternalNotReadYet(t *testing.T) {
	// Before the first read the signal is neither healthy nor failing.
	h := newExtHarness(t, Config{Signals: []SignalConfig{poolSignal(OnErrorCritical)}}, nil)
	s := h.c.Sample(h.now)
	if sig := s.Signals[0]; sig.Measured || sig.Counts || sig.Err != nil || s.Factor != 1 {
		t.Fatalf("before any read: %+v, factor %v", sig, s.Factor)
	}
}

func TestWorstSignalWins(t *testing.T) {
	// Two external signals and CPU: the worst one sets the level, and is
	// named in the log line.
	healthy, bad := &pool{v: 0.1}, &pool{v: 50}
	cfg := Config{Signals: []SignalConfig{
		poolSignal(OnErrorIgnore),
		{Name: "queue", Warn: 10, Critical: 40, OnError: OnErrorIgnore, HTTP: &HTTPSignal{URL: "http://worker/health", Field: "queue.depth"}},
	}}
	h := newExtHarness(t, cfg, map[string]Probe{"pg_pool": healthy, "queue": bad})
	h.tick()
	s := h.tick()
	if s.Level != LevelCritical || s.Signals[1].Pressure < 1 || s.Signals[0].Pressure >= 0 {
		t.Fatalf("level %v, signals %+v", s.Level, s.Signals)
	}
	e := h.logs.FilterMessage("adaptive: level changed").All()
	if len(e) != 1 || e[0].ContextMap()["worst"] != "queue" {
		t.Fatalf("level-change lines %v, want one naming queue as the worst", e)
	}
}

func TestResponseHeaderSignal(t *testing.T) {
	cfg := Config{MinRequests: 10, LatencyWindow: 10 * time.Second, Signals: []SignalConfig{
		{Name: "upstream_queue", ResponseHeader: "x-queue-depth", Warn: 10, Critical: 20, OnError: OnErrorCritical},
	}}
	h := newExtHarness(t, cfg, nil)
	if !h.c.ReadsHeaders() || h.c.CountsInFlight() {
		t.Fatal("ReadsHeaders false or CountsInFlight true")
	}
	respond := func(n int, value string) {
		for range n {
			h.c.Record(10*time.Millisecond, 200)
			hdr := http.Header{}
			if value != "" {
				hdr.Set("X-Queue-Depth", value)
			}
			h.c.RecordHeaders(hdr)
		}
	}
	h.tick()
	respond(5, "30")
	if s := h.tick(); s.Signals[0].Counts {
		t.Fatalf("5 values counted with min_requests 10: %+v", s.Signals[0])
	}
	respond(5, "10")
	respond(20, "") // responses without the header do not count
	respond(3, "lots")
	s := h.tick()
	if sig := s.Signals[0]; !sig.Counts || sig.Value != 20 || sig.Pressure != 1 {
		t.Fatalf("average of 5×30 and 5×10: %+v, want 20 at critical", sig)
	}
	if n := h.c.signals[0].errors.Load(); n != 3 {
		t.Errorf("%d bad header values counted, want 3", n)
	}
	// The values age out with the latency window; then a window of
	// responses without a number in the header is unreadable.
	for range 12 {
		respond(1, "")
		s = h.tick()
	}
	if sig := s.Signals[0]; sig.Err == nil || !strings.Contains(sig.Err.Error(), "X-Queue-Depth") || sig.Pressure != 1 {
		t.Fatalf("a window without the header: %+v, want unreadable (critical)", sig)
	}
}

func TestInFlightSignal(t *testing.T) {
	cfg := Config{Smoothing: time.Nanosecond, Signals: []SignalConfig{{Name: "concurrency", InFlight: 200, Warn: 50, Critical: 90}}}
	h := newExtHarness(t, cfg, nil)
	if !h.c.CountsInFlight() || h.c.ReadsHeaders() {
		t.Fatal("CountsInFlight false or ReadsHeaders true")
	}
	for range 190 {
		h.c.Begin()
	}
	for range 10 {
		h.c.Done()
	}
	s := h.tick()
	if sig := s.Signals[0]; sig.Value != 90 || sig.Pressure != 1 || s.Level != LevelCritical {
		t.Fatalf("180 of 200 in flight: %+v level %v, want 90%% critical", sig, s.Level)
	}
	// A new controller (a changed config) counts the requests still in
	// flight through the old one.
	c2, err := New(cfg, Options{Inherit: h.c, CPU: SourceFunc(func(time.Time) (float64, error) { return 0, nil })})
	if err != nil {
		t.Fatal(err)
	}
	h.c.Done()
	if s := c2.Sample(h.now.Add(time.Second)); s.Signals[0].Value != 89.5 {
		t.Fatalf("inherited in-flight: %v%%, want 89.5%%", s.Signals[0].Value)
	}
	var nilc *Controller
	nilc.Begin()
	nilc.Done()
	nilc.RecordHeaders(nil)
	if nilc.CountsInFlight() || nilc.ReadsHeaders() {
		t.Fatal("nil controller asks for in-flight counts or headers")
	}
}

func TestInheritKeepsSmoothedSignal(t *testing.T) {
	p := &pool{v: 0.95}
	cfg := Config{Signals: []SignalConfig{poolSignal(OnErrorCritical)}}
	h := newExtHarness(t, cfg, map[string]Probe{"pg_pool": p})
	for range 10 {
		h.tick()
	}
	c2, err := New(cfg, Options{Inherit: h.c, Probes: map[string]Probe{"pg_pool": p}, CPU: SourceFunc(func(time.Time) (float64, error) { return 0, nil })})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c2.signals[0].avg.v, h.c.signals[0].avg.v; got != want || len(c2.Status().Signals) != 0 {
		t.Fatalf("inherited average %v (want %v), status signals %v", got, want, c2.Status().Signals)
	}
}

func TestProbesRunAndStop(t *testing.T) {
	// With real goroutines: Start reads each remote signal at once and
	// every interval, with the signal's timeout; Stop waits for them.
	// reads says, of each read, whether its context had a deadline within
	// the timeout; a read finds it full when the test is starved, and
	// must not block then (Stop waits for the probe).
	reads := make(chan bool, 100)
	var stopped, readAfterStop atomic.Bool
	sc := poolSignal(OnErrorIgnore)
	sc.Interval, sc.Timeout = 20*time.Millisecond, 10*time.Millisecond
	c, err := New(Config{CPU: Thresholds{Disabled: true}, Signals: []SignalConfig{sc}}, Options{Probes: map[string]Probe{
		"pg_pool": ProbeFunc(func(ctx context.Context) (float64, error) {
			if stopped.Load() {
				readAfterStop.Store(true)
			}
			d, ok := ctx.Deadline()
			select {
			case reads <- ok && time.Until(d) <= 10*time.Millisecond:
			default:
			}
			return 0.5, nil
		}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	defer c.Stop()
	for range 3 {
		select {
		case ok := <-reads:
			if !ok {
				t.Error("the probe's context has no deadline within the timeout")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the probe was not read within 20 s")
		}
	}
	c.Stop()
	stopped.Store(true)
	// The one sleep, five intervals: nothing may read after Stop.
	time.Sleep(5 * sc.Interval)
	if readAfterStop.Load() {
		t.Error("the probe was read after Stop")
	}
}

func TestSignalLogFieldShowsUnreadable(t *testing.T) {
	enc := zapcore.NewMapObjectEncoder()
	signalsField{{Name: "a", Signal: Signal{Value: 0.12345, Measured: true}}, {Name: "b", Err: errors.New("x")}, {Name: "c"}}.MarshalLogObject(enc)
	if len(enc.Fields) != 2 || enc.Fields["a"] != 0.123 || enc.Fields["b"] != "unreadable" {
		t.Fatalf("fields %v", enc.Fields)
	}
}

// TestHeaderSignalRefusesNegative: a response with a negative number is
// no reading; it does not mask a critical upstream for the whole window.
func TestHeaderSignalRefusesNegative(t *testing.T) {
	cfg := Config{MinRequests: 10, LatencyWindow: 10 * time.Second, Signals: []SignalConfig{
		{Name: "q", ResponseHeader: "x-queue-depth", Warn: 10, Critical: 20, OnError: OnErrorCritical},
	}}
	h := newExtHarness(t, cfg, nil)
	h.tick()
	for i := range 100 {
		h.c.Record(time.Millisecond, 200)
		v := "25" // critical
		if i == 0 {
			v = "-1e9"
		}
		h.c.RecordHeaders(http.Header{"X-Queue-Depth": {v}})
	}
	var s Status
	for range 5 {
		s = h.tick()
	}
	t.Logf("signal %+v factor %v level %v", s.Signals[0], s.Factor, s.Level)
	if s.Factor == 1 {
		t.Errorf("99 of 100 responses critical, one says -1e9: factor %v (healthy)", s.Factor)
	}
}

// TestHeaderSignalRefusesHuge: absurdly large values (of either sign) are
// no readings: the window's sum stays a number, and a NaN never freezes
// the factor while another signal (CPU) is critical.
func TestHeaderSignalRefusesHuge(t *testing.T) {
	cfg := Config{MinRequests: 2, LatencyWindow: 10 * time.Second, Signals: []SignalConfig{
		{Name: "q", ResponseHeader: "x-queue-depth", Warn: 10, Critical: 20, OnError: OnErrorIgnore},
	}}
	h := newHarness(t, cfg, Options{})
	h.step(20)
	rec := func(v string) {
		h.c.Record(time.Millisecond, 200)
		h.c.RecordHeaders(http.Header{"X-Queue-Depth": {v}})
	}
	rec("1.7e308")
	rec("1.7e308")
	h.step(20)
	rec("-1.7e308")
	rec("-1.7e308")
	var s Status
	for range 8 {
		s = h.step(99) // CPU critical
		t.Logf("cpu %v sig %v factor %v", s.CPU.Pressure, s.Signals[0].Value, s.Factor)
	}
	t.Logf("signal %+v factor %v level %v", s.Signals[0], s.Factor, s.Level)
	if s.Factor > 0.3 {
		t.Errorf("CPU critical for 8s: factor %v (NaN from a header froze it)", s.Factor)
	}
}

// TestOneFailedReadIsNoStreak: one failed read of a 5s remote signal
// with on_error critical does not throw the factor down: the last good
// reading stands until the failures last longer than an interval and a
// timeout.
func TestOneFailedReadIsNoStreak(t *testing.T) {
	p := &pool{v: 0.3}
	h := newExtHarness(t, Config{Signals: []SignalConfig{poolSignal(OnErrorCritical)}}, map[string]Probe{"pg_pool": p})
	for range 10 {
		h.tick()
	}
	p.err = errors.New("timeout")
	h.tick()
	p.err = nil
	lo := 1.0
	for range 30 {
		s := h.tick()
		lo = math.Min(lo, s.Factor)
	}
	s := h.tick()
	t.Logf("min factor %v, factor 30s later %v", lo, s.Factor)
	if lo < 0.5 {
		t.Errorf("a single failed scrape of a healthy (30%%) pool took the factor to %v", lo)
	}
}

// TestNegativeRatioIsUnreadable: a negative divisor (a −1 "unknown" gauge)
// makes the ratio unreadable, never a healthy reading.
func TestNegativeRatioIsUnreadable(t *testing.T) {
	pp, err := newPrometheusProbe(nil, &PrometheusSignal{URL: "http://x/metrics", Metric: "in_use", DivideBy: "size"})
	if err != nil {
		t.Fatal(err)
	}
	v, err := pp.eval([]byte("# TYPE in_use gauge\nin_use 95\n# TYPE size gauge\nsize -1\n"))
	t.Logf("v=%v err=%v", v, err)
	if err == nil {
		t.Errorf("ratio of 95 in use to a size of -1 read as %v, want an error", v)
	}
}
