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
	var path strings.Builder
	tag := ""
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
		ev := Escape(v)
		if path.Len() > 0 {
			path.WriteByte('/')
		}
		path.WriteString(tier.Name)
		path.WriteByte('=')
		path.WriteString(ev)

		thisTag := tag
		if tag == "" {
			thisTag = tier.Name + "=" + ev
			if isDynamic(tier.Key) {
				tag = thisTag
			}
		}
		limits := tier.Limits
		if o, ok := tier.Values[v]; ok {
			if o.Unlimited {
				continue
			}
			limits = o.Limits
		}
		for _, l := range limits {
			plan.Buckets = append(plan.Buckets, Bucket{
				Tree:  t,
				Tier:  tier,
				Value: v,
				Limit: l,
				Key:   "{" + t.Name + "|" + thisTag + "}" + path.String() + "#" + l.id,
			})
		}
	}
}

// isDynamic reports whether a key template has a placeholder.
func isDynamic(key string) bool { return strings.ContainsRune(key, '{') }
