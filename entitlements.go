package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/entitle"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/running"
	"github.com/caddy-cascade/cascade/store"
)

// EntitlementsConfig is a source of entitlements: what plan a customer is
// on (and, optionally, limits of its own), looked up by the value of one
// of the handler's tiers (Key: an organisation's id, an API key) in the
// business's own data. A tree takes its plan from it with
// `plan {http.rate_limit.entitlement.<name>.plan} default <plan>`.
//
// Each value is looked up at most once per TTL per instance: the first
// request of a value waits for it (Timeout at most, then the tree's
// default plan), later ones read memory while it is refreshed in the
// background. A failed refresh serves the last answer for Stale; a value
// the source does not know is remembered for NegativeTTL. An entitlement
// set through the admin API (PUT /rate_limit/entitlements/<name>/<value>)
// wins over the source's, on every instance sharing the store.
type EntitlementsConfig struct {
	// Name names the source in placeholders, the admin API and logs.
	Name string `json:"name"`
	// Source says where entitlements are read: exactly one of its
	// fields.
	Source EntitlementSource `json:"source"`
	// Key is the name of the tier whose value is looked up (in the first
	// tree that has a tier of that name).
	Key string `json:"key"`
	// TTL is how long an answer is used before it is looked up again
	// (default 5m); NegativeTTL how long "unknown" is (default 1m); Stale
	// how long past its TTL an answer is still used while the source
	// fails (default 1h); Timeout the longest a request waits for a
	// lookup (default 1s).
	TTL         caddy.Duration `json:"ttl,omitempty"`
	NegativeTTL caddy.Duration `json:"negative_ttl,omitempty"`
	Stale       caddy.Duration `json:"stale,omitempty"`
	Timeout     caddy.Duration `json:"timeout,omitempty"`

	cache *entitle.Cache
	tree  *Tree                // the first tree with the Key tier
	tier  *hierarchy.Tier      // that tier
	index int                  // its index in the tree
	slot  int                  // its index in the handler's Entitlements
	none  *entitle.Entitlement // a value's without one: no plan (its placeholders empty)
}

// EntitlementSource is where entitlements are read.
type EntitlementSource struct {
	// File is a JSON file mapping each value to {"plan": …, "limits":
	// […], other fields}, read again when it changes.
	File string `json:"file,omitempty"`
	// Redis is a key template ({value} replaced by the value) of a hash
	// per value (fields plan, limits as JSON, others), in the handler's
	// Redis store, or in the named store RedisStore (one of Stores).
	Redis      string `json:"redis,omitempty"`
	RedisStore string `json:"redis_store,omitempty"`
	// HTTP is a URL template ({value} replaced by the escaped value)
	// answering GET with the JSON object {"plan": …, "limits": […], …};
	// 404 for a value it does not know.
	HTTP string `json:"http,omitempty"`
	// Header fields sent to an HTTP source (placeholders such as
	// {env.BILLING_TOKEN} are replaced at provision).
	Header map[string]string `json:"header,omitempty"`
}

// check checks the configuration, as far as it can be without the trees.
func (c *EntitlementsConfig) check() error {
	if err := checkEntitlementName(c.Name); err != nil {
		return err
	}
	n := 0
	for _, s := range []string{c.Source.File, c.Source.Redis, c.Source.HTTP} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("entitlements %s: give one source: source file <path.json>, source redis <key template> or source http <url template>", c.Name)
	}
	if c.Source.RedisStore != "" && c.Source.Redis == "" {
		return fmt.Errorf("entitlements %s: store %s applies to a redis source", c.Name, c.Source.RedisStore)
	}
	if c.Source.Header != nil && c.Source.HTTP == "" {
		return fmt.Errorf("entitlements %s: header applies to an http source", c.Name)
	}
	if (c.Source.Redis != "" && !strings.Contains(c.Source.Redis, "{value}")) || (c.Source.HTTP != "" && !strings.Contains(c.Source.HTTP, "{value}")) {
		return fmt.Errorf("entitlements %s: the source's template must contain {value}, where the looked-up value goes", c.Name)
	}
	if c.Key == "" {
		return fmt.Errorf("entitlements %s: name the tier whose value is looked up: key <tier>", c.Name)
	}
	for _, d := range []caddy.Duration{c.TTL, c.NegativeTTL, c.Stale, c.Timeout} {
		if d < 0 {
			return fmt.Errorf("entitlements %s: durations must not be negative (0 is the default)", c.Name)
		}
	}
	return nil
}

