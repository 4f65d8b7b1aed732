package rls

import (
	"context"
	"os"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// FuzzTranslate feeds translate (a call's wire bytes → buckets and costs)
// whatever a caller could send, and checks what it may never do: panic,
// fail with anything but InvalidArgument, take a refund on a route that
// does not allow them, charge an addend above the route's bound or below
// 1, or give a constant tier a value of the caller's choosing. Then the
// call is decided on the memory store, which must not panic either.
func FuzzTranslate(f *testing.F) {
	seed := func(req *rlsv3.RateLimitRequest) {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false, uint16(0))
		f.Add(b, true, uint16(3))
	}
	back := desc("org", "acme")
	back.IsNegativeHits = true
	back.HitsAddend = wrapperspb.UInt64(1 << 40)
	zero := desc("all", "mine", "org", "acme")
	zero.HitsAddend = wrapperspb.UInt64(0)
	for _, domain := range []string{"api", "llm", "edge"} {
		seed(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("org", "acme"), desc("org", "acme", "user", "bob")}})
		seed(&rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{back, zero}})
		seed(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("team", "t", "user", "u", "org", "o", "all", "x")}})
	}
	s, _ := newServer(f, "memory", "")
	routes := s.config.Load().routes
	f.Fuzz(func(t *testing.T, wire []byte, allowRefunds bool, maxAddend uint16) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(wire, &req) != nil {
			return // gRPC refuses it before any handler
		}
		rt, ok := routes[req.GetDomain()]
		if !ok {
			rt = routes["edge"]
		}
		rt.AllowRefunds, rt.MaxAddend = allowRefunds, int64(maxAddend)
		limit := int64(maxAddend)
		if limit == 0 {
			limit = DefaultMaxAddend
		}
		var d, refund engine.Decision
		rt.Engine.Begin(&d)
		defer d.Release()
		rt.Engine.Begin(&refund)
		defer refund.Release()
		spans, idx, costs, refunds, err := translate(rt, &req, &d, &refund, nil, nil, nil)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: want InvalidArgument", err)
			}
			return
		}
		if len(spans) != len(req.GetDescriptors()) || len(costs) != len(d.Buckets) || len(refunds) != len(refund.Buckets) {
			t.Fatalf("%d spans of %d descriptors, %d costs of %d buckets, %d refunds of %d", len(spans), len(req.GetDescriptors()),
				len(costs), len(d.Buckets), len(refunds), len(refund.Buckets))
		}
		for i, sp := range spans {
			if sp.negative && !allowRefunds {
				t.Fatalf("descriptor %d: a refund taken on a route that does not allow them", i)
			}
			if sp.addend < 1 || sp.addend > limit {
				t.Fatalf("descriptor %d: addend %d, want 1 to %d", i, sp.addend, limit)
			}
			if !sp.negative {
				for _, j := range idx[sp.from:sp.to] {
					if j < 0 || j >= len(d.Buckets) {
						t.Fatalf("descriptor %d: bucket %d of %d", i, j, len(d.Buckets))
					}
				}
			}
		}
		seen := map[string]bool{}
		for i, b := range d.Buckets {
			if seen[b.Key] {
				t.Fatalf("bucket %s charged twice", b.Key)
			}
			seen[b.Key] = true
			if c := costs[i]; c < 0 || c > limit {
				t.Fatalf("bucket %s costs %d", b.Key, c)
			}
		}
		for _, bs := range [][]hierarchy.Bucket{d.Buckets, refund.Buckets} {
			for _, b := range bs {
				if !b.Tier.Dynamic() && b.Value != b.Tier.Key {
					t.Fatalf("constant tier %s has the value %q", b.Tier.Name, b.Value)
				}
			}
		}
		for _, r := range refunds {
			if r > 0 || r < -limit {
				t.Fatalf("a refund of %d", r)
			}
		}
		// The whole call, on the memory store: no panic, no other error.
		if _, err := s.ShouldRateLimit(context.Background(), &req); err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
	})
}

// FuzzParseRules feeds ParseRules any file: it must not panic, and an
// error must name the file.
func FuzzParseRules(f *testing.F) {
	example, err := os.ReadFile("testdata/envoy-example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors: {a: b}\n"))
	f.Add([]byte("- 1\n- 2\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - &b\n    key: a\n    shadow_mode: yes\n    rate_limit: &r {unit: hour, requests_per_unit: 0x2}\n  - <<: [*b, {value: v}]\n    key: c\n    descriptors: [*b]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := ParseRules("f.yaml", data)
		if err != nil && !strings.Contains(err.Error(), "f.yaml") {
			t.Fatalf("an error that names no file: %v", err)
		}
	})
}

// FuzzEnvoyDecide feeds a domain of the rls config whatever a caller
// could send: no panic, no error but InvalidArgument, one status per
// descriptor, and an over-limit status only with a limit.
func FuzzEnvoyDecide(f *testing.F) {
	seed := func(req *rlsv3.RateLimitRequest) {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	own := desc("nope", "v")
	own.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 3}
	zero := desc("foo", "x", "bar", "banned")
	zero.HitsAddend = wrapperspb.UInt64(0)
	seed(&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("category", "account"), desc("foo", "x", "bar", "bkthomps")}})
	seed(&rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{own, zero, desc("foo", "x", "baz", "shady")}})
	seed(&rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}})
	s, _, _ := envoyServer(f, true)
	f.Fuzz(func(t *testing.T, wire []byte, atomic bool) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		s.config.Load().envoy.Atomic = atomic
		res, err := s.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: want InvalidArgument", err)
			}
			return
		}
		if len(res.Statuses) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(res.Statuses), len(req.GetDescriptors()))
		}
		for i, st := range res.Statuses {
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && st.CurrentLimit == nil {
				t.Fatalf("status %d over no limit", i)
			}
		}
	})
}
