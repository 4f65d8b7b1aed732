package rls

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// observed is a RuleObserver that keeps what it is told.
type observed struct {
	mu    sync.Mutex
	lines []string
}

func (o *observed) observe(domain, rule, name, detail, outcome string, hits uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, fmt.Sprintf("%s %s %s %s %s %d", domain, rule, name, detail, outcome, hits))
}

// envoyServer serves the rules of files (the rls testdata example first,
// then yamls, one domain each) on a memory store whose clock the test
// moves, from 2026-11-25 10:00:07 UTC.
func envoyServer(t testing.TB, atomic bool, yamls ...string) (*Server, *clock, *observed) {
	t.Helper()
	paths := []string{"testdata/envoy-example.yaml"}
	dir := t.TempDir()
	for i, y := range yamls {
		p := fmt.Sprintf("%s/%d.yaml", dir, i)
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	rules, err := LoadRules(paths...)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{}
	c.now.Store(time.Date(2026, 11, 25, 10, 0, 7, 0, time.UTC).UnixMicro())
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	o := &observed{}
	s := New(nil)
	s.Set(nil, &Envoy{Rules: rules, Store: mem, Atomic: atomic, DescriptorLimits: true, Observe: o.observe,
		Now: func() time.Time { return time.UnixMicro(c.read()) }}, nil)
	return s, c, o
}

// onRedis moves s's rules onto a Redis store of kind (redis, or a
// cluster of three masters) with c's clock.
func onRedis(t *testing.T, s *Server, c *clock, kind string) {
	t.Helper()
	opts := store.RedisOptions{KeyPrefix: fmt.Sprintf("rlsyaml:%s:%x:", kind, rand.Uint32()), Clock: c.read, Timeout: 10 * time.Second}
	if kind == "cluster" {
		opts.Addrs, opts.Cluster = redistest.SharedCluster(t).Addrs(), true
	} else {
		opts.Addrs = []string{redistest.Shared(t).Addr()}
	}
	r, err := store.NewRedis(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s.config.Load().envoy.Store = r
}

// TestEnvoyRedis: on a real Redis, and on a Cluster where a call's
// descriptors live in different slots, all or nothing holds, and windows
// are the memory store's.
func TestEnvoyRedis(t *testing.T) {
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			s, c, _ := envoyServer(t, true)
			onRedis(t, s, c, kind)
			runSteps(t, s, "rl", []envoyStep{
				{descs: []string{"category=account", "foo=x"}, repeat: 2, want: "OK, OK 2, OK 0"},
				{descs: []string{"category=account", "foo=x"}, want: "OVER_LIMIT, OK 2, OVER_LIMIT 0"},
				{descs: []string{"category=account", "foo=x,bar=banned"}, want: "OVER_LIMIT, OK 2, OVER_LIMIT 0"},
				{descs: []string{"category=account", "foo=x,baz=shady"}, want: "OK, OK 1, OK 2"},
				{descs: []string{"category=account"}, want: "OK, OK 0"},
			})
			c.now.Add(53 * time.Second.Microseconds()) // 10:01:00
			runSteps(t, s, "rl", []envoyStep{{descs: []string{"category=account", "foo=x"}, want: "OK, OK 3, OK 1"}})
		})
	}
}

// answer renders a response: the overall code, then each status as
// CODE remaining, "-" for no limit, "inf" for unlimited.
func answer(res *rlsv3.RateLimitResponse) string {
	out := []string{res.OverallCode.String()}
	for _, st := range res.Statuses {
		switch {
		case st.LimitRemaining == math.MaxUint32 && st.CurrentLimit == nil:
			out = append(out, st.Code.String()+" inf")
		case st.CurrentLimit == nil:
			out = append(out, st.Code.String()+" -")
		default:
			out = append(out, fmt.Sprintf("%s %d", st.Code, st.LimitRemaining))
		}
	}
	return strings.Join(out, ", ")
}

