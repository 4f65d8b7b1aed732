package cascade

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/waiting"
)

// The handler's own reasons for a refusal before, or instead of, the
// engine's decision (engine.Reason* are the engine's): each is a value of
// {http.rate_limit.reason} and of the decisions metric's result label.
const (
	reasonMatcherError      = "matcher_error"       // a tree's matcher could not decide on the request
	reasonBadCost           = "bad_cost"            // the request's cost could not be read
	reasonBadIdempotencyKey = "bad_idempotency_key" // its idempotency key is malformed
	reasonBadForwarded      = "bad_forwarded"       // a decision endpoint's forwarded request is malformed
	reasonReducedCapacity   = "reduced_capacity"    // shed_at_floor: the adaptive factor is at its floor
)

// decision is what ServeHTTP learned about one request: the engine's
// decision, and why its cost could not be estimated if it could not. It
// lives on ServeHTTP's stack, its memory pooled (see engine.Decision).
type decision struct {
	engine.Decision
	inputErr  *cost.InputError
	model     string              // the model the request's body names, when a cost or key reads it
	body      peeked              // the start of the body, when a cost or key reads it
	fallback  string              // the model served instead of the one asked for (FallbackModels)
	refunded  bool                // charge_on gave back its charges: nothing to reconcile (set on charge_on's copy)
	recording bool                // its response is being recorded for replay (serveRecorded)
	ents      requestEntitlements // its entitlements, once looked up (plans)
	entry     *waiting.Entry      // an interactive request registered as waiting while it is decided (priority)
}

// atFloor tells whether the adaptive factor of this handler's class has
// been reduced all the way to its floor. A floor of 1 never reduces
// anything, so it never sheds.
func (h *Handler) atFloor() bool {
	f := h.controller.FactorFor(h.priority)
	return f < 1 && f <= h.controller.Config().Floor
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.stores.apply != nil && h.stores.apply.Load() != nil {
		if apply := h.stores.apply.Swap(nil); apply != nil {
			(*apply)() // this configuration is live: its store settings apply
		}
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if h.Forwarded != nil { // a decision endpoint: it answers itself
		if answered, err := h.serveForwarded(w, r); answered {
			return err
		}
		next = answer
	}
	if h.ShedAtFloor && h.Mode != engine.Warn && h.Mode != engine.Shadow && h.atFloor() {
		return h.shed(w, r, repl)
	}
	// The decision's duration on the monotonic clock alone: time.Now
	// reads the wall clock too, which time.Since does not.
	start := time.Since(h.epoch)
	var dv decision
	d := &dv
	defer d.Release()
	status, err := h.decide(r, repl, d)
	defer h.done(r, d) // concurrency slots and idempotency records, ended with the response
	took := time.Since(h.epoch) - start
	h.metrics.observe(d, took)
	if len(d.WouldBlock) > 0 { // trees not enforcing denied, beside trees that do
		h.metrics.wouldBlockedBeside(h.engine, d)
	}
	if h.alerting != nil && len(d.Results) > 0 {
		// Refused too: a charge reconciled after its response may have
		// taken a value over a threshold, and only shows now.
		h.checkAlerts(r.Context(), d)
	}
	if d.fallback != "" {
		w.Header().Set(fallbackHeader, d.fallback)
	}
	if len(h.Routes) > 0 {
		name := d.Route()
		if name == "" {
			name = h.storeName
		}
		h.metrics.observeStore(name, d, took)
	}
	// A request held for its turn (max_wait) publishes them whatever
	// Placeholders says: its wait may yet end in a refusal.
	if !h.quietAdmit || !admitted(d) || d.Wait > 0 {
		h.setPlaceholders(r, repl, d)
	}
	return h.serveDecided(w, r, next, d, status, err)
}

// serveDecided is the rest of ServeHTTP, once the request is decided: it
// answers, passes or refuses it. It is a function of its own so that
// ServeHTTP has few returns: Go open-codes the defers of a function only
// while its returns times its defers are at most 15, and otherwise
// registers and runs each through the runtime, on every request.
func (h *Handler) serveDecided(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision, status int, err error) error {
	if d.Reason == engine.ReasonStoreError {
		h.logStoreError(err)
		return h.storeFailed(w, r, next, d)
	}
	if status != 0 { // a client error before any decision (bad cost, a matcher's error)
		return h.undecided(w, r, next, d, status, err)
	}

	mode := d.Mode
	if d.Response != nil && mode != engine.Shadow && (d.Allowed || mode == engine.Warn) {
		return h.replay(w, r, d)
	}
	if d.Reason == engine.ReasonInFlight && mode == engine.Enforce {
		return h.refuseInFlight(w, r, d)
	}
	if !d.recording && d.KeepsResponse() {
		return h.serveRecorded(w, r, next, d)
	}
	if d.Allowed && d.Wait > 0 && mode == engine.Enforce {
		if answered, err := h.wait(w, r, next, d); answered {
			return err
		}
	}
	if mode != engine.Shadow {
		d.WriteHeaders(w.Header())
		if h.ownHeaders {
			w = keepOwnHeaders(w)
		}
		if d.Allowed && d.Request.Estimates != nil && h.showsCost {
			return h.passShowingCost(w, r, next, d, mode)
		}
	}
	return h.passOn(w, r, next, d, mode)
}

// passOn passes a decided request on (charged on its outcome, its costs
// reconciled, or as it is), or refuses it.
func (h *Handler) passOn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision, mode string) error {
	if h.ChargeOn != nil && d.Allowed && len(d.Limits) > 0 {
		return h.passChargedOn(w, r, next, d)
	}
	// Only a charged request has estimates to reconcile: a path with no
	// bucket (a tree whose matcher did not apply, tiers skipped or
	// unlimited) was charged nothing and is passed through untouched.
	if d.Allowed && len(d.Buckets) > 0 && d.Request.Estimates != nil && len(h.Costs) > 0 {
		if answered, err := h.passReconciled(w, r, next, d, nil); answered {
			return err
		}
	}
	if d.Allowed || d.Buckets == nil {
		return h.pass(w, r, next)
	}
	return h.refuse(w, r, next, d, mode)
}

