package adaptive

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Publisher shares factors between instances, typically through the Redis
// store that already shares their limits. Each sample the controller
// publishes its LOCAL factor (never the merged one: publishing the merged
// factor would let one stressed instance's factor echo back through every
// other instance and never expire) and fetches the group's factor.
//
// Fetch should return the minimum of the local factors published by the
// instances that are alive, each published value expiring after a few
// intervals (a Redis sorted set or hash with timestamps does this). The
// controller then applies min(local, shared): instances that share limits
// also share one factor, set by the most stressed instance, so a tenant gets
// the same effective limit whichever instance serves it.
//
// Both calls run on the sampling goroutine, never on the request path, with
// a context that times out after half an interval and is cancelled by Stop.
// When Fetch fails, the last fetched factor stays in force for
// Config.SharedMaxAge, then the controller falls back to its local factor:
// a broken Redis must not pin every instance at a stale low factor.
type Publisher interface {
	Publish(ctx context.Context, local float64) error
	Fetch(ctx context.Context) (shared float64, err error)
}

// Options carries a Controller's collaborators. The zero value is valid and
// measures the real system.
type Options struct {
	// Logger receives one Info line per level change and one Warn line when
	// a signal or the publisher starts failing. Default: no logging.
	Logger *zap.Logger

	// Now is the clock of the sampling goroutine. Default time.Now.
	Now func() time.Time

	// CPU and Memory replace the system sources (tests inject their own).
	// Default: cgroup v2 when a limit is set, else the host. Memory is only
	// read when Config.Memory enables it.
	CPU, Memory Source

	// FS is the root filesystem in which the default sources look for
	// proc/self/cgroup and sys/fs/cgroup. Default os.DirFS("/").
	FS fs.FS

	// Publisher, when set, merges this instance's factor with its peers'.
	Publisher Publisher

	// Probes replace the reads of remote signals (Prometheus, HTTP), by
	// signal name (tests inject their own). Default: read the configured
	// URL.
	Probes map[string]Probe

	// HTTPClient reads the remote signals. Default: a client of the
	// controller's own, its idle connections closed by Stop. Each read is
	// bounded by its signal's Timeout.
	HTTPClient *http.Client

	// Inherit, when set, starts the new controller from the state of an
	// older one (its factor, level, smoothed signals, shared factor and
	// count of requests in flight)
	// instead of from a healthy factor of 1: replacing the controller
	// because its config changed must not lift throttling in the middle of
	// an incident. The latency window starts empty. Stop the old controller
	// once the new one is in use.
	Inherit *Controller
}

// Controller turns health signals into a factor that scales rate limits.
// One Controller serves a whole process; all its methods are safe for
// concurrent use. Record, Factor, FactorFor, Level and AtFloor are the hot
// path: they take no lock and do not allocate. A nil *Controller is valid
// on the hot path and means "no adaptation": factor 1, Record does nothing.
//
// See the package documentation for the algorithm.
type Controller struct {
	// Hot-path state, written by the sampler, read by everyone.
	factors [numPriorities]atomic.Uint64 // float64 bits, per Priority
	level   atomic.Int32
	win     *window

	cfg    Config
	log    *zap.Logger
	now    func() time.Time
	cpu    Source
	mem    Source // nil when memory is off
	pub    Publisher
	ctx    context.Context // cancelled by Stop; bounds publisher and probe calls
	cancel context.CancelFunc

	signals  []*signal     // external signals, in configuration order
	inflight *atomic.Int64 // requests between Begin and Done
	client   *http.Client  // the remote signals' client, when the controller made it
	probes   sync.WaitGroup

	sampleMu sync.Mutex // serialises Sample; guards the fields below
	st       ctrlState

	statusMu sync.RWMutex
	status   Status

	lifeMu  sync.Mutex
	started bool
	stopped bool
	done    chan struct{}

	collector *collector
}

// ctrlState is the sampler's private state.
type ctrlState struct {
	last        time.Time // previous sample
	local       float64   // local factor
	calm        time.Duration
	signalLevel Level // local signal level, with hysteresis
	levelCalm   time.Duration
	reported    Level // last level logged
	cpu, mem    ewma
	shared      float64
	sharedAt    time.Time // zero: no shared factor yet
	cpuErr      bool      // in a streak of source errors (logged once)
	memErr      bool
	pubErr      bool
}

// ewma is an exponentially weighted moving average with a time constant.
type ewma struct {
	v  float64
	ok bool
}

