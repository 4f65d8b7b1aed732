package rls

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// clock is a store clock the test moves by hand.
type clock struct{ now atomic.Int64 }

func (c *clock) read() int64 { return c.now.Load() }

// TestMain stops the Redis server the tests share.
func TestMain(m *testing.M) { redistest.Main(m) }

// newServer serves the tree api: org (100/min, 1000 tokens/min) > team
// (missing: skip; 50/min) > user (10 per 90 s; bob 2/min), on a store of
// kind (memory, or a real Redis) with a clock the test moves, under the
// domains api (requests) and llm (tokens, refunds allowed); and the tree
// edge: all (a constant key: one bucket, 5/min) > org (100/min), under the
// domain edge.
func newServer(t testing.TB, kind, mode string) (*Server, *clock) {
	t.Helper()
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 100, Per: "min"}, {Count: 1000, Per: "min", Dimension: "tokens"}}},
		{Name: "team", Key: "{team}", Missing: hierarchy.MissingSkip, Limits: []*hierarchy.Limit{{Count: 50, Per: "min"}}},
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 10, Per: "90s"}},
			Values: map[string]*hierarchy.Override{"bob": {Limits: []*hierarchy.Limit{{Count: 2, Per: "min"}}}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	edge := &hierarchy.Tree{Name: "edge", Tiers: []*hierarchy.Tier{
		{Name: "all", Key: "all", Limits: []*hierarchy.Limit{{Count: 5, Per: "min"}}},
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 100, Per: "min"}}},
	}}
	if err := edge.Compile(); err != nil {
		t.Fatal(err)
	}
	hierarchy.QualifyPolicies([]*hierarchy.Tree{tree, edge})
	c := &clock{}
	c.now.Store(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro())
	var st store.Store
	switch kind {
	case "memory":
		mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
		t.Cleanup(func() { _ = mem.Close() })
		st = mem
	case "redis":
		srv := redistest.Shared(t)
		r, err := store.NewRedis(context.Background(), store.RedisOptions{Addrs: []string{srv.Addr()},
			KeyPrefix: fmt.Sprintf("rls:%s:%x:", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), rand.Uint32()),
			Clock:     c.read, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		st = r
	}
	et, eedge := &engine.Tree{Tree: tree}, &engine.Tree{Tree: edge}
	e := engine.New(engine.Config{
		Trees: []*engine.Tree{et, eedge}, Dimensions: []string{"tokens"}, Store: st, StoreName: kind,
		Mode: mode, Headers: engine.Headers{IETF: true, RetryAfter: true}, DenialLog: "off",
	})
	t.Cleanup(e.Close)
	s := New(nil)
	s.SetRoutes(map[string]Route{
		"api":  {Engine: e, Tree: et},
		"llm":  {Engine: e, Tree: et, Dimension: "tokens", AllowRefunds: true},
		"edge": {Engine: e, Tree: eedge},
	}, nil)
	return s, c
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func call(t *testing.T, s *Server, domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	res, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func codesOf(res *rlsv3.RateLimitResponse) string {
	out := []string{res.OverallCode.String()}
	for _, s := range res.Statuses {
		out = append(out, s.Code.String())
	}
	return strings.Join(out, " ")
}

func header(res *rlsv3.RateLimitResponse, name string) string {
	for _, h := range res.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

// TestHierarchicalAllOrNothing: Envoy's hierarchical style, one descriptor
// per level, decides one path; a refusal by the user charges the org
// nothing.
func TestHierarchicalAllOrNothing(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		org := desc("org", "acme")
		bob := desc("org", "acme", "user", "bob")
		for i := range 2 {
			if got := codesOf(call(t, s, "api", 0, org, bob)); got != "OK OK OK" {
				t.Fatalf("call %d: %s", i, got)
			}
		}
		res := call(t, s, "api", 0, org, bob)
		if got := codesOf(res); got != "OVER_LIMIT OK OVER_LIMIT" {
			t.Fatalf("bob's third: %s, want the user's descriptor over", got)
		}
		if ra := header(res, "retry-after"); ra == "" || ra == "0" {
			t.Fatalf("a refusal without retry-after: %v", res.ResponseHeadersToAdd)
		}
		var p map[string]any
		if err := json.Unmarshal(res.RawBody, &p); err != nil || p["status"] != float64(429) || p["blocked_by"] != "api/user" {
			t.Fatalf("raw_body %s: %v", res.RawBody, err)
		}
		// The org was charged once per admitted call: 2 of 100, although two
		// descriptors name it, and nothing for the refused call.
		st := call(t, s, "api", 0, org).Statuses[0]
		if st.LimitRemaining != 100-3 {
			t.Fatalf("org remaining %d after 2 admitted calls and this one, want 97", st.LimitRemaining)
		}
	})
}

func TestStatuses(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		res := call(t, s, "api", 0, desc("org", "acme"), desc("org", "acme", "user", "alice"))
		org, user := res.Statuses[0], res.Statuses[1]
		if l := org.CurrentLimit; l.RequestsPerUnit != 100 || l.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.UnitMultiplier != nil || l.Name != "org.requests" {
			t.Fatalf("org's limit %v", l)
		}
		// alice's path: the user bucket (10 per 90 s) is the one with the least
		// left, 9 of 10; 90 s is 90 SECOND.
		if l := user.CurrentLimit; l.RequestsPerUnit != 10 || l.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND || l.UnitMultiplier.GetValue() != 90 || l.Name != "user" {
			t.Fatalf("user's limit %v", l)
		}
		if user.LimitRemaining != 9 || org.LimitRemaining != 99 {
			t.Fatalf("remaining: org %d user %d, want 99 and 9", org.LimitRemaining, user.LimitRemaining)
		}
		// GCRA refills one request each 9 s: 9 s until full again.
		if d := user.DurationUntilReset.AsDuration(); d != 9*time.Second {
			t.Fatalf("user's duration until reset %v, want 9s", d)
		}
		if got := header(res, "ratelimit"); !strings.HasPrefix(got, `"user";r=9;`) {
			t.Fatalf("ratelimit header %q", got)
		}
	})
}

