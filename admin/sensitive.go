package admin

import (
	"strings"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// What the API shows of the values of sensitive tiers (hierarchy.Tier.
// IsSensitive): their fingerprints, never the values. A caller still names
// a value as it is to find its buckets or override (the operator has it);
// the answer shows the fingerprint.

// showValue is what the API shows of value v of tier of tree: v when
// every one of es that has the tier shows it raw, else its fingerprint
// (two handlers may name a tree and a tier alike, one keyed on a
// credential). A tier none of es has (an override left from another
// configuration) is treated as sensitive.
func showValue(es []*engine.Engine, tree, tier, v string) string {
	return showBy(es, v, func(e *engine.Engine) *hierarchy.Tier {
		if t := e.Tree(tree); t != nil {
			ti, _ := t.Tier(tier)
			return ti
		}
		return nil
	})
}

// showBy shows v as the tier tierOf finds in each engine of es shows it:
// a fingerprint if any shows one, v if one shows it as it is, and when
// none has such a tier (a value left from another configuration), a
// fingerprint.
func showBy(es []*engine.Engine, v string, tierOf func(*engine.Engine) *hierarchy.Tier) string {
	known := false
	for _, e := range es {
		if ti := tierOf(e); ti != nil {
			if s := e.Show(ti, v); s != v {
				return s
			}
			known = true
		}
	}
	switch {
	case known:
		return v
	case len(es) == 0:
		return engine.Unknown
	}
	return es[0].Config().Fingerprints.Value(v)
}

// showOverride returns o as the API shows it: a copy with its value
// fingerprinted if its tier is sensitive; nil stays nil.
func showOverride(es []*engine.Engine, o *control.Override) *control.Override {
	if o == nil {
		return nil
	}
	c := *o
	c.Value = showValue(es, o.Tree, o.Tier, o.Value)
	return &c
}

// showError returns err with value v of the named tier fingerprinted in
// its message, if the tier is sensitive, and any storage key it quotes
// shown as engine.ShowKey does.
func showError(e *engine.Engine, tree, tier, v string, err error) error {
	var bs []hierarchy.Bucket
	if t := e.Tree(tree); t != nil {
		if ti, _ := t.Tier(tier); ti != nil {
			bs = []hierarchy.Bucket{{Tier: ti, Value: v}}
		}
	}
	return e.ShowError(err, bs)
}

// enginesOf returns the engines of es whose runtime state is rt.
func enginesOf(es []*engine.Engine, rt *control.Runtime) []*engine.Engine {
	var out []*engine.Engine
	for _, e := range es {
		if e.Config().Runtime == rt {
			out = append(out, e)
		}
	}
	return out
}

// pathBuckets are stand-ins for the buckets of a path of values, enough
// for engine.ShowError to find the values in a message.
func pathBuckets(t *engine.Tree, values []string) []hierarchy.Bucket {
	bs := make([]hierarchy.Bucket, len(values))
	for i, v := range values {
		bs[i] = hierarchy.Bucket{Tier: t.Tiers[i], Value: v}
	}
	return bs
}

// showKey shows a key of the top-K sketch as engine.ShowKey does, by
// whichever of es that has its tree fingerprints the most of it (handlers
// may name a tree alike, one keyed on a credential); by any of them
// otherwise, which fingerprints every value of a tree it does not know.
func showKey(es []*engine.Engine, key string) string {
	shown, found := "", false
	for _, e := range es {
		if e.Tree(treeOfKey(key)) != nil {
			if s := e.ShowKey(key); !found || strings.Count(s, engine.FingerprintPrefix) > strings.Count(shown, engine.FingerprintPrefix) {
				shown, found = s, true
			}
		}
	}
	switch {
	case found:
		return shown
	case len(es) == 0:
		return key
	}
	return es[0].ShowKey(key)
}

// treeOfKey is the tree named by a storage key "{tree|tag}…".
func treeOfKey(key string) string {
	rest, ok := strings.CutPrefix(key, "{")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "|")
	return name
}