func (e *ewma) update(x float64, dt, tau time.Duration) float64 {
	if !e.ok || tau <= 0 {
		e.v, e.ok = x, true
		return x
	}
	alpha := 1 - math.Exp(-float64(dt)/float64(tau))
	e.v += alpha * (x - e.v)
	return e.v
}

// New returns a Controller for cfg (defaults applied, then validated). It
// does not sample until Start, or until the caller calls Sample.
func New(cfg Config, opts Options) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	c := &Controller{
		cfg: cfg,
		log: opts.Logger,
		now: opts.Now,
		cpu: opts.CPU,
		pub: opts.Publisher,
		win: newWindow(cfg.LatencyWindow, cfg.Interval, headerSignals(cfg)),

		inflight: new(atomic.Int64),
	}
	var err error
	if c.signals, c.client, err = newSignals(cfg, opts); err != nil {
		return nil, err
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.now == nil {
		c.now = time.Now
	}
	fsys := opts.FS
	if fsys == nil {
		fsys = os.DirFS("/")
	}
	if c.cpu == nil && !cfg.CPU.Disabled {
		var desc string
		c.cpu, desc = systemCPU(fsys, runtime.NumCPU())
		c.log.Info("adaptive: cpu source", zap.String("source", desc))
	}
	if cfg.memoryEnabled() {
		c.mem = opts.Memory
		if c.mem == nil {
			var desc string
			c.mem, desc = systemMemory(fsys)
			c.log.Info("adaptive: memory source", zap.String("source", desc))
		}
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.st.local = 1
	c.st.shared = 1
	c.status = Status{Factor: 1, LocalFactor: 1}
	if old := opts.Inherit; old != nil {
		old.sampleMu.Lock()
		c.st = ctrlState{
			last:        old.st.last,
			local:       min(max(old.st.local, cfg.Floor), 1),
			signalLevel: old.st.signalLevel,
			reported:    old.st.reported,
			cpu:         old.st.cpu,
			mem:         old.st.mem,
			shared:      min(max(old.st.shared, cfg.Floor), 1),
			sharedAt:    old.st.sharedAt,
		}
		old.sampleMu.Unlock()
		c.status = old.Status()
		c.status.Signals = nil // the old controller's signals
		c.status.LocalFactor = c.st.local
		c.status.Factor = min(max(c.status.Factor, cfg.Floor), 1)
		c.status.Level = c.levelAt(c.status.Factor)
		c.level.Store(int32(c.status.Level))
		// Requests in flight through the old controller's handlers are
		// still in flight: share the count.
		c.inflight = old.inflight
		// A signal of the same name and kind keeps its smoothed value.
		old.sampleMu.Lock()
		for _, x := range c.signals {
			for _, o := range old.signals {
				if o.cfg.Name == x.cfg.Name && o.kind == x.kind {
					x.avg = o.avg
				}
			}
		}
		old.sampleMu.Unlock()
	}
	c.setFactor(c.status.Factor)
	c.collector = newCollector(c)
	return c, nil
}

// Config returns the controller's configuration, defaults applied.
func (c *Controller) Config() Config { return c.cfg }

// Start starts the sampling goroutine. It is a no-op if the controller is
// already started or has been stopped.
func (c *Controller) Start() {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.started || c.stopped {
		return
	}
	c.started = true
	c.done = make(chan struct{})
	go c.run()
	for _, x := range c.signals {
		if x.probe != nil {
			c.probes.Go(func() { c.runProbe(x) })
		}
	}
}

func (c *Controller) run() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	c.Sample(c.now()) // prime counter-based sources and the window
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			c.Sample(c.now())
		}
	}
}

// Stop stops the sampling goroutine and waits for it to return. It is
// idempotent, and safe to call on a controller that was never started. The
// factor keeps its last value.
func (c *Controller) Stop() {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	c.stopped = true
	c.cancel()
	if c.started {
		<-c.done
		c.probes.Wait()
		c.started = false
	}
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
}

// Record adds one request that the handler let through to the latency and
// error-rate window: d is its latency, status its response status. A status
// of 500 or more counts as an error, and so does a status below 100 (use 0
// when the request got no response at all, e.g. an upstream timeout that
// produced no status). Record is the hot path: a few nanoseconds, no
// allocation, no lock.
//
// Call it only for requests that reached the upstream, not for the 429s and
// 503s the limiter produced itself. For streamed responses, record the time
// to the response header rather than the end of the stream: a long LLM
// stream is not a slow upstream.
func (c *Controller) Record(d time.Duration, status int) {
	if c == nil {
		return
	}
	c.win.record(d, status >= 500 || status < 100)
}

