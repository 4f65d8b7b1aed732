package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
)

// singleEngine is an engine on a memory store read through clock c, over
// a tree of one tier (key {user}) with limit l and the missing policy
// missing: bob has an override of 3 a minute, carl one of two limits, vip
// is unlimited; mode is the tree's mode set at runtime ("" for none).
func singleEngine(t testing.TB, l hierarchy.Limit, missing hierarchy.Missing, mode string, c *clock) (*Engine, *Tree) {
	t.Helper()
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{
		Name: "user", Key: "{user}", Missing: missing, Limits: []*hierarchy.Limit{&l},
		Values: map[string]*hierarchy.Override{
			"bob":  {Limits: []*hierarchy.Limit{{Count: 3, Per: "min"}}},
			"carl": {Limits: []*hierarchy.Limit{{Count: 4, Per: "min"}, {Count: 2, Per: "10s"}}},
			"vip":  {Unlimited: true},
		},
	}}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	hierarchy.QualifyPolicies([]*hierarchy.Tree{tree})
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	et := &Tree{Tree: tree}
	if mode != "" {
		et.mode.Store(&mode)
	}
	e := New(Config{Trees: []*Tree{et}, Store: mem, StoreName: "memory", Mode: Enforce, DenialLog: "off"})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	return e, et
}

// TestDecideSingleAsTheGeneralPath decides the same requests of single-
// bucket trees on two engines, one that decides single paths with
// decideSingle and one made to take the general path for all, on one
// clock, and finds the same decisions: the verdicts, the reasons, the
// results, the limits as decided, the retry.
func TestDecideSingleAsTheGeneralPath(t *testing.T) {
	limits := []hierarchy.Limit{
		{Count: 5, Per: "10s"},
		{Count: 5, Per: "10s", Burst: 8},
		{Count: 5, Per: "10s", Algorithm: "sliding"},
		{Count: 5, Per: "10s", Algorithm: "sliding_approx"},
		{Count: 5, Per: "h", Algorithm: "calendar"},
	}
	for _, l := range limits {
		for _, missing := range []hierarchy.Missing{hierarchy.MissingDeny, hierarchy.MissingShared, hierarchy.MissingSkip} {
			for _, mode := range []string{"", Enforce, Warn, Shadow} {
				name := fmt.Sprintf("%s-%d-%d/%s/%s", l.Algorithm, l.Count, l.Burst, missing, mode)
				t.Run(name, func(t *testing.T) {
					c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
					single, st := singleEngine(t, l, missing, mode, c)
					general, gt := singleEngine(t, l, missing, mode, c)
					if single.single != st {
						t.Fatal("a tree of one tier with one limit is not single")
					}
					general.single = nil
					rng := rand.New(rand.NewPCG(uint64(len(name)), 7))
					users := []string{"alice", "carol", "bob", "carl", "vip", ""} // overrides, and "" missing
					singles := 0
					for i := range 400 {
						if i%50 == 25 { // what the admin API may change: alice's override, the tree's mode
							o := runtimeOverrides[rng.IntN(len(runtimeOverrides))]
							setRuntime(t, single, st, o)
							setRuntime(t, general, gt, o)
							if mode != "" {
								m := []string{Enforce, Warn, Shadow}[rng.IntN(3)]
								st.mode.Store(&m)
								gt.mode.Store(&m)
							}
						}
						c.now += rng.Int64N(3_000_000) // up to 3 s, and now and then a jump past windows
						if rng.IntN(20) == 0 {
							c.now += rng.Int64N(int64(40 * time.Minute / time.Microsecond))
						}
						v := users[rng.IntN(len(users))]
						var ds, dg Decision
						single.Begin(&ds)
						errS := single.Add(&ds, st, append(ds.Values(), v))
						ok := ds.single
						if ok {
							singles++
						}
						if errS == nil {
							errS = single.Decide(context.Background(), &ds, Request{})
						}
						general.Begin(&dg)
						errG := general.Add(&dg, gt, append(dg.Values(), v))
						if dg.single {
							t.Fatalf("request %d (%q): the general engine marked a single path", i, v)
						}
						if errG == nil {
							errG = general.Decide(context.Background(), &dg, Request{})
						}
						if fmt.Sprint(errS) != fmt.Sprint(errG) {
							t.Fatalf("request %d (%q): errors %v and %v", i, v, errS, errG)
						}
						if got, want := view(ds), view(dg); !reflect.DeepEqual(got, want) {
							t.Fatalf("request %d (%q, single %v): decided\n%+v\nthe general path:\n%+v", i, v, ok, got, want)
						}
						ds.Release()
						dg.Release()
					}
					if mode == "" && singles == 0 {
						t.Fatal("no request decided by decideSingle")
					}
				})
			}
		}
	}
}

