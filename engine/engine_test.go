package engine

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
)

// clock is a store clock the test moves by hand.
type clock struct{ now int64 }

func (c *clock) read() int64 { return c.now }

// newEngine returns an engine on a memory store with a fixed clock, over
// the tree org (100 requests/min, 1000 tokens/min) > user (10/min; bob
// 2/min; missing: deny) > agent (5/min; missing: skip).
func newEngine(t *testing.T, mode string) (*Engine, *clock) {
	t.Helper()
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 100, Per: "min"}, {Count: 1000, Per: "min", Dimension: "tokens"}}},
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 10, Per: "min"}},
			Values: map[string]*hierarchy.Override{"bob": {Limits: []*hierarchy.Limit{{Count: 2, Per: "min"}}}}},
		{Name: "agent", Key: "{agent}", Missing: hierarchy.MissingSkip, Limits: []*hierarchy.Limit{{Count: 5, Per: "min"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	hierarchy.QualifyPolicies([]*hierarchy.Tree{tree})
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{
		Trees:      []*Tree{{Tree: tree}},
		Dimensions: []string{"tokens"},
		Store:      mem,
		StoreName:  "memory",
		Mode:       mode,
		Headers:    Headers{IETF: true, RetryAfter: true},
		DenialLog:  "off",
	})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	return e, c
}

// decide decides one request of the given tokens on the path values.
func decide(t *testing.T, e *Engine, tokens int64, values ...string) (Decision, error) {
	t.Helper()
	var d Decision
	e.Begin(&d)
	if err := e.Add(&d, e.Tree("api"), append(d.Values(), values...)); err != nil {
		return d, err
	}
	err := e.Decide(context.Background(), &d, Request{Estimates: []int64{tokens}})
	return d, err
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    string
		path    []string
		tokens  int64
		times   int    // decided this many times; the last is checked
		allowed bool   // the last decision's verdict
		reason  string // its Reason
		blocked string // its Blocked
		buckets int    // buckets on its path
	}{
		{name: "a user's path charges org and user", path: []string{"acme", "alice"}, tokens: 10, times: 1,
			allowed: true, reason: ReasonOK, buckets: 3},
		{name: "an agent adds its tier", path: []string{"acme", "alice", "bot"}, tokens: 10, times: 1,
			allowed: true, reason: ReasonOK, buckets: 4},
		{name: "the user's limit refuses the eleventh", path: []string{"acme", "alice"}, tokens: 1, times: 11,
			reason: ReasonLimited, blocked: "api/user", buckets: 3},
		{name: "a value's own limit", path: []string{"acme", "bob"}, tokens: 1, times: 3,
			reason: ReasonLimited, blocked: "api/user", buckets: 3},
		{name: "tokens refuse before requests", path: []string{"acme", "carol"}, tokens: 400, times: 3,
			reason: ReasonLimited, blocked: "api/org", buckets: 3},
		{name: "a cost above the limit is impossible", path: []string{"acme", "dave"}, tokens: 1001, times: 1,
			reason: ReasonImpossible, blocked: "api/org", buckets: 3},
		{name: "shadow never refuses", mode: Shadow, path: []string{"acme", "bob"}, tokens: 1, times: 3,
			reason: ReasonLimited, blocked: "api/user", buckets: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEngine(t, tc.mode)
			var d Decision
			for range tc.times {
				var err error
				d.Release()
				if d, err = decide(t, e, tc.tokens, tc.path...); err != nil {
					t.Fatal(err)
				}
			}
			defer d.Release()
			if d.Allowed != tc.allowed || d.Reason != tc.reason || d.Blocked != tc.blocked || len(d.Buckets) != tc.buckets {
				t.Fatalf("allowed %v reason %q blocked %q buckets %d, want %v %q %q %d",
					d.Allowed, d.Reason, d.Blocked, len(d.Buckets), tc.allowed, tc.reason, tc.blocked, tc.buckets)
			}
			wantMode := Enforce
			if tc.mode != "" {
				wantMode = tc.mode
			}
			if d.Mode != wantMode {
				t.Fatalf("mode %q, want %q", d.Mode, wantMode)
			}
			if !d.Allowed && tc.reason == ReasonLimited && d.Retry <= 0 {
				t.Fatalf("a refusal without a retry")
			}
		})
	}
}

