package hierarchy

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

func acme() *Tree {
	return &Tree{Name: "acme", Tiers: []*Tier{
		{Name: "org", Key: "{http.request.header.X-Org}", Limits: []*Limit{
			{Count: 10000, Per: "h"}, {Count: 1000000, Per: "h", Dimension: "tokens"}}},
		{Name: "team", Key: "{http.request.header.X-Team}",
			Limits: []*Limit{{Count: 5000, Per: "h"}, {Count: 500000, Per: "h", Dimension: "tokens"}},
			Values: map[string]*Override{"marketing": {Limits: []*Limit{{Count: 200000, Per: "h", Dimension: "tokens"}}}}},
		{Name: "user", Key: "{http.request.header.X-User}", Limits: []*Limit{
			{Count: 1000, Per: "h"}, {Count: 100000, Per: "h", Dimension: "tokens"}}},
		{Name: "agent", Key: "{http.request.header.X-Agent}", Missing: MissingSkip, Limits: []*Limit{
			{Count: 200, Per: "h"}, {Count: 25000, Per: "h", Dimension: "tokens"}}},
	}}
}

func TestResolveAcme(t *testing.T) {
	tree := acme()
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		values  []string
		keys    []string
		missing string
	}{
		{"full path", []string{"acme-corp", "engineering", "alice", "agent-1"}, []string{
			"{acme|org=acme-corp}org=acme-corp#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp#tokens.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering#tokens.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering/user=alice#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering/user=alice#tokens.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering/user=alice/agent=agent-1#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=engineering/user=alice/agent=agent-1#tokens.gcra.3600000000",
		}, ""},
		{"override replaces the defaults; skipped agent", []string{"acme-corp", "marketing", "bob", ""}, []string{
			"{acme|org=acme-corp}org=acme-corp#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp#tokens.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=marketing#tokens.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=marketing/user=bob#requests.gcra.3600000000",
			"{acme|org=acme-corp}org=acme-corp/team=marketing/user=bob#tokens.gcra.3600000000",
		}, ""},
		{"missing user is denied by default", []string{"acme-corp", "engineering", "", "agent-1"}, nil, "user"},
		{"hostile values are escaped and cannot move the hash tag", []string{"a}{b", "x/y=z#w", "u|v", "%41"}, []string{
			"{acme|org=a%7D%7Bb}org=a%7D%7Bb#requests.gcra.3600000000",
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Plan
			tree.Resolve(tt.values, &p)
			if tt.missing != "" {
				if p.MissingTier == nil || p.MissingTier.Name != tt.missing {
					t.Fatalf("missing tier = %v, want %s", p.MissingTier, tt.missing)
				}
				return
			}
			if p.MissingTier != nil {
				t.Fatalf("unexpected missing tier %s", p.MissingTier.Name)
			}
			for i, want := range tt.keys {
				if p.Buckets[i].Key != want {
					t.Errorf("bucket %d key = %s, want %s", i, p.Buckets[i].Key, want)
				}
			}
			if tt.name != "hostile values are escaped and cannot move the hash tag" && len(p.Buckets) != len(tt.keys) {
				t.Fatalf("%d buckets, want %d", len(p.Buckets), len(tt.keys))
			}
			for _, b := range p.Buckets {
				if strings.Count(b.Key, "{") != 1 || strings.Count(b.Key, "}") != 1 || strings.Index(b.Key, "}") < strings.Index(b.Key, "{") {
					t.Errorf("key %q must hold exactly one hash tag", b.Key)
				}
				tag := b.Key[:strings.Index(b.Key, "}")+1]
				if tag != p.Buckets[0].Key[:strings.Index(p.Buckets[0].Key, "}")+1] {
					t.Errorf("key %q is not in the tenant's slot", b.Key)
				}
			}
		})
	}
}

