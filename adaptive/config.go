package adaptive

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config configures a Controller. The zero value is valid: every field left
// at zero takes the default given in its comment (see WithDefaults), so a
// Caddy config only names what it changes. Durations are time.Duration
// (nanoseconds in JSON); a Caddy module embedding Config converts from
// caddy.Duration.
type Config struct {
	// Interval is how often the signals are sampled and the factor
	// recomputed. Default 1s. Every rate in the controller (smoothing,
	// backoff, recovery) is expressed per second of wall time, so Interval
	// changes how quickly the controller notices, not how hard it reacts.
	Interval time.Duration `json:"interval,omitempty"`

	// Floor is the lowest factor the controller applies: however bad the
	// signals, limits keep at least this fraction of their capacity.
	// In (0, 1]; default 0.1. A floor of 1 turns adaptation off.
	Floor float64 `json:"floor,omitempty"`

	// CPU thresholds, in percent of the CPU this process may use: the
	// cgroup v2 quota (cpu.max) when one is set, else the host's CPUs.
	// Default warn 70, critical 85.
	CPU Thresholds `json:"cpu,omitzero"`

	// Memory thresholds, in percent: the cgroup v2 working set
	// (memory.current − inactive_file) of memory.max when a limit is set,
	// else the host's used memory. Memory is off unless Warn or Critical is
	// set; the other one then defaults to 80 or 90.
	Memory Thresholds `json:"memory,omitzero"`

	// ErrorRate thresholds, in percent of the requests recorded over
	// LatencyWindow that failed (status ≥ 500, or no response at all, such
	// as an upstream timeout). Default warn 1, critical 5.
	ErrorRate Thresholds `json:"error_rate,omitzero"`

	// Latency thresholds for the p99 latency of the requests recorded over
	// LatencyWindow. Default warn 500ms, critical 2s.
	Latency LatencyThresholds `json:"latency,omitzero"`

	// LatencyWindow is the sliding window over which the p99 latency and the
	// error rate are computed. Default 30s. Each signal takes the healthier
	// of its value over the whole window and over the window's most recent
	// fifth, when that fifth holds MinRequests requests: the whole window
	// gives a steady estimate, and the recent part lets the controller see a
	// recovery at once instead of cutting limits for a whole window after
	// the upstream got better (the p99 of a window stays high until its slow
	// requests age out).
	LatencyWindow time.Duration `json:"latency_window,omitempty"`

	// MinRequests is the number of requests the window must hold before the
	// latency and error-rate signals count at all, so that one slow request
	// on a quiet server does not shrink every limit. Default 100. (The p99 of
	// fewer than 100 requests is their maximum, and one error in 20 requests
	// would already be a 5% error rate.)
	MinRequests int `json:"min_requests,omitempty"`

	// Smoothing is the time constant of the exponential moving average
	// applied to the CPU and memory readings before they are compared with
	// their thresholds. Default 2s. (Latency and error rate are already
	// averaged over LatencyWindow and are not smoothed again.)
	Smoothing time.Duration `json:"smoothing,omitempty"`

	// Hysteresis is how far, as a fraction of the threshold, a signal must
	// fall below a threshold it crossed before the controller counts it as
	// relief: with 0.1, CPU that crossed 70% must fall below 63% before the
	// level returns to healthy and the factor may climb again. Between the
	// two the factor holds: this dead band is where a loaded system settles.
	// In [0, 0.5); default 0.1 (zero means the default: for practically no
	// hysteresis, set a tiny value such as 0.001).
	Hysteresis float64 `json:"hysteresis,omitempty"`

	// Backoff is the multiplicative decrease per second while a signal is
	// at or beyond critical. In (0, 1); default 0.5: limits halve every
	// second a signal stays critical, down to Floor. Between warn and
	// critical the decrease eases off quadratically: with the signal at
	// position p of the band (0 at warn, 1 at critical) the factor is
	// multiplied by Backoff^(p²) per second, so 0.7% per second just above
	// warn, 16% half way, 50% at critical.
	Backoff float64 `json:"backoff,omitempty"`

	// RecoveryDelay is how long every signal must stay below its warn
	// threshold by the Hysteresis margin, without interruption, before the
	// factor starts to rise (and before the level steps down). Default 5s.
	RecoveryDelay time.Duration `json:"recovery_delay,omitempty"`

	// RecoveryTime is how long the factor takes to climb from Floor to 1
	// once it rises: the increase is linear, (1 − Floor)/RecoveryTime per
	// second. Default 60s.
	RecoveryTime time.Duration `json:"recovery_time,omitempty"`

	// SharedMaxAge is how long a factor fetched from the Publisher stays in
	// force when later fetches fail. Default three Intervals.
	SharedMaxAge time.Duration `json:"shared_max_age,omitempty"`

	// Signals are external signals: the health of the dependencies behind
	// the upstream (a database pool from its exporter, a health endpoint),
	// numbers the upstream reports on its responses, and the requests in
	// flight. They count as the built-in signals do. See SignalConfig.
	Signals []SignalConfig `json:"signals,omitempty"`
}

