// Package cascade is a Caddy HTTP handler that enforces hierarchical,
// cost-weighted rate limits: every request must fit every limit of every
// tier on its path (organisation > team > user > agent, or any tree you
// describe), decided in one atomic step on an embedded store or on Redis.
//
// The request path (DESIGN.md §1): estimate the cost, resolve the plan from
// the trees, decide atomically in the store, write the headers, then either
// refuse (429 with a problem+json body) or pass the request on. This package
// is only the Caddy glue; the algorithms live in packages rate and store,
// the trees in hierarchy.
package cascade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/topk"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// Handler enforces hierarchical, cost-weighted rate limits.
//
// It is a superset of mholt/caddy-ratelimit: its `rate_limits` zones, `jitter`
// and `sweep_interval` keep their meaning, and its `distributed` and `storage`
// settings are accepted with a warning (use the Redis store instead).
type Handler struct {
	// Trees of limits. Every tree whose matchers match the request applies,
	// and the request must fit all of them: all or nothing.
	Trees []*Tree `json:"trees,omitempty"`

	// RateLimits are mholt/caddy-ratelimit zones by name: each is a
	// one-tier tree with a sliding window of max_events per window.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Costs say what a request costs in each dimension other than
	// "requests" (always 1). Every dimension counted by a limit needs one.
	Costs []*Cost `json:"costs,omitempty"`

	// Store holds the limits' state: the embedded memory store (default)
	// or Redis.
	Store *StoreConfig `json:"store,omitempty"`

	// OnStoreError is what happens when the store cannot decide (Redis
	// unreachable or too slow): "deny" (default; 503 with Retry-After) or
	// "allow" (the request passes, and the failure is logged and counted).
	OnStoreError string `json:"on_store_error,omitempty"`

	// Mode is "enforce" (default), "warn" (over-limit requests pass but
	// carry the headers) or "shadow" (over-limit requests pass silently;
	// decisions are only logged, counted and put in placeholders).
	Mode string `json:"mode,omitempty"`

	// Headers selects the response header families to write.
	Headers *HeadersConfig `json:"headers,omitempty"`

	// StatusCode of a denial; default 429.
	StatusCode int `json:"status_code,omitempty"`

	// UseErrorRoutes returns denials as Caddy errors, so `handle_errors`
	// routes can render them (mholt/caddy-ratelimit's behaviour), instead
	// of writing the problem+json body directly.
	UseErrorRoutes bool `json:"use_error_routes,omitempty"`

	// Priority is this handler's traffic class for the adaptive controller:
	// "interactive" (default), "batch" (scaled down first) or "critical"
	// (scaled down last). It matters only for tiers marked adaptive.
	Priority string `json:"priority,omitempty"`

	// ShedAtFloor answers 503 (problem type temporary-reduced-capacity)
	// while the adaptive factor of this handler's class is at its floor,
	// instead of admitting the floor's share of traffic. It never sheds
	// in mode warn or shadow, nor with a floor of 1 (nothing is reduced).
	ShedAtFloor bool `json:"shed_at_floor,omitempty"`

	// Jitter adds up to this fraction (0.2 = 20%, 1.5 = 150%) of random
	// time to Retry-After, so denied clients don't return in a herd. As in
	// mholt/caddy-ratelimit, it is a plain fraction with no upper bound.
	Jitter float64 `json:"jitter,omitempty"`

	// LogKey adds the bucket key that refused a request to its log line.
	// Off by default: keys hold client identities. (mholt/caddy-ratelimit's
	// setting of that name.)
	LogKey bool `json:"log_key,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics (it
	// counts nothing). (mholt/caddy-ratelimit's setting of that name.)
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// DenialLog says how denials are logged: "values" (default: an INFO
	// line naming the tree, the tier and the key values refused), "no_values"
	// (the line without the values, for privacy) or "off". Either way the
	// first denial of a key per minute is logged, and the rest are counted
	// in one line a minute, so that a flood of denials cannot flood the log.
	DenialLog string `json:"denial_log,omitempty"`

	// SweepInterval is how often the memory store drops expired state;
	// default 1m. (Also mholt/caddy-ratelimit's setting of that name.)
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Distributed and StorageRaw are mholt/caddy-ratelimit's file-synced
	// distribution. They are accepted so its configs load, and ignored
	// with a warning: the Redis store shares exact limits instead.
	Distributed json.RawMessage `json:"distributed,omitempty"`
	StorageRaw  json.RawMessage `json:"storage,omitempty"`

	trees       []*Tree
	costs       map[string]*Cost
	policies    map[*hierarchy.Limit]string // each limit's RateLimit-Policy item, unscaled
	counted     map[string]countedAt        // Caddyfile parsing: where each non-request dimension is first counted
	applyStore  *atomic.Pointer[func()]     // store settings to apply at the first request (see StoreConfig.open)
	headerCache *headerCache
	adjusting   *sync.WaitGroup      // reconciliations under way
	controller  *adaptive.Controller // nil unless a tier is adaptive
	priority    adaptive.Priority
	store       store.Store
	into        decideInto // the store, when it can decide into reused memory
	poolKey     string
	logger      *zap.Logger
	metrics     *metrics

	storeErrors      *atomic.Int64 // failures not yet logged
	storeErrorLogged *atomic.Int64 // when the last one was (unix ns)

	storeName   string           // the store's name in logs, metrics and the admin API
	runtime     *control.Runtime // overrides and modes set at runtime, kept in the store
	top         *topk.Sketch     // the most-denied keys of the store
	denials     *logsample.Sampler
	applying    *sync.Mutex // orders applyRuntime's calls
	unsubscribe func()
	unregister  func()
}

// Tree is a hierarchy.Tree with optional request matchers.
type Tree struct {
	hierarchy.Tree
	// MatcherSetsRaw limits the tree to matching requests (any set may match).
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
	// mode is the tree's mode set at runtime (admin API), nil when none
	// is: the handler's Mode applies.
	mode    atomic.Pointer[string]
	dynamic []bool   // per tier: does the key have placeholders?
	header  []string // per tier: the header name when the key is just {http.request.header.NAME}
	// ipv4Prefix and ipv6Prefix group an IP address key by network (an
	// mholt zone's settings; see Zone), for every tier of the tree.
	ipv4Prefix, ipv6Prefix int
}

// Zone is an mholt/caddy-ratelimit zone: at most MaxEvents requests per
// Window for each value of Key, in a sliding window.
type Zone struct {
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`
	Key            string                   `json:"key,omitempty"`
	Window         caddy.Duration           `json:"window,omitempty"`
	MaxEvents      int                      `json:"max_events,omitempty"`
	// IPv4Prefix and IPv6Prefix, when set (bits, 1–32 and 1–128; 0 is
	// unset), turn a
	// key that is an IP address of that family into its network, so that
	// a subnet shares one bucket: with ipv4_prefix 24, 192.0.2.7 and
	// 192.0.2.200 count as 192.0.2.0/24 (IPv4-mapped IPv6 addresses as
	// IPv4). Keys that are not an IP address are used as they are.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`
}

