package adaptive

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// harness drives a Controller with an injected CPU reading and clock. The
// latency and error signals are fed through Record, as in production.
type harness struct {
	t    *testing.T
	c    *Controller
	cpu  float64
	now  time.Time
	logs *observer.ObservedLogs
}

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newHarness(t *testing.T, cfg Config, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, cpu: 20, now: epoch}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	opts.Logger = zap.New(core)
	if opts.CPU == nil {
		opts.CPU = SourceFunc(func(time.Time) (float64, error) { return h.cpu, nil })
	}
	opts.Now = func() time.Time { return h.now }
	c, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

// step advances the clock by one interval with the CPU at cpu and samples.
func (h *harness) step(cpu float64) Status {
	h.cpu = cpu
	h.now = h.now.Add(h.c.cfg.Interval)
	return h.c.Sample(h.now)
}

// traffic records n requests of latency d, of which errs fail.
func (h *harness) traffic(n int, d time.Duration, errs int) {
	for i := range n {
		status := 200
		if i < errs {
			status = 503
		}
		h.c.Record(d, status)
	}
}

// levelLog counts the level changes logged.
func (h *harness) levelLog() int {
	return h.logs.FilterMessage("adaptive: level changed").Len()
}

func TestStepToCriticalDropsFast(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signal func(h *harness, bad bool)
	}{
		{"cpu", func(h *harness, bad bool) {
			h.cpu = 20
			if bad {
				h.cpu = 95
			}
		}},
		{"latency", func(h *harness, bad bool) {
			d := 50 * time.Millisecond
			if bad {
				d = 3 * time.Second
			}
			h.traffic(200, d, 0)
		}},
		{"errors", func(h *harness, bad bool) {
			errs := 0
			if bad {
				errs = 40 // 20%
			}
			h.traffic(200, 50*time.Millisecond, errs)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, Options{})
			for range 10 {
				tc.signal(h, false)
				s := h.step(h.cpu)
				if s.Factor != 1 || s.Level != LevelHealthy {
					t.Fatalf("healthy input: factor %v level %v, want 1 healthy", s.Factor, s.Level)
				}
			}
			var got []float64
			for range 7 {
				tc.signal(h, true)
				got = append(got, h.step(h.cpu).Factor)
			}
			// CPU is smoothed (2s) and errors are diluted by the window: both
			// take a few samples to cross critical. Latency crosses at once.
			if got[3] > 0.5 {
				t.Errorf("factor after 4 critical samples = %.3f, want ≤ 0.5 (factors %.3f)", got[3], got)
			}
			if got[6] != h.c.cfg.Floor {
				t.Errorf("factor after 7 critical samples = %.3f, want the floor (factors %.3f)", got[6], got)
			}
			for i := 1; i < len(got); i++ {
				if got[i] > got[i-1] {
					t.Errorf("factor rose while critical: %.3f", got)
				}
			}
			if !h.c.AtFloor() || h.c.Level() != LevelFloor {
				t.Errorf("AtFloor %v, Level %v; want true, floor", h.c.AtFloor(), h.c.Level())
			}
		})
	}
}

func TestRampLevelsInOrder(t *testing.T) {
	h := newHarness(t, Config{}, Options{})
	prev := 1.0
	var levels []Level
	for i := range 120 {
		cpu := 50 + 50*float64(i)/119 // 50% → 100% over two minutes
		s := h.step(cpu)
		if s.Factor > prev {
			t.Fatalf("sample %d (cpu %.1f): factor rose from %.3f to %.3f during a ramp up", i, cpu, prev, s.Factor)
		}
		if s.CPU.Value < 70 && s.Factor != 1 {
			t.Fatalf("sample %d: factor %.3f before CPU (%.1f) reached warn", i, s.Factor, s.CPU.Value)
		}
		prev = s.Factor
		if len(levels) == 0 || levels[len(levels)-1] != s.Level {
			levels = append(levels, s.Level)
		}
	}
	// The warn band alone walks the factor down as the ramp goes on: it
	// may reach the floor before CPU reaches critical. Levels only worsen.
	if levels[0] != LevelHealthy || levels[1] != LevelWarn || levels[len(levels)-1] != LevelFloor {
		t.Fatalf("levels %v, want healthy, warn, …, floor", levels)
	}
	for i := 1; i < len(levels); i++ {
		if levels[i] < levels[i-1] {
			t.Fatalf("levels %v went back during a ramp up", levels)
		}
	}
	if got := h.levelLog(); got != len(levels)-1 {
		t.Errorf("logged %d level changes, want %d", got, len(levels)-1)
	}
}