// TestResolveLongPath: a path of more buckets than Resolve's stack buffer
// holds (8) is resolved as a short one: acme with a fifth tier, 10 buckets.
func TestResolveLongPath(t *testing.T) {
	tree := acme()
	tree.Tiers = append(tree.Tiers, &Tier{Name: "task", Key: "{http.request.header.X-Task}", Limits: []*Limit{
		{Count: 50, Per: "h"}, {Count: 5000, Per: "h", Dimension: "tokens"}}})
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	var p Plan
	tree.Resolve([]string{"acme-corp", "engineering", "alice", "agent-1", "t9"}, &p)
	path := "org=acme-corp"
	var want []string
	for _, seg := range []string{"", "/team=engineering", "/user=alice", "/agent=agent-1", "/task=t9"} {
		path += seg
		want = append(want, "{acme|org=acme-corp}"+path+"#requests.gcra.3600000000", "{acme|org=acme-corp}"+path+"#tokens.gcra.3600000000")
	}
	if len(p.Buckets) != len(want) {
		t.Fatalf("%d buckets, want %d", len(p.Buckets), len(want))
	}
	for i, w := range want {
		if p.Buckets[i].Key != w {
			t.Errorf("bucket %d key = %s, want %s", i, p.Buckets[i].Key, w)
		}
	}
}