// HeadersConfig switches the response header families. All default to on
// except OpenAI.
type HeadersConfig struct {
	// IETF writes RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers).
	IETF *bool `json:"ietf,omitempty"`
	// XRateLimit writes X-RateLimit-Limit, -Remaining and -Reset.
	XRateLimit *bool `json:"x_ratelimit,omitempty"`
	// RetryAfter writes Retry-After on denials.
	RetryAfter *bool `json:"retry_after,omitempty"`
	// OpenAI writes x-ratelimit-{limit,remaining,reset}-{requests,tokens},
	// the headers LLM SDKs read.
	OpenAI bool `json:"openai,omitempty"`
}

func on(b *bool) bool { return b == nil || *b }

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets the handler up: compiles trees and zones, loads matchers,
// opens (or reuses, across config reloads) the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if len(h.Distributed) > 0 || len(h.StorageRaw) > 0 {
		h.logger.Warn("rate_limit: 'distributed' and 'storage' (mholt/caddy-ratelimit) are ignored; " +
			"to share exact limits across instances, use 'store redis { address ... }'")
	}
	h.trees = append(h.trees[:0], h.Trees...)
	names := make([]string, 0, len(h.RateLimits))
	for name := range h.RateLimits {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t, err := h.RateLimits[name].tree(name)
		if err != nil {
			return err
		}
		h.trees = append(h.trees, t)
	}
	if len(h.trees) == 0 {
		return errors.New("rate_limit: no limits configured: add a tree { tier ... } or a zone")
	}
	seen := map[string]bool{}
	for _, t := range h.trees {
		if seen[t.Name] {
			return fmt.Errorf("rate_limit: tree or zone %q defined twice", t.Name)
		}
		seen[t.Name] = true
		if err := t.Compile(); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
		h.warnCoarseWindows(t)
		t.dynamic = make([]bool, len(t.Tiers))
		t.header = make([]string, len(t.Tiers))
		for i, tier := range t.Tiers {
			t.dynamic[i] = strings.ContainsRune(tier.Key, '{')
			if !t.dynamic[i] && looksLikeHeader(tier.Key) {
				h.logger.Warn("rate_limit: a tier's key is a constant that looks like a header name: every request shares one bucket",
					zap.String("tree", t.Name), zap.String("tier", tier.Name), zap.String("key", tier.Key),
					zap.String("did_you_mean", "{header."+tier.Key+"}"))
			}
			for _, name := range hierarchy.BarePlaceholders(tier.Key) {
				h.logger.Warn("rate_limit: a key placeholder has no namespace: unless a handler before this one sets it (as map does), it is empty and every request is refused as having no key",
					zap.String("tree", t.Name), zap.String("tier", tier.Name), zap.String("key", tier.Key),
					zap.String("did_you_mean", "{header."+name+"}"))
			}
			if name, ok := strings.CutPrefix(tier.Key, "{http.request.header."); ok && strings.HasSuffix(name, "}") &&
				!strings.ContainsAny(name[:len(name)-1], "{}:") {
				t.header[i] = http.CanonicalHeaderKey(name[:len(name)-1])
			}
		}
		if t.MatcherSetsRaw != nil {
			mods, err := ctx.LoadModule(t, "MatcherSetsRaw")
			if err != nil {
				return fmt.Errorf("rate_limit: tree %s: loading matchers: %w", t.Name, err)
			}
			if err := t.matchers.FromInterface(mods); err != nil {
				return fmt.Errorf("rate_limit: tree %s: %w", t.Name, err)
			}
		}
	}
	compiled := make([]*hierarchy.Tree, len(h.trees))
	for i, t := range h.trees {
		compiled[i] = &t.Tree
	}
	hierarchy.QualifyPolicies(compiled)
	h.policies = policyItems(h.trees)
	h.headerCache = &headerCache{policies: h.policies}
	h.costs = map[string]*Cost{}
	for _, c := range h.Costs {
		if err := c.provision(); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
		if h.costs[c.Dimension] != nil {
			return fmt.Errorf("rate_limit: cost %s configured twice", c.Dimension)
		}
		h.costs[c.Dimension] = c
	}
	h.adjusting = new(sync.WaitGroup)
	h.storeErrors, h.storeErrorLogged = new(atomic.Int64), new(atomic.Int64)
	for _, c := range h.Costs {
		if !slices.ContainsFunc(h.trees, func(t *Tree) bool { return slices.Contains(t.Dimensions(), c.Dimension) }) {
			h.logger.Warn("rate_limit: no limit counts a cost's dimension: its cost is computed for nothing (a typo of a dimension's name?)",
				zap.String("cost", c.Dimension), zap.String("fix", "add a limit such as 'limit 1000 "+c.Dimension+"/h', or remove the cost"))
		}
	}
	for _, t := range h.trees {
		for _, dim := range t.Dimensions() {
			if dim != hierarchy.Requests && h.costs[dim] == nil {
				return fmt.Errorf("rate_limit: tree %s counts %s, but no cost says what a request costs in %s: add 'cost %s <number or placeholder>'",
					t.Name, dim, dim, dim)
			}
		}
	}
	if err := h.provisionAdaptive(ctx); err != nil {
		return err
	}
	var err error
	if !h.DisableMetrics {
		if h.metrics, err = newMetrics(ctx.GetMetricsRegistry()); err != nil {
			return fmt.Errorf("rate_limit: metrics: %w", err)
		}
	}
	if h.Store == nil {
		h.Store = &StoreConfig{}
	}
	o, err := h.Store.open(ctx, time.Duration(h.SweepInterval))
	if err != nil {
		return fmt.Errorf("rate_limit: store: %w", err)
	}
	h.store, h.poolKey, h.storeName, h.runtime, h.top = o.Store, o.poolKey, o.name, o.runtime, o.top
	h.into, _ = h.store.(decideInto)
	h.applyStore = new(atomic.Pointer[func()])
	if o.apply != nil {
		h.applyStore.Store(&o.apply)
	}
	if h.DenialLog != "off" {
		h.denials = logsample.New(time.Minute, 10000)
	}
	h.applying = new(sync.Mutex)
	if h.runtime != nil {
		// Subscribe applies the current state first, then every change.
		h.unsubscribe = h.runtime.Subscribe(h.applyRuntime)
	}
	h.unregister = admin.Register(h, ctx.Done())
	return nil
}