func TestWarnBandDecreasesGently(t *testing.T) {
	// Just above warn the factor must fall, slowly; near critical, faster.
	for _, tc := range []struct {
		cpu      float64
		min, max float64 // factor after 10s
	}{
		{71.5, 0.90, 0.99},  // p = 0.1: 0.5^(0.01·10) ≈ 0.93
		{77.5, 0.03, 0.35},  // p = 0.5: 0.5^(0.25·10) ≈ 0.18
		{60, 1, 1},          // healthy
		{66, 1, 1},          // dead band, factor already 1
		{84.9, 0.1, 0.1001}, // nearly critical: floor
	} {
		h := newHarness(t, Config{Smoothing: time.Nanosecond}, Options{})
		var s Status
		for range 10 {
			s = h.step(tc.cpu)
		}
		if s.Factor < tc.min || s.Factor > tc.max {
			t.Errorf("cpu %.1f for 10s: factor %.3f, want in [%.2f, %.2f]", tc.cpu, s.Factor, tc.min, tc.max)
		}
	}
}

func TestNoiseAroundThresholdDoesNotFlap(t *testing.T) {
	// Steady noisy input that the factor does not influence (open loop):
	// the level may change at most twice, and the factor must never go back
	// up, since the signal never clearly clears.
	for _, tc := range []struct {
		name      string
		mean, std float64
		maxLevels int
	}{
		{"around warn", 70, 4, 2},
		{"around critical", 85, 4, 3}, // healthy → warn/critical → floor
		{"just under warn", 66, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, Options{})
			r := rand.New(rand.NewPCG(7, 11))
			prev, changes, level := 1.0, 0, LevelHealthy
			for i := range 600 {
				s := h.step(tc.mean + tc.std*r.NormFloat64())
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
			if got := h.levelLog(); got != changes {
				t.Errorf("logged %d level changes, saw %d", got, changes)
			}
		})
	}
}

func TestLevelHysteresis(t *testing.T) {
	// A square wave with the smoothing off: high for 10s, low for a while,
	// ten times. The level only steps down after RecoveryDelay (5s) below
	// warn·(1 − hysteresis) = 63%.
	for _, tc := range []struct {
		name      string
		high, low float64
		lowFor    int
		want      int
	}{
		{"dips into the dead band", 72, 67, 10, 1},
		{"short dips below it", 72, 60, 4, 1},
		{"long dips below it", 72, 60, 10, 20},
		{"critical, dips into warn", 90, 80, 10, 2}, // healthy → critical → floor
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{Smoothing: time.Nanosecond, Floor: 0.01}, Options{})
			changes, level := 0, LevelHealthy
			for range 10 {
				for i := range 10 + tc.lowFor {
					cpu := tc.high
					if i >= 10 {
						cpu = tc.low
					}
					if s := h.step(cpu); s.Level != level {
						changes++
						level = s.Level
					}
				}
			}
			if changes != tc.want {
				t.Errorf("%d level changes, want %d", changes, tc.want)
			}
		})
	}
}

// TestClosedLoopSettles runs the controller against a plant whose CPU
// follows the admitted load (demand × factor) with noise: the factor must
// settle and then stay put, with CPU just under warn.
func TestClosedLoopSettles(t *testing.T) {
	for _, demand := range []float64{90, 120, 200, 400} {
		h := newHarness(t, Config{}, Options{})
		r := rand.New(rand.NewPCG(uint64(demand), 3))
		var factors, cpus []float64
		changes, level := 0, LevelHealthy
		for i := range 600 {
			cpu := min(100, demand*h.c.Factor()+2*r.NormFloat64())
			s := h.step(cpu)
			factors = append(factors, s.Factor)
			cpus = append(cpus, s.CPU.Value)
			if i >= 300 && s.Level != level {
				changes++
			}
			level = s.Level
		}
		last := factors[300:]
		lo, hi := slicesMinMax(last)
		clo, chi := slicesMinMax(cpus[300:])
		t.Logf("demand %v: last 300s factor [%.3f, %.3f], smoothed CPU [%.1f, %.1f], %d level changes", demand, lo, hi, clo, chi, changes)
		if hi-lo > 0.02 {
			t.Errorf("demand %v: factor still moving over the last 300s: [%.3f, %.3f]", demand, lo, hi)
		}
		if changes > 1 {
			t.Errorf("demand %v: %d level changes over the last 300s, want ≤ 1", demand, changes)
		}
		// Settled just under warn (70): neither overloaded nor throttled
		// far more than needed.
		if chi >= 75 || clo < 58 {
			t.Errorf("demand %v: smoothed CPU over the last 300s in [%.1f, %.1f], want within [58, 75)", demand, clo, chi)
		}
	}
}