// checkEntitlementName checks a name that goes into placeholders.
func checkEntitlementName(name string) error {
	if name == "" {
		return errors.New("entitlements: give the source a name")
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("entitlements %q: a name is letters, digits, '_' and '-' (it goes into placeholders)", name)
		}
	}
	return nil
}

// entitlementPlaceholder is the placeholder of a source's field.
func entitlementPlaceholder(name, field string) string {
	return "http.rate_limit.entitlement." + name + "." + field
}

// planState is what the handler keeps for plans: its sources by name,
// the own limits of runtime entitlements compiled, the unknown plans
// logged, and the runtime entitlements it follows.
type planState struct {
	byName   map[string]*EntitlementsConfig
	own      sync.Map     // ownKey → *ownLimits: a value's own limits, compiled once
	owned    atomic.Int64 // entries stored in own since it was last cleared
	unknown  sync.Map     // plan names logged as unknown, by tree
	unknowns atomic.Int64 // how many: past maxUnknown, no more are logged
	logger   *zap.Logger
	runtime  *control.Runtime
	previous *control.Snapshot
	mu       sync.Mutex
	closers  []func()
}

// ownKey names a value's own limits, compiled for one tree.
type ownKey struct {
	tree  *Tree
	value string
}

// ownLimits are a value's own limits as given (first, to tell them
// apart) and compiled.
type ownLimits struct {
	first    *hierarchy.Limit
	override *hierarchy.Override
}

// provisionEntitlements opens each source, finds its tier and the trees
// whose plan it gives, follows runtime entitlements, and logs the trees'
// allocation problems. redis is the handler's Redis store, nil for memory.
func (h *Handler) provisionEntitlements(ctx caddy.Context, redis *store.Redis) error {
	for _, t := range h.Trees {
		for _, problem := range t.AllocationProblems() {
			h.logger.Warn("a child tier is allowed more than its parent: it can never use it (strict_allocation makes this an error)", zap.String("problem", problem))
		}
	}
	if len(h.Entitlements) == 0 {
		for _, t := range h.Trees {
			if t.PlanKey != "" && !strings.Contains(t.PlanKey, "{") {
				return fmt.Errorf("rate_limit: tree %s: plan %q is a constant: take it from a placeholder", t.Name, t.PlanKey)
			}
		}
		return nil
	}
	repl := caddy.NewReplacer()
	p := &planState{byName: map[string]*EntitlementsConfig{}, logger: h.logger}
	h.plans = p // closed by Cleanup, whatever fails below
	for i, c := range h.Entitlements {
		c.slot = i
		if err := c.check(); err != nil {
			return fmt.Errorf("rate_limit: %w", err)
		}
		if p.byName[c.Name] != nil {
			return fmt.Errorf("rate_limit: entitlements %s defined twice", c.Name)
		}
		p.byName[c.Name] = c
		for _, t := range h.Trees {
			if tier, i := t.Tier(c.Key); tier != nil {
				c.tree, c.tier, c.index = t, tier, i
				break
			}
		}
		if c.tier == nil {
			var tiers []string
			for _, t := range h.Trees {
				for _, tier := range t.Tiers {
					tiers = append(tiers, tier.Name)
				}
			}
			return fmt.Errorf("rate_limit: entitlements %s: key %s: no tree has a tier %s to look its value up; name one of the tiers: %s", c.Name, c.Key, c.Key, strings.Join(tiers, ", "))
		}
		src, err := h.entitlementSource(ctx, c, repl, redis)
		if err != nil {
			return fmt.Errorf("rate_limit: entitlements %s: %w", c.Name, err)
		}
		c.cache = entitle.NewCache(src, entitle.Options{
			TTL: time.Duration(c.TTL), NegativeTTL: time.Duration(c.NegativeTTL), Stale: time.Duration(c.Stale), Timeout: time.Duration(c.Timeout),
			Name: c.Name, OnFailure: p.failed(c),
		})
		c.none = &entitle.Entitlement{Source: c.Name}
	}
	for _, t := range h.Trees {
		if t.PlanKey == "" {
			continue
		}
		for name, c := range p.byName {
			if t.PlanKey == "{"+entitlementPlaceholder(name, "plan")+"}" {
				t.entitledBy = c
			}
		}
	}
	var blocks []running.Entitlements
	for _, c := range h.Entitlements {
		var plans []string
		for _, t := range h.Trees {
			if t.entitledBy == c {
				plans = append(plans, t.PlanNames()...)
				plans = append(plans, t.DefaultPlan)
			}
		}
		if len(plans) > 0 {
			slices.Sort(plans)
			plans = slices.Compact(plans)
		} else {
			plans = nil // its plan may go anywhere (a match, a header): any is accepted
		}
		blocks = append(blocks, running.Entitlements{Name: c.Name, Tree: c.tree.Name, Tier: c.tier.Name, Plans: plans, Stats: c.cache.Stats})
	}
	p.closers = append(p.closers, running.RegisterEntitlements(h.engine, blocks...))
	if rt := h.engine.Config().Runtime; rt != nil {
		p.runtime = rt
		p.previous = rt.Snapshot()
		p.closers = append(p.closers, rt.Subscribe(p.invalidate))
	}
	return nil
}

