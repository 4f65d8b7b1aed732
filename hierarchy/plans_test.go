package hierarchy

import (
	"slices"
	"strings"
	"testing"
)

// saas is the plans example of docs/plans.md: org and key tiers, each with
// free and pro blocks, enterprise unlimited on org.
func saas() *Tree {
	return &Tree{Name: "api", PlanKey: "{http.rate_limit.entitlement.customers.plan}", DefaultPlan: "free", Tiers: []*Tier{
		{Name: "org", Key: "{http.request.header.X-Org}", Penalty: &Penalty{For: "1m", After: 3},
			Limits: []*Limit{{Count: 500, Per: "h"}},
			Plans: map[string]*Override{
				"free":       {Limits: []*Limit{{Count: 1000, Per: "h"}}},
				"pro":        {Limits: []*Limit{{Count: 50000, Per: "h"}, {Count: 5000000, Per: "h", Dimension: "tokens"}}},
				"enterprise": {Unlimited: true},
			}},
		{Name: "key", Key: "{http.request.header.Authorization}",
			Limits: []*Limit{{Count: 1000, Per: "h"}},
			Plans: map[string]*Override{
				"free": {Limits: []*Limit{{Count: 100, Per: "h"}}},
				"pro":  {Limits: []*Limit{{Count: 5000, Per: "h"}}},
			}},
	}}
}

func compiled(t testing.TB, tree *Tree) *Tree {
	t.Helper()
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	return tree
}

// countsOf is the count of each bucket's limit of tier, in order, its
// penalty box aside.
func countsOf(p Plan, tier string) []int64 {
	var counts []int64
	for _, b := range p.Buckets {
		if b.Tier.Name == tier && b.Limit.Penalty() == nil {
			counts = append(counts, b.Limit.Count)
		}
	}
	return counts
}

// TestPlanPrecedence: a tier's limits come from, most specific first, the
// value's runtime override, its value block, the customer's own limits,
// the tier's block for the request's plan, then the tier's own.
func TestPlanPrecedence(t *testing.T) {
	tree := compiled(t, &Tree{Name: "api", PlanKey: "{plan}", DefaultPlan: "free", Tiers: []*Tier{
		{Name: "org", Key: "{http.request.header.X-Org}",
			Limits: []*Limit{{Count: 10, Per: "h"}},
			Values: map[string]*Override{
				"valued": {Limits: []*Limit{{Count: 40, Per: "h"}}},
				"both":   {Limits: []*Limit{{Count: 45, Per: "h"}}},
			},
			Plans: map[string]*Override{
				"free":       {Limits: []*Limit{{Count: 15, Per: "h"}}},
				"pro":        {Limits: []*Limit{{Count: 20, Per: "h"}}},
				"enterprise": {Unlimited: true},
			}},
		{Name: "key", Key: "{http.request.header.X-Key}", Limits: []*Limit{{Count: 5, Per: "h"}},
			Plans: map[string]*Override{"starter": {Limits: []*Limit{{Count: 7, Per: "h"}}}}},
	}})
	org, _ := tree.Tier("org")
	key, _ := tree.Tier("key")
	runtime := &Override{Limits: []*Limit{{Count: 50, Per: "h"}}}
	own := &Override{Limits: []*Limit{{Count: 30, Per: "h"}}}
	ownUnlimited := &Override{Unlimited: true}
	for _, o := range []*Override{runtime, own, ownUnlimited} {
		if err := tree.CompileOverride(org, o); err != nil {
			t.Fatal(err)
		}
	}
	org.SetRuntime(map[string]*Override{"both": runtime})
	tests := []struct {
		name     string
		org      string
		entitled Entitlement
		want     []int64 // org's counts
	}{
		{"no plan given: the default's block", "acme", Entitlement{}, []int64{15}},
		{"the plan's block", "acme", Entitlement{Plan: "pro"}, []int64{20}},
		{"an unknown plan is the default", "acme", Entitlement{Plan: "gold"}, []int64{15}},
		{"a plan the tier does not list: its own limits", "acme", Entitlement{Plan: "starter"}, []int64{10}},
		{"own limits win over the plan", "acme", Entitlement{Plan: "pro", Tier: org, Own: own}, []int64{30}},
		{"own limits of another tier leave this one", "acme", Entitlement{Plan: "pro", Tier: key, Own: own}, []int64{20}},
		{"own limits unlimited", "acme", Entitlement{Plan: "pro", Tier: org, Own: ownUnlimited}, nil},
		{"a value block wins over own limits", "valued", Entitlement{Plan: "pro", Tier: org, Own: own}, []int64{40}},
		{"a runtime override wins over the value block", "both", Entitlement{Plan: "pro", Tier: org, Own: own}, []int64{50}},
		{"an unlimited plan", "acme", Entitlement{Plan: "enterprise"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ent := tt.entitled
			var p Plan
			tree.ResolveEntitled([]string{tt.org, "k1"}, &ent, &p)
			if got := countsOf(p, "org"); !slices.Equal(got, tt.want) {
				t.Errorf("org's limits %v, want %v", got, tt.want)
			}
			if ent != tt.entitled {
				t.Errorf("Resolve changed the entitlement to %+v", ent)
			}
		})
	}
}

