package cascade

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/topk"
)

// The handler as the admin API operates on it (admin.Engine), and what it
// does with the runtime state an operator sets: overrides and modes.

var _ admin.Engine = (*Handler)(nil)

// applyRuntime installs a snapshot of the store's runtime state: each
// tier's overrides, compiled for this handler's trees, and each tree's
// mode. It runs when the handler is provisioned and at every change (see
// control.Runtime.Subscribe), never on the request path: a request reads
// the result through one atomic pointer per tier.
func (h *Handler) applyRuntime(snap *control.Snapshot) {
	h.applying.Lock()
	defer h.applying.Unlock()
	// Overrides of one tier with the same limits share one compiled
	// override: the headers of a path are formatted once per distinct set
	// of limits (headerCache), and 10,000 customers on one plan are one
	// set, not 10,000.
	type shared struct {
		tier *hierarchy.Tier
		spec string
	}
	compiledOnce := map[shared]*hierarchy.Override{}
	for _, t := range h.trees {
		if m := snap.Mode(t.Name); m != nil {
			mode := m.Mode
			t.mode.Store(&mode)
		} else {
			t.mode.Store(nil)
		}
		for _, tier := range t.Tiers {
			var compiled map[string]*hierarchy.Override
			for _, o := range snap.Overrides() {
				if o.Tree != t.Name || o.Tier != tier.Name {
					continue
				}
				spec, _ := json.Marshal(struct {
					L []*hierarchy.Limit
					U bool
				}{o.Limits, o.Unlimited})
				key := shared{tier, string(spec)}
				c := compiledOnce[key]
				if c == nil {
					var err error
					if c, err = h.compileOverride(t, tier, o); err != nil {
						h.logger.Warn("rate limit override not applied: it does not fit this handler's tree",
							zap.String("tree", o.Tree), zap.String("tier", o.Tier), zap.String("value", truncate(o.Value, 256)), zap.Error(err))
						continue
					}
					compiledOnce[key] = c
				}
				if compiled == nil {
					compiled = map[string]*hierarchy.Override{}
				}
				compiled[o.Value] = c
			}
			tier.SetRuntime(compiled)
		}
	}
}

// compileOverride compiles a runtime override for tier of t, on copies of
// its limits (the snapshot is shared, and compiling names them).
func (h *Handler) compileOverride(t *Tree, tier *hierarchy.Tier, o *control.Override) (*hierarchy.Override, error) {
	c := &hierarchy.Override{Unlimited: o.Unlimited}
	for _, l := range o.Limits {
		lc := *l
		c.Limits = append(c.Limits, &hierarchy.Limit{Count: lc.Count, Per: lc.Per, Dimension: lc.Dimension, Burst: lc.Burst, Algorithm: lc.Algorithm, Timezone: lc.Timezone})
	}
	if err := t.CompileOverride(tier, c); err != nil {
		return nil, err
	}
	for _, l := range c.Limits {
		if l.Dimension != hierarchy.Requests && h.costs[l.Dimension] == nil {
			return nil, fmt.Errorf("limit %s counts %s, but this handler has no cost for %s: add 'cost %s …' to its configuration first",
				l.String(), l.Dimension, l.Dimension, l.Dimension)
		}
	}
	return c, nil
}

// CheckOverride implements admin.Engine.
func (h *Handler) CheckOverride(o *control.Override) error {
	t := h.tree(o.Tree)
	if t == nil {
		return fmt.Errorf("no tree %q", o.Tree)
	}
	tier, _ := t.Tier(o.Tier)
	if tier == nil {
		return fmt.Errorf("tree %s has no tier %q: its tiers are %s", t.Name, o.Tier, strings.Join(tierNames(t), ", "))
	}
	if _, err := h.compileOverride(t, tier, o); err != nil {
		return fmt.Errorf("override of %s/%s: %w", t.Name, tier.Name, err)
	}
	return nil
}