// TestHitsAddend: the call's hits_addend, a descriptor's own, and the
// tokens dimension.
func TestHitsAddend(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		if st := call(t, s, "api", 5, desc("org", "a", "user", "u")).Statuses[0]; st.LimitRemaining != 5 {
			t.Fatalf("after 5 hits: %d left of the user's 10", st.LimitRemaining)
		}
		d := desc("org", "b", "user", "u")
		d.HitsAddend = wrapperspb.UInt64(7) // the descriptor's own wins
		if st := call(t, s, "api", 5, d).Statuses[0]; st.LimitRemaining != 3 {
			t.Fatalf("after 7 hits: %d left", st.LimitRemaining)
		}
		// llm counts tokens: 400 tokens and 1 request per call.
		org := desc("org", "c")
		for i, want := range []uint32{600, 200} {
			st := call(t, s, "llm", 400, org).Statuses[0]
			if st.LimitRemaining != want || st.CurrentLimit.Name != "org.tokens" {
				t.Fatalf("call %d: %d %s left, want %d tokens", i, st.LimitRemaining, st.CurrentLimit.Name, want)
			}
		}
		if res := call(t, s, "llm", 400, org); res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("400 tokens admitted with 200 left")
		}
		if st := call(t, s, "api", 0, org).Statuses[0]; st.LimitRemaining != 97 {
			t.Fatalf("org requests: %d left after 2 admitted llm calls and this one, want 97", st.LimitRemaining)
		}
	})
}