// Factor returns the effective factor for interactive traffic, in
// [Floor, 1]: the local factor, lowered to the shared factor when a fresh
// one is lower. Multiply a limit's rate by it.
func (c *Controller) Factor() float64 {
	if c == nil {
		return 1
	}
	return math.Float64frombits(c.factors[PriorityInteractive].Load())
}

// FactorFor returns the factor for traffic of priority p (see Priority). An
// unknown priority gets the interactive factor.
func (c *Controller) FactorFor(p Priority) float64 {
	if c == nil {
		return 1
	}
	if p >= numPriorities {
		p = PriorityInteractive
	}
	return math.Float64frombits(c.factors[p].Load())
}

// Level returns the current level.
func (c *Controller) Level() Level {
	if c == nil {
		return LevelHealthy
	}
	return Level(c.level.Load())
}

// AtFloor reports whether the effective factor is at Config.Floor. A handler
// may then answer 503 (temporary-reduced-capacity) instead of admitting
// traffic at the floor rate. For one class, compare FactorFor(p) with the
// floor instead: batch traffic gets there first.
func (c *Controller) AtFloor() bool {
	return c.Level() == LevelFloor
}

// setFactor publishes the effective factor and the class factors derived
// from it. The class factors are computed here, once per sample, so that
// FactorFor costs one atomic load.
func (c *Controller) setFactor(f float64) {
	for p := range numPriorities {
		c.factors[p].Store(math.Float64bits(classFactor(p, f, c.cfg.Floor)))
	}
}

// Status is a snapshot of the controller, as of its last sample.
type Status struct {
	At    time.Time // time of the sample
	Level Level
	// Factor is the effective factor, min(LocalFactor, SharedFactor) when
	// the shared factor is fresh.
	Factor      float64
	LocalFactor float64
	// SharedFactor is the last factor fetched from the Publisher; Shared
	// reports whether it is fresh enough to count.
	SharedFactor float64
	Shared       bool
	// Requests is the number of requests in the latency window.
	Requests uint64

	CPU, Memory, LatencyP99, ErrorRate Signal

	// Signals are the external signals, in configuration order.
	Signals []SignalStatus
}

// Signal is one signal's reading at a sample.
type Signal struct {
	// Value is in percent for CPU, memory and error rate, in seconds for the
	// p99 latency. It is the smoothed value for CPU and memory.
	Value float64
	// Measured is false when the signal is disabled or its source failed;
	// Value is then meaningless.
	Measured bool
	// Counts is true when the signal takes part in the decision: it is
	// measured and, for latency and error rate, the window holds at least
	// MinRequests requests.
	Counts bool
	// Pressure places Value against the thresholds: (Value − warn) /
	// (critical − warn). Below 0 is healthy, [0, 1) warn, 1 and above
	// critical.
	Pressure float64
}

// Status returns a snapshot as of the last sample.
func (c *Controller) Status() Status {
	c.statusMu.RLock()
	defer c.statusMu.RUnlock()
	return c.status
}

// pressure places v between warn (0) and critical (1).
func pressure(v, warn, critical float64) float64 {
	return (v - warn) / (critical - warn)
}

// levelAt is the level reported with effective factor f: the floor when f
// is there (with a floor below 1: a floor of 1 means no adaptation), the
// signal level otherwise.
func (c *Controller) levelAt(f float64) Level {
	if c.cfg.Floor < 1 && f <= c.cfg.Floor*(1+1e-9) {
		return LevelFloor
	}
	return c.st.signalLevel
}

func levelOf(p float64) Level {
	switch {
	case p < 0:
		return LevelHealthy
	case p < 1:
		return LevelWarn
	}
	return LevelCritical
}

