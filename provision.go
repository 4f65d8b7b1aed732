package cascade

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/running"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// Provision sets the handler up: compiles trees and zones, loads matchers,
// opens (or reuses, across config reloads) the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger, h.epoch = ctx.Logger(), time.Now()
	h.quietAdmit = h.Placeholders == "refused"
	// A held request that goes away gives its reservation back: refundable.
	h.refundable = h.ChargeOn != nil || h.Forwarded != nil && h.Forwarded.Report != "" || h.MaxWait > 0 ||
		slices.ContainsFunc(h.Costs, func(c *Cost) bool { return c.Reconcile != nil })
	h.waiting.queued = new(atomic.Int64)
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
	if err := h.provisionMoney(); err != nil {
		return err
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
		for _, tier := range t.Tiers {
			h.readsModel = h.readsModel || strings.Contains(tier.Key, modelPlaceholder)
		}
		for _, set := range t.MatcherSetsRaw {
			for _, raw := range set {
				if bytes.Contains(raw, []byte(modelPlaceholder[1:len(modelPlaceholder)-1])) {
					h.readsModel, h.matchesModel = true, true
				}
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
		h.showsCost = h.showsCost || c.shows
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
	o, err := h.Store.Open(ctx, time.Duration(h.SweepInterval))
	if err != nil {
		return fmt.Errorf("rate_limit: store: %w", err)
	}
	h.stores.poolKey = o.PoolKey
	if err := h.provisionWaiting(o.Redis); err != nil {
		return fmt.Errorf("rate_limit: max_wait: %w", err)
	}
	h.stores.apply = new(atomic.Pointer[func()])
	if o.Apply != nil {
		h.stores.apply.Store(&o.Apply)
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
		h.stores.local = store.NewMemory(store.MemoryOptions{Reserve: -1}) // deciding only while a store fails: nothing reserved
		local = h.stores.local
		share = 1 / float64(max(h.LocalInstances, 1))
		if h.LocalInstances == 0 && o.Presence != nil {
			o.Presence.Start()
			instances = o.Presence.Count
		}
	}
	fps, err := h.fingerprints(o.Redis)
	if err != nil {
		return err
	}
	h.storeName = o.Name
	h.engine = engine.New(engine.Config{
		Local: local, LocalShare: share, LocalInstances: instances, Routes: routes, OnError: h.onStoreError(),
		Trees: h.etrees, Dimensions: dims,
		Store: o.Store, StoreName: o.Name, Runtime: o.Runtime, Top: o.Top,
		Controller: h.controller, Priority: h.priority,
		Mode: h.Mode,
		Headers: engine.Headers{IETF: on(hc.IETF), XRateLimit: set(hc.XRateLimit), RetryAfter: on(hc.RetryAfter), OpenAI: hc.OpenAI, Anthropic: hc.Anthropic,
			RetryWithin: time.Duration(h.RetryWithin)},
		Jitter: h.Jitter, DenialLog: h.DenialLog, LogKey: h.LogKey, Fingerprints: fps, MaxWait: time.Duration(h.MaxWait),
		Idempotency: h.Idempotency.engineConfig(),
		Logger:      h.logger, Reconciled: h.metrics.reconcile,
	})
	if err := h.provisionEntitlements(ctx, o.Redis); err != nil {
		return err
	}
	if h.Idempotency != nil && h.Idempotency.Replay {
		if err := h.engine.CheckReplay(); err != nil {
			return fmt.Errorf("rate_limit: idempotency replay: %w", err)
		}
	}
	if err := h.provisionAlerts(); err != nil {
		return err
	}
	h.money = h.moneyDimensions()
	if len(h.FallbackModels) > 0 {
		if err := checkFallbacks(h.FallbackModels); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
		h.readsModel = true // a fallback is chosen by the model asked for
	}
	// The model is read within the largest body an llm cost reads (8 MiB
	// by default).
	for _, c := range h.Costs {
		if c.LLM != nil {
			h.modelBodyLimit = max(h.modelBodyLimit, cost.BodyLimit(c.estimator, 1<<20))
		}
	}
	if h.modelBodyLimit == 0 {
		h.modelBodyLimit = cost.DefaultLLMMaxBodyBytes
	}
	if hc := h.Headers; hc != nil {
		h.ownHeaders = hc.OpenAI || hc.Anthropic || hc.XRateLimit != nil && *hc.XRateLimit
	}
	// Only its path to decide (see decide).
	h.direct = !h.readsModel && len(h.trees) == 1 && h.trees[0].matchers == nil && len(h.Costs) == 0 &&
		h.Idempotency == nil && h.MaxWait == 0 && h.Forwarded == nil
	h.config.unregister = running.Register(h.engine, ctx.Done())
	h.config.done, h.config.company = ctx.Done(), new(atomic.Int32)
	if srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv != nil && len(srv.NamedRoutes) > 0 {
		// A named route may be invoked twice in one request, running its
		// handlers twice: as with another handler, the later decision's
		// placeholders must show (see setPlaceholders).
		h.config.company.Store(companySome)
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
	a, err := ctx.App("cascade")
	if err != nil {
		return fmt.Errorf("rate_limit: adaptive: %w", err)
	}
	h.controller = a.(*App).Controller()
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
	switch h.RefusalBody {
	case "", engine.BodyProblem:
	case engine.BodyOpenAI, engine.BodyAnthropic:
		if h.Forwarded != nil {
			return fmt.Errorf("rate_limit: refusal_body %s: a decision endpoint (forwarded) answers its front end with problem+json, which carries the error member the SDKs read", h.RefusalBody)
		}
	default:
		return fmt.Errorf("rate_limit: refusal_body %q: use problem, openai or anthropic", h.RefusalBody)
	}
	if h.RetryWithin < 0 || time.Duration(h.RetryWithin) > time.Minute {
		return fmt.Errorf("rate_limit: retry_within %v: give at most 1m: the SDKs sleep through no longer wait (Python's ignore a longer one and retry at once)", time.Duration(h.RetryWithin))
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
	if len(h.FallbackModels) > 0 && h.Forwarded != nil {
		return errors.New("rate_limit: fallback_model rewrites the body the upstream gets, which a decision endpoint (forwarded) does not pass on: rate limit in front of the upstream instead")
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
	h.closeAlerts()
	if h.plans != nil {
		h.plans.close()
	}
	if h.config.unregister != nil {
		h.config.unregister()
	}
	if h.engine != nil {
		h.engine.Close()
	}
	if h.stores.local != nil {
		_ = h.stores.local.Close()
	}
	if h.waiting.key != "" {
		_, _ = waitlists.Delete(h.waiting.key)
	}
	for _, k := range h.stores.routeKeys {
		_ = storeconfig.Release(k)
	}
	if h.stores.poolKey != "" {
		err := storeconfig.Release(h.stores.poolKey)
		return err
	}
	return nil
}
