package hierarchy

import (
	"strings"
	"unsafe"
)

// Bucket is one limit of one tier, for one request's value of the tier's key.
type Bucket struct {
	Tree  *Tree
	Tier  *Tier
	Value string // the key's value as resolved (unescaped), "" for a shared bucket
	Limit *Limit
	// Key is the storage key: "{tree|tenant}path#limit", with every value escaped.
	Key string
}

// Plan is what one request must fit into: the buckets of every tier on its
// path, root first.
type Plan struct {
	Buckets []Bucket
	// MissingTier is set when a tier whose key resolved to empty has the
	// deny policy: the request must be refused and Buckets is incomplete.
	MissingTier *Tier
}

// Resolve is ResolveEntitled for a request with no entitlement: no plan
// given (the default plan's blocks apply), no limits of its own.
func (t *Tree) Resolve(values []string, plan *Plan) { t.ResolveEntitled(values, nil, plan) }

// ResolveEntitled appends the buckets of tree t for one request, entitled
// to ent (nil: no plan given, no limits of its own), to plan. values[i]
// is the resolved key of t.Tiers[i] ("" when missing). Tiers beyond
// len(values) are left out: the path then ends at the last value given (as
// an operator inspecting a team's buckets gives no user).
//
// A tier's limits for its value v are, most specific first: v's runtime
// override, v's value block, the customer's own (ent.Own, for ent.Tier),
// the tier's block for the request's plan (PlanOf(ent.Plan), or
// ent.Index), the tier's own; an unlimited one leaves the
// tier out. Keys do not depend on which: a limit's key is its path and its
// dimension, algorithm and period, so a customer changing plans keeps
// counting in the buckets it had.
//
// The hash tag of every key is the tree name plus the value of the first
// tier whose key has a placeholder (the tenant): one tenant's subtree lives
// in one Redis Cluster slot. Tiers above it, whose keys are constants
// (global ceilings), are tagged by their own value and so live elsewhere.
func (t *Tree) ResolveEntitled(values []string, ent *Entitlement, plan *Plan) {
	// All the keys of this tree are written into one buffer, sized
	// exactly beforehand, and cut from it: one allocation per tree.
	first := len(plan.Buckets)
	path := make([]byte, 0, 128)
	type span struct{ tagStart, tagEnd, pathEnd int } // of one bucket's key, in path
	var spanBuf [8]span                               // more grow on the heap: a small frame (see store's maxPath)
	spans := spanBuf[:0]
	size := 0
	tag, tenantStart := -1, 0 // the tenant's segment in path: the hash tag
	customerPlan := 0
	switch {
	case ent != nil && ent.Indexed:
		customerPlan = ent.Index
	case ent != nil && t.PlanKey != "":
		customerPlan, _ = t.PlanIndex(ent.Plan)
	case t.PlanKey != "":
		customerPlan, _ = t.PlanIndex("")
	}
	for i, tier := range t.Tiers[:min(len(values), len(t.Tiers))] {
		v := values[i]
		if v == "" {
			switch tier.Missing {
			case MissingSkip:
				continue
			case MissingDeny:
				plan.MissingTier = tier
				return
			}
		}
		if len(path) > 0 {
			path = append(path, '/')
		}
		segment := len(path)
		path = append(path, tier.Name...)
		path = append(path, '=')
		path = append(path, Escape(v)...)
		// The tag is this tier's own segment until a tier with a
		// placeholder (the tenant) fixes it for every tier below.
		tagStart, tagEnd := segment, len(path)
		if tag < 0 {
			if tier.dynamic {
				tag = len(path)
			}
		} else {
			tagStart, tagEnd = tenantStart, tag
		}
		if tag == len(path) {
			tenantStart = segment
		}
		limits := tier.Limits
		o, _ := tier.OverrideOf(v)
		if o == nil {
			o = entitled(tier, customerPlan, ent)
		}
		if o != nil {
			if o.Unlimited {
				continue
			}
			limits = o.Limits
		}
		for _, l := range limits {
			// {tree|tag}path#id
			size += len(t.Name) + tagEnd - tagStart + len(path) + len(l.id) + 4
			spans = append(spans, span{tagStart, tagEnd, len(path)})
			plan.Buckets = append(plan.Buckets, Bucket{Tree: t, Tier: tier, Value: v, Limit: l})
		}
		if p := tier.Penalty; p != nil { // the value's penalty box, after its limits
			size += len(t.Name) + tagEnd - tagStart + len(path) + len(p.box.id) + 4
			spans = append(spans, span{tagStart, tagEnd, len(path)})
			plan.Buckets = append(plan.Buckets, Bucket{Tree: t, Tier: tier, Value: v, Limit: p.box})
		}
	}
	buf := make([]byte, 0, size)
	for k, sp := range spans {
		buf = append(buf, '{')
		buf = append(buf, t.Name...)
		buf = append(buf, '|')
		buf = append(buf, path[sp.tagStart:sp.tagEnd]...)
		buf = append(buf, '}')
		buf = append(buf, path[:sp.pathEnd]...)
		buf = append(buf, '#')
		buf = append(buf, plan.Buckets[first+k].Limit.id...)
		spans[k].pathEnd = len(buf) // now the key's end
	}
	// buf is never written again: the keys can share it rather than a copy
	// (as strings.Builder does, without its checks on every write).
	keys, start := unsafe.String(unsafe.SliceData(buf), len(buf)), 0
	for k, sp := range spans {
		plan.Buckets[first+k].Key = keys[start:sp.pathEnd]
		start = sp.pathEnd
	}
}

// isDynamic reports whether a key template has a placeholder.
func isDynamic(key string) bool { return strings.ContainsRune(key, '{') }

// Subtree selects the stored buckets of the subtree rooted at the last of
// values (values[i] the value of t.Tiers[i], as for Resolve): that value's
// own buckets, every limit's, and those of every value below it. glob is a
// Redis SCAN pattern over the keys, match the same selection as a function.
func (t *Tree) Subtree(values []string) (glob string, match func(key string) bool) {
	var b strings.Builder
	for i, tier := range t.Tiers[:min(len(values), len(t.Tiers))] {
		if values[i] == "" && tier.Missing == MissingSkip {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(tier.Name + "=" + Escape(values[i]))
	}
	path := b.String()
	head := "{" + t.Name + "|"
	// Escaped values hold no glob character (*?[]\), nor do names.
	glob = head + "*}" + path + "[#/]*"
	match = func(key string) bool {
		if !strings.HasPrefix(key, head) {
			return false
		}
		end := strings.IndexByte(key, '}')
		if end < 0 {
			return false
		}
		rest := key[end+1:]
		return len(rest) > len(path) && strings.HasPrefix(rest, path) && (rest[len(path)] == '#' || rest[len(path)] == '/')
	}
	return glob, match
}