// passChargedOn passes an admitted request charged only if its response
// matches charge_on (see chargedNext).
//
//go:noinline
func (h *Handler) passChargedOn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision) error {
	// charge_on's copy of d (which is on ServeHTTP's stack and must not
	// escape): it shares d's pooled memory, released when ServeHTTP
	// returns, after next.
	charged := new(decision)
	*charged = *d
	next = chargedNext{h: h, d: charged, next: next}
	if d.Allowed && len(d.Buckets) > 0 && d.Request.Estimates != nil && len(h.Costs) > 0 {
		if answered, err := h.passReconciled(w, r, next, d, charged); answered {
			return err
		}
	}
	return h.pass(w, r, next)
}

// badForwarded answers a decision endpoint's request whose forwarded
// request cannot be read.
//
//go:noinline
func (h *Handler) badForwarded(w http.ResponseWriter, r *http.Request, err error) error {
	d := &decision{Decision: engine.Decision{Reason: reasonBadForwarded, Closest: -1}}
	h.metrics.observe(d, 0)
	return h.problem(w, r, http.StatusBadRequest, d.Reason, "Bad Request", err.Error(), d)
}

// The rare paths of ServeHTTP are methods of their own, not inlined: their
// temporaries would otherwise enlarge the frame of every request's
// ServeHTTP, whose goroutine stack then grows (and is copied) again after
// each collection has shrunk it.

// shed answers a request of a traffic class shed at the adaptive floor.
//
//go:noinline
func (h *Handler) shed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	d := &decision{Decision: engine.Decision{Reason: reasonReducedCapacity, Closest: -1}}
	h.metrics.observe(d, 0)
	h.setPlaceholders(r, repl, d)
	w.Header().Set("Retry-After", strconv.FormatInt(engine.CeilSeconds(h.controller.Config().Interval), 10))
	return h.problem(w, r, http.StatusServiceUnavailable, "temporary_reduced_capacity", "Temporarily reduced capacity",
		"the upstream is unhealthy and this traffic class is shed until it recovers", d)
}

// undecided answers a request that could not be decided for a client's
// error (a bad cost, a matcher's error).
//
//go:noinline
func (h *Handler) undecided(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision, status int, err error) error {
	if !d.Enforcing { // no tree enforces: never change what clients get
		h.logger.Debug("rate limit not decided", zap.String("reason", d.Reason), zap.Error(h.engine.ShowError(err, d.Buckets)))
		return h.pass(w, r, next)
	}
	if ie := d.inputErr; ie != nil {
		return h.problem(w, r, status, ie.Type, ie.Title, ie.Detail, d)
	}
	return h.problem(w, r, status, d.Reason, http.StatusText(status), err.Error(), d)
}

// passReconciled passes an admitted request whose costs are reconciled
// with the upstream's response; answered is false when no cost of the
// request is tapped (it passes as any other).
//
//go:noinline
func (h *Handler) passReconciled(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d, charged *decision) (answered bool, err error) {
	if h.Forwarded != nil {
		// The upstream's response is the front end's to report.
		if h.Forwarded.Report != "" {
			h.awaitReport(w.Header(), d)
		}
		return true, h.pass(w, r, next)
	}
	t := h.tap(w, d.Buckets)
	if len(t.taps) == 0 {
		return false, nil
	}
	readableEncoding(r.Header)
	err = h.pass(t.w, r, next)
	if charged == nil || !charged.refunded {
		h.reconcile(t, d)
	}
	return true, err
}

