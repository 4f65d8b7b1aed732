package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// External signals (SignalConfig) at run time.
//
// A Prometheus or HTTP signal is read by a goroutine of its own, every
// SignalConfig.Interval, which stores its latest reading (value or error,
// and when); the sampler takes the latest reading at each sample, so a slow
// exporter delays nothing but its own signal, and a reading that stops
// coming is noticed (it goes stale). A response-header signal is fed by the
// request path into the latency window's slots (RecordHeaders), an in-flight
// signal by Begin and Done; both are read by the sampler itself.
//
// From the reading on, every external signal is treated as the built-in
// ones: smoothed (except the response header, already a window average),
// placed on its thresholds as a pressure, and the worst pressure wins. An
// unreadable signal follows its OnError policy: dropped from the decision,
// or counted at pressure 1 (critical), never read as a healthy value.

// signal is one external signal.
type signal struct {
	cfg   SignalConfig // defaults applied
	kind  string
	probe Probe  // prometheus, http
	hdr   string // response_header: canonical header name
	slot  int    // response_header: index of its accumulator in the window's slots

	latest atomic.Pointer[reading] // prometheus, http: the latest reading
	good   atomic.Pointer[reading] // prometheus, http: the latest successful reading
	errors atomic.Uint64           // failed reads (and bad header values)

	// Sampler state, guarded by Controller.sampleMu.
	avg        ewma
	unreadable bool // in a streak of unreadable samples (logged once)
}

// reading is one read of a remote signal.
type reading struct {
	v   float64
	err error
	at  time.Time // when the read ended
}

// SignalStatus is an external signal's state at a sample.
type SignalStatus struct {
	Name string
	// Signal is the reading, in the signal's unit (smoothed, or averaged
	// over the latency window for a response header). An unreadable signal
	// is not Measured; with OnError critical it Counts, at Pressure 1.
	Signal
	// Err says why the signal could not be read at this sample; nil when
	// it was read, or has not been read yet.
	Err error
}

// newSignals builds the external signals of cfg (defaults applied), and
// the HTTP client it made for them, if any (nil when opts gives one).
func newSignals(cfg Config, opts Options) (_ []*signal, own *http.Client, _ error) {
	if len(cfg.Signals) == 0 {
		return nil, nil, nil
	}
	client := opts.HTTPClient
	out := make([]*signal, 0, len(cfg.Signals))
	headers := 0
	for _, sc := range cfg.Signals {
		x := &signal{cfg: sc, kind: sc.kind()}
		var err error
		switch x.kind {
		case kindPrometheus, kindHTTP:
			if p, ok := opts.Probes[sc.Name]; ok {
				x.probe = p
				break
			}
			if client == nil {
				own = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
				client = own
			}
			if x.kind == kindPrometheus {
				x.probe, err = newPrometheusProbe(client, sc.Prometheus)
			} else {
				x.probe, err = newHTTPProbe(client, sc.HTTP)
			}
		case kindHeader:
			x.hdr = textproto.CanonicalMIMEHeaderKey(sc.ResponseHeader)
			x.slot = headers
			headers++
		}
		if err != nil {
			return nil, nil, fmt.Errorf("adaptive: signal %s: %w", sc.Name, err)
		}
		out = append(out, x)
	}
	return out, own, nil
}

// headerSignals counts the response-header signals of cfg.
func headerSignals(cfg Config) int {
	n := 0
	for _, s := range cfg.Signals {
		if s.kind() == kindHeader {
			n++
		}
	}
	return n
}

// poll reads a remote signal once and stores the reading. Its goroutine
// calls it every SignalConfig.Interval; tests call it with their clock.
func (c *Controller) poll(x *signal) {
	ctx, cancel := context.WithTimeout(c.ctx, x.cfg.Timeout)
	v, err := x.probe.Probe(ctx)
	cancel()
	if c.ctx.Err() != nil {
		return // stopping: not the signal's failure
	}
	if err == nil && (math.IsNaN(v) || math.IsInf(v, 0) || v < 0) {
		// A negative reading is no load (exporters say −1 for unknown):
		// never read as healthy.
		err = fmt.Errorf("not a load (a number ≥ 0): %v", v)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within the timeout (%v): %w", x.cfg.Timeout, err)
		}
		x.errors.Add(1)
	}
	r := &reading{v: v, err: err, at: c.now()}
	x.latest.Store(r)
	if err == nil {
		x.good.Store(r)
	}
}

// maxHeaderValue is the largest number a response_header signal takes from
// a response: far above any threshold, far below what a window's sum can
// hold.
const maxHeaderValue = 1e12

