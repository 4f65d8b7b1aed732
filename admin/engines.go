package admin

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
)

// The engines as the admin API sees them: the engines of the running
// configuration's rate_limit handlers (package running), described and
// operated on in this API's terms.

// Cost is the cost of the request an inspection asks about: Dims per
// dimension, and Default for every other dimension but requests (which a
// request costs 1 of), or for requests when the tree counts nothing else.
type Cost struct {
	Default int64
	Dims    map[string]int64
}

// active returns the engines of the running configuration.
func active() []*engine.Engine { return running.Engines() }

// describe describes e's trees, with the overrides and modes in force.
func describe(e *engine.Engine) []Tree {
	var snap *control.Snapshot
	if rt := e.Config().Runtime; rt != nil {
		snap = rt.Snapshot()
	}
	out := make([]Tree, 0, len(e.Config().Trees))
	for _, t := range e.Config().Trees {
		at := Tree{Name: t.Name, Store: e.Config().StoreName, Mode: e.Mode(t), ConfiguredMode: e.Config().Mode,
			Plan: t.PlanKey, DefaultPlan: t.DefaultPlan, AllocationProblems: t.AllocationProblems()}
		if snap != nil {
			at.ModeOverride = snap.Mode(t.Name)
		}
		for _, tier := range t.Tiers {
			ti := Tier{Name: tier.Name, Key: tier.Key, Missing: string(tier.Missing), Adaptive: tier.Adaptive, Sensitive: tier.IsSensitive(), Limits: limitsOf(tier.Limits)}
			for name, o := range tier.Plans {
				if ti.Plans == nil {
					ti.Plans = map[string]Value{}
				}
				ti.Plans[name] = Value{Value: name, Source: "plan", Limits: limitsOf(o.Limits), Unlimited: o.Unlimited}
			}
			values := map[string]*Value{}
			for v, o := range tier.Values {
				values[v] = &Value{Value: e.Show(tier, v), Source: "config", Limits: limitsOf(o.Limits), Unlimited: o.Unlimited}
			}
			if snap != nil {
				for _, o := range snap.Overrides() {
					if o.Tree != t.Name || o.Tier != tier.Name {
						continue
					}
					updated := o.Updated
					av := &Value{Value: e.Show(tier, o.Value), Source: "override", Unlimited: o.Unlimited, Note: o.Note, Updated: &updated,
						Configured: values[o.Value]}
					if c, rt := tier.OverrideOf(o.Value); rt && c != nil {
						av.Limits = limitsOf(c.Limits) // as compiled
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

func limitsOf(ls []*hierarchy.Limit) []Limit {
	out := make([]Limit, len(ls))
	for i, l := range ls {
		out[i] = Limit{Limit: hierarchy.Limit{Count: l.Count, Per: l.Per, Dimension: l.Dimension, Burst: l.Burst, Algorithm: l.Algorithm, Timezone: l.Timezone},
			Text: l.String(), Policy: l.Policy()}
	}
	return out
}

// pathOf resolves the path an admin request names (engine.Path), its
// errors as the API's.
func pathOf(e *engine.Engine, tree string, given map[string]string) (*engine.Tree, []string, error) {
	t, values, err := e.Path(tree, given)
	var pe *engine.PathError
	switch {
	case errors.As(err, &pe) && pe.NotFound:
		return nil, nil, apiError(http.StatusNotFound, "%s", pe.Msg)
	case err != nil:
		return nil, nil, apiError(http.StatusBadRequest, "%v", err)
	}
	return t, values, nil
}

// inspect reads the buckets of one path of a tree without charging them:
// what remains, when full again, and the Retry-After a request of cost
// would get now.
func inspect(r *http.Request, e *engine.Engine, tree string, given map[string]string, cost Cost) (*Buckets, error) {
	t, values, err := pathOf(e, tree, given)
	if err != nil {
		return nil, err
	}
	dims := t.Dimensions()
	for dim := range cost.Dims {
		if !slices.Contains(dims, dim) {
			return nil, apiError(http.StatusBadRequest, "tree %s counts no %s: its dimensions are %s", t.Name, dim, strings.Join(dims, ", "))
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
	out := &Buckets{Tree: t.Name, Cost: costOf, Allowed: true, Buckets: []Bucket{}}
	for i, v := range values {
		out.Path = append(out.Path, PathValue{Tier: t.Tiers[i].Name, Value: e.Show(t.Tiers[i], v)})
	}
	p, err := e.Peek(r.Context(), t, values, costOf)
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: e.ShowError(err, pathBuckets(t, values))}
	}
	out.Store = e.Config().StoreName
	if p.Store != "" {
		out.Store = p.Store
	}
	var retry int64
	for i, b := range p.Buckets {
		now, asked := p.Now.Results[i], p.Asked.Results[i]
		source := "tier"
		if o, rt := b.Tier.OverrideOf(b.Value); o != nil {
			source = map[bool]string{true: "override", false: "config"}[rt]
		}
		ab := Bucket{
			Tier: b.Tier.Name, Value: e.Show(b.Tier, b.Value), Limit: b.Limit.String(), Source: source, Policy: b.Limit.Policy(),
			Dimension: b.Limit.Dimension, Capacity: p.Limits[i].Limit.Capacity(), Remaining: now.Before,
			FullIn: secondsOf(now.Reset), Impossible: asked.Impossible, Scaled: p.Scaled[i], Key: e.ShowKey(b.Key),
		}
		if !asked.Allowed && !asked.Impossible {
			ab.RetryAfter = secondsOf(asked.RetryAfter)
			retry = max(retry, asked.RetryAfter)
		}
		out.Allowed = out.Allowed && asked.Allowed
		out.Impossible = out.Impossible || asked.Impossible
		out.Buckets = append(out.Buckets, ab)
	}
	if !out.Allowed && !out.Impossible {
		out.RetryAfter = secondsOf(retry)
	}
	return out, nil
}

func secondsOf(us int64) float64 { return float64(us) / 1e6 }

// reset makes the buckets of the last tier given full again; with below,
// every bucket of the subtree of that value.
func reset(r *http.Request, e *engine.Engine, tree string, given map[string]string, below bool) (*Reset, error) {
	t, values, err := pathOf(e, tree, given)
	if err != nil {
		return nil, err
	}
	out := &Reset{Tree: t.Name, Below: below}
	for i, v := range values {
		out.Path = append(out.Path, PathValue{Tier: t.Tiers[i].Name, Value: e.Show(t.Tiers[i], v)})
	}
	out.Buckets, err = e.Reset(r.Context(), t, values, below)
	switch {
	case errors.Is(err, engine.ErrCannotReset):
		return nil, caddy.APIError{HTTPStatus: http.StatusNotImplemented, Err: err}
	case err != nil:
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: e.ShowError(err, pathBuckets(t, values))}
	}
	return out, nil
}
