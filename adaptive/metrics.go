package adaptive

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports a controller's last Status as Prometheus gauges. It
// reads the snapshot at scrape time, so the sampler writes no metrics and a
// scrape always sees one consistent sample.
type collector struct {
	c *Controller

	factor, local, shared, level     *prometheus.Desc
	cpu, memory, latency, errorRatio *prometheus.Desc
	requests, pressure               *prometheus.Desc
	signal, unreadable, errors       *prometheus.Desc
}

func newCollector(c *Controller) *collector {
	const ns = "cascade_adaptive_"
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(ns+name, help, labels, nil)
	}
	return &collector{
		c:          c,
		factor:     d("factor", "Effective factor applied to adaptive limits (interactive priority), in [floor, 1]."),
		local:      d("local_factor", "Factor computed from this instance's own signals."),
		shared:     d("shared_factor", "Factor fetched from the publisher; absent when none is fresh."),
		level:      d("level", "Controller level: 0 healthy, 1 warn, 2 critical, 3 floor."),
		cpu:        d("cpu_utilization_ratio", "Smoothed CPU utilisation, relative to the cgroup quota when one is set."),
		memory:     d("memory_utilization_ratio", "Smoothed memory utilisation, relative to the cgroup limit when one is set."),
		latency:    d("latency_p99_seconds", "p99 latency of the requests recorded over the latency window."),
		errorRatio: d("error_ratio", "Share of the requests recorded over the latency window that failed."),
		requests:   d("window_requests", "Requests recorded over the latency window."),
		pressure:   d("pressure", "Signal pressure: below 0 healthy, 0 at warn, 1 at critical. Absent when the signal does not count.", "signal"),
		signal:     d("signal", "External signal's value, in its own unit (smoothed, or averaged over the latency window). Absent while unreadable.", "name"),
		unreadable: d("signal_unreadable", "1 while the external signal cannot be read (it then follows its on_error policy), else 0.", "name"),
		errors:     d("signal_errors_total", "Failed reads of the external signal (and response headers that were not a number).", "name"),
	}
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.factor, m.local, m.shared, m.level, m.cpu, m.memory, m.latency, m.errorRatio, m.requests, m.pressure, m.signal, m.unreadable, m.errors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	s := m.c.Status()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(m.factor, s.Factor)
	gauge(m.local, s.LocalFactor)
	if s.Shared {
		gauge(m.shared, s.SharedFactor)
	}
	gauge(m.level, float64(s.Level))
	gauge(m.requests, float64(s.Requests))
	for _, sig := range []struct {
		name  string
		d     *prometheus.Desc
		s     Signal
		scale float64
	}{
		{"cpu", m.cpu, s.CPU, 0.01},
		{"memory", m.memory, s.Memory, 0.01},
		{"latency_p99", m.latency, s.LatencyP99, 1},
		{"error_rate", m.errorRatio, s.ErrorRate, 0.01},
	} {
		if !sig.s.Measured {
			continue
		}
		gauge(sig.d, sig.s.Value*sig.scale)
		if sig.s.Counts {
			gauge(m.pressure, sig.s.Pressure, sig.name)
		}
	}
	for i, x := range s.Signals {
		if x.Measured {
			gauge(m.signal, x.Value, x.Name)
		}
		if x.Counts {
			gauge(m.pressure, x.Pressure, x.Name)
		}
		unreadable := 0.0
		if x.Err != nil {
			unreadable = 1
		}
		gauge(m.unreadable, unreadable, x.Name)
		ch <- prometheus.MustNewConstMetric(m.errors, prometheus.CounterValue, float64(m.c.signals[i].errors.Load()), x.Name)
	}
}

// Register registers the controller's gauges (all named cascade_adaptive_*)
// into reg. It is meant to be called at every provisioning: Caddy gives each
// config load a fresh registry, and a controller that outlives reloads must
// appear in each. Registering twice into the same registry is a no-op. If
// reg already holds the gauges of another Controller (an older one that is
// being replaced), they are unregistered in favour of this one's.
func (c *Controller) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(c.collector)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		if err != nil {
			return fmt.Errorf("adaptive: registering metrics: %w", err)
		}
		return nil
	}
	if are.ExistingCollector == c.collector {
		return nil
	}
	reg.Unregister(are.ExistingCollector)
	if err := reg.Register(c.collector); err != nil {
		return fmt.Errorf("adaptive: registering metrics in place of another controller's: %w", err)
	}
	return nil
}

// Unregister removes the controller's gauges from reg.
func (c *Controller) Unregister(reg prometheus.Registerer) {
	if reg != nil {
		reg.Unregister(c.collector)
	}
}
