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
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	_ "github.com/caddy-cascade/cascade/admin" // the admin API and the rate-limit command: xcaddy builds this package only
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
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

	// Alerts says where the alerts of limits with thresholds go (see
	// hierarchy.Limit.Alerts): a log line always, a webhook when set.
	Alerts *AlertsConfig `json:"alerts,omitempty"`

	// Entitlements are the sources a tree's plan is looked up from, by a
	// tier's value (see EntitlementsConfig and docs/plans.md).
	Entitlements []*EntitlementsConfig `json:"entitlements,omitempty"`

	// FallbackModels, per model a request asks for, are the models to
	// serve it instead, in order, when its path is refused by a limit of
	// its model (a tier keyed on {http.rate_limit.model}) or of money: the
	// first that the limits admit is served (the body's model rewritten,
	// every other byte kept) and charged; the refused decisions charge
	// nothing. The response says so in Cascade-Fallback-Model.
	FallbackModels map[string][]string `json:"fallback_models,omitempty"`

	// RetryWithin is the longest Retry-After a client's SDK should sleep
	// through on its own (default 1m): a refusal that asks for a longer
	// wait, or that waiting cannot help, says x-should-retry: false.
	RetryWithin caddy.Duration `json:"retry_within,omitempty"`

	// RefusalBody is the body of the handler's refusals: "problem"
	// (default: RFC 9457 problem+json), "openai" or "anthropic" (the
	// provider API's error object, which its official SDKs read).
	RefusalBody string `json:"refusal_body,omitempty"`

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

	// What provisioning made of the configuration, read by every request.
	trees          []*Tree
	etrees         []*engine.Tree // the engine's trees, in the order of trees
	engine         *engine.Engine
	costs          map[string]*Cost
	controller     *adaptive.Controller // nil unless a tier is adaptive
	priority       adaptive.Priority
	inFlight       bool // the controller has an in_flight signal: pass counts requests in flight
	readHeader     bool // the controller has a response_header signal: pass reads the response header
	logger         *zap.Logger
	metrics        *metrics
	direct         bool            // one tree, no matcher, nothing to decide but its path: decide skips the general steps
	storeName      string          // the engine's store, in metrics (Config().StoreName)
	money          map[string]bool // the money dimensions (moneyDimensions)
	matchesModel   bool            // a tree's matcher reads {http.rate_limit.model}: a body whose model cannot be read is refused
	ownHeaders     bool            // the headers include families an upstream writes too (x_ratelimit, openai, anthropic): Cascade's win
	showsCost      bool            // some cost shows what a request costs (charged_header, extensions_cost)
	modelBodyLimit int64           // the most of a body read for its model (readModel)
	readsModel     bool            // a tier's key or a tree's matcher reads {http.rate_limit.model}: decide reads the body's model first
	quietAdmit     bool            // placeholders refused: an admitted request publishes none
	epoch          time.Time       // when provisioned: decisions are timed from it
	// refundable: a charge may be refunded once the response is known
	// (costs reconciled, reported to a decision endpoint, charge_on), so
	// it is never decided on a lease (see engine.Request.Refundable).
	refundable bool

	stores        storeHandles
	waiting       waitLine
	alerting      *alerting        // nil unless a limit has alert thresholds
	plans         *planState       // nil unless entitlements are configured
	reports       *pendingReports  // the decision endpoint's decisions waiting for their usage reports (Forwarded)
	storeErrorLog *logsample.Every // store failures: one logged a second
	config        configShare

	counted  map[string]countedAt // Caddyfile parsing: where each non-request dimension is first counted
	decimals []countedAt          // Caddyfile parsing: the limits with a decimal count (money only)
}

// storeHandles are the stores a handler opened, in the pool shared across
// reloads.
type storeHandles struct {
	poolKey   string
	routeKeys []string                // the pool keys of the named stores (routes, entitlements sources) use
	apply     *atomic.Pointer[func()] // store settings to apply at the first request (see StoreConfig.open)
	local     *store.Memory           // on_store_error local's store
}

// waitLine is where a handler's admitted requests wait their turn
// (MaxWait).
type waitLine struct {
	queued   *atomic.Int64     // requests waiting now
	registry *waiting.Registry // the requests waiting in the handlers of this store
	key      string            // the registry's key in its pool
	batch    bool              // Priority batch: gives way to interactive requests while waiting
}

// configShare is what a handler shares with its configuration.
type configShare struct {
	unregister func()          // takes its engine out of package running's list
	done       <-chan struct{} // the Done channel of the configuration's context
	company    *atomic.Int32   // whether other rate_limit handlers share the configuration (see alone)
}

// Tree is a hierarchy.Tree with optional request matchers.
type Tree struct {
	hierarchy.Tree
	// MatcherSetsRaw limits the tree to matching requests (any set may match).
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
	dynamic  []bool   // per tier: does the key have placeholders?
	header   []string // per tier: the header name when the key is just {http.request.header.NAME}
	// entitledBy is the entitlements source whose plan is the tree's plan
	// (its plan is exactly {http.rate_limit.entitlement.<name>.plan}).
	entitledBy *EntitlementsConfig
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
	// Anthropic writes anthropic-ratelimit-{requests,tokens,input-tokens,
	// output-tokens}-{limit,remaining,reset}, resets as RFC 3339 times, as
	// Anthropic's API does.
	Anthropic bool `json:"anthropic,omitempty"`
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