// TestNegativeHits: on a domain that allows refunds, is_negative_hits
// gives the addend back, never refused, in the call's dimension only.
func TestNegativeHits(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		org := desc("org", "acme")
		call(t, s, "llm", 900, org)
		back := desc("org", "acme")
		back.IsNegativeHits = true
		back.HitsAddend = wrapperspb.UInt64(500)
		if res := call(t, s, "llm", 0, back); res.OverallCode != rlsv3.RateLimitResponse_OK || len(res.Statuses) != 1 {
			t.Fatalf("refund: %s", codesOf(res))
		}
		st := call(t, s, "llm", 1, org).Statuses[0]
		if st.LimitRemaining != 1000-900+500-1 {
			t.Fatalf("after 900, back 500, 1: %d tokens left, want 599", st.LimitRemaining)
		}
		if st := call(t, s, "api", 0, org).Statuses[0]; st.LimitRemaining != 100-3 {
			t.Fatalf("requests: %d left, want 97 (the refund gives back no request)", st.LimitRemaining)
		}
	})
}

func TestBadCalls(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		limited := desc("org", "x")
		limited.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
		huge := desc("org", "x")
		huge.HitsAddend = wrapperspb.UInt64(1 << 60)
		var many []*ratelimitv3.RateLimitDescriptor
		for range MaxDescriptors + 1 {
			many = append(many, desc("org", "x"))
		}
		for _, tc := range []struct {
			name   string
			domain string
			descs  []*ratelimitv3.RateLimitDescriptor
			says   string
		}{
			{"unknown domain", "nope", []*ratelimitv3.RateLimitDescriptor{desc("org", "x")}, `no domain "nope": the domains served are api, edge, llm`},
			{"no descriptors", "api", nil, "at least one descriptor"},
			{"too many", "api", many, "at most 64"},
			{"unknown key", "api", []*ratelimitv3.RateLimitDescriptor{desc("org", "x"), desc("org", "x", "region", "eu")}, `descriptor 1: the key "region" is not a tier of tree api: its tiers are org, team, user`},
			{"no entries", "api", []*ratelimitv3.RateLimitDescriptor{desc()}, "no entries"},
			{"twice", "api", []*ratelimitv3.RateLimitDescriptor{desc("org", "x", "org", "y")}, "named twice"},
			{"missing org", "api", []*ratelimitv3.RateLimitDescriptor{desc("user", "x")}, "no org"},
			{"a limit", "api", []*ratelimitv3.RateLimitDescriptor{limited}, "carries a limit"},
			{"huge addend", "api", []*ratelimitv3.RateLimitDescriptor{huge}, "more than this domain takes (at most 4294967295: max_hits_addend)"},
		} {
			_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: tc.domain, Descriptors: tc.descs})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, err, tc.says)
			}
		}
		// Nothing was charged by any of them.
		if st := call(t, s, "api", 0, desc("org", "x")).Statuses[0]; st.LimitRemaining != 99 {
			t.Fatalf("org x: %d left after bad calls and this one, want 99", st.LimitRemaining)
		}
	})
}

// TestSkippedTier: a tier the descriptor does not name follows its missing
// policy: team skips, so org > user is the path.
func TestSkippedTier(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		call(t, s, "api", 0, desc("org", "acme", "user", "carol"))
		res := call(t, s, "api", 0, desc("user", "carol", "org", "acme")) // any order
		if st := res.Statuses[0]; st.LimitRemaining != 8 {
			t.Fatalf("carol: %d left after two calls, want 8", st.LimitRemaining)
		}
		res = call(t, s, "api", 0, desc("org", "acme", "team", "eng", "user", "carol"))
		if st := res.Statuses[0]; st.LimitRemaining != 10-1 || st.CurrentLimit.Name != "user" {
			t.Fatalf("under team eng, carol is another bucket: %d %s", st.LimitRemaining, st.CurrentLimit.Name)
		}
	})
}

