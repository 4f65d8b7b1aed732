package engine

import (
	"context"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// The most common path is a single bucket: one tree of one tier with one
// limit (an mholt zone, a limit per user or per address) on the memory
// store. Add and Decide serve every path, and on this one their
// generality (costs in several dimensions, adaptive scaling, penalty
// boxes, concurrency slots, waiting, idempotency records, routes, leases)
// is a measurable part of the handler's time (the root package's
// BenchmarkHandlerZone, path=single against path=general). Single tells a
// front end when DecideSingle can decide a tree's requests instead: it
// decides as Add and Decide would, sharing settle with them (the store
// call and the reading of its verdict), and
// TestDecideSingleAsTheGeneralPath holds it to their decisions.

// Single reports whether DecideSingle can decide the requests of t: t is
// the engine's only tree, with no IP prefixes, of one tier with one limit
// of requests, which is not adaptive, not a concurrency limit and has no
// penalty box; and the store decides in reused memory, without leases,
// routes, a local fallback, waiting or idempotency records.
func (e *Engine) Single(t *Tree) bool {
	if e.into == nil || e.unleased != nil || len(e.cfg.Routes) > 0 || e.cfg.Local != nil ||
		e.cfg.MaxWait > 0 || e.cfg.Idempotency.TTL > 0 ||
		len(e.cfg.Trees) != 1 || e.cfg.Trees[0] != t || t.IPv4Prefix != 0 || t.IPv6Prefix != 0 || len(t.Tiers) != 1 {
		return false
	}
	tier := t.Tiers[0]
	if len(tier.Limits) != 1 || tier.Adaptive || tier.Penalty != nil {
		return false
	}
	l := tier.Limits[0]
	return (l.Dimension == "" || l.Dimension == hierarchy.Requests) && l.Rate().Algorithm != rate.Concurrent
}

// DecideSingle decides d, just begun (Begin) and given no bucket yet, for
// value v of the tier of t, a tree Single accepts: as Add(d, t,
// []string{v}) and Decide(ctx, d, nil) would. It reports false, and d is
// then as it was, when the request takes the general path after all, for
// what may change at runtime or differs per request: v is empty (the
// tier's missing policy applies), t is not in enforce mode, or v has an
// override.
func (e *Engine) DecideSingle(ctx context.Context, d *Decision, t *Tree, v string) (bool, error) {
	if v == "" || len(d.Buckets) != 0 || e.Mode(t) != Enforce {
		return false, nil
	}
	tier := t.Tiers[0]
	plan := hierarchy.Plan{Buckets: d.Buckets}
	t.Resolve(append(d.Values(), v), &plan)
	// Resolve reads the overrides once, as Add does: an override (one set
	// at runtime a moment ago included) makes a path of other limits, or
	// of none.
	if len(plan.Buckets) != 1 || plan.Buckets[0].Limit != tier.Limits[0] {
		clear(d.scratch.buckets[:min(len(plan.Buckets), len(d.scratch.buckets))]) // written by Resolve: the scratch keeps no key
		return false, nil
	}
	d.Buckets = plan.Buckets
	d.used = max(d.used, len(d.Buckets))
	d.Enforcing, d.Mode = true, Enforce
	d.Costs = d.scratch.costs[:1]
	d.Costs[0] = 1
	d.Limits = d.scratch.limits[:1]
	d.Limits[0] = store.Bucket{Key: d.Buckets[0].Key, Limit: d.Buckets[0].Limit.Rate(), Cost: 1}
	if err := e.settle(ctx, d, d.scratch); err != nil {
		d.Reason = ReasonStoreError
		return true, err
	}
	// No Strike: only a tier with a penalty box is struck, and Single
	// admits none.
	return true, nil
}