// failed logs the failed lookups of source c, once a minute at most with
// how many there were: its requests run on their last answer, or on the
// default plan. The errors name templates, never a value.
func (p *planState) failed(c *EntitlementsConfig) func(error) {
	every := &logsample.Every{Interval: time.Minute}
	return func(err error) {
		if ok, held := every.Allow(time.Now()); ok {
			p.logger.Warn("entitlements: a lookup failed; its value runs on its last answer (within stale) or on the default plan",
				zap.String("entitlements", c.Name), zap.Int64("failures_not_logged", held), zap.Error(err))
		}
	}
}

// close stops following runtime entitlements and closes the sources.
func (p *planState) close() {
	for _, c := range p.closers {
		c()
	}
	for _, c := range p.byName {
		if c.cache != nil {
			_ = c.cache.Close()
		}
	}
}

// entitlementSource opens the source c names.
func (h *Handler) entitlementSource(ctx caddy.Context, c *EntitlementsConfig, repl *caddy.Replacer, redis *store.Redis) (entitle.Source, error) {
	switch {
	case c.Source.File != "":
		return entitle.NewFile(repl.ReplaceKnown(c.Source.File, ""), entitle.FileOptions{
			OnError: func(err error) {
				h.logger.Error("entitlements: the file cannot be read; the last good one is used", zap.String("entitlements", c.Name), zap.Error(err))
			},
			Show: func(v string) string { return h.engine.Show(c.tier, v) },
		})
	case c.Source.Redis != "" && c.Source.RedisStore != "":
		sc := h.Stores[c.Source.RedisStore]
		if sc == nil || sc.Redis == nil {
			return nil, fmt.Errorf("source redis %s store %s: name a Redis store of the handler (store redis %s { ... }); stores: %v",
				c.Source.Redis, c.Source.RedisStore, c.Source.RedisStore, keysOf(h.Stores))
		}
		o, err := sc.Open(ctx, time.Duration(h.SweepInterval))
		if err != nil {
			return nil, fmt.Errorf("store %s: %w", c.Source.RedisStore, err)
		}
		h.stores.routeKeys = append(h.stores.routeKeys, o.PoolKey) // released with the routes' stores
		return entitle.NewRedis(o.Redis.Client(), c.Source.Redis)
	case c.Source.Redis != "":
		if redis == nil {
			return nil, errors.New("source redis reads the handler's Redis store: give the handler store redis, or use source file or http")
		}
		return entitle.NewRedis(redis.Client(), c.Source.Redis)
	default:
		hdr := http.Header{}
		for k, v := range c.Source.Header {
			hdr.Set(k, repl.ReplaceKnown(v, ""))
		}
		return entitle.NewHTTP(c.Source.HTTP, entitle.HTTPOptions{Header: hdr})
	}
}