// d is a descriptor written "k=v,k=v".
func d(s string) *ratelimitv3.RateLimitDescriptor {
	var kv []string
	for _, e := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(e, "=")
		kv = append(kv, k, v)
	}
	return desc(kv...)
}

type envoyStep struct {
	descs  []string
	hits   uint32
	repeat int
	want   string // of the last repeat
}

func runSteps(t *testing.T, s *Server, domain string, steps []envoyStep) {
	t.Helper()
	for i, st := range steps {
		var ds []*ratelimitv3.RateLimitDescriptor
		for _, x := range st.descs {
			ds = append(ds, d(x))
		}
		var got string
		for range max(st.repeat, 1) {
			got = answer(call(t, s, domain, st.hits, ds...))
		}
		if got != st.want {
			t.Errorf("step %d %v: %s, want %s", i, st.descs, got, st.want)
		}
	}
}

// TestEnvoyExample: envoyproxy/ratelimit's own example configuration,
// each of its rules probed, as envoyproxy/ratelimit answers (its source,
// src/config/config_impl.go and src/service/ratelimit.go, read side by
// side; rls_envoy_compat_test.go asks the real one).
func TestEnvoyExample(t *testing.T) {
	tests := []struct {
		name  string
		steps []envoyStep
	}{
		{"a value rule: 4 a minute", []envoyStep{
			{descs: []string{"category=account"}, repeat: 4, want: "OK, OK 0"},
			{descs: []string{"category=account"}, want: "OVER_LIMIT, OVER_LIMIT 0"},
		}},
		{"nested under a value", []envoyStep{
			{descs: []string{"source_cluster=proxy,destination_cluster=mock"}, want: "OK, OK 0"},
			{descs: []string{"source_cluster=proxy,destination_cluster=mock"}, want: "OVER_LIMIT, OVER_LIMIT 0"},
			{descs: []string{"source_cluster=proxy,destination_cluster=bkthomps"}, want: "OK, OK 1"},
			// the parent alone has no rate_limit; another parent value no rule
			{descs: []string{"source_cluster=proxy"}, want: "OK, OK -"},
			{descs: []string{"source_cluster=other,destination_cluster=mock"}, want: "OK, OK -"},
		}},
		{"key only, and the most specific nested rule", []envoyStep{
			{descs: []string{"foo=x"}, want: "OK, OK 1"},
			{descs: []string{"foo=y"}, want: "OK, OK 1"}, // each value its own counter
			{descs: []string{"foo=x,bar=y"}, want: "OK, OK 2"},
			{descs: []string{"foo=x,bar=bkthomps"}, want: "OK, OK 0"},
			{descs: []string{"foo=x,bar=bkthomps"}, want: "OVER_LIMIT, OVER_LIMIT 0"},
			{descs: []string{"foo=x,baz=anything"}, want: "OK, OK 0"},
			{descs: []string{"foo=x,baz=not-so-shady"}, want: "OK, OK 2"},
			// deeper than any rule: not limited
			{descs: []string{"foo=x,bar=y,baz=z"}, want: "OK, OK -"},
		}},
		{"requests_per_unit 0 is always over, a check of 0 hits is not", []envoyStep{
			{descs: []string{"foo=x,bar=banned"}, want: "OVER_LIMIT, OVER_LIMIT 0"},
		}},
		{"shadow_mode: over is OK", []envoyStep{
			{descs: []string{"foo=x,baz=shady"}, repeat: 3, want: "OK, OK 0"},
			{descs: []string{"foo=x,baz=shady"}, repeat: 2, want: "OK, OK 0"},
		}},
		{"unlimited", []envoyStep{
			{descs: []string{"foo=x,bay=y"}, repeat: 5, want: "OK, OK inf"},
			{descs: []string{"qux=any"}, repeat: 5, want: "OK, OK inf"},
		}},
		{"no rule", []envoyStep{
			{descs: []string{"nope=v"}, want: "OK, OK -"},
			{descs: []string{"category=other"}, want: "OK, OK -"},
		}},
		{"replaces: a named limit another matched limit replaces is dropped", []envoyStep{
			{descs: []string{"category=account", "foo=x,bar=bkthomps"}, repeat: 3, want: "OK, OK 1, OK -"},
			{descs: []string{"foo=x,bar=bkthomps"}, want: "OK, OK 0"},
			// fake_name and banned_limit, replaced
			{descs: []string{"category=account", "source_cluster=proxy,destination_cluster=fake"}, want: "OK, OK 0, OK -"},
			{descs: []string{"source_cluster=proxy,destination_cluster=override", "foo=x,bar=banned"}, want: "OK, OK 1, OK -"},
		}},
		{"hits_addend: the call's, a descriptor's own, 0 only checks", []envoyStep{
			{descs: []string{"unspec=a"}, hits: 2, want: "OK, OK 0"},
			{descs: []string{"unspec=b"}, hits: 3, want: "OVER_LIMIT, OVER_LIMIT 0"},
			{descs: []string{"unspec=b"}, hits: 2, want: "OK, OK 0"}, // the refused 3 was not charged
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := envoyServer(t, true)
			runSteps(t, s, "rl", tt.steps)
		})
	}
}