// TestAllOrNothing: a refusal by one tier charges no other.
func TestAllOrNothing(t *testing.T) {
	e, _ := newEngine(t, "")
	for range 2 {
		d, _ := decide(t, e, 1, "acme", "bob")
		d.Release()
	}
	d, _ := decide(t, e, 1, "acme", "bob") // bob's third: refused
	if d.Allowed {
		t.Fatal("bob's third request was admitted")
	}
	d.Release()
	peek, err := e.Peek(context.Background(), e.Tree("api"), []string{"acme"}, map[string]int64{"tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range peek.Buckets {
		if b.Limit.Dimension == "" || b.Limit.Dimension == hierarchy.Requests {
			if got := peek.Now.Results[i].Remaining; got != 98 {
				t.Fatalf("org has %d requests left after two admitted and one refused, want 98", got)
			}
		}
	}
}

func TestMissingKey(t *testing.T) {
	e, _ := newEngine(t, "")
	d, err := decide(t, e, 1, "acme", "")
	defer d.Release()
	var missing *MissingKeyError
	if !errors.As(err, &missing) || missing.Tier.Name != "user" || d.Reason != ReasonMissingKey || d.Blocked != "api/user" {
		t.Fatalf("err %v reason %q blocked %q, want a missing user", err, d.Reason, d.Blocked)
	}
	// In shadow mode a missing key leaves the tree out instead.
	e, _ = newEngine(t, Shadow)
	d2, err := decide(t, e, 1, "acme", "")
	defer d2.Release()
	if err != nil || !d2.Allowed || len(d2.Buckets) != 0 {
		t.Fatalf("shadow: err %v allowed %v buckets %d, want admitted on no bucket", err, d2.Allowed, len(d2.Buckets))
	}
}

// TestRetryAdmits: a retry at the Retry-After a refusal gave is admitted.
func TestRetryAdmits(t *testing.T) {
	e, c := newEngine(t, "")
	var d Decision
	for range 3 {
		d.Release()
		d, _ = decide(t, e, 1, "acme", "bob")
	}
	if d.Allowed || d.Retry <= 0 {
		t.Fatalf("bob's third: allowed %v retry %v", d.Allowed, d.Retry)
	}
	c.now += d.Retry.Microseconds()
	d.Release()
	d, _ = decide(t, e, 1, "acme", "bob")
	defer d.Release()
	if !d.Allowed {
		t.Fatalf("refused again at its Retry-After")
	}
}

// TestChargeReconcile: a decision's charge, kept beyond the decision,
// reconciles to its actual usage, once per call, synchronously.
func TestChargeReconcile(t *testing.T) {
	e, _ := newEngine(t, "")
	d, _ := decide(t, e, 500, "acme", "alice")
	c := d.Charge()
	d.Release()
	if c == nil {
		t.Fatal("an admitted decision with an estimate kept no charge")
	}
	adjusted, err := c.Reconcile(context.Background(), Usage{Dimension: "tokens", Actual: 120})
	if err != nil || len(adjusted) != 1 || adjusted[0].Cost != 120-500 {
		t.Fatalf("corrections %+v, %v: want one refund of 380 to org's tokens", adjusted, err)
	}
	// 1000 − 120 left; so an estimate of 880 fits, 881 does not.
	if d, _ := decide(t, e, 881, "acme", "alice"); d.Allowed {
		t.Fatal("881 tokens admitted with 880 left")
	}
	if d, _ := decide(t, e, 880, "acme", "alice"); !d.Allowed {
		t.Fatal("880 tokens refused with 880 left")
	}
	// A refused decision keeps no charge: nothing was charged.
	d, _ = decide(t, e, 1, "acme", "alice")
	if d.Charge() != nil {
		t.Fatal("a refused decision kept a charge")
	}
}

func TestWriteHeaders(t *testing.T) {
	e, _ := newEngine(t, "")
	d, _ := decide(t, e, 1, "acme", "bob")
	defer d.Release()
	hdr := http.Header{}
	d.WriteHeaders(hdr)
	if p := hdr.Get("RateLimit-Policy"); !strings.Contains(p, `"user";q=2;w=60`) {
		t.Fatalf("RateLimit-Policy %q lacks bob's own limit", p)
	}
	if r := hdr.Get("RateLimit"); !strings.HasPrefix(r, `"user";r=1;`) {
		t.Fatalf("RateLimit %q, want the user's with 1 left", r)
	}
	d2, _ := decide(t, e, 1, "acme", "bob")
	d3, _ := decide(t, e, 1, "acme", "bob")
	defer d2.Release()
	defer d3.Release()
	hdr = http.Header{}
	d3.WriteHeaders(hdr)
	if hdr.Get("Retry-After") == "" {
		t.Fatalf("a refusal without Retry-After: %v", hdr)
	}
}

func TestPathErrors(t *testing.T) {
	e, _ := newEngine(t, "")
	for _, tc := range []struct {
		tree  string
		given map[string]string
		says  string
	}{
		{"nope", nil, "nope"},
		{"api", map[string]string{"team": "x"}, "team"},
		{"api", map[string]string{"user": "alice"}, "org"},
	} {
		_, _, err := e.Path(tc.tree, tc.given)
		var pe *PathError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Path(%q, %v): %v, want a PathError naming %q", tc.tree, tc.given, err, tc.says)
		}
	}
	tr, values, err := e.Path("api", map[string]string{"org": "acme", "user": "alice"})
	if err != nil || tr.Name != "api" || strings.Join(values, "/") != "acme/alice" {
		t.Fatalf("Path: %v %v %v", tr, values, err)
	}
}