func slicesMinMax(v []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

func TestRecoveryIsGradualAndCompletes(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"defaults", Config{}},
		{"fast", Config{RecoveryDelay: 2 * time.Second, RecoveryTime: 10 * time.Second, Floor: 0.25}},
		{"sub-second interval", Config{Interval: 250 * time.Millisecond, RecoveryTime: 20 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.cfg, Options{})
			cfg := h.c.cfg
			for range 20 {
				h.step(99)
			}
			if !h.c.AtFloor() {
				t.Fatalf("not at the floor after 20 critical samples: %v", h.c.Factor())
			}
			// Drop the load. Once the smoothed CPU is under 63%, recovery
			// takes RecoveryDelay + RecoveryTime, and never less than
			// RecoveryTime.
			start := h.now
			maxStep := (1 - cfg.Floor) * float64(cfg.Interval) / float64(cfg.RecoveryTime)
			prev := h.c.Factor()
			var full time.Duration
			for h.now.Sub(start) < 2*(cfg.RecoveryDelay+cfg.RecoveryTime) {
				s := h.step(10)
				if s.Factor < prev {
					t.Fatalf("factor fell during recovery: %.3f → %.3f", prev, s.Factor)
				}
				if s.Factor-prev > maxStep*1.0001 {
					t.Fatalf("factor jumped %.4f in one interval, want ≤ %.4f", s.Factor-prev, maxStep)
				}
				prev = s.Factor
				if s.Factor == 1 && full == 0 {
					full = h.now.Sub(start)
				}
			}
			// The smoothed CPU needs a few samples to fall below 63%.
			lag := 3 * time.Second
			if full == 0 || full > lag+cfg.RecoveryDelay+cfg.RecoveryTime {
				t.Errorf("factor back to 1 after %v, want within %v + %v (+%v smoothing)", full, cfg.RecoveryDelay, cfg.RecoveryTime, lag)
			}
			if full < cfg.RecoveryTime {
				t.Errorf("factor back to 1 after %v, faster than recovery_time %v", full, cfg.RecoveryTime)
			}
			if h.c.Level() != LevelHealthy {
				t.Errorf("level %v after recovery, want healthy", h.c.Level())
			}
		})
	}
}

func TestRecoveryWaitsForUninterruptedRelief(t *testing.T) {
	h := newHarness(t, Config{Smoothing: time.Nanosecond}, Options{})
	for range 10 {
		h.step(99)
	}
	// Relief for 4s, one sample in the dead band, relief again: the delay
	// restarts, so nothing rises before 5 uninterrupted seconds.
	for range 4 {
		h.step(30)
	}
	h.step(65) // dead band: under warn, over warn·(1−hysteresis)
	for i := range 4 {
		if s := h.step(30); s.Factor != h.c.cfg.Floor {
			t.Fatalf("relief sample %d after an interruption: factor %.3f, want still the floor", i+1, s.Factor)
		}
	}
	if s := h.step(30); s.Factor <= h.c.cfg.Floor {
		t.Fatalf("factor %.3f after 5s of uninterrupted relief, want rising", s.Factor)
	}
}

