package adaptive

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	pub := &fakePublisher{shared: 0.8}
	h := newHarness(t, Config{Memory: Thresholds{Warn: 80}, MinRequests: 10, Smoothing: time.Nanosecond}, Options{
		Publisher: pub,
		Memory:    SourceFunc(func(time.Time) (float64, error) { return 40, nil }),
	})
	// Caddy gives each config load a pedantic registry.
	reg := prometheus.NewPedanticRegistry()
	if err := h.c.Register(reg); err != nil {
		t.Fatal(err)
	}
	h.traffic(100, 250*time.Millisecond, 2)
	h.step(77.5)

	want := `
# HELP cascade_adaptive_cpu_utilization_ratio Smoothed CPU utilisation, relative to the cgroup quota when one is set.
# TYPE cascade_adaptive_cpu_utilization_ratio gauge
cascade_adaptive_cpu_utilization_ratio 0.775
# HELP cascade_adaptive_error_ratio Share of the requests recorded over the latency window that failed.
# TYPE cascade_adaptive_error_ratio gauge
cascade_adaptive_error_ratio 0.02
# HELP cascade_adaptive_level Controller level: 0 healthy, 1 warn, 2 critical, 3 floor.
# TYPE cascade_adaptive_level gauge
cascade_adaptive_level 1
# HELP cascade_adaptive_memory_utilization_ratio Smoothed memory utilisation, relative to the cgroup limit when one is set.
# TYPE cascade_adaptive_memory_utilization_ratio gauge
cascade_adaptive_memory_utilization_ratio 0.4
# HELP cascade_adaptive_shared_factor Factor fetched from the publisher; absent when none is fresh.
# TYPE cascade_adaptive_shared_factor gauge
cascade_adaptive_shared_factor 0.8
# HELP cascade_adaptive_window_requests Requests recorded over the latency window.
# TYPE cascade_adaptive_window_requests gauge
cascade_adaptive_window_requests 100
`
	names := []string{
		"cascade_adaptive_cpu_utilization_ratio", "cascade_adaptive_error_ratio", "cascade_adaptive_level",
		"cascade_adaptive_memory_utilization_ratio", "cascade_adaptive_shared_factor",
		"cascade_adaptive_window_requests",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// Factors and latency are not round numbers: check them against Status.
	s := h.c.Status()
	for name, v := range map[string]float64{
		"cascade_adaptive_factor":              s.Factor,
		"cascade_adaptive_local_factor":        s.LocalFactor,
		"cascade_adaptive_latency_p99_seconds": s.LatencyP99.Value,
	} {
		if got := gaugeValue(t, reg, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	pressure := gaugeValues(t, reg, "cascade_adaptive_pressure")
	if len(pressure) != 4 || pressure["cpu"] != 0.5 || pressure["error_rate"] != 0.25 || pressure["memory"] != -4 ||
		pressure["latency_p99"] != s.LatencyP99.Pressure || pressure["latency_p99"] > -0.1 {
		t.Errorf("pressure gauges %v", pressure)
	}
	if s.LocalFactor >= 1 || s.Factor != min(s.LocalFactor, 0.8) {
		t.Errorf("factor %v local %v", s.Factor, s.LocalFactor)
	}
	if p99 := s.LatencyP99.Value; p99 < 0.23 || p99 > 0.27 {
		t.Errorf("p99 %vs, want ~0.25", p99)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 13 {
		t.Errorf("%d metrics, %v; want 13", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, ok := gaugeValues(t, reg, name)[""]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return v
}

// gaugeValues returns a gauge family's values by the value of its first
// label ("" when it has none).
func gaugeValues(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			label := ""
			if len(m.GetLabel()) > 0 {
				label = m.GetLabel()[0].GetValue()
			}
			out[label] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestRegisterAcrossReloads(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	old := newHarness(t, Config{}, Options{})
	if err := old.c.Register(reg); err != nil {
		t.Fatal(err)
	}
	// Same controller, same registry (a reload that reuses the registry).
	if err := old.c.Register(reg); err != nil {
		t.Errorf("registering twice: %v", err)
	}
	// A new controller replaces the old one's gauges.
	cur := newHarness(t, Config{}, Options{})
	for range 3 {
		cur.step(99)
	}
	if err := cur.c.Register(reg); err != nil {
		t.Fatalf("replacing another controller's gauges: %v", err)
	}
	if got := gaugeValue(t, reg, "cascade_adaptive_factor"); got != cur.c.Factor() || got == 1 {
		t.Errorf("factor gauge %v, want the new controller's %v", got, cur.c.Factor())
	}
	// And a controller that outlives a reload joins the next registry too.
	next := prometheus.NewPedanticRegistry()
	if err := cur.c.Register(next); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, next, "cascade_adaptive_factor"); got != cur.c.Factor() {
		t.Errorf("factor gauge in the next registry %v, want %v", got, cur.c.Factor())
	}
	cur.c.Unregister(next)
	if n, _ := testutil.GatherAndCount(next); n != 0 {
		t.Errorf("%d metrics after Unregister", n)
	}
	// A clash with an unrelated collector is an error, with context.
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "cascade_adaptive_factor", Help: "x"}))
	if err := cur.c.Register(clash); err == nil || !strings.HasPrefix(err.Error(), "adaptive: registering metrics") {
		t.Errorf("clash: %v", err)
	}
	if err := cur.c.Register(nil); err != nil {
		t.Errorf("nil registerer: %v", err)
	}
}

func TestSignalMetrics(t *testing.T) {
	// Each external signal has its gauge, its pressure, whether it is
	// unreadable and its count of failed reads.
	pg := poolSignal(OnErrorCritical)
	pg.Warn, pg.Critical, pg.Interval = 0.5, 1, time.Second // exact in binary
	cfg := Config{Smoothing: time.Nanosecond, Signals: []SignalConfig{
		pg,
		{Name: "queue", Warn: 10, Critical: 40, OnError: OnErrorIgnore, Interval: time.Second, HTTP: &HTTPSignal{URL: "http://w/health", Field: "depth"}},
	}}
	h := newExtHarness(t, cfg, map[string]Probe{"pg_pool": &pool{v: 0.75}, "queue": ProbeFunc(func(context.Context) (float64, error) {
		return 0, errors.New("refused")
	})})
	reg := prometheus.NewPedanticRegistry()
	if err := h.c.Register(reg); err != nil {
		t.Fatal(err)
	}
	h.tick()
	h.tick()
	want := `
# HELP cascade_adaptive_pressure Signal pressure: below 0 healthy, 0 at warn, 1 at critical. Absent when the signal does not count.
# TYPE cascade_adaptive_pressure gauge
cascade_adaptive_pressure{signal="pg_pool"} 0.5
# HELP cascade_adaptive_signal External signal's value, in its own unit (smoothed, or averaged over the latency window). Absent while unreadable.
# TYPE cascade_adaptive_signal gauge
cascade_adaptive_signal{name="pg_pool"} 0.75
# HELP cascade_adaptive_signal_errors_total Failed reads of the external signal (and response headers that were not a number).
# TYPE cascade_adaptive_signal_errors_total counter
cascade_adaptive_signal_errors_total{name="pg_pool"} 0
cascade_adaptive_signal_errors_total{name="queue"} 2
# HELP cascade_adaptive_signal_unreadable 1 while the external signal cannot be read (it then follows its on_error policy), else 0.
# TYPE cascade_adaptive_signal_unreadable gauge
cascade_adaptive_signal_unreadable{name="pg_pool"} 0
cascade_adaptive_signal_unreadable{name="queue"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"cascade_adaptive_pressure", "cascade_adaptive_signal", "cascade_adaptive_signal_errors_total", "cascade_adaptive_signal_unreadable"); err != nil {
		t.Error(err)
	}
}