// runProbe polls a remote signal until the controller stops.
func (c *Controller) runProbe(x *signal) {
	t := time.NewTicker(x.cfg.Interval)
	defer t.Stop()
	for {
		c.poll(x)
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readSignal takes an external signal's reading as of now (sampler only).
// ws is the latency window's reading, for the response-header signal's
// count of responses.
func (c *Controller) readSignal(x *signal, now time.Time, dt time.Duration, requests uint64) SignalStatus {
	out := SignalStatus{Name: x.cfg.Name}
	var v float64
	var err error
	switch x.kind {
	case kindPrometheus, kindHTTP:
		r := x.latest.Load()
		switch {
		case r == nil:
			return out // not read yet
		case now.Sub(r.at) > 2*x.cfg.Interval+x.cfg.Timeout:
			err = fmt.Errorf("no reading since %s", r.at.Format(time.RFC3339))
		case r.err != nil:
			// One failed read is not a streak: the last good reading
			// stands until the next read is due and late (two intervals
			// and a timeout old at most), so a read that times out now
			// and then does not throw the factor down.
			if g := x.good.Load(); g != nil && now.Sub(g.at) <= 2*x.cfg.Interval+x.cfg.Timeout {
				v = g.v
				break
			}
			err = r.err
		default:
			v = r.v
		}
	case kindInFlight:
		v = 100 * float64(c.inflight.Load()) / float64(x.cfg.InFlight)
	case kindHeader:
		sum, n := c.win.headerStats(x.slot)
		need := uint64(max(c.cfg.MinRequests, 1))
		switch {
		case n >= need && !math.IsNaN(sum) && !math.IsInf(sum, 0):
			v = sum / float64(n)
		case n >= need:
			err = fmt.Errorf("the values of %s over the latency window do not sum to a number", x.hdr)
		case n == 0 && requests >= need:
			err = fmt.Errorf("none of the %d responses over the latency window carried a number in %s", requests, x.hdr)
		default:
			return out // not enough responses yet
		}
	}
	if err != nil {
		x.avg.ok = false // restart the average from the next good reading
		if !x.unreadable {
			c.log.Warn("adaptive: signal unreadable", zap.String("signal", x.cfg.Name),
				zap.String("on_error", string(x.cfg.OnError)), zap.Error(err))
			x.unreadable = true
		}
		out.Err = err
		if x.cfg.OnError == OnErrorCritical {
			out.Counts, out.Pressure = true, 1
		}
		return out
	}
	if x.unreadable {
		c.log.Info("adaptive: signal readable again", zap.String("signal", x.cfg.Name))
		x.unreadable = false
	}
	if x.kind != kindHeader {
		v = x.avg.update(v, dt, x.cfg.Smoothing)
	}
	out.Signal = Signal{Value: v, Measured: true, Counts: true, Pressure: pressure(v, x.cfg.Warn, x.cfg.Critical)}
	return out
}

// relief is the pressure of an external signal inflated by the hysteresis
// margin h: see Sample. An unreadable signal counted as critical gives no
// relief.
func (x *signal) relief(s *SignalStatus, h float64) float64 {
	if s.Err != nil {
		return 1
	}
	return pressure(s.Value*h, x.cfg.Warn, x.cfg.Critical)
}

// Begin counts a request passed to the upstream as in flight, for the
// in-flight signals; Done ends it. Call them only when CountsInFlight.
// They are the hot path: one atomic add each.
func (c *Controller) Begin() {
	if c != nil {
		c.inflight.Add(1)
	}
}

// Done ends a request counted by Begin.
func (c *Controller) Done() {
	if c != nil {
		c.inflight.Add(-1)
	}
}

// CountsInFlight reports whether an in-flight signal is configured: whether
// the request path must call Begin and Done.
func (c *Controller) CountsInFlight() bool {
	if c == nil {
		return false
	}
	for _, x := range c.signals {
		if x.kind == kindInFlight {
			return true
		}
	}
	return false
}

// ReadsHeaders reports whether a response-header signal is configured:
// whether the request path must call RecordHeaders.
func (c *Controller) ReadsHeaders() bool {
	return c != nil && c.win.headers > 0
}

// RecordHeaders reads the response-header signals' numbers from the header
// of a response the handler let through (call it with Record, and only when
// ReadsHeaders). A header absent from h is not counted; one that is not a
// number is counted as a read error.
func (c *Controller) RecordHeaders(h http.Header) {
	if c == nil || c.win.headers == 0 {
		return
	}
	for _, x := range c.signals {
		if x.kind != kindHeader {
			continue
		}
		vs := h[x.hdr]
		if len(vs) == 0 {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(vs[0]), 64)
		// Not a load: not a number, negative (it would mask the others
		// in the average), or absurdly large (it would overflow it).
		if err != nil || math.IsNaN(f) || !(f >= 0 && f <= maxHeaderValue) {
			x.errors.Add(1)
			continue
		}
		c.win.recordHeader(x.slot, f)
	}
}

// signalsField writes the external signals' values into the level-change
// log line: a number per readable signal, "unreadable" otherwise.
type signalsField []SignalStatus

func (f signalsField) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, s := range f {
		switch {
		case s.Err != nil:
			enc.AddString(s.Name, "unreadable")
		case s.Measured:
			enc.AddFloat64(s.Name, round(s.Value, 3))
		}
	}
	return nil
}