// refuse answers a request its limits refused (or passes it, in shadow
// and warn modes).
//
//go:noinline
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision, mode string) error {
	d.NoteDenial(r.URL.Path, func() string { return requestID(r) })
	if mode == engine.Shadow || mode == engine.Warn {
		h.metrics.wouldBlocked(h.engine, d)
		return h.pass(w, r, next)
	}
	code := h.StatusCode
	if code == 0 {
		code = http.StatusTooManyRequests
	}
	detail := d.Detail()
	if h.UseErrorRoutes {
		return caddyhttp.Error(code, errors.New(detail))
	}
	if w, ew := h.refusalShowingCost(w, d); ew != nil { // extensions_cost
		err := h.problem(w, r, code, d.Reason, "Too Many Requests", detail, d)
		_ = ew.Close()
		return err
	}
	return h.problem(w, r, code, d.Reason, "Too Many Requests", detail, d)
}

// done ends what d holds while its request is in flight (concurrency
// slots, an idempotency record), if anything: the request's response has
// ended, or its client has gone.
func (h *Handler) done(r *http.Request, d *decision) {
	if !d.NeedsDone() {
		return
	}
	// Not cancelled with the request (its client may be gone); the store
	// bounds its own calls (Redis's timeout).
	d.Done(context.WithoutCancel(r.Context()))
}

// giveBack refunds a reservation that will not be used.
func (h *Handler) giveBack(ctx context.Context, d *decision) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := d.Refund(ctx)
	if err != nil {
		h.logger.Warn("rate limit: giving back a reservation failed; it stays charged", zap.Error(h.engine.ShowError(err, d.Buckets)))
	}
	return err
}

// logStoreError logs store failures at ERROR, at most once a second with
// the number of failures since the last line: a dead Redis under load must
// not turn every request into a log line.
func (h *Handler) logStoreError(err error) {
	ok, held := h.storeErrorLog.Allow(time.Now())
	if !ok {
		return
	}
	h.logger.Error("rate limit store failed", zap.Error(h.engine.ShowError(err, nil)), zap.Int64("failures", held+1),
		zap.String("on_store_error", h.onStoreError()))
}

// pass hands the request to the next handler and, when the adaptive
// controller is in use, records the latency and status of what it let
// through: the signals by which it judges the upstream's health. Only when
// the controller has such signals does it also count the request in flight
// and read the numbers the upstream reports in its response header.
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.controller == nil {
		return next.ServeHTTP(w, r)
	}
	if h.inFlight {
		h.controller.Begin()
		defer h.controller.Done()
	}
	sw := &statusWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, start: time.Now()}
	err := next.ServeHTTP(sw, r)
	status, latency := sw.status, sw.latency
	if status == 0 { // no response header written: the whole call
		latency = time.Since(sw.start)
	}
	if err != nil {
		status = errorStatus(err, http.StatusBadGateway)
	} else if status == 0 {
		status = http.StatusOK
	}
	h.controller.Record(latency, status)
	if h.readHeader {
		h.controller.RecordHeaders(sw.Header())
	}
	return err
}

// errorStatus is the status of a handler's error: its HandlerError's, or
// otherwise.
func errorStatus(err error, otherwise int) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return otherwise
}

// statusWriter remembers the status code of a response and how long the
// upstream took to send its header: the latency the adaptive controller
// records. A stream (an LLM's tokens, a WebSocket after its 101) then
// counts for how soon it started, not for how long it lasted.
type statusWriter struct {
	*caddyhttp.ResponseWriterWrapper
	start   time.Time
	status  int
	latency time.Duration // from start to the response header
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status, w.latency = code, time.Since(w.start)
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status, w.latency = http.StatusOK, time.Since(w.start)
	}
	return w.ResponseWriterWrapper.Write(b)
}

// storeFailed answers a request its store could not decide, by the
// policy of the store its path lives in: a routed tenant's route's, else
// the handler's (on_store_error local was decided in memory, not here).
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision) error {
	policy := d.OnStoreError
	if policy == "" {
		policy = h.onStoreError()
	}
	if policy == "allow" || !d.Enforcing {
		return h.pass(w, r, next)
	}
	w.Header().Set("Retry-After", "1")
	return h.problem(w, r, http.StatusServiceUnavailable, problemUnavailable, "Rate limit unavailable",
		"the rate limit store could not decide this request; try again shortly", d)
}

func (h *Handler) onStoreError() string {
	if h.OnStoreError == "" {
		return "deny"
	}
	return h.OnStoreError
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
