package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// Operations on the buckets of one path, for the admin API, and what the
// engine notes of denials.

// PathError is a path of buckets named by an operator that the engine
// cannot resolve: no such tree (NotFound), or values that do not make a
// path. Its message says what to fix.
type PathError struct {
	NotFound bool
	Msg      string
}

func (err *PathError) Error() string { return err.Msg }

func badPath(format string, args ...any) error {
	return &PathError{Msg: fmt.Sprintf(format, args...)}
}

// ErrCannotReset is returned by Reset when the store cannot reset buckets.
var ErrCannotReset = errors.New("this store cannot reset buckets")

// Path resolves the path an operator names: the tiers' values by name,
// down to the deepest tier given. Tiers above it that are constants (a
// global ceiling) take their constant; tiers that skip a missing key may
// be left out; any other tier on the way must be given. Values are
// transformed as on the request path (an mholt zone's IP prefixes), and
// escaped by Resolve alike.
func (e *Engine) Path(tree string, given map[string]string) (*Tree, []string, error) {
	t := e.Tree(tree)
	if t == nil {
		return nil, nil, &PathError{NotFound: true, Msg: fmt.Sprintf("no tree %q", tree)}
	}
	depth := 0
	for name := range given {
		_, i := t.Tier(name)
		if i < 0 {
			return nil, nil, badPath("tree %s has no tier %q: its tiers are %s (a tier named like a parameter, e.g. tree, is given as tier.tree=…)",
				t.Name, name, strings.Join(t.TierNames(), ", "))
		}
		depth = max(depth, i+1)
	}
	for depth < len(t.Tiers) && depth == 0 && !t.Tiers[0].Dynamic() {
		depth++ // nothing given: the constant tiers at the top, if any
	}
	if depth == 0 {
		return nil, nil, badPath("give the value of at least one tier, e.g. &%s=<value>", t.Tiers[0].Name)
	}
	values := make([]string, depth)
	for i, tier := range t.Tiers[:depth] {
		v, ok := given[tier.Name]
		switch {
		case ok && v == "" && tier.Missing == hierarchy.MissingDeny:
			return nil, nil, badPath("tier %s refuses requests without a value: give one", tier.Name)
		case ok:
		case !tier.Dynamic():
			v = tier.Key
		case tier.Missing != hierarchy.MissingDeny:
			v = "" // skipped, or the shared bucket of requests without one
		default:
			return nil, nil, badPath("the path needs the value of tier %s (its key is %s): add &%s=<value>", tier.Name, tier.Key, tier.Name)
		}
		values[i] = t.value(v)
	}
	return t, values, nil
}

// Peeked is what Peek read of a path's buckets.
type Peeked struct {
	Buckets []hierarchy.Bucket
	// Limits are the buckets' effective limits; Scaled, per bucket, says
	// whether the adaptive factor changed one.
	Limits []store.Bucket
	Scaled []bool
	// Now is each bucket as it is (at cost 0: what remains, when full
	// again); Asked at the cost asked about (whether it fits, else when).
	Now, Asked store.Decision
	// Store names the route's store that holds the path (Config.Routes),
	// "" for Config.Store.
	Store string
}

// Peek reads the buckets of t's path of values without charging them: in
// one store call, at cost 0 and at costOf[dimension].
func (e *Engine) Peek(ctx context.Context, t *Tree, values []string, costOf map[string]int64) (*Peeked, error) {
	var plan hierarchy.Plan
	t.Resolve(values, &plan)
	n := len(plan.Buckets)
	out := &Peeked{Buckets: plan.Buckets, Limits: make([]store.Bucket, n), Scaled: make([]bool, n)}
	if n == 0 {
		return out, nil
	}
	peek := make([]store.Bucket, 2*n)
	for i, b := range plan.Buckets {
		l, scaled := e.effective(b)
		out.Scaled[i] = scaled
		out.Limits[i] = store.Bucket{Key: b.Key, Limit: l}
		peek[i] = out.Limits[i]
		cost := costOf[b.Limit.Dimension]
		if l.Algorithm == rate.Concurrent {
			cost = min(cost, 1) // a request takes one slot, whatever its cost
		}
		peek[n+i] = store.Bucket{Key: b.Key, Limit: l, Cost: cost}
	}
	route := e.routeOf(plan.Buckets)
	d, err := store.Peek(ctx, e.storeAt(route), peek)
	if err != nil {
		return nil, err
	}
	if route > 0 {
		out.Store = e.cfg.Routes[route-1].Name
	}
	out.Now, out.Asked = d, d
	out.Now.Results, out.Asked.Results = d.Results[:n], d.Results[n:]
	return out, nil
}

