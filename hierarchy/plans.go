package hierarchy

// Plans are customer tiers (free, pro, enterprise) in a tree: a request's
// plan, resolved by the caller from the tree's PlanKey, selects each tier's
// Plans block. Not to be confused with Plan, a request's path of buckets.

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-cascade/cascade/rate"
)

// Entitlement is what a request's customer is entitled to in one tree.
type Entitlement struct {
	Plan string    // the plan's name as the request gave it (PlanOf applies)
	Tier *Tier     // the tier Own applies to (nil: none)
	Own  *Override // limits of the customer's own for its value of Tier (compiled with Tree.CompileOverride), nil: none
	// Indexed says Index is Tree.PlanIndex of the plan's name, looked up
	// by the caller (which saves Resolve the lookup; Plan may then be
	// empty); else Resolve looks Plan up.
	Indexed bool
	Index   int
}

// KnownPlan reports whether some tier of the tree has a block for plan
// name. Valid after Compile.
func (t *Tree) KnownPlan(name string) bool { return t.plans[name] > 0 }

// PlanIndex is the number of the plan whose blocks a request that gave
// plan name gets (PlanOf), for Entitlement.Index; known says whether some
// tier declares name. Valid after Compile.
func (t *Tree) PlanIndex(name string) (index int, known bool) {
	if i := t.plans[name]; i > 0 {
		return i, true
	}
	return t.defaultPlan, false
}

// PlanLimits are the limits tier has under plan name (PlanOf applied): its
// block's for that plan, else its own; nil when the plan leaves it
// unlimited. Valid after Compile; the limits are compiled and shared.
func (t *Tree) PlanLimits(tier *Tier, name string) []*Limit {
	i, _ := t.PlanIndex(name)
	if i < len(tier.byPlan) {
		if o := tier.byPlan[i]; o != nil {
			if o.Unlimited {
				return nil
			}
			return o.Limits
		}
	}
	return tier.Limits
}

