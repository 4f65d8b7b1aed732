package hierarchy

import (
	"strings"
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

// Resolve appends the buckets of tree t for one request to plan. values[i]
// is the resolved key of t.Tiers[i] ("" when missing).
//
// The hash tag of every key is the tree name plus the value of the first
// tier whose key has a placeholder (the tenant): one tenant's subtree lives
// in one Redis Cluster slot. Tiers above it, whose keys are constants
// (global ceilings), are tagged by their own value and so live elsewhere.
func (t *Tree) Resolve(values []string, plan *Plan) {
	// All the keys of this tree are written into one buffer and cut from
	// one string: one allocation per tree instead of one per bucket.
	first := len(plan.Buckets)
	var stack [512]byte // most paths' keys fit: then only the final string is allocated
	buf := stack[:0]
	path := make([]byte, 0, 128)
	tag, tenantStart := -1, 0 // the tenant's segment in path: the hash tag
	for i, tier := range t.Tiers {
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
			if isDynamic(tier.Key) {
				tag = len(path)
			}
		} else {
			tagStart, tagEnd = tenantStart, tag
		}
		if tag == len(path) {
			tenantStart = segment
		}
		limits := tier.Limits
		if o, ok := tier.Values[v]; ok {
			if o.Unlimited {
				continue
			}
			limits = o.Limits
		}
		for _, l := range limits {
			buf = append(buf, '{')
			buf = append(buf, t.Name...)
			buf = append(buf, '|')
			buf = append(buf, path[tagStart:tagEnd]...)
			buf = append(buf, '}')
			buf = append(buf, path...)
			buf = append(buf, '#')
			buf = append(buf, l.id...)
			plan.Buckets = append(plan.Buckets, Bucket{Tree: t, Tier: tier, Value: v, Limit: l})
		}
	}
	// Every key starts with its hash tag's "{", and escaped values never
	// hold one: the next "{" starts the next key.
	keys := string(buf)
	for i := first; i < len(plan.Buckets); i++ {
		end := strings.IndexByte(keys[1:], '{') + 1
		if end == 0 {
			end = len(keys)
		}
		plan.Buckets[i].Key, keys = keys[:end], keys[end:]
	}
}

// isDynamic reports whether a key template has a placeholder.
func isDynamic(key string) bool { return strings.ContainsRune(key, '{') }