// invalidate forgets the cached answers of the values whose runtime
// entitlement changed: the next request looks them up again.
func (p *planState) invalidate(snap *control.Snapshot) {
	p.mu.Lock()
	prev := p.previous
	p.previous = snap
	p.mu.Unlock()
	seen := map[[2]string]*control.Entitlement{}
	for _, e := range prev.Entitlements() {
		seen[[2]string{e.Name, e.Value}] = e
	}
	for _, e := range snap.Entitlements() {
		k := [2]string{e.Name, e.Value}
		if old, ok := seen[k]; !ok || !old.Updated.Equal(e.Updated) {
			if c := p.byName[e.Name]; c != nil {
				c.cache.Invalidate(e.Value)
				p.own.Delete(ownKey{c.tree, e.Value})
			}
		}
		delete(seen, k)
	}
	for k := range seen { // deleted: back to the source's answer
		if c := p.byName[k[0]]; c != nil {
			c.cache.Invalidate(k[1])
			p.own.Delete(ownKey{c.tree, k[1]})
		}
	}
}

// runtimeEntitlement is value's entitlement from source c set through the
// admin API, if any: it wins over the source's.
func (p *planState) runtimeEntitlement(value string, c *EntitlementsConfig) *entitle.Entitlement {
	if p.runtime == nil {
		return nil
	}
	if e := p.runtime.Snapshot().Entitlement(c.Name, value); e != nil {
		return &entitle.Entitlement{Plan: e.Plan, Limits: e.Limits, Fields: map[string]string{"plan": e.Plan}, Source: c.Name}
	}
	return nil
}

// ownOverride is a value's own limits, compiled for tree t once (while
// the same answer is cached).
func (p *planState) ownOverride(t *Tree, tier *hierarchy.Tier, value, plan string, limits []*hierarchy.Limit) *hierarchy.Override {
	if len(limits) == 0 {
		return nil
	}
	k := ownKey{t, value}
	if v, ok := p.own.Load(k); ok && v.(*ownLimits).first == limits[0] {
		return v.(*ownLimits).override
	}
	o := p.compileOwn(t, tier, plan, limits)
	if p.owned.Add(1) > maxOwn { // bounded: a value's is compiled again when needed
		p.own.Clear()
		p.owned.Store(0)
	}
	p.own.Store(k, &ownLimits{first: limits[0], override: o})
	return o
}

// compileOwn compiles a value's own limits into tree t's tier, with the
// limits of plan of the dimensions they do not name (nil when they are
// not valid: its plan's apply).
func (p *planState) compileOwn(t *Tree, tier *hierarchy.Tier, plan string, limits []*hierarchy.Limit) *hierarchy.Override {
	// Compiled on a copy: the answer is shared, read-only, and compiling
	// writes into limits. Requests racing here compile alike; one's stays.
	// Its own limits replace those of the dimensions they name: the
	// plan's limits of every other dimension stay (a requests limit of its
	// own must not lift the plan's tokens limit).
	own := make([]*hierarchy.Limit, 0, len(limits))
	named := map[string]bool{}
	for _, l := range limits {
		c := *l
		own = append(own, &c)
		named[l.Counts()] = true
	}
	for _, l := range t.PlanLimits(tier, plan) {
		if !named[l.Counts()] {
			c := hierarchy.Limit{Count: l.Count, Amount: l.Amount, Per: l.Per, Dimension: l.Dimension, Burst: l.Burst,
				Algorithm: l.Algorithm, Timezone: l.Timezone, Alerts: l.Alerts}
			own = append(own, &c)
		}
	}
	o := &hierarchy.Override{Limits: own}
	if err := t.CompileOverride(tier, o); err != nil {
		p.logger.Warn("entitlements: a value's own limits are not valid; its plan's apply", zap.String("tree", t.Name), zap.Error(err))
		return nil
	}
	return o
}

// maxUnknown is how many unknown plan names are logged at most.
const maxUnknown = 1000

// maxOwn is how many values' own limits are kept compiled at most.
const maxOwn = 100_000

// unknownPlan logs, once per tree and name, a plan no tier of tree t
// declares: the default plan's limits apply.
func (p *planState) unknownPlan(t *Tree, name string) {
	if _, logged := p.unknown.Load([2]string{t.Name, name}); logged || p.unknowns.Load() >= maxUnknown {
		return // a plan from a header may take any name: the names logged are bounded
	}
	if _, logged := p.unknown.LoadOrStore([2]string{t.Name, name}, true); !logged {
		p.unknowns.Add(1)
		p.logger.Warn("entitlements: a plan no tier names; the default plan's limits apply",
			zap.String("tree", t.Name), zap.String("plan", name), zap.String("default", t.DefaultPlan))
	}
}