// TestEnvoyZeroHitsChecks: a descriptor's own hits_addend of 0 checks
// without charging; at the limit it is still OK (nothing more counted).
func TestEnvoyZeroHitsChecks(t *testing.T) {
	s, _, _ := envoyServer(t, true)
	zero := d("unspec=z")
	zero.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		if got := answer(call(t, s, "rl", 0, zero)); got != "OK, OK 2" {
			t.Fatalf("check: %s, want OK, OK 2", got)
		}
	}
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"unspec=z"}, repeat: 2, want: "OK, OK 0"}})
	if got := answer(call(t, s, "rl", 0, zero)); got != "OK, OK 0" {
		t.Fatalf("check at the limit: %s, want OK, OK 0", got)
	}
	banned := d("foo=x,bar=banned")
	banned.HitsAddend = wrapperspb.UInt64(0)
	if got := answer(call(t, s, "rl", 0, banned)); got != "OK, OK 0" {
		t.Fatalf("a check of requests_per_unit 0: %s, want OK, OK 0", got)
	}
}

// TestEnvoyWildcardsAndNesting: a value beats a wildcard, a wildcard the
// key alone; each value a wildcard matches counts apart, unless
// share_threshold; nested rules belong to their parent's value.
func TestEnvoyWildcardsAndNesting(t *testing.T) {
	s, _, _ := envoyServer(t, true, `
domain: wild
descriptors:
  - key: user
    value: vip-*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    value: vip-gold
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: org
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
`)
	runSteps(t, s, "wild", []envoyStep{
		{descs: []string{"user=vip-gold"}, want: "OK, OK 9"},
		{descs: []string{"user=vip-x"}, want: "OK, OK 4"},
		{descs: []string{"user=vip-y"}, want: "OK, OK 4"},
		{descs: []string{"user=bob"}, want: "OK, OK 1"},
		{descs: []string{"path=/api/a"}, want: "OK, OK 2"},
		{descs: []string{"path=/api/b"}, want: "OK, OK 1"},
		{descs: []string{"org=acme,user=x"}, want: "OK, OK 0"},
		{descs: []string{"org=acme,user=x"}, want: "OVER_LIMIT, OVER_LIMIT 0"},
		{descs: []string{"org=other,user=x"}, want: "OK, OK 2"},
	})
}