// TestPlanOf: a declared plan is itself, anything else the default; a
// tree without plans has none.
func TestPlanOf(t *testing.T) {
	tree := compiled(t, saas())
	plain := compiled(t, acme())
	tests := []struct {
		tree       *Tree
		name, want string
		known      bool
	}{
		{tree, "pro", "pro", true},
		{tree, "enterprise", "enterprise", true},
		{tree, "", "free", false},
		{tree, "Pro", "free", false},
		{tree, "gold", "free", false},
		{plain, "pro", "", false},
	}
	for _, tt := range tests {
		if got := tt.tree.PlanOf(tt.name); got != tt.want {
			t.Errorf("%s: PlanOf(%q) = %q, want %q", tt.tree.Name, tt.name, got, tt.want)
		}
		if got := tt.tree.KnownPlan(tt.name); got != tt.known {
			t.Errorf("%s: KnownPlan(%q) = %v", tt.tree.Name, tt.name, got)
		}
	}
	// A default no tier declares: its requests get the tiers' own limits.
	own := saas()
	own.DefaultPlan = "trial"
	compiled(t, own)
	p := Plan{}
	own.ResolveEntitled([]string{"acme", "k1"}, &Entitlement{Plan: "gold"}, &p)
	if got := countsOf(p, "org"); !slices.Equal(got, []int64{500}) || own.KnownPlan("trial") {
		t.Errorf("undeclared default: org's limits %v", got)
	}
}

// TestPlanChangeKeepsKeys: a customer moving between plans keeps its
// buckets: a limit's key is its path and its dimension, algorithm and
// period, whichever block it comes from.
func TestPlanChangeKeepsKeys(t *testing.T) {
	tree := compiled(t, saas())
	resolve := func(plan string) []string {
		p := Plan{}
		tree.ResolveEntitled([]string{"acme", "k1"}, &Entitlement{Plan: plan}, &p)
		return keysOf(p)
	}
	org := "{api|org=acme}org=acme"
	// The penalty box follows its value's limits; key has none.
	requests := []string{org + "#requests.gcra.3600000000", org + "#penalty.gcra.60000000", org + "/key=k1#requests.gcra.3600000000"}
	for _, tt := range []struct {
		plan string
		want []string
	}{
		{"free", requests},
		{"starter", requests}, // unknown: free
		{"pro", []string{requests[0], org + "#tokens.gcra.3600000000", requests[1], requests[2]}},
		{"enterprise", requests[2:]},
	} {
		if got := resolve(tt.plan); !slices.Equal(got, tt.want) {
			t.Errorf("plan %s: keys\n%v\nwant\n%v", tt.plan, got, tt.want)
		}
	}
	// A tree without plans keys its tier's limit as a plan's of the same
	// rate's dimension and period.
	plain := saas()
	plain.PlanKey, plain.DefaultPlan = "", ""
	for _, tier := range plain.Tiers {
		tier.Plans = nil
	}
	var p Plan
	compiled(t, plain).Resolve([]string{"acme", "k1"}, &p)
	if got := keysOf(p); !slices.Equal(got, requests) {
		t.Errorf("without plans: %v", got)
	}
}