func TestGlobalCeilingHasItsOwnTag(t *testing.T) {
	tree := &Tree{Name: "notify", Tiers: []*Tier{
		{Name: "global", Key: "all", Limits: []*Limit{{Count: 100, Per: "30m", Algorithm: "sliding"}}},
		{Name: "category", Key: "{http.request.header.X-Category}", Limits: []*Limit{{Count: 10, Per: "30m", Algorithm: "sliding"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	var p Plan
	tree.Resolve([]string{"all", "billing"}, &p)
	if got := p.Buckets[0].Key; got != "{notify|global=all}global=all#requests.sliding-log.1800000000" {
		t.Errorf("global key = %s", got)
	}
	if got := p.Buckets[1].Key; got != "{notify|category=billing}global=all/category=billing#requests.sliding-log.1800000000" {
		t.Errorf("category key = %s", got)
	}
}

// TestKeysNameTheFormOfTheirState: a limit's storage key names the form of
// its state, not its algorithm, so that no state is read as another form:
// the exact sliding window's log has its own name, and the two-counter
// estimate keeps the name its counters have always been stored under.
func TestKeysNameTheFormOfTheirState(t *testing.T) {
	for _, tt := range []struct {
		algorithm, key, rendered string
	}{
		{"", "#requests.gcra.60000000", "5/min"},
		{"sliding", "#requests.sliding-log.60000000", "5/min sliding"},
		{"sliding_approx", "#requests.sliding.60000000", "5/min sliding approx"},
		{"calendar", "#requests.calendar.hour", "5/h calendar"},
		{"fixed", "#requests.calendar.fixed600000000", "5/10m fixed"},
	} {
		per := "min"
		switch tt.algorithm {
		case "calendar":
			per = "h"
		case "fixed":
			per = "10m"
		}
		l := &Limit{Count: 5, Per: per, Algorithm: tt.algorithm}
		tree := &Tree{Name: "t", Tiers: []*Tier{{Name: "u", Key: "{http.request.header.X-U}", Limits: []*Limit{l}}}}
		if err := tree.Compile(); err != nil {
			t.Fatalf("%s: %v", tt.algorithm, err)
		}
		var p Plan
		tree.Resolve([]string{"a"}, &p)
		if got := p.Buckets[0].Key; !strings.HasSuffix(got, tt.key) {
			t.Errorf("%q: key %s, want it to end %s", tt.algorithm, got, tt.key)
		}
		if got := l.String(); got != tt.rendered {
			t.Errorf("%q: rendered %q, want %q", tt.algorithm, got, tt.rendered)
		}
	}
}

func TestSeed004NamedChildren(t *testing.T) {
	tree := &Tree{Name: "exchange", Tiers: []*Tier{
		{Name: "user", Key: "{http.request.header.X-User}", Limits: []*Limit{{Count: 30, Per: "60s", Burst: 15}}},
		{Name: "action", Key: "{http.request.header.X-Action}", Missing: MissingSkip, Values: map[string]*Override{
			"trade":      {Limits: []*Limit{{Count: 10, Per: "15s", Burst: 5}}},
			"withdrawal": {Limits: []*Limit{{Count: 3, Per: "h"}}},
		}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		action string
		n      int
	}{{"trade", 2}, {"withdrawal", 2}, {"balance", 1}, {"", 1}} {
		var p Plan
		tree.Resolve([]string{"alex", tt.action}, &p)
		if len(p.Buckets) != tt.n {
			t.Errorf("action %q: %d buckets, want %d", tt.action, len(p.Buckets), tt.n)
		}
	}
	l := tree.Tiers[1].Values["trade"].Limits[0].Rate()
	if l.Burst != 5 || l.Count != 10 || l.Period != 15*time.Second || l.Algorithm != rate.GCRA {
		t.Errorf("trade limit = %+v", l)
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		tree Tree
		want string
	}{
		{"bad tree name", Tree{Name: "a b"}, "tree name"},
		{"no tiers", Tree{Name: "t"}, "no tiers"},
		{"no key", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Limits: []*Limit{{Count: 1, Per: "s"}}}}}, "no key"},
		{"no limits", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k"}}}, "no limits"},
		{"bad period", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "fortnight"}}}}}, "unknown period"},
		{"zero count", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 0, Per: "s"}}}}}, "count must be positive"},
		{"gcra month", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "month", Algorithm: "gcra"}}}}}, "calendar"},
		{"calendar minute", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "min", Algorithm: "calendar"}}}}}, "hour, day, week or month"},
		{"sliding burst", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "s", Burst: 3, Algorithm: "sliding"}}}}}, "burst applies only"},
		{"bad zone", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "day", Algorithm: "calendar", Timezone: "Mars/Olympus"}}}}}, "timezone"},
		{"duplicate limit", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "s"}, {Count: 2, Per: "1s"}}}}}, "same dimension"},
		{"bad missing", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Missing: "ignore", Limits: []*Limit{{Count: 1, Per: "s"}}}}}, "missing policy"},
		{"duplicate tier", Tree{Name: "t", Tiers: []*Tier{{Name: "a", Key: "k", Limits: []*Limit{{Count: 1, Per: "s"}}}, {Name: "a", Key: "k", Limits: []*Limit{{Count: 1, Per: "s"}}}}}, "twice"},
		{"empty override", Tree{Name: "t", Tiers: []*Tier{{Name: "a", Key: "k", Values: map[string]*Override{"x": {}}}}}, "no limits"},
		{"fixed month", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "month", Algorithm: "fixed"}}}}}, "month has no fixed length"},
		{"fixed tz", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "h", Algorithm: "fixed", Timezone: "Europe/Paris"}}}}}, "drop tz"},
		{"fixed burst", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "h", Burst: 5, Algorithm: "fixed"}}}}}, "burst applies only"},
		{"fixed nanoseconds", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "1500ns", Algorithm: "fixed"}}}}}, "whole number of microseconds"},
		{"idempotent limit", Tree{Name: "t", Tiers: []*Tier{{Name: "org", Key: "k", Limits: []*Limit{{Count: 1, Per: "s", Algorithm: "idempotent"}}}}}, "not a limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.tree.Compile()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Compile() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestPolicyNames(t *testing.T) {
	tree := acme()
	tree.Tiers[0].Limits = append(tree.Tiers[0].Limits, &Limit{Count: 100, Per: "min"})
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range tree.Tiers[0].Limits {
		got = append(got, l.Policy())
	}
	want := []string{"org.requests.h", "org.tokens", "org.requests.min"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("policies = %v, want %v", got, want)
	}
	if p := tree.Tiers[1].Values["marketing"].Limits[0].Policy(); p != "team" {
		t.Errorf("override policy = %s", p)
	}
}