// PlanNames are the plans the tree's tiers declare, sorted (the default
// among them only if a tier declares it).
func (t *Tree) PlanNames() []string {
	names := make([]string, 0, len(t.plans))
	for name := range t.plans {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// PlanOf is the plan whose blocks a request that gave plan name gets: name
// when some tier declares it, else DefaultPlan (an empty or unknown name);
// "" when the tree has no plans. Valid after Compile.
func (t *Tree) PlanOf(name string) string {
	if t.PlanKey == "" {
		return ""
	}
	if t.plans[name] > 0 {
		return name
	}
	return t.DefaultPlan
}

// entitled is what replaces tier's own limits for a request when no
// override of its value does: the customer's own limits when e is for
// tier, else tier's block for plan (PlanOf applied), else nil. A tier
// without plan blocks costs no map lookup.
func entitled(tier *Tier, plan int, e *Entitlement) *Override {
	if e != nil && e.Own != nil && e.Tier == tier {
		return e.Own
	}
	if plan < len(tier.byPlan) {
		return tier.byPlan[plan]
	}
	return nil
}

// compile validates and compiles an override of tier (a value's or a
// plan's block): limits or unlimited, not both, not neither.
func (o *Override) compile(tier string) error {
	switch {
	case o == nil:
		return fmt.Errorf("empty override")
	case o.Unlimited && len(o.Limits) > 0:
		return fmt.Errorf("unlimited and limits are exclusive")
	case !o.Unlimited && len(o.Limits) == 0:
		return fmt.Errorf("no limits (say unlimited to exempt it)")
	}
	return compileLimits(tier, o.Limits)
}

// compilePlans validates the tree's plans, compiles its tiers' plan
// blocks, and notes the plans they declare. A DefaultPlan that no tier
// declares is allowed: its requests get every tier's own limits. With
// StrictAllocation, AllocationProblems are errors.
func (t *Tree) compilePlans() error {
	t.plans = nil
	switch {
	case t.PlanKey != "" && t.DefaultPlan == "":
		return fmt.Errorf("tree %s: plan needs a default: plan <placeholder> default <plan>", t.Name)
	case t.PlanKey == "" && t.DefaultPlan != "":
		return fmt.Errorf("tree %s: default plan %q, but no plan: say where a request's plan comes from, plan <placeholder> default %s", t.Name, t.DefaultPlan, t.DefaultPlan)
	}
	for _, tier := range t.Tiers {
		if len(tier.Plans) > 0 && t.PlanKey == "" {
			return fmt.Errorf("tree %s: tier %s has plan blocks, but the tree has no plan: add plan <placeholder> default <plan> to the tree", t.Name, tier.Name)
		}
		for name, o := range tier.Plans {
			if strings.TrimSpace(name) == "" {
				return fmt.Errorf("tree %s: tier %s: a plan block with no name", t.Name, tier.Name)
			}
			if err := o.compile(tier.Name); err != nil {
				return fmt.Errorf("tree %s: tier %s: plan %s: %w", t.Name, tier.Name, name, err)
			}
			if t.plans == nil {
				t.plans = map[string]int{}
			}
			if t.plans[name] == 0 {
				t.plans[name] = len(t.plans) + 1
			}
		}
	}
	t.defaultPlan = t.plans[t.DefaultPlan]
	for _, tier := range t.Tiers {
		tier.byPlan = nil
		if len(tier.Plans) == 0 {
			continue
		}
		tier.byPlan = make([]*Override, len(t.plans)+1)
		for name, o := range tier.Plans {
			tier.byPlan[t.plans[name]] = o
		}
	}
	if t.StrictAllocation {
		if problems := t.AllocationProblems(); len(problems) > 0 {
			return fmt.Errorf("tree %s: strict_allocation: %s; lower the child's limit in that plan to at most its parent's, or raise the parent's", t.Name, strings.Join(problems, "; "))
		}
	}
	return nil
}

// AllocationProblems lists, for each plan (and DefaultPlan; or once for a
// tree without plans), each tier whose limit allows more than the nearest
// tier above it that limits the same dimension in that plan: rates are
// compared per unit of time (a calendar unit by its length, a month as 30
// days), the tightest limit of a dimension on each side; concurrency
// limits by their counts. A tier unlimited in a plan limits nothing there
// (the tiers below are compared with those above it), and value blocks are
// not compared. Valid after Compile; Compile returns them as an error only
// with StrictAllocation.
func (t *Tree) AllocationProblems() []string {
	var problems []string
	for _, plan := range t.allocationPlans() {
		where := "tree " + t.Name
		if plan != "" {
			where += ", plan " + plan
		}
		for i, tier := range t.Tiers {
			limits := limitsIn(tier, plan)
			for k, l := range limits {
				if slices.IndexFunc(limits, func(o *Limit) bool { return sameKind(o, l) }) != k {
					continue // one comparison per kind, with its tightest limit
				}
				child := tightest(limits, l)
				for j := i - 1; j >= 0; j-- {
					above := t.Tiers[j]
					parentLimits := limitsIn(above, plan)
					if !slices.ContainsFunc(parentLimits, func(o *Limit) bool { return sameKind(o, l) }) {
						continue
					}
					parent := tightest(parentLimits, l)
					if exceeds(child, parent) {
						relation := "parent"
						if j < i-1 {
							relation = "ancestor"
						}
						problems = append(problems, fmt.Sprintf("%s: tier %s allows %s, more than its %s %s's %s",
							where, tier.Name, allowance(child, true), relation, above.Name, allowance(parent, false)))
					}
					break
				}
			}
		}
	}
	return problems
}

// allocationPlans is every plan a request may have, sorted: those the
// tiers declare and the default; [""] for a tree without plans.
func (t *Tree) allocationPlans() []string {
	if t.PlanKey == "" {
		return []string{""}
	}
	plans := []string{t.DefaultPlan}
	for name := range t.plans {
		if name != t.DefaultPlan {
			plans = append(plans, name)
		}
	}
	slices.Sort(plans)
	return plans
}

// limitsIn is tier's limits in plan, value blocks aside: its plan block's,
// else its own; nil when the plan makes it unlimited.
func limitsIn(tier *Tier, plan string) []*Limit {
	if o := tier.Plans[plan]; o != nil {
		return o.Limits
	}
	return tier.Limits
}

// sameKind reports whether a and b are compared with each other: of one
// dimension, and both concurrency limits or neither.
func sameKind(a, b *Limit) bool {
	return a.Dimension == b.Dimension && (a.compiled.Algorithm == rate.Concurrent) == (b.compiled.Algorithm == rate.Concurrent)
}

// tightest is the limit of limits of like's kind that allows the least.
func tightest(limits []*Limit, like *Limit) *Limit {
	var best *Limit
	for _, l := range limits {
		if sameKind(l, like) && (best == nil || exceeds(best, l)) {
			best = l
		}
	}
	return best
}

// exceeds reports whether a allows more than b, of one kind: a larger
// count in flight, or a larger count per unit of time, compared exactly
// (a.Count/a.period > b.Count/b.period, cross-multiplied in 128 bits).
func exceeds(a, b *Limit) bool {
	if a.compiled.Algorithm == rate.Concurrent {
		return a.Count > b.Count
	}
	ahi, alo := bits.Mul64(uint64(a.Count), uint64(periodMicros(b)))
	bhi, blo := bits.Mul64(uint64(b.Count), uint64(periodMicros(a)))
	return ahi > bhi || ahi == bhi && alo > blo
}

// periodMicros is a compiled limit's period in µs: a calendar unit's
// length (a month 30 days).
func periodMicros(l *Limit) int64 {
	const day = 86400 * 1000000
	if l.compiled.Algorithm != rate.Calendar {
		return l.compiled.Period.Microseconds()
	}
	switch l.compiled.Unit {
	case rate.Hour:
		return day / 24
	case rate.Day:
		return day
	case rate.Week:
		return 7 * day
	default:
		return 30 * day
	}
}

// allowance renders what l allows for a problem's message: "5000/h of
// requests" (the dimension only when full), or "10 requests in flight".
func allowance(l *Limit, full bool) string {
	count := l.Amount
	if count == "" {
		count = strconv.FormatInt(l.Count, 10)
	}
	if l.compiled.Algorithm == rate.Concurrent {
		if full {
			return count + " requests in flight"
		}
		return count
	}
	if full {
		return count + "/" + l.Per + " of " + l.Dimension
	}
	return count + "/" + l.Per
}