// Reset makes the buckets of the last tier of t's path of values full
// again; with below, every bucket of the subtree of that value. It
// returns how many buckets it reset.
func (e *Engine) Reset(ctx context.Context, t *Tree, values []string, below bool) (int, error) {
	rs, ok := e.cfg.Store.(store.Resetter)
	if !ok {
		return 0, ErrCannotReset
	}
	var n int
	var err error
	if below {
		// A subtree may span routes: every store is reset.
		glob, match := t.Subtree(values)
		reset := func(rs store.Resetter) (int, error) {
			return rs.ResetMatching(ctx, store.KeyMatch{Glob: glob, Match: match})
		}
		n, err = reset(rs)
		if err == nil {
			n, err = e.resetRoutes(n, reset)
		}
	} else {
		var plan hierarchy.Plan
		t.Resolve(values, &plan)
		route := e.routeOf(plan.Buckets)
		if route > 0 {
			if rs, ok = e.cfg.Routes[route-1].Store.(store.Resetter); !ok {
				return 0, ErrCannotReset
			}
		}
		last := t.Tiers[len(values)-1]
		var keys []string
		for _, b := range plan.Buckets {
			if b.Tier == last {
				keys = append(keys, b.Key)
				if b.Limit.Penalty() != nil { // out of its box, strikes forgotten
					strikes, _ := b.Strikes()
					keys = append(keys, strikes)
				}
			}
		}
		n, err = rs.Reset(ctx, keys)
		if err == nil && route == 0 && !slices.ContainsFunc(t.Tiers[:len(values)], (*hierarchy.Tier).Dynamic) {
			// A ceiling above the tenants: each store holds a copy of
			// its buckets.
			n, err = e.resetRoutes(n, func(rs store.Resetter) (int, error) { return rs.Reset(ctx, keys) })
		}
	}
	if err != nil {
		return 0, err
	}
	fields := []zap.Field{zap.String("tree", t.Name), zap.Bool("below", below), zap.Int("buckets", n)}
	if e.cfg.DenialLog != "no_values" {
		var path []string
		for i, v := range values {
			path = append(path, t.Tiers[i].Name+"="+truncate(e.Show(t.Tiers[i], v), 256))
		}
		fields = append(fields, zap.Strings("path", path))
	}
	e.cfg.Logger.Info("rate limit buckets reset", fields...)
	return n, nil
}

// Mark claims tag for bucket i of d's path, in the store that decided d:
// true the first time in the period of the bucket's limit (a calendar
// limit's calendar period, another's Per), false after, across every
// instance sharing the store. For what must happen once a period, as a
// budget alert. A local decision's marks are this instance's own.
func (d *Decision) Mark(ctx context.Context, i int, tag string) (bool, error) {
	b := d.Buckets[i]
	l := b.Limit.Rate()
	marker := rate.Limit{Algorithm: rate.GCRA, Count: 1, Period: l.Period}
	if l.Algorithm == rate.Calendar {
		marker = l // its window, whatever defines it (unit, period, location)
		marker.Count = 1
	}
	res, err := d.e.storeFor(d.Local, d.route).Decide(ctx, []store.Bucket{{Key: b.Key + "#mark:" + tag, Limit: marker, Cost: 1}})
	if err != nil {
		return false, d.e.ShowError(err, d.Buckets)
	}
	return res.Allowed, nil
}

// NoteDenial counts a denied request among the store's most-denied keys,
// and logs it: the first denial of its key each minute at INFO, the others
// counted into one line a minute (see logsample). what names the request
// in the line (its URL path).
func (d *Decision) NoteDenial(what string, requestID func() string) {
	if d.Closest < 0 || d.Closest >= len(d.Buckets) {
		return
	}
	e := d.e
	b := d.Buckets[d.Closest]
	key := b.Key
	if i := strings.LastIndexByte(key, '#'); i >= 0 {
		key = key[:i] // the bucket's path, whatever the limit
	}
	if e.cfg.Top != nil {
		e.cfg.Top.Add(key, 1)
	}
	if e.denials == nil {
		return
	}
	first, summary := e.denials.Allow(key, time.Now())
	if summary.Suppressed > 0 {
		e.cfg.Logger.Info("rate limited (more denials, not logged one by one)",
			zap.Int("denials", summary.Suppressed), zap.Int("keys", summary.Keys), zap.Duration("over", summary.Interval))
	}
	if !first {
		return
	}
	fields := []zap.Field{
		zap.String("blocked_by", d.Blocked),
		zap.String("reason", d.Reason),
		zap.String("mode", d.Mode),
		zap.Duration("retry_after", d.Retry),
		zap.String("path", what),
	}
	if requestID != nil {
		if id := requestID(); id != "" {
			fields = append(fields, zap.String("request_id", id))
		}
	}
	if e.cfg.DenialLog != "no_values" {
		var path []string
		for _, pb := range d.Buckets {
			if pb.Tree == b.Tree {
				seg := pb.Tier.Name + "=" + truncate(e.Show(pb.Tier, pb.Value), 256)
				if !slices.Contains(path, seg) {
					path = append(path, seg)
				}
			}
		}
		fields = append(fields, zap.Strings("values", path))
	}
	if e.cfg.LogKey {
		fields = append(fields, zap.String("key", e.ShowKey(b.Key)))
	}
	e.cfg.Logger.Info("rate limited", fields...)
}

// resetRoutes resets in every route's store too, adding to the n buckets
// already reset.
func (e *Engine) resetRoutes(n int, reset func(store.Resetter) (int, error)) (int, error) {
	for _, r := range e.cfg.Routes {
		rs, ok := r.Store.(store.Resetter)
		if !ok {
			return 0, ErrCannotReset
		}
		m, err := reset(rs)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