// provisionAdaptive connects the handler to the process's adaptive
// controller when any of its tiers opted in.
func (h *Handler) provisionAdaptive(ctx caddy.Context) error {
	var err error
	if h.priority, err = adaptive.ParsePriority(h.Priority); err != nil {
		return fmt.Errorf("rate_limit: priority: %w", err)
	}
	uses := false
	for _, t := range h.trees {
		for _, tier := range t.Tiers {
			uses = uses || tier.Adaptive
		}
	}
	if !uses {
		if h.ShedAtFloor || h.Priority != "" {
			return errors.New("rate_limit: priority and shed_at_floor need a tier marked adaptive")
		}
		return nil
	}
	app, err := ctx.App("cascade")
	if err != nil {
		return fmt.Errorf("rate_limit: adaptive: %w", err)
	}
	h.controller = app.(*App).Controller()
	return nil
}

// tree converts an mholt zone into a one-tier tree with a sliding window.
func (z *Zone) tree(name string) (*Tree, error) {
	if z.Window <= 0 || z.MaxEvents <= 0 {
		return nil, fmt.Errorf("rate_limit: zone %s: a zone requires both a window and max events (events N, window DURATION)", name)
	}
	if z.IPv4Prefix < 0 || z.IPv4Prefix > 32 {
		return nil, fmt.Errorf("rate_limit: zone %s: ipv4_prefix %d: use 1 to 32 bits (24 groups a /24), or 0 for none", name, z.IPv4Prefix)
	}
	if z.IPv6Prefix < 0 || z.IPv6Prefix > 128 {
		return nil, fmt.Errorf("rate_limit: zone %s: ipv6_prefix %d: use 1 to 128 bits (64 groups a /64), or 0 for none", name, z.IPv6Prefix)
	}
	key := z.Key
	if key == "" {
		key = "static"
	}
	return &Tree{
		Tree: hierarchy.Tree{Name: name, Tiers: []*hierarchy.Tier{{
			Name: name, Key: key, Missing: hierarchy.MissingShared,
			Limits: []*hierarchy.Limit{{
				Count: int64(z.MaxEvents), Per: time.Duration(z.Window).String(), Algorithm: string(rate.Sliding),
			}},
		}}},
		MatcherSetsRaw: z.MatcherSetsRaw,
		ipv4Prefix:     z.IPv4Prefix,
		ipv6Prefix:     z.IPv6Prefix,
	}, nil
}