// Sample reads the signals and updates the factor as of now. The sampling
// goroutine calls it every Interval; tests call it directly with their own
// clock. Samples must come in non-decreasing time order.
func (c *Controller) Sample(now time.Time) Status {
	c.sampleMu.Lock()
	defer c.sampleMu.Unlock()
	st := &c.st
	cfg := &c.cfg

	// dt is the time since the previous sample. It is clamped so that a
	// process that was suspended does not jump its whole recovery at once.
	dt := cfg.Interval
	if !st.last.IsZero() {
		dt = min(max(now.Sub(st.last), 0), 5*cfg.Interval)
	}
	st.last = now

	s := Status{At: now}
	c.readResource(&s.CPU, c.cpu, &st.cpu, &st.cpuErr, "cpu", cfg.CPU, now, dt)
	if c.mem != nil {
		c.readResource(&s.Memory, c.mem, &st.mem, &st.memErr, "memory", cfg.Memory, now, dt)
	}

	c.win.advance(now)
	ws := c.win.stats(len(c.win.slots))
	// The recent part: the current slot and the newest fifth of the full
	// slots (see Config.LatencyWindow).
	if recent := c.win.stats((len(c.win.slots)-1+4)/5 + 1); recent.requests >= uint64(max(cfg.MinRequests, 1)) {
		ws = healthier(ws, recent)
	}
	s.Requests = ws.requests
	enough := ws.requests > 0 && ws.requests >= uint64(cfg.MinRequests)
	if ws.requests > 0 {
		if !cfg.Latency.Disabled {
			s.LatencyP99 = Signal{Value: ws.p99.Seconds(), Measured: true, Counts: enough}
			s.LatencyP99.Pressure = pressure(float64(ws.p99), float64(cfg.Latency.Warn), float64(cfg.Latency.Critical))
		}
		if !cfg.ErrorRate.Disabled {
			rate := 100 * float64(ws.errors) / float64(ws.requests)
			s.ErrorRate = Signal{Value: rate, Measured: true, Counts: enough}
			s.ErrorRate.Pressure = pressure(rate, cfg.ErrorRate.Warn, cfg.ErrorRate.Critical)
		}
	}

	// p is the worst pressure now. relief is the worst pressure the signals
	// would have if each were inflated by the hysteresis margin: only when
	// even that is below a boundary has the signal clearly crossed back.
	p, relief := math.Inf(-1), math.Inf(-1)
	h := 1 / (1 - cfg.Hysteresis)
	consider := func(sig *Signal, warn, critical float64, scale float64) {
		if !sig.Counts {
			return
		}
		p = max(p, sig.Pressure)
		relief = max(relief, pressure(sig.Value*scale*h, warn, critical))
	}
	consider(&s.CPU, cfg.CPU.Warn, cfg.CPU.Critical, 1)
	consider(&s.Memory, cfg.Memory.Warn, cfg.Memory.Critical, 1)
	consider(&s.LatencyP99, float64(cfg.Latency.Warn), float64(cfg.Latency.Critical), float64(time.Second))
	consider(&s.ErrorRate, cfg.ErrorRate.Warn, cfg.ErrorRate.Critical, 1)
	if len(c.signals) > 0 {
		s.Signals = make([]SignalStatus, len(c.signals))
		for i, x := range c.signals {
			s.Signals[i] = c.readSignal(x, now, dt, ws.requests)
			if sig := &s.Signals[i]; sig.Counts {
				p = max(p, sig.Pressure)
				relief = max(relief, x.relief(sig, h))
			}
		}
	}

	c.stepLocal(p, relief, dt)
	c.stepLevel(p, relief, dt)
	s.LocalFactor = st.local

	// Merge with the peers' factor.
	c.exchange(now)
	s.Factor = st.local
	s.SharedFactor = st.shared
	if !st.sharedAt.IsZero() && now.Sub(st.sharedAt) <= cfg.SharedMaxAge {
		s.Shared = true
		s.Factor = min(st.local, st.shared)
	}
	s.Level = c.levelAt(s.Factor)

	c.setFactor(s.Factor)
	c.level.Store(int32(s.Level))
	c.statusMu.Lock()
	c.status = s
	c.statusMu.Unlock()

	if s.Level != st.reported {
		c.logLevel(st.reported, s)
		st.reported = s.Level
	}
	return s
}

// readResource reads a CPU or memory source into sig, smoothing it.
func (c *Controller) readResource(sig *Signal, src Source, avg *ewma, inErr *bool, name string, t Thresholds, now time.Time, dt time.Duration) {
	if src == nil || t.Disabled {
		return
	}
	v, err := src.Read(now)
	switch {
	case errors.Is(err, ErrNoSample):
		return
	case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
		if err == nil {
			err = fmt.Errorf("not a number: %v", v)
		}
		if !*inErr {
			c.log.Warn("adaptive: signal unavailable, ignoring it until it recovers",
				zap.String("signal", name), zap.Error(err))
			*inErr = true
		}
		avg.ok = false // restart the average from the next good reading
		return
	}
	if *inErr {
		c.log.Info("adaptive: signal available again", zap.String("signal", name))
		*inErr = false
	}
	v = avg.update(v, dt, c.cfg.Smoothing)
	*sig = Signal{Value: v, Measured: true, Counts: true, Pressure: pressure(v, t.Warn, t.Critical)}
}