// TestPlanLimitsAreTheTrees: Limits yields plan blocks' limits, named
// (for RateLimit-Policy) as the tier's.
func TestPlanLimitsAreTheTrees(t *testing.T) {
	tree := compiled(t, saas())
	var names []string
	for tier, l := range tree.Limits() {
		names = append(names, tier.Name+":"+l.Policy())
	}
	slices.Sort(names)
	want := []string{"key:key", "key:key", "key:key", "org:org", "org:org", "org:org.requests", "org:org.tokens"}
	if !slices.Equal(names, want) {
		t.Fatalf("limits %v, want %v", names, want)
	}
	if got := tree.Dimensions(); !slices.Contains(got, "tokens") {
		t.Fatalf("dimensions %v: the pro plan's tokens are missing", got)
	}
}

func TestPlanCompileErrors(t *testing.T) {
	one := func() []*Limit { return []*Limit{{Count: 1, Per: "s"}} }
	tier := func(plans map[string]*Override) *Tier {
		return &Tier{Name: "org", Key: "{k}", Plans: plans}
	}
	tests := []struct {
		name string
		tree Tree
		want string
	}{
		{"plan without default", Tree{Name: "t", PlanKey: "{p}", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: one()}})}},
			"tree t: plan needs a default: plan <placeholder> default <plan>"},
		{"default without plan", Tree{Name: "t", DefaultPlan: "free", Tiers: []*Tier{{Name: "org", Key: "{k}", Limits: one()}}},
			"default plan \"free\", but no plan"},
		{"plan blocks without plan", Tree{Name: "t", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: one()}})}},
			"tree t: tier org has plan blocks, but the tree has no plan"},
		{"empty plan block", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {}})}},
			"tier org: plan pro: no limits"},
		{"nil plan block", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": nil})}},
			"plan pro: empty override"},
		{"limits and unlimited", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {Unlimited: true, Limits: one()}})}},
			"plan pro: unlimited and limits are exclusive"},
		{"a bad limit", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: []*Limit{{Count: 1, Per: "fortnight"}}}})}},
			"plan pro: limit 1/fortnight"},
		{"two limits of one id", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: []*Limit{{Count: 1, Per: "h"}, {Count: 2, Per: "60m"}}}})}},
			"same dimension, period and algorithm"},
		{"a penalty's dimension", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: []*Limit{{Count: 1, Per: "h", Dimension: "penalty"}}}})}},
			"penalty box's"},
		{"an unnamed plan", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"": {Limits: one()}})}},
			"a plan block with no name"},
		{"strict allocation", Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", StrictAllocation: true, Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: []*Limit{{Count: 10, Per: "h"}}},
			{Name: "key", Key: "{k}", Plans: map[string]*Override{"pro": {Limits: []*Limit{{Count: 20, Per: "h"}}}}}}},
			"tree t: strict_allocation: tree t, plan pro: tier key allows 20/h of requests, more than its parent org's 10/h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.tree.Compile()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Compile() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// A tier of plan blocks only is a tier with limits.
	ok := Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{tier(map[string]*Override{"pro": {Limits: one()}})}}
	if err := ok.Compile(); err != nil {
		t.Fatal(err)
	}
}