// TestRefundableNotLeased: a charge that may be refunded is decided in the
// shared store, never on a lease (a refund cannot reach beneath a lease
// taken after it), while the same path's other requests are leased.
func TestRefundableNotLeased(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 1000, Per: "min"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	leases, err := lease.New(mem, lease.Options{Clock: c.read, Sweep: -1, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: leases, StoreName: "redis", DenialLog: "off"})
	t.Cleanup(func() { e.Close(); _ = leases.Close() })
	decideOnce := func(refundable bool) {
		t.Helper()
		var d Decision
		e.Begin(&d)
		if err := e.Add(&d, e.Tree("api"), []string{"acme"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(context.Background(), &d, Request{Refundable: refundable}); err != nil || !d.Allowed {
			t.Fatalf("decide: %v, allowed %v", err, d.Allowed)
		}
		c.now += 1000
	}
	for range 3 {
		decideOnce(false)
	}
	before := leases.Stats()
	if before.Local != 1 {
		t.Fatalf("stats %+v: the path was not leased", before)
	}
	for range 3 {
		decideOnce(true)
	}
	if after := leases.Stats(); after.Local != before.Local || after.Strict != before.Strict+3 {
		t.Fatalf("refundable charges: stats %+v after %+v, want three more decided in the store", after, before)
	}
}

// TestReleaseClears: Release gives the pooled memory back without the
// pointers the decision wrote there (keys, limits, the request's values),
// so that the pool keeps no request's memory alive.
func TestReleaseClears(t *testing.T) {
	e, _ := newEngine(t, Enforce)
	var d Decision
	e.Begin(&d)
	sc := d.scratch
	if err := e.Add(&d, e.Tree("api"), append(d.Values(), "acme", "ann", "a1")); err != nil {
		t.Fatal(err)
	}
	if err := e.Decide(context.Background(), &d, Request{Estimates: []int64{1}}); err != nil || !d.Allowed {
		t.Fatal(err, d.Allowed)
	}
	d.Release()
	if sc.values != [8]string{} || sc.buckets != [8]hierarchy.Bucket{} || sc.limits != [8]store.Bucket{} {
		t.Fatalf("the pooled scratch still holds the request's values, buckets or limits: %q, %+v", sc.values, sc.buckets[0])
	}
}

// TestAnthropicHeaders: the anthropic family names each dimension of the
// path Anthropic's API names, with its tightest limit, and resets as RFC
// 3339 times (the memory store's clock: 2026-11-25 00:00 UTC; bob's 2 a
// minute are full again after 30 s; the organisation's 1,000 tokens
// after 60 × 300/1000 = 18 s).
func TestAnthropicHeaders(t *testing.T) {
	e, _ := newEngine(t, "")
	e.cfg.Headers = Headers{Anthropic: true}
	d, _ := decide(t, e, 300, "acme", "bob")
	defer d.Release()
	hdr := http.Header{}
	d.WriteHeaders(hdr)
	want := http.Header{
		"Anthropic-Ratelimit-Requests-Limit":     {"2"},
		"Anthropic-Ratelimit-Requests-Remaining": {"1"},
		"Anthropic-Ratelimit-Requests-Reset":     {"2026-11-25T00:00:30Z"},
		"Anthropic-Ratelimit-Tokens-Limit":       {"1000"},
		"Anthropic-Ratelimit-Tokens-Remaining":   {"700"},
		"Anthropic-Ratelimit-Tokens-Reset":       {"2026-11-25T00:00:18Z"},
	}
	if !reflect.DeepEqual(hdr, want) {
		t.Fatalf("headers %v\nwant %v", hdr, want)
	}
}

// TestRetryHeaders: a refusal says its exact wait in retry-after-ms, and
// x-should-retry says whether an SDK should sleep through it: not for an
// impossible cost, nor for a wait past RetryWithin.
func TestRetryHeaders(t *testing.T) {
	for _, tc := range []struct {
		name      string
		d         Decision
		within    time.Duration
		ms, retry string
	}{
		{"a short wait", Decision{Retry: 1944 * time.Millisecond}, 0, "1944", "true"},
		{"a part of a millisecond", Decision{Retry: 1500 * time.Microsecond}, 0, "2", "true"},
		{"a wait past a minute", Decision{Retry: 15 * time.Minute}, 0, "900000", "false"},
		{"a wait past a set bound", Decision{Retry: 45 * time.Second}, 30 * time.Second, "45000", "false"},
		{"a wait within a set bound", Decision{Retry: 25 * time.Second}, 30 * time.Second, "25000", "true"},
		{"impossible", Decision{Decision: store.Decision{Impossible: true}}, 0, "", "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			writeRetry(hdr, &tc.d, tc.within)
			if hdr.Get("Retry-After-Ms") != tc.ms || hdr.Get("X-Should-Retry") != tc.retry {
				t.Fatalf("retry-after-ms %q, x-should-retry %q; want %q, %q", hdr.Get("Retry-After-Ms"), hdr.Get("X-Should-Retry"), tc.ms, tc.retry)
			}
		})
	}
}