func TestEscape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"alice", "alice"},
		{"alice@example.com", "alice@example.com"},
		{"", ""},
		{"a b", "a%20b"},
		{"{x}", "%7Bx%7D"},
		{"%41", "%2541"},
		{"~", "%7E"},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
	}
	for _, tt := range tests {
		if got := Escape(tt.in); got != tt.want {
			t.Errorf("Escape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	long := Escape(strings.Repeat("a", 65))
	if !strings.HasPrefix(long, "~") || len(long) != 44 {
		t.Errorf("long value escaped to %q, want a ~hash", long)
	}
}

// FuzzEscape checks the properties keys rely on: bounded length, no key
// separators, and no two values escaping alike.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "alice", "{tag}", "a|b/c=d#e", "%7B", "~x", strings.Repeat("é", 40)} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := Escape(a), Escape(b)
		if len(ea) > maxEscaped {
			t.Fatalf("Escape(%q) is %d bytes", a, len(ea))
		}
		if strings.ContainsAny(ea, "{}|/=#") {
			t.Fatalf("Escape(%q) = %q holds a separator", a, ea)
		}
		if a != b && ea == eb {
			t.Fatalf("Escape(%q) == Escape(%q) == %q", a, b, ea)
		}
	})
}

// BenchmarkResolve is one request's plan on the acme tree (8 buckets), on
// a 4-tier tree of one limit per tier (the load script's) and on a tree of
// one tier and one limit (a mholt zone's).
func BenchmarkResolve(b *testing.B) {
	four := &Tree{Name: "acme"}
	for _, name := range []string{"org", "team", "user", "agent"} {
		four.Tiers = append(four.Tiers, &Tier{Name: name, Key: "{http.request.header.X-" + name + "}",
			Limits: []*Limit{{Count: 1000000000, Per: "h"}}})
	}
	one := &Tree{Name: "users", Tiers: []*Tier{{Name: "users", Key: "{http.request.header.X-User}",
		Limits: []*Limit{{Count: 1000, Per: "s"}}}}}
	for _, tc := range []struct {
		name string
		tree *Tree
	}{{"acme", acme()}, {"four", four}, {"one", one}} {
		if err := tc.tree.Compile(); err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			values := []string{"org7", "team42", "user123", "agent2"}
			buf := make([]Bucket, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				p := Plan{Buckets: buf[:0]}
				tc.tree.Resolve(values, &p)
			}
		})
	}
}

// TestQualifyPolicies: a limit name two trees share is qualified by its
// tree in both; the others keep their short names.
func TestQualifyPolicies(t *testing.T) {
	a := &Tree{Name: "a", Tiers: []*Tier{
		{Name: "org", Key: "{header.X-Org}", Limits: []*Limit{{Count: 10, Per: "min"}}},
		{Name: "user", Key: "{header.X-User}", Limits: []*Limit{{Count: 10, Per: "min"}},
			Values: map[string]*Override{"vip": {Limits: []*Limit{{Count: 100, Per: "min"}}}}},
	}}
	b := &Tree{Name: "b", Tiers: []*Tier{
		{Name: "user", Key: "{header.X-User}", Limits: []*Limit{{Count: 3, Per: "min"}}},
	}}
	for _, tree := range []*Tree{a, b} {
		if err := tree.Compile(); err != nil {
			t.Fatal(err)
		}
	}
	QualifyPolicies([]*Tree{a, b})
	for _, c := range []struct {
		l          *Limit
		policy, nm string
	}{
		{a.Tiers[0].Limits[0], "org", "org"},
		{a.Tiers[1].Limits[0], "a/user", "user"},
		{a.Tiers[1].Values["vip"].Limits[0], "a/user", "user"},
		{b.Tiers[0].Limits[0], "b/user", "user"},
	} {
		if c.l.Policy() != c.policy || c.l.Name() != c.nm {
			t.Errorf("%s: policy %q name %q, want %q and %q", c.l, c.l.Policy(), c.l.Name(), c.policy, c.nm)
		}
	}
	QualifyPolicies([]*Tree{a}) // alone again (a reload without b): short names
	if p := a.Tiers[1].Limits[0].Policy(); p != "user" {
		t.Errorf("a alone: policy %q, want user", p)
	}
}