func tierNames(t *Tree) []string {
	names := make([]string, len(t.Tiers))
	for i, tier := range t.Tiers {
		names[i] = tier.Name
	}
	return names
}

func (h *Handler) tree(name string) *Tree {
	for _, t := range h.trees {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// HasTree implements admin.Engine.
func (h *Handler) HasTree(name string) bool { return h.tree(name) != nil }

// Runtime implements admin.Engine.
func (h *Handler) Runtime() *control.Runtime { return h.runtime }

// Top implements admin.Engine.
func (h *Handler) Top() *topk.Sketch { return h.top }

// Describe implements admin.Engine.
func (h *Handler) Describe() []admin.Tree {
	var snap *control.Snapshot
	if h.runtime != nil {
		snap = h.runtime.Snapshot()
	}
	out := make([]admin.Tree, 0, len(h.trees))
	for _, t := range h.trees {
		at := admin.Tree{Name: t.Name, Store: h.storeName, Mode: h.treeMode(t), ConfiguredMode: h.configuredMode()}
		if snap != nil {
			at.ModeOverride = snap.Mode(t.Name)
		}
		for _, tier := range t.Tiers {
			ti := admin.Tier{Name: tier.Name, Key: tier.Key, Missing: string(tier.Missing), Adaptive: tier.Adaptive, Limits: limitsOf(tier.Limits)}
			values := map[string]*admin.Value{}
			for v, o := range tier.Values {
				values[v] = &admin.Value{Value: v, Source: "config", Limits: limitsOf(o.Limits), Unlimited: o.Unlimited}
			}
			if snap != nil {
				for _, o := range snap.Overrides() {
					if o.Tree != t.Name || o.Tier != tier.Name {
						continue
					}
					updated := o.Updated
					av := &admin.Value{Value: o.Value, Source: "override", Unlimited: o.Unlimited, Note: o.Note, Updated: &updated,
						Configured: values[o.Value]}
					if c, ok := runtimeOverride(tier, o.Value); ok {
						av.Limits = limitsOf(c.Limits)
					} else {
						av.Limits = limitsOf(o.Limits)
					}
					if !o.Expires.IsZero() {
						exp := o.Expires
						av.Expires = &exp
					}
					values[o.Value] = av
				}
			}
			keys := make([]string, 0, len(values))
			for v := range values {
				keys = append(keys, v)
			}
			slices.Sort(keys)
			for _, v := range keys {
				ti.Values = append(ti.Values, *values[v])
			}
			at.Tiers = append(at.Tiers, ti)
		}
		out = append(out, at)
	}
	return out
}

// runtimeOverride is the compiled runtime override of value v of tier, if
// one is installed.
func runtimeOverride(tier *hierarchy.Tier, v string) (*hierarchy.Override, bool) {
	o, rt := tier.OverrideOf(v)
	return o, rt && o != nil
}

func limitsOf(ls []*hierarchy.Limit) []admin.Limit {
	out := make([]admin.Limit, len(ls))
	for i, l := range ls {
		out[i] = admin.Limit{Limit: hierarchy.Limit{Count: l.Count, Per: l.Per, Dimension: l.Dimension, Burst: l.Burst, Algorithm: l.Algorithm, Timezone: l.Timezone},
			Text: l.String(), Policy: l.Policy()}
	}
	return out
}

// badRequest is an admin API error of the caller's.
func badRequest(format string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(format, args...)}
}

// adminPath resolves the path an admin request names: the tiers' values
// by name, down to the deepest tier given. Tiers above it that are
// constants (a global ceiling) take their constant; tiers that skip a
// missing key may be left out; any other tier on the way must be given.
// Values are transformed as on the request path (an mholt zone's IP
// prefixes), and escaped by Resolve alike.
func (h *Handler) adminPath(tree string, given map[string]string) (*Tree, []string, error) {
	t := h.tree(tree)
	if t == nil {
		return nil, nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tree %q", tree)}
	}
	depth := 0
	for name := range given {
		_, i := t.Tier(name)
		if i < 0 {
			return nil, nil, badRequest("tree %s has no tier %q: its tiers are %s (a tier named like a parameter, e.g. tree, is given as tier.tree=…)",
				t.Name, name, strings.Join(tierNames(t), ", "))
		}
		depth = max(depth, i+1)
	}
	for depth < len(t.Tiers) && depth == 0 && !t.Tiers[0].Dynamic() {
		depth++ // nothing given: the constant tiers at the top, if any
	}
	if depth == 0 {
		return nil, nil, badRequest("give the value of at least one tier, e.g. &%s=<value>", t.Tiers[0].Name)
	}
	values := make([]string, depth)
	for i, tier := range t.Tiers[:depth] {
		v, ok := given[tier.Name]
		switch {
		case ok && v == "" && tier.Missing == hierarchy.MissingDeny:
			return nil, nil, badRequest("tier %s refuses requests without a value: give one", tier.Name)
		case ok:
		case !tier.Dynamic():
			v = tier.Key
		case tier.Missing != hierarchy.MissingDeny:
			v = "" // skipped, or the shared bucket of requests without one
		default:
			return nil, nil, badRequest("the path needs the value of tier %s (its key is %s): add &%s=<value>", tier.Name, tier.Key, tier.Name)
		}
		if t.ipv4Prefix != 0 || t.ipv6Prefix != 0 {
			v = networkOf(v, t.ipv4Prefix, t.ipv6Prefix)
		}
		values[i] = v
	}
	return t, values, nil
}

// Inspect implements admin.Engine: it peeks at the path's buckets twice
// in one store call, at cost 0 (what remains, when full again) and at the
// request's cost (whether it fits, else when).
func (h *Handler) Inspect(r *http.Request, tree string, given map[string]string, cost admin.Cost) (*admin.Buckets, error) {
	t, values, err := h.adminPath(tree, given)
	if err != nil {
		return nil, err
	}
	var plan hierarchy.Plan
	t.Resolve(values, &plan)
	dims := t.Dimensions()
	for dim := range cost.Dims {
		if !slices.Contains(dims, dim) {
			return nil, badRequest("tree %s counts no %s: its dimensions are %s", t.Name, dim, strings.Join(dims, ", "))
		}
	}
	costOf := map[string]int64{}
	for _, dim := range dims {
		n, ok := cost.Dims[dim]
		switch {
		case ok:
		case dim != hierarchy.Requests || len(dims) == 1:
			n = cost.Default
		default:
			n = 1
		}
		costOf[dim] = n
	}
	n := len(plan.Buckets)
	peek := make([]store.Bucket, 2*n)
	scaled := make([]bool, n)
	for i, b := range plan.Buckets {
		l := b.Limit.Rate()
		if b.Tier.Adaptive && h.controller != nil {
			l = scale(l, h.controller.FactorFor(h.priority))
			scaled[i] = l.Count != b.Limit.Rate().Count || l.Burst != b.Limit.Rate().Burst
		}
		peek[i] = store.Bucket{Key: b.Key, Limit: l}
		peek[n+i] = store.Bucket{Key: b.Key, Limit: l, Cost: costOf[b.Limit.Dimension]}
	}
	out := &admin.Buckets{Tree: t.Name, Cost: costOf, Allowed: true, Buckets: []admin.Bucket{}}
	for i, v := range values {
		out.Path = append(out.Path, admin.PathValue{Tier: t.Tiers[i].Name, Value: v})
	}
	if n == 0 {
		return out, nil
	}
	d, err := store.Peek(r.Context(), h.store, peek)
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	var retry int64
	for i, b := range plan.Buckets {
		now, asked := d.Results[i], d.Results[n+i]
		source := "tier"
		if o, rt := b.Tier.OverrideOf(b.Value); o != nil {
			source = map[bool]string{true: "override", false: "config"}[rt]
		}
		ab := admin.Bucket{
			Tier: b.Tier.Name, Value: b.Value, Limit: b.Limit.String(), Source: source, Policy: b.Limit.Policy(),
			Dimension: b.Limit.Dimension, Capacity: peek[i].Limit.Capacity(), Remaining: now.Before,
			FullIn: seconds(now.Reset), Impossible: asked.Impossible, Scaled: scaled[i], Key: b.Key,
		}
		if !asked.Allowed && !asked.Impossible {
			ab.RetryAfter = seconds(asked.RetryAfter)
			retry = max(retry, asked.RetryAfter)
		}
		out.Allowed = out.Allowed && asked.Allowed
		out.Impossible = out.Impossible || asked.Impossible
		out.Buckets = append(out.Buckets, ab)
	}
	if !out.Allowed && !out.Impossible {
		out.RetryAfter = seconds(retry)
	}
	return out, nil
}

func seconds(us int64) float64 { return float64(us) / 1e6 }

// Reset implements admin.Engine.
func (h *Handler) Reset(r *http.Request, tree string, given map[string]string, below bool) (*admin.Reset, error) {
	t, values, err := h.adminPath(tree, given)
	if err != nil {
		return nil, err
	}
	out := &admin.Reset{Tree: t.Name, Below: below}
	for i, v := range values {
		out.Path = append(out.Path, admin.PathValue{Tier: t.Tiers[i].Name, Value: v})
	}
	rs, ok := h.store.(store.Resetter)
	if !ok {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotImplemented, Err: fmt.Errorf("this store cannot reset buckets")}
	}
	if below {
		glob, match := t.Subtree(values)
		out.Buckets, err = rs.ResetMatching(r.Context(), store.KeyMatch{Glob: glob, Match: match})
	} else {
		var plan hierarchy.Plan
		t.Resolve(values, &plan)
		last := t.Tiers[len(values)-1]
		var keys []string
		for _, b := range plan.Buckets {
			if b.Tier == last {
				keys = append(keys, b.Key)
			}
		}
		out.Buckets, err = rs.Reset(r.Context(), keys)
	}
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	fields := []zap.Field{zap.String("tree", t.Name), zap.Bool("below", below), zap.Int("buckets", out.Buckets)}
	if h.DenialLog != "no_values" {
		fields = append(fields, zap.Any("path", out.Path))
	}
	h.logger.Info("rate limit buckets reset", fields...)
	return out, nil
}