// runtimeOverrides are overrides of alice's limits the admin API may set
// (nil removes hers).
var runtimeOverrides = []*control.Override{
	nil,
	{Limits: []*hierarchy.Limit{{Count: 2, Per: "min"}}},
	{Limits: []*hierarchy.Limit{{Count: 6, Per: "min"}, {Count: 1, Per: "5s"}}},
	{Unlimited: true},
}

// setRuntime gives alice, on tree t of e, runtime override o.
func setRuntime(t *testing.T, e *Engine, tree *Tree, o *control.Override) {
	t.Helper()
	tier := tree.Tiers[0]
	if o == nil {
		tier.SetRuntime(nil)
		return
	}
	spec := *o
	spec.Tree, spec.Tier, spec.Value = tree.Name, tier.Name, "alice"
	c, err := e.compileOverride(tree, tier, &spec)
	if err != nil {
		t.Fatal(err)
	}
	tier.SetRuntime(map[string]*hierarchy.Override{"alice": c})
}

// TestDecideSingleWhileOverridden decides alice's requests on the single
// path while her runtime override changes under it (none, one limit, two,
// unlimited): each decision is of her path as one reading of the
// overrides makes it, never a part of it, and none panics.
func TestDecideSingleWhileOverridden(t *testing.T) {
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	e, tree := singleEngine(t, hierarchy.Limit{Count: 1_000_000, Per: "s"}, hierarchy.MissingDeny, "", c)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			setRuntime(t, e, tree, runtimeOverrides[i%len(runtimeOverrides)])
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 20_000 {
		var d Decision
		e.Begin(&d)
		if err := e.Add(&d, tree, append(d.Values(), "alice")); err != nil {
			t.Fatal(err)
		}
		ok := d.single
		if err := e.Decide(context.Background(), &d, Request{}); err != nil {
			t.Fatal(err)
		}
		if ok && (len(d.Buckets) != 1 || len(d.Limits) != 1 || len(d.Results) != 1 || d.Buckets[0].Limit != tree.Tiers[0].Limits[0]) {
			t.Fatalf("decision %d: a path of %d buckets, %d limits, %d results, on the tier's own limit: %v",
				i, len(d.Buckets), len(d.Limits), len(d.Results), d.Buckets[0].Limit == tree.Tiers[0].Limits[0])
		}
		if !ok && len(d.Limits) != len(d.Buckets) {
			t.Fatalf("decision %d: the general path decided %d limits of %d buckets", i, len(d.Limits), len(d.Buckets))
		}
		d.Release()
	}
}

// view is what a front end reads of a decision.
func view(d Decision) map[string]any {
	keys := make([]string, len(d.Buckets))
	for i, b := range d.Buckets {
		keys[i] = b.Key
	}
	return map[string]any{
		"allowed": d.Allowed, "impossible": d.Impossible, "results": fmt.Sprint(d.Results), "retryAfter": d.RetryAfter,
		"at": d.At, "keys": keys, "costs": fmt.Sprint(d.Costs), "limits": fmt.Sprint(d.Limits), "scaled": d.Scaled,
		"mode": d.Mode, "enforcing": d.Enforcing, "reason": d.Reason, "blocked": d.Blocked, "closest": d.Closest,
		"retry": d.Retry, "wait": d.Wait, "local": d.Local, "slots": d.slots, "route": d.route,
	}
}