// entSlot is one source's entitlement for one request.
type entSlot struct {
	got  *entitle.Entitlement // nil: none (the default plan)
	memo *entitle.Memo        // got's, when a cache keeps it
	done bool                 // looked up
}

// requestEntitlements are the entitlements looked up for one request, by
// source (h.Entitlements' order): two kept inline, so that a handler's
// common case allocates nothing for them (and, copied, a placeholder
// provider holds its own).
type requestEntitlements struct {
	n      int // sources
	inline [2]entSlot
	extra  []entSlot // beyond the inline ones
}

// slot is source i's.
func (re *requestEntitlements) slot(i int) *entSlot {
	if i < len(re.inline) {
		return &re.inline[i]
	}
	return &re.extra[i-len(re.inline)]
}

// shownEntitlement is what a request's placeholders show of one source's
// entitlement: its name and answer (shared, read-only; nil for none).
type shownEntitlement struct {
	name string
	got  *entitle.Entitlement
}

// shownEntitlements are what a request's placeholders show of its
// entitlements (kept apart from the placeholders of every request, which
// stay small: the provider of a request without entitlements is one
// allocation).
type shownEntitlements struct {
	first shownEntitlement
	more  []shownEntitlement
}

// shownOne is what placeholders show of re when its handler has one
// source: that source's answer, which names it (nil when not looked up).
func (re *requestEntitlements) shownOne() *entitle.Entitlement {
	if re.n != 1 {
		return nil
	}
	return re.inline[0].got
}

// shown is what placeholders show of re, whose sources are srcs: those
// the request looked up (another's placeholders stay unknown).
func (re *requestEntitlements) shown(srcs []*EntitlementsConfig) *shownEntitlements {
	s := &shownEntitlements{first: re.shownSlot(srcs, 0)}
	for i := 1; i < re.n; i++ {
		s.more = append(s.more, re.shownSlot(srcs, i))
	}
	return s
}

// shownSlot is what placeholders show of source i: nothing (no name, which
// no placeholder asks for) when the request did not look it up.
func (re *requestEntitlements) shownSlot(srcs []*EntitlementsConfig, i int) shownEntitlement {
	if sl := re.slot(i); sl.done {
		return shownEntitlement{srcs[i].Name, sl.got}
	}
	return shownEntitlement{}
}

// lookup answers {http.rate_limit.entitlement.<name>.<field>} (name is
// what follows "http.rate_limit.").
func (s *shownEntitlements) lookup(name string) (any, bool) {
	rest, ok := strings.CutPrefix(name, "entitlement.")
	if !ok {
		return nil, false
	}
	source, field, ok := strings.Cut(rest, ".")
	if !ok {
		return nil, false
	}
	e := &s.first
	for i := 0; e.name != source; i++ {
		if i >= len(s.more) {
			return nil, false
		}
		e = &s.more[i]
	}
	return entitlementField(e.got, field)
}

// entitlementField is a field of e for its placeholder ("" when e is nil
// or has none).
func entitlementField(e *entitle.Entitlement, field string) (any, bool) {
	if e == nil {
		return "", true
	}
	if field == "plan" {
		return e.Plan, true
	}
	return e.Fields[field], true
}

// entitlementPlaceholderOf answers {http.rate_limit.entitlement.<source>.<field>}
// from e, the answer of source e.Source (name is what follows
// "http.rate_limit.").
func entitlementPlaceholderOf(e *entitle.Entitlement, name string) (any, bool) {
	rest, _ := strings.CutPrefix(name, "entitlement.")
	source, field, ok := strings.Cut(rest, ".")
	if !ok || source != e.Source {
		return nil, false
	}
	return entitlementField(e, field)
}