// TestShadowAndWarn: a tree in shadow never refuses nor shows anything; in
// warn it does not refuse but says so.
func TestShadowAndWarn(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		for _, mode := range []string{engine.Shadow, engine.Warn} {
			s, _ := newServer(t, kind, mode)
			bob := desc("org", "acme", "user", "bob")
			var res *rlsv3.RateLimitResponse
			for range 3 {
				res = call(t, s, "api", 0, bob)
			}
			if res.OverallCode != rlsv3.RateLimitResponse_OK || len(res.RawBody) != 0 {
				t.Fatalf("%s: %s, want the call passed", mode, codesOf(res))
			}
			switch mode {
			case engine.Shadow:
				if res.Statuses[0].Code != rlsv3.RateLimitResponse_OK || len(res.ResponseHeadersToAdd) != 0 {
					t.Fatalf("shadow showed something: %s %v", codesOf(res), res.ResponseHeadersToAdd)
				}
			case engine.Warn:
				if res.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || header(res, "ratelimit") == "" {
					t.Fatalf("warn: %s %v, want the descriptor over and the headers", codesOf(res), res.ResponseHeadersToAdd)
				}
			}
		}
	})
}

// TestRetryAtDurationAdmits: a refused descriptor's duration_until_reset
// is when a retry is admitted.
func TestRetryAtDurationAdmits(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, c := newServer(t, kind, "")
		bob := desc("org", "acme", "user", "bob")
		var res *rlsv3.RateLimitResponse
		for range 3 {
			res = call(t, s, "api", 0, bob)
		}
		wait := res.Statuses[0].DurationUntilReset.AsDuration()
		if res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || wait <= 0 {
			t.Fatalf("bob's third: %s after %v", codesOf(res), wait)
		}
		c.now.Add(wait.Microseconds() - 1000)
		if res := call(t, s, "api", 0, bob); res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatal("admitted a millisecond before its duration_until_reset")
		}
		c.now.Add(1000)
		if res := call(t, s, "api", 0, bob); res.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatal("refused at its duration_until_reset")
		}
	})
}

// TestConcurrentExact: 200 concurrent gRPC calls of cost k against a
// capacity C admit exactly floor(C/k).
func TestConcurrentExact(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		lis := bufconn.Listen(1 << 20)
		g := grpc.NewServer()
		s.Register(g)
		go func() { _ = g.Serve(lis) }()
		defer g.Stop()
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client := rlsv3.NewRateLimitServiceClient(conn)
		const calls, k = 200, 13 // 1000 tokens of the org: floor(1000/13) = 76 (and 76 of its 100 requests)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range calls {
			wg.Go(func() {
				res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain: "llm", HitsAddend: k, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("org", "exact")}})
				if err != nil {
					t.Error(err)
					return
				}
				if res.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 1000/k {
			t.Fatalf("%d admitted, want %d", got, 1000/k)
		}
	})
}

// TestStoreDown: a store that cannot answer makes the call UNAVAILABLE
// (Envoy then applies its failure_mode_deny), saying so.
func TestStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	r, err := store.NewRedis(context.Background(), store.RedisOptions{Addrs: []string{srv.Addr()}, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	srv.Kill() // a Redis that was there, and is gone
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 10, Per: "min"}}}}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	et := &engine.Tree{Tree: tree}
	e := engine.New(engine.Config{Trees: []*engine.Tree{et}, Store: r, StoreName: "redis", DenialLog: "off"})
	defer e.Close()
	s := New(nil)
	s.SetRoutes(map[string]Route{"api": {Engine: e, Tree: et, AllowRefunds: true}}, nil)
	for _, d := range []*ratelimitv3.RateLimitDescriptor{desc("org", "x"), func() *ratelimitv3.RateLimitDescriptor {
		back := desc("org", "x")
		back.IsNegativeHits = true
		return back
	}()} {
		_, err = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rate limit store could not") {
			t.Fatalf("negative %v: %v, want UNAVAILABLE naming the store", d.IsNegativeHits, err)
		}
	}
}