// noteDenial counts a denied request among the store's most-denied keys,
// and logs it: the first denial of its key each minute at INFO, the others
// counted into one line a minute (see logsample).
func (h *Handler) noteDenial(r *http.Request, d *decision) {
	if d.closest < 0 || d.closest >= len(d.buckets) {
		return
	}
	b := d.buckets[d.closest]
	key := b.Key
	if i := strings.LastIndexByte(key, '#'); i >= 0 {
		key = key[:i] // the bucket's path, whatever the limit
	}
	if h.top != nil {
		h.top.Add(key, 1)
	}
	if h.denials == nil {
		return
	}
	first, summary := h.denials.Allow(key, time.Now())
	if summary.Suppressed > 0 {
		h.logger.Info("rate limited (more denials, not logged one by one)",
			zap.Int("denials", summary.Suppressed), zap.Int("keys", summary.Keys), zap.Duration("over", summary.Interval))
	}
	if !first {
		return
	}
	fields := []zap.Field{
		zap.String("blocked_by", d.blocked),
		zap.String("reason", d.reason),
		zap.String("mode", d.mode),
		zap.Duration("retry_after", d.retry),
		zap.String("path", r.URL.Path),
	}
	if h.DenialLog != "no_values" {
		var path []string
		for _, pb := range d.buckets {
			if pb.Tree == b.Tree {
				seg := pb.Tier.Name + "=" + truncate(pb.Value, 256)
				if !slices.Contains(path, seg) {
					path = append(path, seg)
				}
			}
		}
		fields = append(fields, zap.Strings("values", path))
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", b.Key))
	}
	h.logger.Info("rate limited", fields...)
}