// TestEnvoyAtomic: with atomic (the default), a call one descriptor
// refuses charges none; atomic off charges the others, as
// envoyproxy/ratelimit does (but never the one that refused).
func TestEnvoyAtomic(t *testing.T) {
	for _, atomic := range []bool{true, false} {
		t.Run(fmt.Sprint("atomic=", atomic), func(t *testing.T) {
			s, _, _ := envoyServer(t, atomic)
			steps := []envoyStep{
				{descs: []string{"category=account", "foo=x"}, repeat: 2, want: "OK, OK 2, OK 0"},
				{descs: []string{"category=account", "foo=x"}, want: "OVER_LIMIT, OK 2, OVER_LIMIT 0"},
				{descs: []string{"category=account"}, want: "OK, OK 1"},
			}
			if !atomic {
				steps[1].want = "OVER_LIMIT, OK 1, OVER_LIMIT 0"
				steps[2].want = "OK, OK 0"
			}
			runSteps(t, s, "rl", steps)
			// requests_per_unit 0 refuses the call: atomic, nothing charged
			want := "OVER_LIMIT, OK 1, OVER_LIMIT 0"
			if !atomic {
				want = "OVER_LIMIT, OVER_LIMIT 0, OVER_LIMIT 0"
			}
			runSteps(t, s, "rl", []envoyStep{{descs: []string{"category=account", "foo=x,bar=banned"}, want: want}})
			// a shadow rule over its limit refuses nothing, charges the others
			s2, _, _ := envoyServer(t, atomic)
			runSteps(t, s2, "rl", []envoyStep{
				{descs: []string{"foo=x,baz=shady"}, repeat: 3, want: "OK, OK 0"},
				{descs: []string{"category=account", "foo=x,baz=shady"}, want: "OK, OK 3, OK 0"},
				{descs: []string{"category=account"}, want: "OK, OK 2"},
			})
		})
	}
}

// TestEnvoyFixedWindows: windows aligned to the epoch, as
// envoyproxy/ratelimit's: a minute's counter resets on the minute, and
// duration_until_reset is the whole seconds left of it.
func TestEnvoyFixedWindows(t *testing.T) {
	s, c, _ := envoyServer(t, true)
	res := call(t, s, "rl", 0, d("foo=x"))
	if got := res.Statuses[0].DurationUntilReset.AsDuration(); got != 53*time.Second {
		t.Errorf("duration_until_reset at 10:00:07: %v, want 53s", got)
	}
	if cl := res.Statuses[0].CurrentLimit; cl.RequestsPerUnit != 2 || cl.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v, want 2 a MINUTE", cl)
	}
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"foo=x"}, repeat: 2, want: "OVER_LIMIT, OVER_LIMIT 0"}})
	c.now.Add((52*time.Second + 999*time.Millisecond).Microseconds()) // 10:00:59.999
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"foo=x"}, want: "OVER_LIMIT, OVER_LIMIT 0"}})
	c.now.Add(time.Millisecond.Microseconds()) // 10:01:00
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"foo=x"}, want: "OK, OK 1"}})
	// a second's window
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"foo=x,baz=q"}, repeat: 2, want: "OVER_LIMIT, OVER_LIMIT 0"}})
	c.now.Add(time.Second.Microseconds())
	runSteps(t, s, "rl", []envoyStep{{descs: []string{"foo=x,baz=q"}, want: "OK, OK 0"}})
}

// TestEnvoyDescriptorLimit: a descriptor's own limit, honoured when
// allowed, counts in the counter of its entries and unit (shared with a
// rule of the same); refused as invalid otherwise.
func TestEnvoyDescriptorLimit(t *testing.T) {
	s, _, _ := envoyServer(t, true)
	own := d("nope=v")
	own.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	if got := answer(call(t, s, "rl", 0, own)); got != "OK, OK 0" {
		t.Fatalf("first: %s", got)
	}
	if got := answer(call(t, s, "rl", 0, own)); got != "OVER_LIMIT, OVER_LIMIT 0" {
		t.Fatalf("second: %s", got)
	}
	s.config.Load().envoy.DescriptorLimits = false
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*ratelimitv3.RateLimitDescriptor{own}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor_limits") {
		t.Fatalf("without descriptor_limits: %v, want InvalidArgument naming descriptor_limits", err)
	}
}

// TestEnvoyUnknownDomain: a domain neither rules nor trees have is not
// limited, as envoyproxy/ratelimit answers; an empty one is invalid.
func TestEnvoyUnknownDomain(t *testing.T) {
	s, _, _ := envoyServer(t, true)
	if got := answer(call(t, s, "elsewhere", 0, d("a=b"), d("c=d"))); got != "OK, OK -, OK -" {
		t.Fatalf("unknown domain: %s", got)
	}
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{d("a=b")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty domain: %v", err)
	}
}