// TestSingleRefuses: the trees and engines whose paths decideSingle does
// not decide.
func TestSingleRefuses(t *testing.T) {
	c := &clock{}
	one := func(mod func(*hierarchy.Tier)) *hierarchy.Tree {
		tier := &hierarchy.Tier{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 5, Per: "s"}}}
		mod(tier)
		tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{tier}}
		if err := tree.Compile(); err != nil {
			t.Fatal(err)
		}
		return tree
	}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	leases, err := lease.New(mem, lease.Options{Clock: c.read, Sweep: -1, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Close() })
	for _, tc := range []struct {
		name string
		tree *hierarchy.Tree
		cfg  func(*Config, *Tree)
		want bool
	}{
		{"one tier, one limit", one(func(*hierarchy.Tier) {}), nil, true},
		{"two limits", one(func(t *hierarchy.Tier) { t.Limits = append(t.Limits, &hierarchy.Limit{Count: 50, Per: "min"}) }), nil, false},
		{"adaptive", one(func(t *hierarchy.Tier) { t.Adaptive = true }), nil, false},
		{"a concurrency limit", one(func(t *hierarchy.Tier) { t.Limits[0] = &hierarchy.Limit{Count: 5, Algorithm: "concurrent"} }), nil, false},
		{"a penalty box", one(func(t *hierarchy.Tier) { t.Penalty = &hierarchy.Penalty{After: 3, Within: "1m", For: "1m"} }), nil, false},
		{"two tiers", func() *hierarchy.Tree {
			tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
				{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 50, Per: "s"}}},
				{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 5, Per: "s"}}}}}
			if err := tree.Compile(); err != nil {
				t.Fatal(err)
			}
			return tree
		}(), nil, false},
		{"an IP prefix", one(func(*hierarchy.Tier) {}), func(_ *Config, t *Tree) { t.IPv4Prefix = 24 }, false},
		{"waiting", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.MaxWait = time.Second }, false},
		{"idempotency records", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Idempotency.TTL = time.Minute }, false},
		{"a local fallback", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Local = mem }, false},
		{"another tree", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Trees = append(c.Trees, &Tree{Tree: c.Trees[0].Tree}) }, false},
		{"a tree not the engine's", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Trees = []*Tree{{Tree: c.Trees[0].Tree}} }, false},
		{"a limit of tokens", one(func(t *hierarchy.Tier) { t.Limits[0].Dimension = "tokens" }), func(c *Config, _ *Tree) { c.Dimensions = []string{"tokens"} }, false},
		{"routes", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Routes = []Route{{Store: mem}} }, false},
		{"a store that leases", one(func(*hierarchy.Tier) {}), func(c *Config, _ *Tree) { c.Store = leases }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			et := &Tree{Tree: tc.tree}
			cfg := Config{Trees: []*Tree{et}, Store: mem, StoreName: "memory", DenialLog: "off"}
			if tc.cfg != nil {
				tc.cfg(&cfg, et)
			}
			e := New(cfg)
			defer e.Close()
			if got := e.single == et; got != tc.want {
				t.Fatalf("single: %v, want %v", got, tc.want)
			}
		})
	}
}

// BenchmarkDecide decides requests of a tree of one tier with one limit,
// on the single-bucket path and on the general one.
func BenchmarkDecide(b *testing.B) {
	for _, path := range []string{"single", "general"} {
		b.Run("path="+path, func(b *testing.B) {
			c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
			e, tree := singleEngine(b, hierarchy.Limit{Count: 1 << 40, Per: "s"}, hierarchy.MissingDeny, "", c)
			if path == "general" {
				e.single = nil
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				var d Decision
				e.Begin(&d)
				if err := e.Add(&d, tree, append(d.Values(), "alice")); err != nil {
					b.Fatal(err)
				}
				if err := e.Decide(ctx, &d, Request{}); err != nil || !d.Allowed {
					b.Fatalf("decided %v, %v", d.Allowed, err)
				}
				d.Release()
			}
		})
	}
}