// TestRefundsRefused: a domain that does not allow refunds refuses a call
// with is_negative_hits as invalid, naming the option, and neither gives
// back nor charges anything, even for the call's other descriptors.
func TestRefundsRefused(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		org := desc("org", "acme")
		for range 3 {
			call(t, s, "api", 0, org)
		}
		back := desc("org", "acme")
		back.IsNegativeHits = true
		back.HitsAddend = wrapperspb.UInt64(50)
		_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("org", "other"), back}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1 has is_negative_hits") ||
			!strings.Contains(err.Error(), "allow_refunds") {
			t.Fatalf("a refund on api: %v, want InvalidArgument naming allow_refunds", err)
		}
		if st := call(t, s, "api", 0, org).Statuses[0]; st.LimitRemaining != 100-4 {
			t.Fatalf("org acme: %d left after 3 calls, a refused refund and this call, want 96", st.LimitRemaining)
		}
		if st := call(t, s, "api", 0, desc("org", "other")).Statuses[0]; st.LimitRemaining != 100-1 {
			t.Fatalf("org other: %d left, want 99 (the refused call charged nothing)", st.LimitRemaining)
		}
	})
}

// TestZeroAddend: a descriptor's hits_addend of 0 means 1, as the call's
// does: a call that counts nothing would be admitted for free.
func TestZeroAddend(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		d := desc("org", "zero", "user", "u")
		d.HitsAddend = wrapperspb.UInt64(0)
		for i := range 10 {
			if res := call(t, s, "api", 0, d); res.OverallCode != rlsv3.RateLimitResponse_OK || res.Statuses[0].LimitRemaining != uint32(9-i) {
				t.Fatalf("call %d: %s, %d left", i, codesOf(res), res.Statuses[0].LimitRemaining)
			}
		}
		if res := call(t, s, "api", 0, d); res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("an 11th call of addend 0 against 10/90s: %s", codesOf(res))
		}
	})
}

// TestConstantTier: an entry naming a tier whose key is a constant cannot
// choose its value: every descriptor shares the one bucket (the ceiling of
// 5/min), whether it names the tier or not, and with whatever value.
func TestConstantTier(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		s, _ := newServer(t, kind, "")
		for i := range 5 {
			d := desc("org", fmt.Sprint("o", i), "all", fmt.Sprint("mine-", i))
			if i%2 == 0 {
				d = desc("org", fmt.Sprint("o", i))
			}
			if res := call(t, s, "edge", 0, d); res.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("call %d: %s", i, codesOf(res))
			}
		}
		res := call(t, s, "edge", 0, desc("all", "a-ceiling-of-my-own", "org", "fresh"))
		if res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || res.Statuses[0].CurrentLimit.Name != "all" {
			t.Fatalf("a sixth call naming its own ceiling: %s %v, want refused by the one ceiling", codesOf(res), res.Statuses[0].CurrentLimit)
		}
	})
}

// TestMaxAddend: a route's MaxAddend refuses larger addends at either
// level, as invalid, charging nothing; up to it is taken.
func TestMaxAddend(t *testing.T) {
	s, _ := newServer(t, "memory", "")
	cfg := s.config.Load()
	routes := map[string]Route{}
	for k, v := range cfg.routes {
		v.MaxAddend = 8
		routes[k] = v
	}
	s.SetRoutes(routes, nil)
	d := desc("org", "m", "user", "u")
	if st := call(t, s, "api", 8, d).Statuses[0]; st.LimitRemaining != 2 {
		t.Fatalf("8 hits: %d left of 10", st.LimitRemaining)
	}
	big := desc("org", "m", "user", "u")
	big.HitsAddend = wrapperspb.UInt64(9)
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "api", HitsAddend: 9, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}},
	} {
		_, err := s.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "hits_addend 9 is more than this domain takes (at most 8: max_hits_addend)") {
			t.Fatalf("9 hits: %v", err)
		}
	}
	if st := call(t, s, "api", 1, d).Statuses[0]; st.LimitRemaining != 1 {
		t.Fatalf("after refused calls and 1 hit: %d left, want 1", st.LimitRemaining)
	}
}