// TestEnvoyMetrics: each descriptor decided under a limit is observed by
// rule, name and outcome; detailed_metric adds the values, at most
// MaxDetails of them per rule.
func TestEnvoyMetrics(t *testing.T) {
	s, _, o := envoyServer(t, true)
	runSteps(t, s, "rl", []envoyStep{
		{descs: []string{"foo=x,bar=bkthomps"}, repeat: 2, want: "OVER_LIMIT, OVER_LIMIT 0"},
		{descs: []string{"foo=x,baz=shady"}, repeat: 4, want: "OK, OK 0"},
		{descs: []string{"unspec=v1"}, want: "OK, OK 1"},
	})
	want := []string{
		"rl rl.foo.bar_bkthomps bkthomps  within_limit 1",
		"rl rl.foo.bar_bkthomps bkthomps  over_limit 1",
		"rl rl.foo.baz_shady   within_limit 1",
		"rl rl.foo.baz_shady   within_limit 1",
		"rl rl.foo.baz_shady   within_limit 1",
		"rl rl.foo.baz_shady   shadow_mode 1",
		"rl rl.unspec  rl.unspec_v1 within_limit 1",
	}
	if strings.Join(o.lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("observed:\n%s\nwant:\n%s", strings.Join(o.lines, "\n"), strings.Join(want, "\n"))
	}
	for i := range MaxDetails + 10 {
		call(t, s, "rl", 0, d(fmt.Sprintf("unspec=u%d", i)))
	}
	if last := o.lines[len(o.lines)-1]; last != "rl rl.unspec  other within_limit 1" {
		t.Fatalf("past MaxDetails: %q", last)
	}
}

// TestEnvoyMetricsLongValue: a client's value of a megabyte is not a
// label of a megabyte (MaxDetails of them would hold 100 MB, and every
// scrape would carry them): a detail longer than MaxDetailLen is "other".
func TestEnvoyMetricsLongValue(t *testing.T) {
	s, _, o := envoyServer(t, true)
	call(t, s, "rl", 0, d("unspec="+strings.Repeat("v", 1<<20)))
	call(t, s, "rl", 0, d("unspec="+strings.Repeat("v", MaxDetailLen-len("rl.unspec_"))))
	if len(o.lines) != 2 || o.lines[0] != "rl rl.unspec  other within_limit 1" {
		t.Fatalf("a value of 1 MiB observed as %.200q", o.lines[0])
	}
	if want := "rl.unspec_" + strings.Repeat("v", MaxDetailLen-len("rl.unspec_")); !strings.Contains(o.lines[1], " "+want+" ") {
		t.Fatalf("a detail of MaxDetailLen bytes observed as %.300q", o.lines[1])
	}
}

// TestEnvoyShadow: with Shadow, a call over a limit is OK overall, its
// statuses and counters as if it enforced (envoyproxy/ratelimit's
// GLOBAL_SHADOW_MODE, but a call it would refuse charges nothing).
func TestEnvoyShadow(t *testing.T) {
	s, _, o := envoyServer(t, true)
	s.config.Load().envoy.Shadow = true
	runSteps(t, s, "rl", []envoyStep{
		{descs: []string{"foo=x"}, repeat: 3, want: "OK, OVER_LIMIT 0"},
		{descs: []string{"foo=x,bar=banned", "category=account"}, want: "OK, OVER_LIMIT 0, OK 4"}, // counted as if enforced: refused, charged nothing
	})
	if last := o.lines[len(o.lines)-2]; !strings.HasSuffix(last, " over_limit 1") {
		t.Fatalf("observed %q, want the over_limit counted", last)
	}
}