// networkOf is key's network when key is an IP address of a family with a
// prefix set (an IPv4-mapped IPv6 address counts as IPv4), else key: what
// mholt/caddy-ratelimit does with ipv4_prefix and ipv6_prefix.
func networkOf(key string, ipv4Prefix, ipv6Prefix int) string {
	ip, err := netip.ParseAddr(key)
	if err != nil || ip.Zone() != "" {
		return key
	}
	bits := ipv6Prefix
	if ip.Is4() || ip.Is4In6() {
		ip, bits = ip.Unmap(), ipv4Prefix
	}
	if bits == 0 {
		return key
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}

// warnCoarseWindows warns of each exact sliding window above
// rate.MaxExact of a tree: it times charges in ticks rather than µs (see
// rate.Limit.Tick), which the user may not expect of an exact window.
func (h *Handler) warnCoarseWindows(t *Tree) {
	warn := func(tier *hierarchy.Tier, l *hierarchy.Limit) {
		r := l.Rate()
		if r.Algorithm != rate.Sliding || r.Count <= rate.MaxExact {
			return
		}
		h.logger.Warn(fmt.Sprintf("rate_limit: a sliding window of more than %d per window counts in ticks of 1/%d of the window: "+
			"it never admits more than its count, but a charge leaves the window up to one tick late", rate.MaxExact, rate.MaxExact),
			zap.String("tree", t.Name), zap.String("tier", tier.Name), zap.String("limit", l.String()),
			zap.Duration("tick", time.Duration(r.Tick())*time.Microsecond),
			zap.String("instead", "gcra (a rate and a burst, in constant memory) or sliding approx (constant memory, may admit up to twice the count in a window)"))
	}
	for tier, l := range t.Limits() {
		warn(tier, l)
	}
}

// Validate checks the settings that Provision does not.
func (h *Handler) Validate() error {
	switch h.OnStoreError {
	case "", "deny", "allow":
	default:
		return fmt.Errorf("rate_limit: on_store_error %q: use deny or allow", h.OnStoreError)
	}
	switch h.Mode {
	case "", "enforce", "warn", "shadow":
	default:
		return fmt.Errorf("rate_limit: mode %q: use enforce, warn or shadow", h.Mode)
	}
	switch h.DenialLog {
	case "", "values", "no_values", "off":
	default:
		return fmt.Errorf("rate_limit: denial_log %q: use values, no_values or off", h.DenialLog)
	}
	if !(h.Jitter >= 0) || math.IsInf(h.Jitter, 1) { // written so that NaN fails
		return fmt.Errorf("rate_limit: jitter %v: use a non-negative fraction (0.2 is up to 20%%)", h.Jitter)
	}
	if h.StatusCode != 0 && (h.StatusCode < 400 || h.StatusCode > 599) {
		return fmt.Errorf("rate_limit: status_code %d: use a 4xx or 5xx code", h.StatusCode)
	}
	return nil
}

// Cleanup releases this config's hold on the store; the store itself lives
// on while a newer config uses it, so limits survive reloads.
func (h *Handler) Cleanup() error {
	if h.unregister != nil {
		h.unregister()
	}
	if h.unsubscribe != nil {
		h.unsubscribe()
	}
	if h.adjusting != nil {
		h.adjusting.Wait()
	}
	if h.poolKey != "" {
		_, err := stores.Delete(h.poolKey)
		return err
	}
	return nil
}

// decision is what ServeHTTP learned about one request. It lives on
// ServeHTTP's stack; its slices point into scratch, pooled memory that is
// recycled when ServeHTTP returns, so nothing may keep them beyond the
// request (the placeholders keep a copy of what they show).
type decision struct {
	buckets   []hierarchy.Bucket
	costs     []int64 // per bucket
	estimates []int64 // per configured cost
	store.Decision
	limits   []store.Bucket   // the effective limits decided (scaled by the adaptive factor)
	scaled   bool             // some limit was scaled by the adaptive factor
	inputErr *cost.InputError // why the request's cost could not be estimated

	mode      string // the mode that applies to the response: enforce, warn or shadow
	enforcing bool   // some tree that applies to the request enforces its limits

	reason  string // ok | limited | impossible | missing_key | store_error | bad_cost | matcher_error
	blocked string // tree/tier of the first denying bucket
	closest int    // index of the bucket closest to exhaustion, -1 if none
	retry   time.Duration

	scratch *scratch // nil until decide takes one
	used    int      // buckets of scratch written to
}

// scratch is the memory of one decision's slices, reused across requests
// so that the common path (up to 8 buckets) allocates none of it.
type scratch struct {
	buckets [8]hierarchy.Bucket
	limits  [8]store.Bucket
	costs   [8]int64
	results [8]rate.Result
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// release gives the decision's scratch memory back to the pool, cleared
// of the pointers it held (keys, limits) so the pool retains nothing.
func (d *decision) release() {
	sc := d.scratch
	if sc == nil {
		return
	}
	n := min(d.used, len(sc.buckets))
	clear(sc.buckets[:n])
	clear(sc.limits[:n])
	d.scratch, d.buckets, d.limits, d.costs, d.Results = nil, nil, nil, nil, nil
	scratchPool.Put(sc)
}

// looksLikeHeader tells whether a constant key is probably a header name
// written without its placeholder (tier user X-User).
func looksLikeHeader(key string) bool {
	if len(key) > 2 && strings.EqualFold(key[:2], "x-") {
		return true
	}
	switch strings.ToLower(key) {
	case "authorization", "cookie", "host", "user-agent", "x-forwarded-for":
		return true
	}
	return false
}

// atFloor tells whether the adaptive factor of this handler's class has
// been reduced all the way to its floor. A floor of 1 never reduces
// anything, so it never sheds.
func (h *Handler) atFloor() bool {
	f := h.controller.FactorFor(h.priority)
	return f < 1 && f <= h.controller.Config().Floor
}

// decideInto is implemented by stores that can write a decision's results
// into memory the caller reuses (the memory store).
type decideInto interface {
	DecideInto(ctx context.Context, buckets []store.Bucket, results []rate.Result) (store.Decision, error)
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.applyStore != nil && h.applyStore.Load() != nil {
		if apply := h.applyStore.Swap(nil); apply != nil {
			(*apply)() // this configuration is live: its store settings apply
		}
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if h.ShedAtFloor && h.configuredMode() == "enforce" && h.atFloor() {
		d := &decision{reason: "reduced_capacity", closest: -1}
		h.metrics.observe(d, 0)
		h.setPlaceholders(r, repl, d)
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(h.controller.Config().Interval), 10))
		return h.problem(w, http.StatusServiceUnavailable, "temporary_reduced_capacity", "Temporarily reduced capacity",
			"the upstream is unhealthy and this traffic class is shed until it recovers", d)
	}
	start := time.Now()
	var dv decision
	d := &dv
	defer d.release()
	status, err := h.decide(r, repl, d)
	h.metrics.observe(d, time.Since(start))
	h.setPlaceholders(r, repl, d)

	if d.reason == "store_error" {
		h.logStoreError(err)
		if h.onStoreError() == "allow" || !d.enforcing {
			return h.pass(w, r, next)
		}
		w.Header().Set("Retry-After", "1")
		return h.problem(w, http.StatusServiceUnavailable, problemUnavailable, "Rate limit unavailable",
			"the rate limit store could not decide this request; try again shortly", d)
	}
	if status != 0 { // a client error before any decision (bad cost, a matcher's error)
		if !d.enforcing { // no tree enforces: never change what clients get
			h.logger.Debug("rate limit not decided", zap.String("reason", d.reason), zap.Error(err))
			return h.pass(w, r, next)
		}
		if ie := d.inputErr; ie != nil {
			return h.problem(w, status, ie.Type, ie.Title, ie.Detail, d)
		}
		return h.problem(w, status, d.reason, http.StatusText(status), err.Error(), d)
	}

	mode := d.mode
	if mode != "shadow" {
		h.writeHeaders(w.Header(), d)
	}
	// Only a charged request has estimates to reconcile: a path with no
	// bucket (a tree whose matcher did not apply, tiers skipped or
	// unlimited) was charged nothing and is passed through untouched.
	if d.Allowed && len(d.buckets) > 0 && d.estimates != nil && len(h.Costs) > 0 {
		t := h.tap(w, d.buckets)
		if len(t.taps) > 0 {
			readableEncoding(r.Header)
			err := h.pass(t.w, r, next)
			h.reconcile(t, d)
			return err
		}
	}
	if d.Allowed || d.buckets == nil {
		return h.pass(w, r, next)
	}
	h.noteDenial(r, d)
	if mode == "shadow" || mode == "warn" {
		return h.pass(w, r, next)
	}
	code := h.StatusCode
	if code == 0 {
		code = http.StatusTooManyRequests
	}
	detail := "the " + d.blocked + " limit is exhausted"
	if d.reason == "impossible" {
		detail = "this request costs more than the " + d.blocked + " limit can ever admit"
	} else {
		detail += "; retry in " + strconv.FormatInt(ceilSeconds(d.retry), 10) + " s"
	}
	if h.UseErrorRoutes {
		return caddyhttp.Error(code, errors.New(detail))
	}
	return h.problem(w, code, d.reason, "Too Many Requests", detail, d)
}

// logStoreError logs store failures at ERROR, at most once a second with
// the number of failures since the last line: a dead Redis under load must
// not turn every request into a log line.
func (h *Handler) logStoreError(err error) {
	n := h.storeErrors.Add(1)
	now := time.Now().UnixNano()
	last := h.storeErrorLogged.Load()
	if now-last < int64(time.Second) || !h.storeErrorLogged.CompareAndSwap(last, now) {
		return
	}
	h.storeErrors.Add(-n)
	h.logger.Error("rate limit store failed", zap.Error(err), zap.Int64("failures", n),
		zap.String("on_store_error", h.onStoreError()))
}

// pass hands the request to the next handler and, when the adaptive
// controller is in use, records the latency and status of what it let
// through: the signals by which it judges the upstream's health.
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.controller == nil {
		return next.ServeHTTP(w, r)
	}
	sw := &statusWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, start: time.Now()}
	err := next.ServeHTTP(sw, r)
	status, latency := sw.status, sw.latency
	if status == 0 { // no response header written: the whole call
		latency = time.Since(sw.start)
	}
	if err != nil {
		status = http.StatusBadGateway
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			status = he.StatusCode
		}
	} else if status == 0 {
		status = http.StatusOK
	}
	h.controller.Record(latency, status)
	return err
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

