// Package cascade is a Caddy HTTP handler that enforces hierarchical,
// cost-weighted rate limits: every request must fit every limit of every
// tier on its path (organisation > team > user > agent, or any tree you
// describe), decided in one atomic step on an embedded store or on Redis.
//
// The request path (docs/architecture.md): estimate the cost, resolve the plan from
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
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	_ "github.com/caddy-cascade/cascade/admin" // the admin API and the rate-limit command: xcaddy builds this package only
	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/running"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/waiting"
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
	// unreachable or too slow): "deny" (default; 503 with Retry-After),
	// "allow" (the request passes, and the failure is logged and counted)
	// or "local" (Redis stores only: the request is decided in this
	// process's memory, each limit divided by LocalInstances, until Redis
	// answers again).
	OnStoreError string `json:"on_store_error,omitempty"`
	// LocalInstances is, for on_store_error local, how many instances
	// share the limits: each decides on its share while Redis is away.
	// Default (0): the instances counted live on the Redis store when it
	// last answered (each sends a heartbeat every second).
	LocalInstances int `json:"local_instances,omitempty"`

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

	// Priority is this handler's traffic class: "interactive" (default),
	// "batch" or "critical". The adaptive controller scales batch down
	// first and critical last (tiers marked adaptive). With MaxWait, a
	// batch request may wait only while no interactive (or critical)
	// request waits on any of its buckets, and one that does preempts the
	// batch requests held on its buckets: they give their reservations
	// back and are refused (429, problem type preempted), so interactive
	// requests are never held behind batch ones. Priority needs a tier
	// marked adaptive or MaxWait.
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

	// FingerprintSecret is the secret under which the values of sensitive
	// tiers (hierarchy.Tier.Sensitive: by default, a key that reads a
	// credential) are fingerprinted wherever a value is written out: logs,
	// the admin API. Placeholders such as {env.X} and {file.X} are
	// replaced; at least 16 bytes; never logged. The same secret on every
	// instance gives the same fingerprints. Default: a random secret kept
	// in the Redis store (made once, shared by the instances), or, on the
	// memory store, this process's own.
	FingerprintSecret string `json:"fingerprint_secret,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics (it
	// counts nothing). (mholt/caddy-ratelimit's setting of that name.)
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// DenialLog says how denials are logged: "values" (default: an INFO
	// line naming the tree, the tier and the key values refused), "no_values"
	// (the line without the values, for privacy) or "off". Either way the
	// first denial of a key per minute is logged, and the rest are counted
	// in one line a minute, so that a flood of denials cannot flood the log.
	DenialLog string `json:"denial_log,omitempty"`

	// Placeholders says which requests publish {http.rate_limit.*}:
	// "all" (the default) or "refused": only a request not admitted
	// (refused, passed over a limit in mode warn or shadow, or without a
	// decision: a missing key, a store error that on_store_error local did
	// not decide) or held for its turn (max_wait) publishes them, as
	// mholt/caddy-ratelimit publishes {http.rate_limit.exceeded.name}
	// only on a refusal. Publishing them takes a request an allocation (a
	// closure holding the values): "refused" spares admitted requests
	// that cost when nothing reads their placeholders. A handler that
	// publishes nothing leaves those of an earlier rate_limit handler of
	// the request as they were.
	Placeholders string `json:"placeholders,omitempty"`

	// SweepInterval is how often the memory store drops expired state;
	// default 1m. (Also mholt/caddy-ratelimit's setting of that name.)
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Forwarded makes this handler a decision endpoint for another proxy
	// (Traefik, nginx, Envoy): it decides the request the forwarded
	// headers describe and answers 200 or the refusal itself, without
	// calling the next handler. See ForwardedConfig.
	Forwarded *ForwardedConfig `json:"forwarded,omitempty"`

	// ChargeOn, when set, charges an admitted request only if its response
	// matches (status codes, a class such as 4 for 4xx, and headers, as
	// reverse_proxy's handle_response matchers): e.g. only failed logins
	// count. The request is decided up front as any other — a path whose
	// limit is spent is refused — and, when its response does not match,
	// given back everything it was charged, before the response leaves.
	ChargeOn *caddyhttp.ResponseMatcher `json:"charge_on,omitempty"`

	// MaxWait, when positive, holds a request that does not fit its GCRA
	// limits now but will within MaxWait instead of refusing it: its
	// charge is reserved in the decision (GCRA's reservation) and the
	// request is forwarded when its time comes, in order; one that would
	// wait longer is refused at once, with the Retry-After after which it
	// would be held no longer than MaxWait. A client that goes away while
	// held gives its reservation back.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
	// MaxQueued bounds the requests this handler holds at once (default
	// 1000 with MaxWait); beyond it a request that would wait is refused.
	MaxQueued int `json:"max_queued,omitempty"`

	// Stores are further stores by name, for Routes.
	Stores map[string]*StoreConfig `json:"stores,omitempty"`
	// Routes send the paths of some tenants to one of Stores (see
	// StoreRoute): their load and their store's failures stay theirs.
	Routes []*StoreRoute `json:"routes,omitempty"`

	// Idempotency, when set, charges a request with an idempotency key
	// once: its retries on the same path are admitted without a charge,
	// and a duplicate while it is in flight gets 409 (see
	// IdempotencyConfig).
	Idempotency *IdempotencyConfig `json:"idempotency,omitempty"`

	// Distributed and StorageRaw are mholt/caddy-ratelimit's file-synced
	// distribution. They are accepted so its configs load, and ignored
	// with a warning: the Redis store shares exact limits instead.
	Distributed json.RawMessage `json:"distributed,omitempty"`
	StorageRaw  json.RawMessage `json:"storage,omitempty"`

	trees      []*Tree
	etrees     []*engine.Tree // the engine's trees, in the order of trees
	engine     *engine.Engine
	costs      map[string]*Cost
	counted    map[string]countedAt    // Caddyfile parsing: where each non-request dimension is first counted
	applyStore *atomic.Pointer[func()] // store settings to apply at the first request (see StoreConfig.open)
	controller *adaptive.Controller    // nil unless a tier is adaptive
	priority   adaptive.Priority
	inFlight   bool // the controller has an in_flight signal: pass counts requests in flight
	readHeader bool // the controller has a response_header signal: pass reads the response header
	poolKey    string
	logger     *zap.Logger
	metrics    *metrics
	single     bool      // the requests are decided by engine.DecideSingle first
	quietAdmit bool      // placeholders refused: an admitted request publishes none
	epoch      time.Time // when provisioned: decisions are timed from it

	// refundable: a charge may be refunded once the response is known
	// (costs reconciled, reported to a decision endpoint, charge_on), so
	// it is never decided on a lease (see Decision.Refundable).
	refundable bool
	queued     *atomic.Int64     // requests held (MaxWait)
	waits      *waiting.Registry // the requests held by the handlers of this store (MaxWait)
	waitsKey   string
	batch      bool // Priority batch: gives way to interactive requests while waiting

	storeErrorLog *logsample.Every // store failures: one logged a second

	routeKeys  []string // the pool keys of the stores routes use
	unregister func()
	configDone <-chan struct{} // the Done channel of this handler's configuration's context
	company    *atomic.Int32   // whether other rate_limit handlers share the configuration (see alone)
	pending    *held           // decisions waiting for a usage report (Forwarded)
	local      *store.Memory   // on_store_error local's store
}

// Tree is a hierarchy.Tree with optional request matchers.
type Tree struct {
	hierarchy.Tree
	// MatcherSetsRaw limits the tree to matching requests (any set may match).
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
	dynamic  []bool   // per tier: does the key have placeholders?
	header   []string // per tier: the header name when the key is just {http.request.header.NAME}
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
	// Sensitive, as a tier's (hierarchy.Tier.Sensitive): nil detects it
	// from Key.
	Sensitive *bool `json:"sensitive,omitempty"`
}

// HeadersConfig switches the response header families. IETF and
// RetryAfter default to on, XRateLimit and OpenAI to off: every header
// costs each response its bytes, and the IETF pair says what the others
// say.
type HeadersConfig struct {
	// IETF writes RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers).
	IETF *bool `json:"ietf,omitempty"`
	// XRateLimit writes X-RateLimit-Limit, -Remaining and -Reset (off
	// unless set true).
	XRateLimit *bool `json:"x_ratelimit,omitempty"`
	// RetryAfter writes Retry-After on denials.
	RetryAfter *bool `json:"retry_after,omitempty"`
	// OpenAI writes x-ratelimit-{limit,remaining,reset}-{requests,tokens},
	// the headers LLM SDKs read.
	OpenAI bool `json:"openai,omitempty"`
}

// on is a family's setting, true when unset; set is one that is off when
// unset.
func on(b *bool) bool  { return b == nil || *b }
func set(b *bool) bool { return b != nil && *b }

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
	h.logger, h.epoch = ctx.Logger(), time.Now()
	h.quietAdmit = h.Placeholders == "refused"
	// A held request that goes away gives its reservation back: refundable.
	h.refundable = h.ChargeOn != nil || h.Forwarded != nil && h.Forwarded.Report != "" || h.MaxWait > 0 ||
		slices.ContainsFunc(h.Costs, func(c *Cost) bool { return c.Reconcile != nil })
	h.queued = new(atomic.Int64)
	if h.Idempotency != nil {
		if err := h.Idempotency.provision(); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
	}
	if h.MaxWait > 0 && h.MaxQueued == 0 {
		h.MaxQueued = 1000
	}
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
	h.etrees = make([]*engine.Tree, len(h.trees))
	for i, t := range h.trees {
		compiled[i] = &t.Tree
		h.etrees[i] = &engine.Tree{Tree: &t.Tree, IPv4Prefix: t.ipv4Prefix, IPv6Prefix: t.ipv6Prefix}
	}
	hierarchy.QualifyPolicies(compiled)
	h.costs = map[string]*Cost{}
	if h.Forwarded != nil {
		if err := h.provisionForwarded(ctx); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
	}
	for _, c := range h.Costs {
		if err := c.provision(); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
		if h.costs[c.Dimension] != nil {
			return fmt.Errorf("rate_limit: cost %s configured twice", c.Dimension)
		}
		h.costs[c.Dimension] = c
	}
	h.storeErrorLog = new(logsample.Every)
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
	h.poolKey = o.poolKey
	if err := h.provisionWaiting(o.redis); err != nil {
		return fmt.Errorf("rate_limit: max_wait: %w", err)
	}
	h.applyStore = new(atomic.Pointer[func()])
	if o.apply != nil {
		h.applyStore.Store(&o.apply)
	}
	dims := make([]string, len(h.Costs))
	for i, c := range h.Costs {
		dims[i] = c.Dimension
	}
	hc := h.Headers
	if hc == nil {
		hc = &HeadersConfig{}
	}
	routes, routedLocal, err := h.provisionRoutes(ctx)
	if err != nil {
		return fmt.Errorf("rate_limit: %w", err)
	}
	var local store.Store
	share := 1.0
	var instances func() int64
	if routedLocal && h.Store.Redis == nil && h.LocalInstances == 0 {
		return errors.New("rate_limit: a route's on_store_error local divides each limit among the instances sharing it: give local_instances <n>, or use a Redis store for the handler (whose heartbeats count them)")
	}
	if h.OnStoreError == "local" && h.Store.Redis == nil {
		return errors.New("rate_limit: on_store_error local decides in memory when Redis cannot: it needs store redis (the memory store does not fail)")
	}
	if routedLocal || h.OnStoreError == "local" {
		// The handler's paths, or only routed tenants', decide in memory
		// while their store fails: on each limit's local share, among the
		// instances the handler's store counts, or as many as given.
		h.local = store.NewMemory(store.MemoryOptions{Reserve: -1}) // deciding only while a store fails: nothing reserved
		local = h.local
		share = 1 / float64(max(h.LocalInstances, 1))
		if h.LocalInstances == 0 && o.presence != nil {
			o.presence.Start()
			instances = o.presence.Count
		}
	}
	fps, err := h.fingerprints(o.redis)
	if err != nil {
		return err
	}
	h.engine = engine.New(engine.Config{
		Local: local, LocalShare: share, LocalInstances: instances, Routes: routes, OnError: h.onStoreError(),
		Trees: h.etrees, Dimensions: dims,
		Store: o.Store, StoreName: o.name, Runtime: o.runtime, Top: o.top,
		Controller: h.controller, Priority: h.priority,
		Mode:    h.Mode,
		Headers: engine.Headers{IETF: on(hc.IETF), XRateLimit: set(hc.XRateLimit), RetryAfter: on(hc.RetryAfter), OpenAI: hc.OpenAI},
		Jitter:  h.Jitter, DenialLog: h.DenialLog, LogKey: h.LogKey, Fingerprints: fps, MaxWait: time.Duration(h.MaxWait),
		Idempotency: h.Idempotency.engineConfig(),
		Logger:      h.logger, Reconciled: h.metrics.reconcile,
	})
	// A handler that only counts requests, with one tree of one tier and
	// one limit on the memory store (see engine.Single).
	h.single = len(h.trees) == 1 && h.trees[0].matchers == nil && len(h.Costs) == 0 && h.Forwarded == nil &&
		h.engine.Single(h.etrees[0])
	h.unregister = running.Register(h.engine, ctx.Done())
	h.configDone, h.company = ctx.Done(), new(atomic.Int32)
	if srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv != nil && len(srv.NamedRoutes) > 0 {
		// A named route may be invoked twice in one request, running its
		// handlers twice: as with another handler, the later decision's
		// placeholders must show (see setPlaceholders).
		h.company.Store(companySome)
	}
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
		if h.ShedAtFloor {
			return errors.New("rate_limit: shed_at_floor needs a tier marked adaptive")
		}
		if h.Priority != "" && h.MaxWait <= 0 {
			return errors.New("rate_limit: priority needs a tier marked adaptive, or max_wait (batch requests then wait only while interactive ones do not)")
		}
		return nil
	}
	app, err := ctx.App("cascade")
	if err != nil {
		return fmt.Errorf("rate_limit: adaptive: %w", err)
	}
	h.controller = app.(*App).Controller()
	h.inFlight, h.readHeader = h.controller.CountsInFlight(), h.controller.ReadsHeaders()
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
			Name: name, Key: key, Missing: hierarchy.MissingShared, Sensitive: z.Sensitive,
			Limits: []*hierarchy.Limit{{
				Count: int64(z.MaxEvents), Per: time.Duration(z.Window).String(), Algorithm: string(rate.Sliding),
			}},
		}}},
		MatcherSetsRaw: z.MatcherSetsRaw,
		ipv4Prefix:     z.IPv4Prefix,
		ipv6Prefix:     z.IPv6Prefix,
	}, nil
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
	case "", "deny", "allow", "local":
	default:
		return fmt.Errorf("rate_limit: on_store_error %q: use deny, allow or local", h.OnStoreError)
	}
	routesLocal := slices.ContainsFunc(h.Routes, func(r *StoreRoute) bool { return r.OnStoreError == "local" })
	if h.LocalInstances < 0 || (h.LocalInstances > 0 && h.OnStoreError != "local" && !routesLocal) {
		return fmt.Errorf("rate_limit: local_instances %d: give a positive number, with on_store_error local", h.LocalInstances)
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
	switch h.Placeholders {
	case "", "all", "refused":
	default:
		return fmt.Errorf("rate_limit: placeholders %q: use all or refused", h.Placeholders)
	}
	if !(h.Jitter >= 0) || math.IsInf(h.Jitter, 1) { // written so that NaN fails
		return fmt.Errorf("rate_limit: jitter %v: use a non-negative fraction (0.2 is up to 20%%)", h.Jitter)
	}
	if h.StatusCode != 0 && (h.StatusCode < 400 || h.StatusCode > 599) {
		return fmt.Errorf("rate_limit: status_code %d: use a 4xx or 5xx code", h.StatusCode)
	}
	if h.MaxWait < 0 || h.MaxQueued < 0 {
		return fmt.Errorf("rate_limit: max_wait %v, max_queued %d: neither may be negative", time.Duration(h.MaxWait), h.MaxQueued)
	}
	if h.Forwarded != nil {
		for _, t := range h.trees {
			if t.Concurrent() {
				return fmt.Errorf("rate_limit: tree %s: a concurrency limit counts requests until their response ends, which a decision endpoint (forwarded) never sees: limit concurrency in a rate_limit in front of the upstream", t.Name)
			}
		}
	}
	if h.MaxWait > 0 && h.Forwarded != nil {
		return errors.New("rate_limit: max_wait holds the request in front of the upstream, which a decision endpoint (forwarded) is not: rate limit in front of the upstream instead")
	}
	if h.Idempotency != nil && h.Forwarded != nil {
		return errors.New("rate_limit: idempotency needs to see when a request ends, which a decision endpoint (forwarded) does not: rate limit in front of the upstream instead")
	}
	if h.ChargeOn != nil {
		if h.Forwarded != nil {
			return errors.New("rate_limit: charge_on needs the response, which a decision endpoint (forwarded) does not see: report it instead, or rate limit in front of the upstream")
		}
		if len(h.ChargeOn.StatusCode) == 0 && len(h.ChargeOn.Headers) == 0 {
			return errors.New("rate_limit: charge_on matches every response: give status codes (charge_on status 401 403) or headers")
		}
		for _, c := range h.ChargeOn.StatusCode {
			if !(c >= 1 && c <= 5 || c >= 100 && c <= 599) {
				return fmt.Errorf("rate_limit: charge_on status %d: use a status code (100-599) or a class (4xx)", c)
			}
		}
	}
	return nil
}

// Cleanup releases this config's hold on the store; the store itself lives
// on while a newer config uses it, so limits survive reloads.
func (h *Handler) Cleanup() error {
	if h.unregister != nil {
		h.unregister()
	}
	if h.engine != nil {
		h.engine.Close()
	}
	if h.local != nil {
		_ = h.local.Close()
	}
	if h.waitsKey != "" {
		_, _ = waitlists.Delete(h.waitsKey)
	}
	for _, k := range h.routeKeys {
		_, _ = stores.Delete(k)
	}
	if h.poolKey != "" {
		_, err := stores.Delete(h.poolKey)
		return err
	}
	return nil
}

// decision is what ServeHTTP learned about one request: the engine's
// decision, and why its cost could not be estimated if it could not. It
// lives on ServeHTTP's stack, its memory pooled (see engine.Decision).
type decision struct {
	engine.Decision
	inputErr *cost.InputError
	refunded bool           // charge_on gave back its charges: nothing to reconcile (set on charge_on's copy)
	entry    *waiting.Entry // an interactive request registered as waiting while it is decided (priority)
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
	if h.Forwarded != nil { // a decision endpoint: it answers itself
		if answered, err := h.serveForwarded(w, r); answered {
			return err
		}
		next = answer
	}
	if h.ShedAtFloor && h.engine.ConfiguredMode() == engine.Enforce && h.atFloor() {
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
	if len(h.Routes) > 0 {
		name := h.engine.RouteName(&d.Decision)
		if name == "" {
			name = h.engine.StoreName()
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
	if d.Reason == engine.ReasonInFlight && mode == engine.Enforce {
		return h.refuseInFlight(w, d)
	}
	if d.Allowed && d.Wait > 0 && mode == engine.Enforce {
		if answered, err := h.wait(w, r, next, d); answered {
			return err
		}
	}
	if mode != engine.Shadow {
		h.engine.WriteHeaders(w.Header(), &d.Decision)
	}
	if h.ChargeOn != nil && d.Allowed && len(d.Limits) > 0 {
		return h.passChargedOn(w, r, next, d)
	}
	// Only a charged request has estimates to reconcile: a path with no
	// bucket (a tree whose matcher did not apply, tiers skipped or
	// unlimited) was charged nothing and is passed through untouched.
	if d.Allowed && len(d.Buckets) > 0 && d.Estimates != nil && len(h.Costs) > 0 {
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
	if d.Allowed && len(d.Buckets) > 0 && d.Estimates != nil && len(h.Costs) > 0 {
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
func (h *Handler) badForwarded(w http.ResponseWriter, err error) error {
	d := &decision{Decision: engine.Decision{Reason: "bad_forwarded", Closest: -1}}
	h.metrics.observe(d, 0)
	return h.problem(w, http.StatusBadRequest, d.Reason, "Bad Request", err.Error(), d)
}

// The rare paths of ServeHTTP are methods of their own, not inlined: their
// temporaries would otherwise enlarge the frame of every request's
// ServeHTTP, whose goroutine stack then grows (and is copied) again after
// each collection has shrunk it.

// shed answers a request of a traffic class shed at the adaptive floor.
//
//go:noinline
func (h *Handler) shed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	d := &decision{Decision: engine.Decision{Reason: "reduced_capacity", Closest: -1}}
	h.metrics.observe(d, 0)
	h.setPlaceholders(r, repl, d)
	w.Header().Set("Retry-After", strconv.FormatInt(engine.CeilSeconds(h.controller.Config().Interval), 10))
	return h.problem(w, http.StatusServiceUnavailable, "temporary_reduced_capacity", "Temporarily reduced capacity",
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
		return h.problem(w, status, ie.Type, ie.Title, ie.Detail, d)
	}
	return h.problem(w, status, d.Reason, http.StatusText(status), err.Error(), d)
}

// wait holds an admitted request until its reserved time; answered tells
// whether its wait ended with an answer (err), or it goes on as decided.
//
//go:noinline
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision) (answered bool, err error) {
	outcome, retry := h.holdUntil(r, d)
	h.metrics.heldEnded(outcome)
	switch outcome {
	case "gone":
		return true, nil // the client went away while held: nothing to answer
	case "preempted", "yielded":
		return true, h.refuseBatch(w, outcome, retry, d)
	case "redecided": // decided again: answered as any decision
		if d.Reason == engine.ReasonStoreError {
			return true, h.storeFailed(w, r, next, d)
		}
	case "queue_full":
		retry := strconv.FormatInt(engine.CeilSeconds(d.Wait), 10)
		w.Header().Set("Retry-After", retry)
		return true, h.problem(w, http.StatusTooManyRequests, "queue_full", "Too Many Requests",
			"too many requests are waiting for their turn; retry in "+retry+" s", d)
	}
	return false, nil
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
			h.hold(w.Header(), d)
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
	h.engine.NoteDenial(&d.Decision, r.URL.Path)
	if mode == engine.Shadow || mode == engine.Warn {
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
	return h.problem(w, code, d.Reason, "Too Many Requests", detail, d)
}

// holdUntil keeps an admitted request until its reserved time (d.Wait), and
// says how its wait ended: "released" (it goes on), "queue_full" (MaxQueued
// requests are already held), "gone" (its client went away), "yielded" (a
// batch request while interactive ones wait on its buckets) or "preempted"
// (a held batch request whose place an interactive one took). Unless
// released, its reservation is given back, exactly once; retry is when a
// batch request refused may come back.
func (h *Handler) holdUntil(r *http.Request, d *decision) (outcome string, retry time.Duration) {
	if h.queued.Add(1) > int64(h.MaxQueued) {
		h.queued.Add(-1)
		d.entry.Leave()
		h.giveBack(r.Context(), d)
		return "queue_full", 0
	}
	defer h.queued.Add(-1)
	e, busy, victims := h.line(d)
	if busy > 0 {
		h.giveBack(r.Context(), d)
		return "yielded", busy
	}
	defer h.metrics.holdingNow()()
	if len(victims) > 0 {
		// An interactive request decided behind batch reservations (made
		// while it was decided), which it has preempted: once they are
		// given back, it takes its place again, ahead of them.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		_ = waiting.Wait(wctx, victims)
		cancel()
		if h.giveBack(r.Context(), d) != nil {
			// Still charged: not decided again (that would charge twice);
			// it waits as decided.
			victims = nil
		}
		var err error
		if victims != nil {
			err = h.engine.Redecide(r.Context(), &d.Decision, d.Estimates)
		}
		if victims != nil && (err != nil || !(d.Allowed && d.Wait > 0)) {
			e.Leave()
			if err != nil {
				h.logStoreError(err)
			}
			return "redecided", 0
		}
	}
	var preempted <-chan struct{}
	if e != nil {
		preempted = e.Preempted()
	}
	t := time.NewTimer(d.Wait)
	defer t.Stop()
	select {
	case <-t.C:
		if e.Go() {
			return "released", 0
		}
	case <-preempted:
	case <-r.Context().Done():
		if e.Go() {
			h.giveBack(r.Context(), d)
			return "gone", 0
		}
	}
	// Preempted (perhaps just as its time came or its client left): its
	// place goes to the interactive request, which waits for it.
	h.giveBack(r.Context(), d)
	e.GaveBack()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	return "preempted", time.Until(e.Retry(ctx)) // when the interactive requests will have gone
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
	h.engine.Done(context.WithoutCancel(r.Context()), &d.Decision)
}

// giveBack refunds a reservation that will not be used.
func (h *Handler) giveBack(ctx context.Context, d *decision) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := h.engine.Refund(ctx, &d.Decision)
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

// decide runs steps 1-4 of the request path: the trees that apply and
// their key values, the cost, then the engine's decision. A non-zero
// status means the request is refused before any decision (a client
// error), with err saying why.
func (h *Handler) decide(r *http.Request, repl *caddy.Replacer, d *decision) (int, error) {
	h.engine.Begin(&d.Decision)
	// One tree, tier and limit: most often decided without the general
	// path's layers (see engine.DecideSingle).
	var single string // with h.single, the value of its one tier's key
	if h.single {
		single = h.trees[0].value(r, repl, 0)
		d.Refundable = h.refundable
		if ok, err := h.engine.DecideSingle(r.Context(), &d.Decision, h.etrees[0], single); ok {
			return 0, err
		}
	}
	for i, t := range h.trees {
		if t.matchers != nil {
			match, err := t.matchers.AnyMatchWithError(r)
			if err != nil {
				// A matcher that cannot decide must not let the tree's
				// limits go unenforced (Caddy's deprecated AnyMatch would
				// say "no match"): the request is refused, with the
				// matcher's status if it gave one.
				d.Reason, d.Blocked, d.Enforcing, d.Mode = "matcher_error", t.Name, true, engine.Enforce
				return errorStatus(err, http.StatusInternalServerError), fmt.Errorf("the matcher of tree %s could not decide on this request: %w", t.Name, err)
			}
			if !match {
				continue
			}
		}
		values := d.Values()
		if h.single { // declined by DecideSingle: its value as read
			values = append(values, single)
		} else {
			for j := range t.Tiers {
				values = append(values, t.value(r, repl, j))
			}
		}
		if err := h.engine.Add(&d.Decision, h.etrees[i], values); err != nil {
			return http.StatusBadRequest, err
		}
	}
	var estimates []int64
	if len(d.Buckets) > 0 {
		var err error
		if estimates, err = h.estimate(r, repl, d.Buckets); err != nil {
			var ie *cost.InputError
			errors.As(err, &ie)
			d.Reason, d.Buckets, d.inputErr = "bad_cost", nil, ie
			return ie.Status, err
		}
	}
	// A charge that may be refunded is not decided on a lease.
	d.Refundable = h.refundable
	d.Untracked = h.Forwarded != nil // a decision endpoint never sees the response
	if h.Idempotency != nil && len(d.Buckets) > 0 {
		key, err := h.Idempotency.key(r)
		if err != nil {
			d.Reason, d.Buckets = "bad_idempotency_key", nil
			return http.StatusBadRequest, err
		}
		d.Idempotency = key
	}
	return 0, h.decideWaiting(r.Context(), d, estimates)
}

// value is the request's value of the key of tier j.
func (t *Tree) value(r *http.Request, repl *caddy.Replacer, j int) string {
	if t.header[j] != "" { // the common case, without the replacer's parsing
		return headerValue(r.Header[t.header[j]])
	}
	return resolveKey(repl, t.Tiers[j].Key, t.dynamic[j])
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
	return h.problem(w, http.StatusServiceUnavailable, problemUnavailable, "Rate limit unavailable",
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