// entitlementOf looks source c's entitlement up for the request, once.
// values are tree t's values when t is c's tree (else c's tree's are
// resolved).
func (h *Handler) entitlementOf(r *http.Request, repl *caddy.Replacer, d *decision, c *EntitlementsConfig, t *Tree, values []string) *entSlot {
	re := &d.ents
	if re.n == 0 {
		re.n = len(h.Entitlements)
		if re.n > len(re.inline) {
			re.extra = make([]entSlot, re.n-len(re.inline))
		}
	}
	sl := re.slot(c.slot)
	if !sl.done {
		var value string
		if c.tree == t && c.index < len(values) {
			value = values[c.index]
		} else {
			value = c.tree.value(r, repl, c.index)
		}
		got, memo := c.none, (*entitle.Memo)(nil)
		if value != "" {
			if e := h.plans.runtimeEntitlement(value, c); e != nil {
				got = e
			} else if e, m, ok := c.cache.Get(r.Context(), value); ok {
				got, memo = e, m
			}
		}
		sl.got, sl.memo, sl.done = got, memo, true
	}
	return sl
}

// publishEntitlements sets the request's entitlements as placeholders at
// once: for a tree whose plan is read from one (its plan placeholder is
// not a source's plain plan), before the plan is resolved.
func publishEntitlements(repl *caddy.Replacer, re *requestEntitlements, srcs []*EntitlementsConfig) {
	for i := range re.n {
		sl := re.slot(i)
		if sl.got == nil {
			continue
		}
		name := srcs[i].Name
		repl.Set(entitlementPlaceholder(name, "plan"), sl.got.Plan)
		for k, v := range sl.got.Fields {
			if k != "plan" {
				repl.Set(entitlementPlaceholder(name, k), v)
			}
		}
	}
}

// addEntitled adds tree i's path with the request's entitlement in it.
//
//go:noinline
func (h *Handler) addEntitled(r *http.Request, repl *caddy.Replacer, d *decision, i int, values []string) error {
	t := h.trees[i]
	p := h.plans
	var ent hierarchy.Entitlement
	if p != nil {
		if c := t.entitledBy; c != nil {
			sl := h.entitlementOf(r, repl, d, c, t, values)
			if sl.memo == nil || !sl.memo.Entitled(&t.Tree, &ent) {
				p.entitledIn(t, c, sl, values, &ent)
			}
			return h.engine.AddEntitled(&d.Decision, h.etrees[i], values, &ent)
		}
		for _, c := range h.Entitlements { // their placeholders first: the plan may read any
			e := h.entitlementOf(r, repl, d, c, t, values).got
			if e != nil && c.tree == t && len(e.Limits) > 0 && ent.Own == nil {
				ent.Tier, ent.Own = c.tier, p.ownOverride(t, c.tier, values[c.index], e.Plan, e.Limits)
			}
		}
		publishEntitlements(repl, &d.ents, h.Entitlements)
	}
	ent.Plan = resolveKey(repl, t.PlanKey, true)
	p.indexPlan(t, &ent)
	return h.engine.AddEntitled(&d.Decision, h.etrees[i], values, &ent)
}

// indexPlan looks ent's plan up in tree t, logging an unknown one (p may
// be nil: no entitlements, nothing logged).
func (p *planState) indexPlan(t *Tree, ent *hierarchy.Entitlement) {
	var known bool
	ent.Index, known = t.PlanIndex(ent.Plan)
	ent.Indexed = true
	if !known && ent.Plan != "" && p != nil {
		p.unknownPlan(t, ent.Plan)
	}
}

// entitledIn sets ent to what the answer in sl (of source c, whose plan
// tree t reads) entitles a request to in t: its plan's index and, when t
// is c's tree, its own limits compiled. Worked out once per answer the
// cache keeps, and kept in the answer's memo (which the caller reads
// first).
func (p *planState) entitledIn(t *Tree, c *EntitlementsConfig, sl *entSlot, values []string, ent *hierarchy.Entitlement) {
	m, e := sl.memo, sl.got
	ent.Plan = e.Plan
	p.indexPlan(t, ent)
	if c.tree == t && len(e.Limits) > 0 {
		if m != nil {
			ent.Tier, ent.Own = c.tier, p.compileOwn(t, c.tier, e.Plan, e.Limits)
		} else { // a runtime entitlement: compiled once per value
			ent.Tier, ent.Own = c.tier, p.ownOverride(t, c.tier, values[c.index], e.Plan, e.Limits)
		}
	}
	if m != nil && c.tree == t { // one tree's per answer: its source's (whose own limits it compiles)
		m.SetEntitled(&t.Tree, *ent)
	}
}