// decide runs steps 1-4 of the request path. A non-zero status means the
// request is refused before any decision (a client error), with err saying why.
func (h *Handler) decide(r *http.Request, repl *caddy.Replacer, d *decision) (int, error) {
	// The slices below live in pooled scratch memory unless the path is
	// unusually long.
	d.closest = -1
	sc := scratchPool.Get().(*scratch)
	d.scratch = sc
	plan := hierarchy.Plan{Buckets: sc.buckets[:0]}
	var valueBuf [8]string
	lenient := "" // the mode of the trees that apply and do not enforce (warn over shadow)
	for _, t := range h.trees {
		if t.matchers != nil {
			match, err := t.matchers.AnyMatchWithError(r)
			if err != nil {
				// A matcher that cannot decide must not let the tree's
				// limits go unenforced (Caddy's deprecated AnyMatch would
				// say "no match"): the request is refused, with the
				// matcher's status if it gave one.
				d.reason, d.blocked, d.enforcing, d.mode = "matcher_error", t.Name, true, "enforce"
				status := http.StatusInternalServerError
				var he caddyhttp.HandlerError
				if errors.As(err, &he) && he.StatusCode != 0 {
					status = he.StatusCode
				}
				return status, fmt.Errorf("the matcher of tree %s could not decide on this request: %w", t.Name, err)
			}
			if !match {
				continue
			}
		}
		mode := h.treeMode(t)
		values := valueBuf[:0]
		for i, tier := range t.Tiers {
			var v string
			if t.header[i] != "" { // the common case, without the replacer's parsing
				v = headerValue(r.Header[t.header[i]])
			} else {
				v = resolveKey(repl, tier.Key, t.dynamic[i])
			}
			if t.ipv4Prefix != 0 || t.ipv6Prefix != 0 {
				v = networkOf(v, t.ipv4Prefix, t.ipv6Prefix)
			}
			values = append(values, v)
		}
		before := len(plan.Buckets)
		t.Resolve(values, &plan)
		d.used = max(d.used, len(plan.Buckets))
		if plan.MissingTier != nil {
			if mode != "enforce" {
				// A tree that does not enforce never refuses a request:
				// it leaves this one out.
				plan.Buckets, plan.MissingTier = plan.Buckets[:before], nil
				continue
			}
			d.reason, d.enforcing, d.mode = "missing_key", true, "enforce"
			d.blocked = t.Name + "/" + plan.MissingTier.Name
			return http.StatusBadRequest, fmt.Errorf("this request has no %s: its %s key (%s) is empty, and the tier refuses requests without it",
				plan.MissingTier.Name, d.blocked, plan.MissingTier.Key)
		}
		if mode == "enforce" {
			d.enforcing = true
		} else if lenient != "warn" {
			lenient = mode
		}
	}
	d.mode = "enforce"
	if !d.enforcing && lenient != "" {
		d.mode = lenient
	}
	d.buckets = plan.Buckets
	if len(d.buckets) == 0 {
		d.Allowed, d.reason = true, "ok"
		return 0, nil
	}

	costs, err := h.estimate(r, repl, d.buckets)
	if err != nil {
		var ie *cost.InputError
		errors.As(err, &ie)
		d.reason, d.buckets, d.inputErr = "bad_cost", nil, ie
		return ie.Status, err
	}
	d.estimates = costs
	sb := sized(sc.limits[:], len(d.buckets))
	d.costs = sized(sc.costs[:], len(d.buckets))
	for i, b := range d.buckets {
		d.costs[i] = 1
		for j, c := range h.Costs {
			if c.Dimension == b.Limit.Dimension {
				d.costs[i] = costs[j]
			}
		}
		sb[i] = store.Bucket{Key: b.Key, Limit: b.Limit.Rate(), Cost: d.costs[i]}
		if b.Tier.Adaptive && h.controller != nil {
			lim := &sb[i].Limit
			*lim = scale(*lim, h.controller.FactorFor(h.priority))
			d.scaled = d.scaled || lim.Count != b.Limit.Rate().Count || lim.Burst != b.Limit.Rate().Burst
		}
	}
	d.limits = sb
	if err := h.settle(r.Context(), d, sc); err != nil {
		d.reason = "store_error"
		return 0, err
	}
	switch {
	case d.Allowed:
	case d.mode == "enforce" && lenient != "":
		if err := h.enforceOnly(r.Context(), d); err != nil {
			d.reason = "store_error"
			return 0, err
		}
	case d.mode != "enforce" && d.closest >= 0:
		// No tree enforces: the denying tree's mode says what the client
		// sees (a shadow tree's denial shows nothing, even beside a tree
		// in warn).
		d.mode = h.treeMode(h.treeOf(d.buckets[d.closest].Tree))
	}
	return 0, nil
}

