// Package adaptive turns the health of the system into a factor in
// [Floor, 1] that scales rate limits: when the machine or the upstream is
// struggling, every limit that opts in shrinks, and it grows back when
// health returns. It is Cascade's version of the "adaptive throttle" of
// seed 002, made container-aware, stable under noise and observable.
//
// The package knows nothing of requests' identities or of Caddy. One
// Controller serves a whole process:
//
//	c, err := adaptive.New(cfg, adaptive.Options{Logger: log})
//	c.Register(registry)           // Prometheus gauges, cascade_adaptive_*
//	c.Start()                      // samples every cfg.Interval
//	defer c.Stop()
//
//	// request path, for each request let through to the upstream:
//	limit := base * c.FactorFor(priority)
//	if c.CountsInFlight() { c.Begin(); defer c.Done() }  // an in_flight signal
//	...
//	c.Record(latency, status)
//	if c.ReadsHeaders() { c.RecordHeaders(resp.Header) } // a response_header signal
//
// # Signals
//
// Every Interval (1s) a background goroutine samples:
//
//   - CPU utilisation relative to what the process may use: the cgroup v2
//     quota (cpu.max over cpu.stat's usage_usec) when the process's group or
//     an ancestor sets one, else the host's CPUs (from /proc/stat through
//     gopsutil, as a delta between samples: no sleeping).
//   - Memory, if configured: the cgroup's working set against memory.max,
//     else the host's used memory.
//   - The p99 latency and the error rate (5xx, or no response at all) of the
//     requests the handler let through, over a sliding window (30s). Record
//     feeds them on the request path at the cost of two atomic adds: each
//     time slot of the window is a log-linear histogram of atomic counters,
//     and the sampler sums the slots and interpolates the p99.
//
// Beside these, Config.Signals adds external signals (SignalConfig): the
// health of the dependencies that drown first, behind the upstream.
//
//   - A Prometheus gauge, or the ratio of two (pool in use ÷ pool size),
//     from an exporter's text exposition, parsed by
//     github.com/prometheus/common/expfmt.
//   - A number at a dotted path of a JSON document (a health endpoint).
//   - A number the upstream reports in a response header, averaged over the
//     latency window (fed by RecordHeaders).
//   - The requests in flight through the handlers, against a maximum (fed
//     by Begin and Done).
//
// The first two are read by a goroutine per signal, each at its own
// interval and with its own timeout, so a slow exporter delays nothing but
// its own reading; the sampler takes the latest reading, and one that
// stops coming goes stale. A signal that cannot be read follows its
// declared policy: it drops out of the decision ("ignore") or counts as
// critical ("critical"); never is a failed read taken for a healthy value.
// The first failure of a streak is logged, every one is counted.
//
// CPU and memory are smoothed (an exponential moving average, 2s), latency
// and errors are already averaged by their window; external gauges and the
// in-flight count are smoothed as CPU is, a response header's number is a
// window average. Each signal is then placed on its thresholds as a
// pressure p = (v − warn)/(critical − warn): below 0 it is healthy, from 0
// to 1 it is in the warn band, at 1 and beyond it is critical. The worst
// signal wins, external or not, and everything below (smoothing aside)
// treats them all alike.
//
// # The controller: AIMD with a dead band
//
// The factor follows additive-increase / multiplicative-decrease, the rule
// that keeps TCP stable, with a dead band between the two:
//
//	worst pressure p ≥ 1    f ← f · Backoff^dt            halve every second
//	0 ≤ p < 1               f ← f · Backoff^(p²·dt)        ease off near warn
//	dead band               f unchanged                    settle here
//	clear relief ≥ delay    f ← f + (1−Floor)·dt/RecoveryTime
//
// with dt in seconds and f kept in [Floor, 1]. Clear relief means that every
// signal would still be below its warn threshold if it were inflated by the
// Hysteresis margin (CPU under 63% for a 70% warn), and that this has held
// without interruption for RecoveryDelay (5s). Between warn·(1−Hysteresis)
// and warn lies the dead band.
//
// Why this shape:
//
//   - Decrease is integral, not a fixed map from health to factor. The
//     effect of a factor on load is unknown and nonlinear: scaling limits
//     that nobody reaches sheds nothing. A map such as seed 002's ("CPU 77%
//     → 0.75") can sit at a factor that does not bite while CPU stays at 77%
//     forever; an integral controller keeps tightening until the signal
//     falls below warn, whatever the traffic mix. The rate grows with the
//     square of the pressure, so a signal just over warn nudges the factor
//     (0.7%/s) while one near critical cuts hard (50%/s at critical).
//   - Decrease is fast, increase slow and linear: overload is expensive and
//     recovery probes for capacity. From the floor, the factor is back to 1
//     RecoveryDelay + RecoveryTime after the signals clear (65s by default).
//   - The dead band and the recovery delay prevent flapping. A loaded system
//     whose limits bite settles where its worst signal sits just below warn:
//     there nothing moves, so noise that does not cross warn, or that dips
//     below the band for less than RecoveryDelay, changes nothing. Without
//     the band an AIMD controller saw-tooths around its threshold forever.
//   - Levels (healthy, warn, critical) change up at once and down only after
//     RecoveryDelay of relief below the boundary by the same margin, so the
//     level, which is logged, flaps even less than the factor.
//
// The signals' own lag is the main risk to an integral controller (it keeps
// cutting while a stale signal still says "bad"), which is why CPU is only
// lightly smoothed and why the latency and error signals look at the most
// recent fifth of their window when it has enough requests and is
// healthier. With a load that does not respond at all to the factor (CPU
// burnt by another process), the factor falls to the floor and stays there
// until the signal clears: it cannot tell "not yet enough" from "useless".
// The floor bounds the cost.
//
// # Priorities, the floor and shared factors
//
// FactorFor gives lower priorities less at the same health (batch f²,
// interactive f, critical √f; see Priority). Level reports LevelFloor, and
// AtFloor true, while the effective factor is at Floor, which a handler may
// answer with 503 temporary-reduced-capacity instead of a trickle.
//
// Instances sharing limits through Redis can share one factor through a
// Publisher: each publishes its local factor and applies the minimum of its
// own and the group's fresh factor (see Publisher).
//
// # Visibility
//
// Register exports the factor, the level and every signal as Prometheus
// gauges named cascade_adaptive_*, read from the last sample at scrape time;
// each external signal has cascade_adaptive_signal{name}, its pressure,
// cascade_adaptive_signal_unreadable{name} and
// cascade_adaptive_signal_errors_total{name}. A level change is logged at
// Info with the signals' values and the name of the worst; nothing else is
// logged per sample.
package adaptive