// Thresholds are a signal's warn and critical levels, in the signal's unit.
// Below Warn the signal is healthy. Above it the factor falls, slowly just
// above Warn and faster towards Critical, where it halves every second (see
// Config.Backoff).
type Thresholds struct {
	Warn     float64 `json:"warn,omitempty"`
	Critical float64 `json:"critical,omitempty"`
	// Disabled ignores this signal.
	Disabled bool `json:"disabled,omitempty"`
}

// LatencyThresholds are Thresholds for the p99 latency.
type LatencyThresholds struct {
	Warn     time.Duration `json:"warn,omitempty"`
	Critical time.Duration `json:"critical,omitempty"`
	// Disabled ignores the latency signal.
	Disabled bool `json:"disabled,omitempty"`
}

// The defaults, from seed 002 (Adaptive Throttle) where it gives them.
const (
	DefaultInterval      = time.Second
	DefaultFloor         = 0.1
	DefaultLatencyWindow = 30 * time.Second
	DefaultMinRequests   = 100
	DefaultSmoothing     = 2 * time.Second
	DefaultHysteresis    = 0.1
	DefaultBackoff       = 0.5
	DefaultRecoveryDelay = 5 * time.Second
	DefaultRecoveryTime  = 60 * time.Second
)

// Default thresholds (percent, or a duration for latency).
const (
	defaultCPUWarn, defaultCPUCritical             = 70, 85
	defaultMemoryWarn, defaultMemoryCritical       = 80, 90
	defaultErrorRateWarn, defaultErrorRateCritical = 1, 5
	defaultLatencyWarn, defaultLatencyCritical     = 500 * time.Millisecond, 2 * time.Second
)

// maxSlots bounds the latency window's ring of time slots (memory and the
// cost of a sample): the slot width grows with LatencyWindow beyond it.
const maxSlots = 60

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Floor == 0 {
		c.Floor = DefaultFloor
	}
	c.CPU = c.CPU.withDefaults(defaultCPUWarn, defaultCPUCritical)
	if c.Memory.Warn != 0 || c.Memory.Critical != 0 {
		c.Memory = c.Memory.withDefaults(defaultMemoryWarn, defaultMemoryCritical)
	}
	c.ErrorRate = c.ErrorRate.withDefaults(defaultErrorRateWarn, defaultErrorRateCritical)
	if c.Latency.Warn == 0 {
		c.Latency.Warn = defaultLatencyWarn
	}
	if c.Latency.Critical == 0 {
		c.Latency.Critical = defaultLatencyCritical
	}
	if c.LatencyWindow == 0 {
		c.LatencyWindow = DefaultLatencyWindow
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultMinRequests
	}
	if c.Smoothing == 0 {
		c.Smoothing = DefaultSmoothing
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = DefaultHysteresis
	}
	if c.Backoff == 0 {
		c.Backoff = DefaultBackoff
	}
	if c.RecoveryDelay == 0 {
		c.RecoveryDelay = DefaultRecoveryDelay
	}
	if c.RecoveryTime == 0 {
		c.RecoveryTime = DefaultRecoveryTime
	}
	if c.SharedMaxAge == 0 {
		c.SharedMaxAge = 3 * c.Interval
	}
	if len(c.Signals) > 0 {
		signals := make([]SignalConfig, len(c.Signals))
		for i, s := range c.Signals {
			signals[i] = s.withDefaults(c.Smoothing)
		}
		c.Signals = signals
	}
	return c
}