// settle decides d's buckets (limits) in the store and reads the verdict:
// the reason, the bucket that denied or is closest to exhaustion, the
// retry.
func (h *Handler) settle(ctx context.Context, d *decision, sc *scratch) error {
	var res store.Decision
	var err error
	if h.into != nil && sc != nil {
		res, err = h.into.DecideInto(ctx, d.limits, sc.results[:])
	} else {
		res, err = h.store.Decide(ctx, d.limits)
	}
	if err != nil {
		return err
	}
	d.Decision = res
	if res.Impossible && d.scaled {
		h.reducedNotImpossible(d)
	}
	d.closest = closest(d)
	switch {
	case d.Allowed:
		d.reason = "ok"
	case d.Impossible:
		d.reason = "impossible"
	default:
		d.reason = "limited"
	}
	if !d.Allowed {
		for i, rr := range d.Results {
			if !rr.Allowed {
				b := d.buckets[i]
				d.blocked = b.Tree.Name + "/" + b.Tier.Name
				d.closest = i
				break
			}
		}
		d.retry = d.RetryAfter
		if h.Jitter > 0 && d.retry > 0 {
			d.retry += time.Duration(rand.Float64() * h.Jitter * float64(d.retry))
		}
	}
	return nil
}

// enforceOnly handles a denial on a path where trees of different modes
// apply. A bucket of an enforcing tree that denies is a denial. But when
// only trees in warn or shadow mode denied, the request must still be
// charged to the enforcing trees, as it would be without the others (all
// or nothing charged it nowhere): it is decided again on the enforcing
// trees' buckets alone, a second store call on this rare path only.
func (h *Handler) enforceOnly(ctx context.Context, d *decision) error {
	for i, rr := range d.Results {
		if !rr.Allowed && h.treeMode(h.treeOf(d.buckets[i].Tree)) == "enforce" {
			return nil // an enforcing tree denied: that is the answer
		}
	}
	var buckets []hierarchy.Bucket
	var limits []store.Bucket
	var costs []int64
	for i, b := range d.buckets {
		if h.treeMode(h.treeOf(b.Tree)) == "enforce" {
			buckets = append(buckets, b)
			limits = append(limits, d.limits[i])
			costs = append(costs, d.costs[i])
		}
	}
	if ce := h.logger.Check(zap.DebugLevel, "rate limited by a tree that does not enforce"); ce != nil {
		ce.Write(zap.String("blocked_by", d.blocked), zap.String("reason", d.reason))
	}
	d.buckets, d.limits, d.costs, d.blocked, d.retry = buckets, limits, costs, "", 0
	d.Decision = store.Decision{}
	if len(buckets) == 0 {
		d.Allowed, d.reason, d.closest = true, "ok", -1
		return nil
	}
	return h.settle(ctx, d, nil)
}