func TestMinRequestsGatesLatencyAndErrors(t *testing.T) {
	h := newHarness(t, Config{MinRequests: 50}, Options{})
	// A quiet server: a few very slow, failing requests must not count.
	h.traffic(10, 10*time.Second, 10)
	s := h.step(20)
	if s.Factor != 1 || s.LatencyP99.Counts || s.ErrorRate.Counts {
		t.Fatalf("10 requests: factor %v, latency counts %v, errors count %v; want 1, false, false", s.Factor, s.LatencyP99.Counts, s.ErrorRate.Counts)
	}
	if !s.LatencyP99.Measured || s.LatencyP99.Value < 5 {
		t.Errorf("latency not reported (measured %v, %.2fs)", s.LatencyP99.Measured, s.LatencyP99.Value)
	}
	h.traffic(40, 10*time.Second, 0)
	s = h.step(20)
	if !s.LatencyP99.Counts || s.Factor >= 1 {
		t.Fatalf("50 requests: latency counts %v, factor %v; want true, < 1", s.LatencyP99.Counts, s.Factor)
	}
	if math.Abs(s.ErrorRate.Value-20) > 1e-9 {
		t.Errorf("error rate %.2f%%, want 20%%", s.ErrorRate.Value)
	}
}

func TestWindowAgesOut(t *testing.T) {
	cfg := Config{LatencyWindow: 10 * time.Second, MinRequests: 1}
	h := newHarness(t, cfg, Options{})
	h.step(20)
	h.traffic(100, time.Second, 0)
	s := h.step(20)
	if s.Requests != 100 {
		t.Fatalf("requests in window %d, want 100", s.Requests)
	}
	for i := 2; i <= 12; i++ {
		s = h.step(20)
		want := uint64(100)
		if i > 10 {
			want = 0
		}
		if s.Requests != want {
			t.Fatalf("%ds after the burst: %d requests in a 10s window, want %d", i, s.Requests, want)
		}
	}
}

func TestRecentWindowShowsRecovery(t *testing.T) {
	// 20s of slow traffic, then fast traffic: the whole 30s window's p99
	// stays slow for a long time, the recent fifth shows the recovery.
	h := newHarness(t, Config{CPU: Thresholds{Disabled: true}}, Options{})
	for range 20 {
		h.traffic(200, 3*time.Second, 0)
		h.step(0)
	}
	for i := range 8 {
		h.traffic(200, 20*time.Millisecond, 0)
		s := h.step(0)
		if i >= 6 && s.LatencyP99.Value > 0.1 {
			t.Errorf("%ds after recovery: p99 %.3fs, want the recent requests' (~20ms)", i+1, s.LatencyP99.Value)
		}
	}
	// Recent traffic too thin to count (under MinRequests): the whole
	// window decides.
	h2 := newHarness(t, Config{CPU: Thresholds{Disabled: true}}, Options{})
	for range 20 {
		h2.traffic(200, 3*time.Second, 0)
		h2.step(0)
	}
	var s Status
	for range 8 {
		h2.traffic(5, 20*time.Millisecond, 0)
		s = h2.step(0)
	}
	if s.LatencyP99.Value < 2 {
		t.Errorf("thin recent traffic: p99 %.3fs, want the whole window's (~3s)", s.LatencyP99.Value)
	}
}

func TestFloor(t *testing.T) {
	for _, tc := range []struct {
		floor   float64
		atFloor bool
	}{
		{0.05, true},
		{0.1, true},
		{0.3, true},
		{1, false}, // floor 1 turns adaptation off: never "at the floor"
	} {
		h := newHarness(t, Config{Floor: tc.floor}, Options{})
		for range 60 {
			h.step(100)
			if f := h.c.Factor(); f < tc.floor {
				t.Fatalf("floor %v: factor %v below the floor", tc.floor, f)
			}
			for p := range numPriorities {
				if f := h.c.FactorFor(p); f < tc.floor || f > 1 {
					t.Fatalf("floor %v: %v factor %v outside [floor, 1]", tc.floor, p, f)
				}
			}
		}
		if f := h.c.Factor(); f != tc.floor {
			t.Errorf("floor %v: factor %v after a minute critical, want the floor", tc.floor, f)
		}
		if got := h.c.AtFloor(); got != tc.atFloor {
			t.Errorf("floor %v: AtFloor %v, want %v", tc.floor, got, tc.atFloor)
		}
		if got := h.c.Level() == LevelFloor; got != tc.atFloor {
			t.Errorf("floor %v: level %v", tc.floor, h.c.Level())
		}
	}
}

