// Package engine decides requests: from the key values of each tree that
// applies and what the request costs, it resolves the path of buckets
// (trees, tiers, overrides), scales adaptive limits, decides every bucket
// at once in the store, and says what to answer (the rate-limit headers,
// a problem body). It reconciles estimates with actual usage, and keeps
// the runtime state (overrides, modes) applied.
//
// It knows nothing of Caddy's handlers nor of any protocol: the rate_limit
// handler, the admin API, the decision endpoint and Envoy's rate limit
// service are its front ends. A front end
//
//	var d engine.Decision
//	e.Begin(&d)
//	defer d.Release()
//	for each tree that applies: e.Add(&d, tree, values) // the tiers' key values
//	e.Decide(ctx, &d, engine.Request{Estimates: …})   // one store call
//	d.WriteHeaders(header)
//
// and answers d.Allowed, or the refusal that d describes. What it does
// after, the decision's methods do: Refund (the response says the request
// should not count), Reconcile (its actual usage is known), Done (it has
// ended: its concurrency slots go back), Charge (keep what reconciling
// later needs, beyond Release).
package engine

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/topk"
)

// Modes of a tree.
const (
	Enforce = "enforce" // over-limit requests are refused
	Warn    = "warn"    // over-limit requests pass, with the headers
	Shadow  = "shadow"  // over-limit requests pass silently; decisions are only recorded
)

// Config is what an Engine is made of. Trees must be compiled (and their
// policies qualified, hierarchy.QualifyPolicies).
type Config struct {
	Trees []*Tree
	// Dimensions are the dimensions other than requests that have a cost,
	// in the order of the estimates given to Decide.
	Dimensions []string
	Store      store.Store
	// StoreName names the store in logs and the admin API.
	StoreName string
	// Local, when set, decides whatever Store cannot (Redis unreachable, or
	// its circuit breaker open): on this store, with each limit scaled by
	// LocalShare (1/n for n instances sharing the limits), until Store
	// answers again. LocalInstances, when set, gives n instead, as
	// counted when the store last answered (store.Presence).
	Local          store.Store
	LocalShare     float64
	LocalInstances func() int64
	// OnError is what a failure of Store does: "local" decides on Local;
	// "deny" or "allow" is the front end's to apply (it is set as
	// Decision.OnStoreError); "" decides on Local when it is set.
	OnError string
	// Routes are further stores, each deciding the paths of the tenants it
	// lists: every store call for such a path (decisions, refunds, give-
	// backs, strikes, the admin API's) goes to its route's store, so a
	// tenant's failure or load stays in its store. Other paths go to Store.
	Routes []Route
	// Runtime is the store's runtime state (overrides and modes); nil for
	// none.
	Runtime *control.Runtime
	// Top counts the most-denied keys; nil for none.
	Top *topk.Sketch
	// Controller scales the limits of adaptive tiers, for the traffic
	// class Priority; nil when no tier is adaptive.
	Controller *adaptive.Controller
	Priority   adaptive.Priority
	// Mode is the configured mode of every tree (Enforce when empty); a
	// runtime mode of a tree wins over it.
	Mode    string
	Headers Headers
	// Jitter adds up to this fraction of random time to a denial's retry.
	Jitter float64
	// MaxWait, when positive, admits a request that does not fit its GCRA
	// limits now but will within MaxWait: its charge is reserved now (the
	// limits' capacity counts it at once) and Decision.Wait says how long
	// to hold it before it may go (see Decision.Wait).
	MaxWait time.Duration
	// Idempotency, when its TTL is positive, keeps a record of each
	// request that carries an idempotency key (Request.Idempotency), so
	// that its retries are not charged again (see Decision.Replayed).
	Idempotency Idempotency
	// DenialLog is "values" (default), "no_values" or "off"; LogKey adds the
	// refusing bucket's key to the line.
	DenialLog string
	LogKey    bool
	// Fingerprints show the values of sensitive tiers wherever values are
	// written out (logs, the admin API); nil: under a random secret of
	// this process (NewFingerprints).
	Fingerprints *Fingerprints
	Logger       *zap.Logger
	// Reconciled, when set, is told of each reconciliation's outcome.
	Reconciled func(error)
}

// Route is a further store and the tenants whose paths it decides.
type Route struct {
	// Name names the store in logs, metrics and the admin API.
	Name  string
	Store store.Store
	// Tenants are hash tags, "{<tree>|<tier>=<escaped value>}": the
	// tenants' subtrees (see hierarchy.Tree.Resolve).
	Tenants map[string]bool
	// OnError is what a failure of this store does, as Config.OnError;
	// "" as Store's.
	OnError string
}

// Idempotency configures the records of requests with idempotency keys.
type Idempotency struct {
	// TTL is how long a record is kept: a retry after it is a new request.
	TTL time.Duration
	// InFlight is the longest a first request counts as in flight (its
	// response ends it sooner, Done): a duplicate meanwhile is refused as
	// a conflict; after it, as if it had ended (a crashed instance's
	// record does not refuse retries for the whole TTL).
	InFlight time.Duration
	// Retries is how many retries of a request a record lets through
	// without a charge; the next is charged as a new request (and
	// recorded afresh). A gateway cannot tell a retry from another request
	// that reuses its key: this bounds what reusing one gets. With
	// Replay, it is how many times a kept response is answered without a
	// charge (see Replay).
	Retries int
	// Replay keeps each first request's response with its record, and
	// answers its retries with it (see Replay).
	Replay bool
}