func TestAllocationProblems(t *testing.T) {
	lim := func(count int64, per string, more ...string) *Limit {
		l := &Limit{Count: count, Per: per}
		if len(more) > 0 {
			l.Dimension = more[0]
		}
		if len(more) > 1 {
			l.Algorithm = more[1]
		}
		return l
	}
	limits := func(ls ...*Limit) []*Limit { return ls }
	tests := []struct {
		name string
		tree *Tree
		want []string
	}{
		{"the docs' example: each plan's key within its org", saas(), nil},
		{"no plans: per-period rates compared", &Tree{Name: "t", Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: limits(lim(1000, "h"))},
			{Name: "team", Key: "{t}", Limits: limits(lim(20, "min"))}, // 1200/h
			{Name: "user", Key: "{u}", Limits: limits(lim(16, "min"))}, // 960/h, under team's 1200/h
		}}, []string{"tree t: tier team allows 20/min of requests, more than its parent org's 1000/h"}},
		{"equal rates are fine", &Tree{Name: "t", Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: limits(lim(24000, "day"))},
			{Name: "team", Key: "{t}", Limits: limits(lim(1000, "h"))},
		}}, nil},
		{"calendar units by their length; the tightest limit of each side", &Tree{Name: "t", Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: limits(lim(3000, "month"), lim(1000, "h"))}, // 100/day
			{Name: "team", Key: "{t}", Limits: limits(lim(101, "day"), lim(10, "s"))},
		}}, []string{"tree t: tier team allows 101/day of requests, more than its parent org's 3000/month"}},
		{"dimensions apart; the nearest tier limiting one", &Tree{Name: "t", Tiers: []*Tier{
			{Name: "global", Key: "all", Limits: limits(lim(100, "s"), lim(1000, "s", "tokens"))},
			{Name: "org", Key: "{o}", Limits: limits(lim(10, "s", "tokens"))},
			{Name: "user", Key: "{u}", Limits: limits(lim(200, "s"), lim(5, "s", "tokens"))},
		}}, []string{"tree t: tier user allows 200/s of requests, more than its ancestor global's 100/s"}},
		{"concurrency by count, not against rates", &Tree{Name: "t", Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: limits(lim(10, "", "", "concurrent"), lim(1, "s"))},
			{Name: "user", Key: "{u}", Limits: limits(lim(20, "", "", "concurrent"))},
		}}, []string{"tree t: tier user allows 20 requests in flight, more than its parent org's 10"}},
		{"per plan; an unlimited parent limits nothing", &Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "free", Tiers: []*Tier{
			{Name: "global", Key: "all", Limits: limits(lim(100000, "h"))},
			{Name: "org", Key: "{o}", Limits: limits(lim(1000, "h")), Plans: map[string]*Override{
				"pro": {Limits: limits(lim(50000, "h"))}, "enterprise": {Unlimited: true}}},
			{Name: "key", Key: "{k}", Limits: limits(lim(100, "h")), Plans: map[string]*Override{
				"pro": {Limits: limits(lim(60000, "h"))}, "enterprise": {Limits: limits(lim(200000, "h"))}}},
		}}, []string{
			"tree t, plan enterprise: tier key allows 200000/h of requests, more than its ancestor global's 100000/h",
			"tree t, plan pro: tier key allows 60000/h of requests, more than its parent org's 50000/h",
		}},
		{"a default no tier declares: own limits", &Tree{Name: "t", PlanKey: "{p}", DefaultPlan: "trial", Tiers: []*Tier{
			{Name: "org", Key: "{o}", Limits: limits(lim(10, "h")), Plans: map[string]*Override{"pro": {Limits: limits(lim(100, "h"))}}},
			{Name: "key", Key: "{k}", Limits: limits(lim(50, "h"))},
		}}, []string{"tree t, plan trial: tier key allows 50/h of requests, more than its parent org's 10/h"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compiled(t, tt.tree).AllocationProblems()
			if !slices.Equal(got, tt.want) {
				t.Fatalf("AllocationProblems() =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// TestResolvePlansAllocations: with plans, Resolve allocates only its key
// buffer, as without.
func TestResolvePlansAllocations(t *testing.T) {
	tree := compiled(t, saas())
	buf := make([]Bucket, 0, 8)
	allocs := testing.AllocsPerRun(100, func() {
		p := Plan{Buckets: buf[:0]}
		tree.ResolveEntitled([]string{"acme", "k1"}, &Entitlement{Plan: "pro"}, &p)
	})
	if allocs != 1 {
		t.Fatalf("%v allocations, want 1", allocs)
	}
}

// BenchmarkResolvePlans is BenchmarkResolve's two-tier path on a tree
// with plans: a plan each tier lists, and an unknown one.
func BenchmarkResolvePlans(b *testing.B) {
	tree := compiled(b, saas())
	for _, plan := range []string{"pro", "gold"} {
		b.Run(plan, func(b *testing.B) {
			buf := make([]Bucket, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				p := Plan{Buckets: buf[:0]}
				tree.ResolveEntitled([]string{"acme", "k1"}, &Entitlement{Plan: plan}, &p)
			}
		})
	}
}
