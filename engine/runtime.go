package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// What the engine does with the runtime state an operator sets: overrides
// and modes.

// applyRuntime installs a snapshot of the store's runtime state: each
// tier's overrides, compiled for this handler's trees, and each tree's
// mode. It runs when the handler is provisioned and at every change (see
// control.Runtime.Subscribe), never on the request path: a request reads
// the result through one atomic pointer per tier.
func (e *Engine) applyRuntime(snap *control.Snapshot) {
	e.applying.Lock()
	defer e.applying.Unlock()
	// Overrides of one tier with the same limits share one compiled
	// override: the headers of a path are formatted once per distinct set
	// of limits (headerCache), and 10,000 customers on one plan are one
	// set, not 10,000.
	type shared struct {
		tier *hierarchy.Tier
		spec string
	}
	compiledOnce := map[shared]*hierarchy.Override{}
	for _, t := range e.cfg.Trees {
		if m := snap.Mode(t.Name); m != nil {
			mode := m.Mode
			switch mode {
			case Enforce, Warn, Shadow:
			default:
				// package control validates modes read from the store;
				// this keeps any other source of snapshots from turning
				// enforcement off with a mode the engine does not know.
				mode = Enforce
			}
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
					R bool
				}{o.Limits, o.Unlimited, o.Replace})
				key := shared{tier, string(spec)}
				c := compiledOnce[key]
				if c == nil {
					var err error
					if c, err = e.compileOverride(t, tier, o); err != nil {
						e.cfg.Logger.Warn("rate limit override not applied: it does not fit this handler's tree",
							zap.String("tree", o.Tree), zap.String("tier", o.Tier), zap.String("value", truncate(e.Show(tier, o.Value), 256)), zap.Error(err))
						continue
					}
					compiledOnce[key] = c
				}
				if err := keepsDimensions(tier, o, c); err != nil {
					e.cfg.Logger.Warn("rate limit override not applied: it would lift a limit it does not name",
						zap.String("tree", o.Tree), zap.String("tier", o.Tier), zap.String("value", truncate(e.Show(tier, o.Value), 256)), zap.Error(err))
					continue
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
func (e *Engine) compileOverride(t *Tree, tier *hierarchy.Tier, o *control.Override) (*hierarchy.Override, error) {
	c := &hierarchy.Override{Unlimited: o.Unlimited}
	for i, l := range o.Limits {
		if l == nil {
			return nil, fmt.Errorf("limit %d is null: give each limit as {\"count\": …, \"per\": …}", i+1)
		}
		lc := *l
		c.Limits = append(c.Limits, &hierarchy.Limit{Count: lc.Count, Per: lc.Per, Dimension: lc.Dimension, Burst: lc.Burst, Algorithm: lc.Algorithm, Timezone: lc.Timezone})
	}
	if err := t.CompileOverride(tier, c); err != nil {
		return nil, err
	}
	for _, l := range c.Limits {
		if l.Dimension != hierarchy.Requests && !slices.Contains(e.cfg.Dimensions, l.Dimension) {
			return nil, fmt.Errorf("limit %s counts %s, but this handler has no cost for %s: add 'cost %s …' to its configuration first",
				l.String(), l.Dimension, l.Dimension, l.Dimension)
		}
	}
	return c, nil
}

// CheckOverride tells whether an override can apply to the engine's
// tree: its tier exists, its limits compile and every dimension they
// count has a cost. Its error says what to fix.
func (e *Engine) CheckOverride(o *control.Override) error {
	t := e.Tree(o.Tree)
	if t == nil {
		return fmt.Errorf("no tree %q", o.Tree)
	}
	tier, _ := t.Tier(o.Tier)
	if tier == nil {
		return fmt.Errorf("tree %s has no tier %q: its tiers are %s", t.Name, o.Tier, strings.Join(t.TierNames(), ", "))
	}
	c, err := e.compileOverride(t, tier, o)
	if err == nil {
		err = keepsDimensions(tier, o, c)
	}
	if err != nil {
		return fmt.Errorf("override of %s/%s: %w", t.Name, tier.Name, err)
	}
	return nil
}

// keepsDimensions refuses an override whose limits (c, compiled) leave
// out a dimension that the tier, or the configured value block of o's
// value, counts, unless o says Replace: an override that raises the
// requests limit of a value must not silently lift its tokens limit. A
// concurrency limit counts as a dimension of its own ("concurrent"). An
// unlimited override lifts every limit by saying so.
func keepsDimensions(tier *hierarchy.Tier, o *control.Override, c *hierarchy.Override) error {
	if o.Replace || c.Unlimited {
		return nil
	}
	has := map[string]bool{}
	for _, l := range c.Limits {
		has[l.Counts()] = true
	}
	limits := tier.Limits
	if v := tier.Values[o.Value]; v != nil {
		limits = append(slices.Clip(limits), v.Limits...)
	}
	for _, p := range tier.Plans { // whichever plan the value is on
		limits = append(slices.Clip(limits), p.Limits...)
	}
	var missing []string
	for _, l := range limits {
		if d := l.Counts(); !has[d] && !slices.Contains(missing, d) {
			missing = append(missing, d)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the override has no %s limit, and tier %s limits %s: it would lift that limit for this value. "+
		"Add a %s limit to the override, or say \"replace\": true to replace all of the tier's limits for this value",
		strings.Join(missing, " or "), tier.Name, strings.Join(missing, " and "), strings.Join(missing, " and a "))
}
