package hierarchy

import (
	"fmt"
	"slices"
	"testing"
)

func keysOf(p Plan) []string {
	var keys []string
	for _, b := range p.Buckets {
		keys = append(keys, b.Key)
	}
	return keys
}

// TestRuntimeOverrides: an override set while the tree is in use replaces
// the tier's limits for its value, wins over a value block of the
// configuration, and goes when removed.
func TestRuntimeOverrides(t *testing.T) {
	tree := acme()
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	team, _ := tree.Tier("team")
	resolve := func() []string {
		var p Plan
		tree.Resolve([]string{"acme-corp", "marketing"}, &p)
		return keysOf(p)
	}
	configured := resolve()
	if want := "{acme|org=acme-corp}org=acme-corp/team=marketing#tokens.gcra.3600000000"; configured[2] != want || len(configured) != 3 {
		t.Fatalf("configured: %v", configured)
	}
	raised := &Override{Limits: []*Limit{{Count: 50, Per: "min"}, {Count: 900000, Per: "h", Dimension: "tokens"}}}
	if err := tree.CompileOverride(team, raised); err != nil {
		t.Fatal(err)
	}
	team.SetRuntime(map[string]*Override{"marketing": raised})
	got := resolve()
	want := []string{
		"{acme|org=acme-corp}org=acme-corp#requests.gcra.3600000000",
		"{acme|org=acme-corp}org=acme-corp#tokens.gcra.3600000000",
		"{acme|org=acme-corp}org=acme-corp/team=marketing#requests.gcra.60000000",
		"{acme|org=acme-corp}org=acme-corp/team=marketing#tokens.gcra.3600000000",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("with the override:\n%v\nwant\n%v", got, want)
	}
	if o, rt := team.OverrideOf("marketing"); o != raised || !rt {
		t.Fatal("OverrideOf does not report the runtime override")
	}
	if raised.Limits[1].Policy() != "team.tokens" {
		t.Fatalf("policy %q", raised.Limits[1].Policy())
	}
	team.SetRuntime(map[string]*Override{"marketing": {Unlimited: true}})
	if got := resolve(); len(got) != 2 {
		t.Fatalf("unlimited: %v", got)
	}
	team.SetRuntime(nil)
	if got := resolve(); !slices.Equal(got, configured) {
		t.Fatalf("removed: %v", got)
	}
	for _, bad := range []*Override{{}, {Unlimited: true, Limits: []*Limit{{Count: 1, Per: "s"}}}, {Limits: []*Limit{{Count: -1, Per: "s"}}}, {Limits: []*Limit{{Count: 1, Per: "fortnight"}}}} {
		if err := tree.CompileOverride(team, bad); err == nil {
			t.Errorf("override %+v compiled", bad)
		}
	}
}

// TestRuntimeOverridePolicyQualified: a runtime override's policies are
// qualified by the tree's name where the configuration's are.
func TestRuntimeOverridePolicyQualified(t *testing.T) {
	a, b := acme(), acme()
	b.Name = "other"
	for _, tr := range []*Tree{a, b} {
		if err := tr.Compile(); err != nil {
			t.Fatal(err)
		}
	}
	QualifyPolicies([]*Tree{a, b})
	user, _ := a.Tier("user")
	o := &Override{Limits: []*Limit{{Count: 5, Per: "min"}, {Count: 10, Per: "min", Dimension: "tokens"}}}
	if err := a.CompileOverride(user, o); err != nil {
		t.Fatal(err)
	}
	if p := o.Limits[0].Policy(); p != "acme/user.requests" {
		t.Fatalf("policy %q", p)
	}
}

func TestResolvePrefixAndSubtree(t *testing.T) {
	tree := acme()
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	var p Plan
	tree.Resolve([]string{"acme-corp", "engineering"}, &p)
	if len(p.Buckets) != 4 || p.MissingTier != nil {
		t.Fatalf("a path ending at the team: %v", keysOf(p))
	}
	glob, match := tree.Subtree([]string{"acme-corp", "a:b/é"})
	if want := "{acme|*}org=acme-corp/team=a:b%2F%C3%A9[#/]*"; glob != want {
		t.Fatalf("glob %q, want %q", glob, want)
	}
	for key, want := range map[string]bool{
		"{acme|org=acme-corp}org=acme-corp/team=a:b%2F%C3%A9#requests.gcra.1":            true,
		"{acme|org=acme-corp}org=acme-corp/team=a:b%2F%C3%A9/user=x#requests.gcra.1":     true,
		"{acme|org=acme-corp}org=acme-corp/team=a:b%2F%C3%A9x#requests.gcra.1":           false,
		"{acme|org=acme-corp}org=acme-corp#requests.gcra.1":                              false,
		"{other|org=acme-corp}org=acme-corp/team=a:b%2F%C3%A9#requests.gcra.1":           false,
		"{acme|org=acme-corp}org=acme-corp/team=a:b%2F%C3%A9#requests.sliding-log.1~log": true,
	} {
		if match(key) != want {
			t.Errorf("match(%q) = %v", key, !want)
		}
	}
}

// BenchmarkResolveOverrides resolves a 4-tier path with runtime overrides
// in force on the leaf: none, 10, and 10,000 (every value has one).
func BenchmarkResolveOverrides(b *testing.B) {
	for _, n := range []int{0, 10, 10000} {
		b.Run(fmt.Sprintf("overrides=%d", n), func(b *testing.B) {
			tree := acme()
			if err := tree.Compile(); err != nil {
				b.Fatal(err)
			}
			agent, _ := tree.Tier("agent")
			shared := &Override{Limits: []*Limit{{Count: 500, Per: "h"}}}
			if err := tree.CompileOverride(agent, shared); err != nil {
				b.Fatal(err)
			}
			m := map[string]*Override{}
			for i := 0; i < n; i++ {
				m[fmt.Sprintf("agent-%d", i)] = shared
			}
			agent.SetRuntime(m)
			values := make([][]string, 1000)
			for i := range values {
				values[i] = []string{"acme-corp", "engineering", "alice", fmt.Sprintf("agent-%d", i)}
			}
			plan := Plan{Buckets: make([]Bucket, 0, 16)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				plan.Buckets = plan.Buckets[:0]
				tree.Resolve(values[i%len(values)], &plan)
			}
		})
	}
}