// stepLocal moves the local factor. See the package documentation.
func (c *Controller) stepLocal(p, relief float64, dt time.Duration) {
	st := &c.st
	cfg := &c.cfg
	f := st.local
	sec := dt.Seconds()
	switch {
	case p >= 0:
		// Warn or critical: multiplicative decrease, Backoff per second at
		// critical and beyond, easing off quadratically to nothing at warn.
		q := min(p, 1)
		f *= math.Pow(cfg.Backoff, q*q*sec)
		st.calm = 0
	case relief < 0 && f < 1:
		// Clear relief: every signal is below warn even with the hysteresis
		// margin. After RecoveryDelay of it without interruption, climb
		// linearly.
		st.calm += dt
		if st.calm >= cfg.RecoveryDelay {
			f += (1 - cfg.Floor) * float64(dt) / float64(cfg.RecoveryTime)
		}
	default:
		// The dead band just below warn: hold.
		st.calm = 0
	}
	st.local = min(max(f, cfg.Floor), 1)
}

// stepLevel moves the signal level: up at once, down only after
// RecoveryDelay of relief below the boundary.
func (c *Controller) stepLevel(p, relief float64, dt time.Duration) {
	st := &c.st
	now := levelOf(p)
	switch {
	case now > st.signalLevel:
		st.signalLevel = now
		st.levelCalm = 0
	case levelOf(relief) < st.signalLevel:
		st.levelCalm += dt
		if st.levelCalm >= c.cfg.RecoveryDelay {
			st.signalLevel = levelOf(relief)
			st.levelCalm = 0
		}
	default:
		st.levelCalm = 0
	}
}

// exchange publishes the local factor and fetches the shared one.
func (c *Controller) exchange(now time.Time) {
	if c.pub == nil {
		return
	}
	st := &c.st
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Interval/2)
	defer cancel()
	err := c.pub.Publish(ctx, st.local)
	if err != nil {
		err = fmt.Errorf("publishing the local factor: %w", err)
	} else {
		var shared float64
		shared, err = c.pub.Fetch(ctx)
		switch {
		case err != nil:
			err = fmt.Errorf("fetching the shared factor: %w", err)
		case math.IsNaN(shared) || shared <= 0:
			err = fmt.Errorf("fetching the shared factor: invalid factor %v", shared)
		default:
			st.shared = min(max(shared, c.cfg.Floor), 1)
			st.sharedAt = now
		}
	}
	if err != nil && !st.pubErr {
		c.log.Warn("adaptive: shared factor unavailable, using the local factor once the last one expires",
			zap.Error(err), zap.Duration("shared_max_age", c.cfg.SharedMaxAge))
	} else if err == nil && st.pubErr {
		c.log.Info("adaptive: shared factor available again")
	}
	st.pubErr = err != nil
}

func (c *Controller) logLevel(from Level, s Status) {
	fields := []zap.Field{
		zap.Stringer("from", from),
		zap.Stringer("to", s.Level),
		zap.Float64("factor", s.Factor),
		zap.Float64("local_factor", s.LocalFactor),
	}
	if s.Shared {
		fields = append(fields, zap.Float64("shared_factor", s.SharedFactor))
	}
	if s.CPU.Measured {
		fields = append(fields, zap.Float64("cpu_percent", round(s.CPU.Value, 1)))
	}
	if s.Memory.Measured {
		fields = append(fields, zap.Float64("memory_percent", round(s.Memory.Value, 1)))
	}
	if s.LatencyP99.Measured {
		fields = append(fields, zap.Duration("latency_p99", time.Duration(s.LatencyP99.Value*float64(time.Second)).Round(time.Millisecond)))
	}
	if s.ErrorRate.Measured {
		fields = append(fields, zap.Float64("error_percent", round(s.ErrorRate.Value, 2)))
	}
	fields = append(fields, zap.Uint64("window_requests", s.Requests))
	if len(s.Signals) > 0 {
		fields = append(fields, zap.Object("signals", signalsField(s.Signals)))
	}
	if worst := s.worst(); worst != "" {
		fields = append(fields, zap.String("worst", worst))
	}
	c.log.Info("adaptive: level changed", fields...)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// worst names the signal with the highest pressure among those that count,
// "" when none does.
func (s *Status) worst() string {
	name, p := "", math.Inf(-1)
	for _, b := range []struct {
		name string
		sig  *Signal
	}{{"cpu", &s.CPU}, {"memory", &s.Memory}, {"latency_p99", &s.LatencyP99}, {"error_rate", &s.ErrorRate}} {
		if b.sig.Counts && b.sig.Pressure > p {
			name, p = b.name, b.sig.Pressure
		}
	}
	for i := range s.Signals {
		if x := &s.Signals[i]; x.Counts && x.Pressure > p {
			name, p = x.Name, x.Pressure
		}
	}
	return name
}
