package engine

import (
	"context"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// The most common path is a single bucket: one tree of one tier with one
// limit (an mholt zone, a limit per user or per address) on the memory
// store. Decide serves every path, and on this one its generality (costs
// in several dimensions, adaptive scaling, penalty boxes, concurrency
// slots, waiting, idempotency records, routes, leases) is a measurable
// part of the handler's time (the root package's BenchmarkHandlerZone).
// So New finds the tree whose paths may be single (singleTree), Add marks
// a path of its one configured limit, and Decide decides such a path with
// decideSingle: as the general path would, sharing settle with it (the
// store call and the reading of its verdict).
// TestDecideSingleAsTheGeneralPath holds it to the general path's
// decisions.

// singleTree is the engine's tree whose paths decideSingle may decide, or
// nil: the engine's only tree, with no IP prefixes, of one tier with one
// limit of requests, which is not adaptive, not a concurrency limit and
// has no penalty box; and the store decides in reused memory, without
// leases, routes, a local fallback, waiting or idempotency records.
func (e *Engine) singleTree() *Tree {
	if e.into == nil || e.unleased != nil || len(e.cfg.Routes) > 0 || e.cfg.Local != nil ||
		e.cfg.MaxWait > 0 || e.cfg.Idempotency.TTL > 0 || len(e.cfg.Trees) != 1 {
		return nil
	}
	t := e.cfg.Trees[0]
	if t.IPv4Prefix != 0 || t.IPv6Prefix != 0 || len(t.Tiers) != 1 {
		return nil
	}
	tier := t.Tiers[0]
	if len(tier.Limits) != 1 || tier.Adaptive || tier.Penalty != nil {
		return nil
	}
	l := tier.Limits[0]
	if l.Dimension != "" && l.Dimension != hierarchy.Requests || l.Rate().Algorithm == rate.Concurrent {
		return nil
	}
	return t
}

// decideSingle decides d, a path Add marked single, as Decide would: one
// bucket of requests, in enforce mode, costing 1.
func (e *Engine) decideSingle(ctx context.Context, d *Decision) error {
	d.Mode = Enforce
	d.Costs = d.scratch.costs[:1]
	d.Costs[0] = 1
	d.Limits = d.scratch.limits[:1]
	d.Limits[0] = store.Bucket{Key: d.Buckets[0].Key, Limit: d.Buckets[0].Limit.Rate(), Cost: 1}
	if err := e.settle(ctx, d, d.scratch); err != nil {
		d.Reason = ReasonStoreError
		return err
	}
	// No Strike: only a tier with a penalty box is struck, and a single
	// path has none.
	return nil
}