// treeOf returns the handler's Tree whose hierarchy.Tree t is.
func (h *Handler) treeOf(t *hierarchy.Tree) *Tree {
	for _, ht := range h.trees {
		if &ht.Tree == t {
			return ht
		}
	}
	return nil
}

// configuredMode is the handler's Mode, "enforce" when unset.
func (h *Handler) configuredMode() string {
	if h.Mode == "" {
		return "enforce"
	}
	return h.Mode
}

// treeMode is the mode in force for tree t: the runtime mode set through
// the admin API, else the handler's.
func (h *Handler) treeMode(t *Tree) string {
	if t != nil {
		if m := t.mode.Load(); m != nil {
			return *m
		}
	}
	return h.configuredMode()
}

// reducedNotImpossible turns an "impossible" decision back into a plain
// denial when only the adaptive factor makes the cost exceed a capacity: the
// limit is reduced for now, not too small for this request for ever, and a
// client told "impossible" would give up for good. It is retried no sooner
// than the controller's next sample, when the factor may rise.
func (h *Handler) reducedNotImpossible(d *decision) {
	retry := int64(h.controller.Config().Interval / time.Microsecond)
	for i := range d.Results {
		rr := &d.Results[i]
		if rr.Impossible {
			if d.costs[i] > d.buckets[i].Limit.Rate().Capacity() {
				return // impossible even at full capacity
			}
		}
		if !rr.Allowed && rr.RetryAfter > retry {
			retry = rr.RetryAfter
		}
	}
	for i := range d.Results {
		if d.Results[i].Impossible {
			d.Results[i].Impossible, d.Results[i].RetryAfter = false, retry
		}
	}
	d.Impossible, d.RetryAfter = false, time.Duration(retry)*time.Microsecond
}