// BenchmarkEnvoyDecide is one call of Envoy's usual two descriptors on
// the example's rules, on the memory store.
func BenchmarkEnvoyDecide(b *testing.B) {
	s, _, _ := envoyServer(b, true)
	s.config.Load().envoy.Observe = nil
	req := &rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: 0, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		d("foo=x,bar=y"), d("source_cluster=proxy,destination_cluster=bkthomps")}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEnvoyMetricNames: value_to_metric puts the call's value in the
// metric detail where the rule has a wildcard or no value, as
// envoyproxy/ratelimit names its stats.
func TestEnvoyMetricNames(t *testing.T) {
	s, _, o := envoyServer(t, true, `
domain: m
descriptors:
  - key: user
    value: vip-*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: empty
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`)
	runSteps(t, s, "m", []envoyStep{
		{descs: []string{"user=vip-x"}, want: "OK, OK 4"},
		{descs: []string{"route=/a,method=GET"}, want: "OK, OK 4"},
		{descs: []string{"empty="}, want: "OK, OK 4"},
	})
	want := []string{
		"m m.user_vip-*  m.user_vip-x within_limit 1",
		"m m.route.method  m.route_/a.method within_limit 1",
		"m m.empty  m.empty_ within_limit 1",
	}
	if got := strings.Join(o.lines, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("observed:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// TestEnvoyHeaders: with Headers, an answer carries the limit, what is
// left and the seconds to its reset of the status with the least left,
// or of the last that refuses; under the names given.
func TestEnvoyHeaders(t *testing.T) {
	s, _, _ := envoyServer(t, true)
	s.config.Load().envoy.Headers = &EnvoyHeaders{}
	headers := func(descs ...string) string {
		t.Helper()
		var ds []*ratelimitv3.RateLimitDescriptor
		for _, x := range descs {
			ds = append(ds, d(x))
		}
		var out []string
		for _, h := range call(t, s, "rl", 0, ds...).ResponseHeadersToAdd {
			out = append(out, h.Key+": "+h.Value)
		}
		return strings.Join(out, ", ")
	}
	if got, want := headers("category=account", "foo=x"), "RateLimit-Limit: 2, RateLimit-Remaining: 1, RateLimit-Reset: 53"; got != want {
		t.Errorf("the least left: %s, want %s", got, want)
	}
	if got := headers("nope=v", "qux=q"); got != "" {
		t.Errorf("no limit: %q, want none", got)
	}
	call(t, s, "rl", 0, d("foo=x"))
	if got, want := headers("foo=x", "category=account"), "RateLimit-Limit: 2, RateLimit-Remaining: 0, RateLimit-Reset: 53"; got != want {
		t.Errorf("a refusal: %s, want %s", got, want)
	}
	s.config.Load().envoy.Headers = &EnvoyHeaders{Limit: "X-Limit", Remaining: "X-Left", Reset: "X-Reset"}
	if got, want := headers("unspec=u"), "X-Limit: 2, X-Left: 1, X-Reset: 53"; got != want {
		t.Errorf("named: %s, want %s", got, want)
	}
}

// refusingStore refuses every call, each of its buckets admitting: a store
// at odds with itself.
type refusingStore struct {
	store.Store
	calls int
}

func (r *refusingStore) Decide(_ context.Context, buckets []store.Bucket) (store.Decision, error) {
	r.calls++
	if r.calls > 100 {
		return store.Decision{}, fmt.Errorf("asked %d times", r.calls)
	}
	d := store.Decision{Results: make([]rate.Result, len(buckets))}
	for i := range d.Results {
		d.Results[i] = rate.Result{Allowed: true, Remaining: 1}
	}
	return d, nil
}

// TestEnvoyAtomicStoreAtOdds: a store that refuses a call no bucket of
// which refused is asked once more at most, not for ever.
func TestEnvoyAtomicStoreAtOdds(t *testing.T) {
	s, _, _ := envoyServer(t, true)
	rs := &refusingStore{}
	s.config.Load().envoy.Store = rs
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{d("foo=x,baz=shady"), d("category=account")}}); err != nil {
		t.Fatal(err)
	}
	if rs.calls > 2 {
		t.Fatalf("the store asked %d times", rs.calls)
	}
}