// TestBarePlaceholders: placeholders without a namespace are found (map's
// outputs, or a mistake for {header.X-User}); Caddy's own are not.
func TestBarePlaceholders(t *testing.T) {
	for key, want := range map[string]string{
		"{X-User}":                       "X-User",
		"{http.request.header.X-User}":   "",
		"{env.T}/{tenant}":               "tenant",
		`\{literal}{http.vars.x}`:        "",
		"static":                         "",
		"a{b":                            "",
		"{http.regexp.name.1}{a}{b.c}{}": "a",
	} {
		if got := strings.Join(BarePlaceholders(key), ","); got != want {
			t.Errorf("BarePlaceholders(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestPenaltyBox: a tier with a penalty puts its value's box on the path,
// after its limits and keyed beside them, with the strikes keyed beside
// the box; the penalty's dimensions are not a limit's to take.
func TestPenaltyBox(t *testing.T) {
	tree := &Tree{Name: "api", Tiers: []*Tier{
		{Name: "org", Key: "{org}", Limits: []*Limit{{Count: 100, Per: "min"}}},
		{Name: "user", Key: "{user}", Limits: []*Limit{{Count: 10, Per: "min"}},
			Penalty: &Penalty{For: "10m", After: 5}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	var plan Plan
	tree.Resolve([]string{"acme", "bob"}, &plan)
	if len(plan.Buckets) != 3 {
		t.Fatalf("%d buckets, want org's, user's and the user's box", len(plan.Buckets))
	}
	box := plan.Buckets[2]
	if box.Limit.Penalty() == nil || box.Limit.Name() != "user.penalty" || box.Key != "{api|org=acme}org=acme/user=bob#penalty.gcra.600000000" {
		t.Fatalf("box %+v (key %s)", box.Limit, box.Key)
	}
	if r := box.Limit.Rate(); r.Count != 1<<20 || r.Period != 10*time.Minute {
		t.Fatalf("box limit %+v, want 2^20 per 10m", r)
	}
	key, strikes := box.Strikes()
	if r := strikes.Rate(); key != "{api|org=acme}org=acme/user=bob#strikes.sliding-log.600000000" || r.Count != 5 || r.Algorithm != rate.Sliding {
		t.Fatalf("strikes %s %+v, want 5 per 10m beside the box, an exact sliding window", key, r)
	}
	if !box.SameValue(plan.Buckets[1]) || box.SameValue(plan.Buckets[0]) {
		t.Fatal("SameValue: the box is the user's, not the org's")
	}
	var other Plan
	tree.Resolve([]string{"acme", "ann"}, &other)
	if box.SameValue(other.Buckets[1]) {
		t.Fatal("SameValue: bob's box is not ann's")
	}
	for _, dim := range []string{"penalty", "strikes"} {
		bad := &Tree{Name: "x", Tiers: []*Tier{{Name: "k", Key: "k", Limits: []*Limit{{Count: 1, Per: "s", Dimension: dim}}}}}
		if err := bad.Compile(); err == nil || !strings.Contains(err.Error(), "penalty box's") {
			t.Fatalf("a limit in dimension %s: %v", dim, err)
		}
	}
	day := Penalty{For: "1d", After: 1}
	if err := day.compile("k"); err != nil || day.Duration() != 24*time.Hour {
		t.Fatalf("penalty 1d: %v, %v", err, day.Duration())
	}
	for _, bad := range []Penalty{{For: "month", After: 1}, {For: "500ms", After: 1}, {For: "1m", After: 1, Within: "0s"}} {
		if err := bad.Validate(); err == nil {
			t.Fatalf("penalty %+v accepted", bad)
		}
	}
}