// sized returns buf cut to n, or a new slice when buf is too short.
func sized[T any](buf []T, n int) []T {
	if n <= len(buf) {
		return buf[:n]
	}
	return make([]T, n)
}

// scale returns a limit with its count and burst multiplied by factor
// (at least 1). GCRA keeps its period, so the refill rate scales too.
func scale(l rate.Limit, factor float64) rate.Limit {
	if factor >= 1 {
		return l
	}
	mul := func(n int64) int64 {
		if n == 0 {
			return 0
		}
		return max(1, int64(float64(n)*factor))
	}
	l.Count, l.Burst = mul(l.Count), mul(l.Burst)
	return l
}

// headerValue is what {http.request.header.NAME} resolves to: the values
// joined with commas.
func headerValue(vals []string) string {
	switch len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	}
	return strings.Join(vals, ",")
}

// resolveKey resolves a tier's key template. A key is missing (empty) when
// any placeholder in it resolves to empty: "user-{header}" without the
// header must not become one shared "user-" bucket.
func resolveKey(repl *caddy.Replacer, tmpl string, dynamic bool) string {
	if !dynamic {
		return tmpl
	}
	empty := false
	out, err := repl.ReplaceFunc(tmpl, func(_ string, val any) (any, error) {
		switch v := val.(type) {
		case nil:
			empty = true
		case string:
			empty = empty || v == ""
		case []string: // header values
			empty = empty || len(v) == 0 || v[0] == ""
		}
		return val, nil
	})
	if err != nil || empty {
		return ""
	}
	return out
}

// resolveCost turns a cost template into a non-negative integer.
func resolveCost(repl *caddy.Replacer, tmpl string, def *int64) (int64, error) {
	s := strings.TrimSpace(repl.ReplaceAll(tmpl, ""))
	if s == "" {
		if def != nil {
			return *def, nil
		}
		return 0, fmt.Errorf("resolved to nothing (is the header or placeholder set?)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative integer", truncate(s, 32))
	}
	return n, nil
}

// closest picks the bucket nearest to exhaustion: the lowest fraction of
// its capacity remaining, the longest reset on a tie.
func closest(d *decision) int {
	best, bestFrac := -1, 2.0
	for i, r := range d.Results {
		frac := float64(r.Remaining) / float64(d.limits[i].Limit.Capacity())
		if frac < bestFrac || (frac == bestFrac && r.Reset > d.Results[best].Reset) {
			best, bestFrac = i, frac
		}
	}
	return best
}

func (h *Handler) onStoreError() string {
	if h.OnStoreError == "" {
		return "deny"
	}
	return h.OnStoreError
}

func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