func (t Thresholds) withDefaults(warn, critical float64) Thresholds {
	if t.Warn == 0 {
		t.Warn = warn
	}
	if t.Critical == 0 {
		t.Critical = critical
	}
	return t
}

// memoryEnabled reports whether the memory signal is on, in a config with
// defaults applied.
func (c Config) memoryEnabled() bool {
	return !c.Memory.Disabled && c.Memory.Warn != 0
}

// Validate reports the first problem with c after defaults are applied, so
// a zero Config is valid. The error names the JSON field at fault.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Interval < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("interval %v is too short (minimum 10ms)", c.Interval))
	}
	if !(c.Floor > 0 && c.Floor <= 1) { // written so that NaN fails
		errs = append(errs, fmt.Errorf("floor %v must be in (0, 1]", c.Floor))
	}
	if !(c.Backoff > 0 && c.Backoff < 1) {
		errs = append(errs, fmt.Errorf("backoff %v must be in (0, 1)", c.Backoff))
	}
	if !(c.Hysteresis >= 0 && c.Hysteresis < 0.5) {
		errs = append(errs, fmt.Errorf("hysteresis %v must be in [0, 0.5)", c.Hysteresis))
	}
	if err := c.CPU.validate("cpu", 100); err != nil {
		errs = append(errs, err)
	}
	if c.memoryEnabled() {
		if err := c.Memory.validate("memory", 100); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.ErrorRate.validate("error_rate", 100); err != nil {
		errs = append(errs, err)
	}
	if !c.Latency.Disabled {
		if c.Latency.Warn <= 0 || c.Latency.Critical <= 0 {
			errs = append(errs, fmt.Errorf("latency: thresholds must be positive (warn %v, critical %v)", c.Latency.Warn, c.Latency.Critical))
		} else if c.Latency.Warn >= c.Latency.Critical {
			errs = append(errs, fmt.Errorf("latency: warn (%v) must be below critical (%v)", c.Latency.Warn, c.Latency.Critical))
		}
	}
	if c.LatencyWindow < c.Interval {
		errs = append(errs, fmt.Errorf("latency_window %v must be at least one interval (%v)", c.LatencyWindow, c.Interval))
	}
	if c.MinRequests < 0 {
		errs = append(errs, fmt.Errorf("min_requests %d must not be negative", c.MinRequests))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"smoothing", c.Smoothing},
		{"recovery_delay", c.RecoveryDelay},
		{"recovery_time", c.RecoveryTime},
		{"shared_max_age", c.SharedMaxAge},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v must not be negative", d.name, d.v))
		}
	}
	errs = append(errs, validateSignals(c.Signals)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("adaptive: invalid config: %w", err)
	}
	return nil
}

func (t Thresholds) validate(name string, max float64) error {
	if t.Disabled {
		return nil
	}
	switch {
	case math.IsNaN(t.Warn) || math.IsNaN(t.Critical):
		return fmt.Errorf("%s: thresholds must be numbers", name)
	case t.Warn <= 0 || t.Critical <= 0:
		return fmt.Errorf("%s: thresholds must be positive (warn %v, critical %v)", name, t.Warn, t.Critical)
	case t.Warn >= t.Critical:
		return fmt.Errorf("%s: warn (%v) must be below critical (%v)", name, t.Warn, t.Critical)
	case t.Critical > max:
		return fmt.Errorf("%s: critical (%v) is a percentage and must be at most %v", name, t.Critical, max)
	}
	return nil
}