func TestPriorityOrdering(t *testing.T) {
	h := newHarness(t, Config{Smoothing: time.Nanosecond}, Options{})
	floor := h.c.cfg.Floor
	batchFloorFirst := false
	for i := range 40 {
		h.step(75) // warn: the factor walks down from 1 to the floor
		f := h.c.Factor()
		crit, inter, batch := h.c.FactorFor(PriorityCritical), h.c.FactorFor(PriorityInteractive), h.c.FactorFor(PriorityBatch)
		if inter != f {
			t.Fatalf("interactive factor %v, Factor() %v", inter, f)
		}
		if !(crit >= inter && inter >= batch) {
			t.Fatalf("sample %d: critical %.3f, interactive %.3f, batch %.3f: want critical ≥ interactive ≥ batch", i, crit, inter, batch)
		}
		if f < 1 && f > floor && !(crit > inter && inter > batch) && batch != floor {
			t.Fatalf("sample %d: classes not strictly ordered at factor %.3f", i, f)
		}
		if batch == floor && inter > floor {
			batchFloorFirst = true
		}
	}
	if !batchFloorFirst {
		t.Error("batch never reached the floor before interactive traffic")
	}
	if got := h.c.FactorFor(Priority(200)); got != h.c.Factor() {
		t.Errorf("unknown priority got %v, want the interactive factor %v", got, h.c.Factor())
	}
	// Healthy: everyone gets 1.
	h2 := newHarness(t, Config{}, Options{})
	h2.step(10)
	for p := range numPriorities {
		if f := h2.c.FactorFor(p); f != 1 {
			t.Errorf("healthy: %v factor %v, want 1", p, f)
		}
	}
}

func TestNilController(t *testing.T) {
	var c *Controller
	c.Record(time.Second, 500)
	if c.Factor() != 1 || c.FactorFor(PriorityBatch) != 1 || c.AtFloor() || c.Level() != LevelHealthy {
		t.Error("nil controller must mean no adaptation")
	}
}

func TestSourceErrorsAreIgnoredAndLoggedOnce(t *testing.T) {
	var fail bool
	h := newHarness(t, Config{}, Options{CPU: SourceFunc(func(time.Time) (float64, error) {
		if fail {
			return 0, errors.New("boom")
		}
		return 99, nil
	})})
	h.step(0)
	if h.c.Factor() != 0.5 {
		t.Fatalf("factor %v, want 0.5 after one critical sample", h.c.Factor())
	}
	fail = true
	for range 10 {
		s := h.step(0)
		if s.CPU.Measured {
			t.Fatal("failed source still reported as measured")
		}
	}
	if n := h.logs.FilterMessageSnippet("signal unavailable").Len(); n != 1 {
		t.Errorf("logged the failure %d times, want once", n)
	}
	// While the only signal fails, the controller sees no pressure and
	// recovers: a broken sensor must not pin limits down.
	if h.c.Factor() <= 0.5 {
		t.Errorf("factor %v after 10s without any signal, want recovering", h.c.Factor())
	}
	fail = false
	h.step(0)
	if n := h.logs.FilterMessageSnippet("available again").Len(); n != 1 {
		t.Errorf("logged the recovery %d times, want once", n)
	}
	// ErrNoSample is silent.
	h2 := newHarness(t, Config{}, Options{CPU: SourceFunc(func(time.Time) (float64, error) { return 0, ErrNoSample })})
	h2.step(0)
	if h2.logs.Len() != 0 {
		t.Errorf("ErrNoSample logged: %v", h2.logs.All())
	}
}

func TestLevelChangeLogLine(t *testing.T) {
	h := newHarness(t, Config{Smoothing: time.Nanosecond}, Options{})
	h.traffic(200, 100*time.Millisecond, 1)
	for range 5 {
		h.step(20)
	}
	if h.logs.Len() != 0 {
		t.Fatalf("healthy samples logged: %v", h.logs.All())
	}
	h.step(80)
	entries := h.logs.FilterMessage("adaptive: level changed").All()
	if len(entries) != 1 {
		t.Fatalf("got %d level-change lines, want 1", len(entries))
	}
	e := entries[0]
	if e.Level != zapcore.InfoLevel {
		t.Errorf("logged at %v, want info", e.Level)
	}
	fields := e.ContextMap()
	for k, want := range map[string]any{"from": "healthy", "to": "warn", "cpu_percent": 80.0, "window_requests": uint64(200), "error_percent": 0.5} {
		if fields[k] != want {
			t.Errorf("field %s = %v (%T), want %v", k, fields[k], fields[k], want)
		}
	}
	if _, ok := fields["latency_p99"]; !ok {
		t.Error("no latency_p99 field")
	}
	for range 5 {
		h.step(80)
	}
	if n := h.levelLog(); n != 1 {
		t.Errorf("steady warn logged %d level changes, want 1", n)
	}
}