// Headers selects the response header families WriteHeaders writes.
type Headers struct {
	IETF       bool // RateLimit-Policy and RateLimit
	XRateLimit bool // X-RateLimit-Limit, -Remaining, -Reset
	RetryAfter bool // Retry-After on denials; with it or OpenAI or Anthropic, retry-after-ms and x-should-retry
	// RetryWithin is the longest wait a client's SDK should sleep through
	// on its own: a refusal that asks for longer (or can never be
	// admitted) says x-should-retry: false. 0 is 60 s.
	RetryWithin time.Duration
	OpenAI      bool // x-ratelimit-{limit,remaining,reset}-{requests,tokens}
	Anthropic   bool // anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
}

// Tree is a compiled hierarchy.Tree as the engine runs it.
type Tree struct {
	*hierarchy.Tree
	// IPv4Prefix and IPv6Prefix, when set, turn a value that is an IP
	// address of that family into its network (an mholt zone's setting).
	IPv4Prefix, IPv6Prefix int

	// mode is the tree's mode set at runtime, nil when none is.
	mode atomic.Pointer[string]
}

// Engine decides requests on a set of trees and one store. It is safe for
// concurrent use.
type Engine struct {
	cfg         Config
	into        decideInto       // the store, when it can decide into reused memory
	single      *Tree            // the tree whose paths may be decided by decideSingle (nil for none)
	singleLimit *hierarchy.Limit // its one limit
	unleased    unleased         // the store, when it leases capacity (package lease)
	policies    map[*hierarchy.Limit]string
	headerCache *headerCache
	denials     *logsample.Sampler
	adjusting   sync.WaitGroup // reconciliations under way
	closing     sync.RWMutex   // orders adjusting.Add before Close's Wait
	closed      bool
	applying    sync.Mutex // orders applyRuntime's calls
	unsubscribe func()
	localLog    logsample.Every // deciding locally: logged once a second
	keepLog     logsample.Every // responses that could not be kept: logged once a second
	holders     atomic.Int64    // the last concurrency slot holder given out
}

// decideInto is implemented by stores that can write a decision's results
// into memory the caller reuses (the memory store).
type decideInto interface {
	DecideInto(ctx context.Context, buckets []store.Bucket, results []rate.Result) (store.Decision, error)
}

// unleased is implemented by stores that decide on leases of capacity
// (package lease): DecideUnleased decides a path in the shared store, as
// if there were no leases.
type unleased interface {
	DecideUnleased(ctx context.Context, buckets []store.Bucket) (store.Decision, error)
}

// New returns an engine, with the runtime state applied and followed.
// Close it when its configuration is unloaded.
func New(cfg Config) *Engine {
	if cfg.Mode == "" {
		cfg.Mode = Enforce
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Fingerprints == nil {
		cfg.Fingerprints = NewFingerprints(nil, nil, cfg.Logger)
	}
	e := &Engine{cfg: cfg}
	// Holders count up from a random start below 2^52, so that engines
	// (handlers, instances) sharing a store give out distinct ones: a
	// holder names a slot in Redis, as an exact float64.
	e.holders.Store(rand.Int64N(1 << 52))
	e.into, _ = cfg.Store.(decideInto)
	e.unleased, _ = cfg.Store.(unleased)
	if e.single = e.singleTree(); e.single != nil {
		e.singleLimit = e.single.Tiers[0].Limits[0]
	}
	e.policies = policyItems(cfg.Trees)
	e.headerCache = &headerCache{policies: e.policies}
	if cfg.DenialLog != "off" {
		e.denials = logsample.New(time.Minute, 10000)
	}
	if cfg.Runtime != nil {
		// Subscribe applies the current state first, then every change.
		unsubscribe := cfg.Runtime.Subscribe(e.applyRuntime)
		unshow := cfg.Runtime.ShowValues(e.showValue)
		e.unsubscribe = func() { unsubscribe(); unshow() }
	}
	return e
}

// Close stops following the runtime state and waits for the
// reconciliations under way. The store is the caller's to close.
func (e *Engine) Close() {
	if e.unsubscribe != nil {
		e.unsubscribe()
	}
	e.closing.Lock()
	e.closed = true
	e.closing.Unlock()
	e.adjusting.Wait()
}

// Apply installs a snapshot of the store's runtime state (the runtime's
// subscription does, at every change).
func (e *Engine) Apply(snap *control.Snapshot) { e.applyRuntime(snap) }

// Config is the engine's configuration, as New completed it (its Mode,
// Logger and Fingerprints set): change a copy to make another engine.
func (e *Engine) Config() Config { return e.cfg }

// Tree is the engine's tree of that name, or nil.
func (e *Engine) Tree(name string) *Tree {
	for _, t := range e.cfg.Trees {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// treeOf returns the engine's Tree whose hierarchy.Tree t is.
func (e *Engine) treeOf(t *hierarchy.Tree) *Tree {
	for _, et := range e.cfg.Trees {
		if et.Tree == t {
			return et
		}
	}
	return nil
}

// Mode is the mode in force for tree t: the runtime mode set through the
// admin API, else the configured one.
func (e *Engine) Mode(t *Tree) string {
	if t != nil {
		if m := t.mode.Load(); m != nil {
			return *m
		}
	}
	return e.cfg.Mode
}

// TierNames are the names of t's tiers, from the top.
func (t *Tree) TierNames() []string {
	names := make([]string, len(t.Tiers))
	for i, tier := range t.Tiers {
		names[i] = tier.Name
	}
	return names
}

// value is what the engine keys a tier's bucket by, given the value a
// front end resolved: an IP address grouped by its network where the tree
// says so.
func (t *Tree) value(v string) string {
	if t.IPv4Prefix != 0 || t.IPv6Prefix != 0 {
		return NetworkOf(v, t.IPv4Prefix, t.IPv6Prefix)
	}
	return v
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