// fakePublisher records what it is given and returns a programmed factor.
type fakePublisher struct {
	mu        sync.Mutex
	published []float64
	shared    float64
	fetchErr  error
	pubErr    error
	sawCtx    bool
}

func (p *fakePublisher) Publish(ctx context.Context, local float64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := ctx.Deadline(); ok {
		p.sawCtx = true
	}
	p.published = append(p.published, local)
	return p.pubErr
}

func (p *fakePublisher) Fetch(context.Context) (float64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shared, p.fetchErr
}

func TestSharedFactorMerge(t *testing.T) {
	pub := &fakePublisher{shared: 0.4}
	h := newHarness(t, Config{}, Options{Publisher: pub})

	s := h.step(20) // healthy locally
	if s.Factor != 0.4 || s.LocalFactor != 1 || !s.Shared {
		t.Fatalf("healthy local, shared 0.4: factor %v local %v shared %v; want 0.4 1 true", s.Factor, s.LocalFactor, s.Shared)
	}
	if h.c.Factor() != 0.4 || math.Abs(h.c.FactorFor(PriorityBatch)-0.16) > 1e-12 {
		t.Errorf("hot path factors %v / batch %v, want 0.4 / 0.16", h.c.Factor(), h.c.FactorFor(PriorityBatch))
	}
	if !pub.sawCtx {
		t.Error("publisher called without a deadline")
	}

	// Local worse than shared: local wins. What is published is always
	// the LOCAL factor, never the merged one (which would echo).
	for range 6 {
		s = h.step(99)
		if got := pub.published[len(pub.published)-1]; got != s.LocalFactor {
			t.Fatalf("published %v, want the local factor %v", got, s.LocalFactor)
		}
	}
	if s.Factor != s.LocalFactor || s.LocalFactor >= 0.4 {
		t.Errorf("local %v below shared 0.4: factor %v, want the local one", s.LocalFactor, s.Factor)
	}
	if pub.published[0] != 1 {
		t.Errorf("first publish %v, want the local factor 1 (not the merged 0.4)", pub.published[0])
	}

	// Fetch fails: the last shared factor holds for SharedMaxAge, then the
	// local factor alone.
	pub.shared = 0.3
	h.step(20)
	pub.fetchErr = errors.New("redis down")
	maxAge := h.c.cfg.SharedMaxAge
	start := h.now
	for h.now.Sub(start) < maxAge {
		if s = h.step(5); !s.Shared || s.Factor > 0.3 {
			t.Fatalf("%v after the last fetch: shared %v factor %v, want the stale shared factor still applied", h.now.Sub(start), s.Shared, s.Factor)
		}
	}
	s = h.step(5)
	if s.Shared || s.Factor != s.LocalFactor {
		t.Errorf("%v after the last fetch: shared %v factor %v local %v, want local only", h.now.Sub(start), s.Shared, s.Factor, s.LocalFactor)
	}
	if n := h.logs.FilterMessageSnippet("shared factor unavailable").Len(); n != 1 {
		t.Errorf("logged the publisher failure %d times, want once", n)
	}
}

func TestSharedFactorValidation(t *testing.T) {
	for _, tc := range []struct {
		shared     float64
		wantShared bool
		want       float64
	}{
		{0.5, true, 0.5},
		{7, true, 1},           // clamped to 1
		{0.01, true, 0.1},      // clamped to the floor
		{0, false, 1},          // invalid
		{-1, false, 1},         // invalid
		{math.NaN(), false, 1}, // invalid
		{math.Inf(1), true, 1}, // clamped
	} {
		pub := &fakePublisher{shared: tc.shared}
		h := newHarness(t, Config{}, Options{Publisher: pub})
		s := h.step(20)
		if s.Shared != tc.wantShared || s.Factor != tc.want {
			t.Errorf("shared %v: applied %v factor %v, want %v %v", tc.shared, s.Shared, s.Factor, tc.wantShared, tc.want)
		}
	}
	// A publish error skips the fetch.
	pub := &fakePublisher{shared: 0.5, pubErr: errors.New("no")}
	h := newHarness(t, Config{}, Options{Publisher: pub})
	if s := h.step(20); s.Shared {
		t.Error("shared factor applied although publishing failed")
	}
}

func TestSharedFloorIsLevelFloor(t *testing.T) {
	pub := &fakePublisher{shared: 0.1}
	h := newHarness(t, Config{}, Options{Publisher: pub})
	s := h.step(20)
	if s.Level != LevelFloor || !h.c.AtFloor() {
		t.Errorf("shared factor at the floor: level %v, want floor", s.Level)
	}
}

func TestInherit(t *testing.T) {
	old := newHarness(t, Config{}, Options{})
	for range 10 {
		old.step(99)
	}
	if !old.c.AtFloor() {
		t.Fatal("old controller not at the floor")
	}
	// A reload changes the config: the new controller must keep
	// throttling, at its own floor, and recover gradually.
	h := newHarness(t, Config{Floor: 0.2, RecoveryTime: 20 * time.Second}, Options{Inherit: old.c})
	if f := h.c.Factor(); f != 0.2 {
		t.Fatalf("inherited factor %v, want the new floor 0.2", f)
	}
	if !h.c.AtFloor() || h.c.Level() != LevelFloor || h.c.FactorFor(PriorityBatch) != 0.2 {
		t.Fatalf("inherited level %v", h.c.Level())
	}
	h.now = old.now
	s := h.step(99)
	if s.Factor != 0.2 || h.levelLog() != 0 {
		t.Errorf("still critical: factor %v, %d level lines; want 0.2 and no change logged", s.Factor, h.levelLog())
	}
	s = h.step(10)
	if s.Factor != 0.2 {
		t.Errorf("first healthy sample after inheriting: factor %v, want still 0.2 (recovery delay)", s.Factor)
	}
	// Without Inherit a new controller starts healthy.
	fresh := newHarness(t, Config{}, Options{})
	if fresh.c.Factor() != 1 || fresh.c.Level() != LevelHealthy {
		t.Error("fresh controller not at 1")
	}
}

func TestLifecycle(t *testing.T) {
	// Stop before Start: Start is then a no-op, nothing ever samples.
	h := newHarness(t, Config{}, Options{})
	h.c.Stop()
	h.c.Start()
	h.c.Stop()
	if got := h.c.Status().At; !got.IsZero() {
		t.Errorf("a stopped controller sampled at %v", got)
	}

	h2 := newHarness(t, Config{}, Options{})
	h2.c.Start()
	h2.c.Start() // no-op
	h2.c.Stop()  // waits for the goroutine, which samples once at start
	h2.c.Stop()  // idempotent
	if got := h2.c.Status().At; !got.Equal(epoch) {
		t.Errorf("the goroutine's first sample was at %v, want the injected clock's %v", got, epoch)
	}
	h2.c.Start() // after Stop: no-op
	h2.c.Stop()
}

func TestConcurrentUse(t *testing.T) {
	h := newHarness(t, Config{Interval: 10 * time.Millisecond}, Options{Publisher: &fakePublisher{shared: 0.9}})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	counts := make([]int, 4)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					counts[g] = i
					return
				default:
				}
				h.c.Record(time.Duration(i%1000)*time.Millisecond, 200+g*100) // g = 3 fails
				_ = h.c.FactorFor(Priority(i % 3))
				_ = h.c.AtFloor()
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			_ = h.c.Status()
		}
	})
	for i := range 200 {
		h.c.Sample(epoch.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	close(stop)
	wg.Wait()
	// Every record is still in the 30s window: none may be lost.
	s := h.c.Sample(epoch.Add(2 * time.Second))
	total := counts[0] + counts[1] + counts[2] + counts[3]
	if s.Requests != uint64(total) {
		t.Errorf("window holds %d requests, %d were recorded", s.Requests, total)
	}
	if want := 100 * float64(counts[3]) / float64(total); math.Abs(s.ErrorRate.Value-want) > 1e-9 {
		t.Errorf("error rate %.4f%%, want %.4f%%", s.ErrorRate.Value, want)
	}
}
