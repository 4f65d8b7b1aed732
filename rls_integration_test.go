package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// rlsClient dials Cascade's rate limit service as Envoy does (gRPC over
// HTTP/2, plaintext).
func rlsClient(t testing.TB, port int) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func rlsDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// rlsSite is a Caddy site whose rate_limit handler holds the tree api:
// org (capacity C per hour) > user (10 per minute).
func rlsSite(port, capacity int, storeCfg string) string {
	return fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		%s
		tree api {
			tier org {header.X-Org} {
				limit %d/h
			}
			tier user {header.X-User} {
				limit 10/min
			}
		}
	}
	respond 200
}`, port, storeCfg, capacity)
}

func rlsGlobal(port int, domains string) string {
	return fmt.Sprintf("cascade {\n\trls {\n\t\tlisten 127.0.0.1:%d\n\t\t%s\n\t}\n}", port, domains)
}

// TestRLSExact: through a real Caddy's gRPC listener, on the memory store
// and on a real Redis: 200 concurrent calls of k hits against an org of
// capacity C admit exactly floor(C/k); hierarchical descriptors charge
// their shared org once.
func TestRLSExact(t *testing.T) {
	for _, st := range []string{"memory", "redis"} {
		t.Run(st, func(t *testing.T) {
			storeCfg := ""
			if st == "redis" {
				storeCfg = redisBlock(t, "rlsexact")
			}
			grpcPort := freePort(t)
			startCaddy(t, rlsSite(freePort(t), 1000, storeCfg), rlsGlobal(grpcPort, "domain api"))
			client := rlsClient(t, grpcPort)
			ctx := context.Background()

			const calls, k = 200, 7
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := range calls {
				wg.Go(func() {
					res, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: k,
						Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "exact")}})
					if err != nil {
						t.Errorf("call %d: %v", i, err)
						return
					}
					if res.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != 1000/k {
				t.Fatalf("%d admitted, want floor(1000/%d) = %d", got, k, 1000/k)
			}

			// Hierarchical descriptors: the org once per call.
			org, bob := rlsDesc("org", "acme"), rlsDesc("org", "acme", "user", "bob")
			var res *rlsv3.RateLimitResponse
			for range 11 {
				var err error
				if res, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{org, bob}}); err != nil {
					t.Fatal(err)
				}
			}
			if res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || res.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("bob's 11th call: %v", res)
			}
			if got := res.Statuses[0].LimitRemaining; got != 1000-10 {
				t.Fatalf("org acme: %d left after 10 admitted calls, want 990", got)
			}
			// Bad input: a clear error, nothing charged.
			_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "acme", "team", "x")}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"team" is not a tier of tree api`) {
				t.Fatalf("unknown key: %v", err)
			}
			res, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{org}})
			if err != nil || res.Statuses[0].LimitRemaining != 1000-11 {
				t.Fatalf("org acme after the bad call: %v %v", res, err)
			}
		})
	}
}

// TestRLSReload: a reload swaps the trees the running listener decides
// on without closing it; a configuration whose domain names no tree fails
// to load, naming it, and the running one keeps serving.
func TestRLSReload(t *testing.T) {
	grpcPort, site := freePort(t), freePort(t)
	startCaddy(t, rlsSite(site, 1000, ""), rlsGlobal(grpcPort, ""))
	client := rlsClient(t, grpcPort)
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "reload")}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := ask().Statuses[0].CurrentLimit.RequestsPerUnit; got != 1000 {
		t.Fatalf("limit %d, want 1000", got)
	}
	if err := reload(t, rlsSite(site, 500, ""), rlsGlobal(grpcPort, "")); err != nil {
		t.Fatal(err)
	}
	if got := ask().Statuses[0].CurrentLimit.RequestsPerUnit; got != 500 {
		t.Fatalf("after the reload: limit %d, want 500", got)
	}
	err := reload(t, rlsSite(site, 500, ""), rlsGlobal(grpcPort, "domain llm tree chat"))
	if err == nil || !strings.Contains(err.Error(), `domain llm: no rate_limit handler has a tree "chat" (the trees are: api)`) {
		t.Fatalf("a domain without its tree: %v", err)
	}
	if got := ask().Statuses[0].CurrentLimit.RequestsPerUnit; got != 500 {
		t.Fatalf("after the failed reload: limit %d, want 500", got)
	}

	// The calls are counted by domain and outcome; a domain nobody
	// configured is "unknown", not a label the caller chooses.
	_, err = client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "made-up",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "x")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown domain: %v", err)
	}
	counts := map[string]float64{}
	for _, m := range runningMetrics(t, "cascade_rls_calls_total") {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		counts[strings.Join(labels, ",")] = m.GetCounter().GetValue()
	}
	// The running configuration's registry counts since it was loaded:
	// the ask after the failed reload (the earlier ones went to the
	// registries of the configurations before).
	if counts["domain=api,outcome=ok"] < 1 || counts["domain=unknown,outcome=invalid"] != 1 {
		t.Fatalf("cascade_rls_calls_total: %v", counts)
	}
}

// TestRLSCaddyfileErrors: bad rls options are refused when the Caddyfile
// is adapted, naming the line and the fix.
func TestRLSCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ rls, says string }{
		{"rls {\n\t\tdomain api\n\t}", "listen is required"},
		{"rls {\n\t\tlisten 127.0.0.1:8081-8083\n\t}", "give one port"},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tdomain api tree\n\t}", "expected domain <name> [tree <tree>] [dimension <dimension>]"},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tdomain api color red\n\t}", `unknown setting "color"`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tdomain api\n\t\tdomain api\n\t}", `domain "api" configured twice`},
		{"rls {\n\t\tport 8081\n\t}", `unknown option "port": expected listen or domain`},
	} {
		cf := "{\n\tcascade {\n\t\t" + tc.rls + "\n\t}\n}\n" + rlsSite(8080, 1, "")
		_, err := adapt(t, cf)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%q: %v, want an error at its line saying %q", tc.rls, err, tc.says)
		}
	}
	// A dimension the tree does not count fails to start, naming it.
	grpcPort := freePort(t)
	cfg, err := adapt(t, fmt.Sprintf(globalOptions, rlsGlobal(grpcPort, "domain api dimension tokens"))+rlsSite(freePort(t), 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(cfg, true)
	defer caddy.Stop()
	if err == nil || !strings.Contains(err.Error(), "tree api limits no tokens") {
		t.Fatalf("a dimension the tree does not count: %v", err)
	}
}

// TestEnvoyExample runs examples/envoy/Caddyfile and calls it as its
// envoy.yaml has Envoy call it; and checks envoy.yaml against Envoy's own
// configuration schema (go-control-plane's Bootstrap and its validation
// rules), since no Envoy is installed here to load it.
func TestEnvoyExample(t *testing.T) {
	b, err := os.ReadFile("examples/envoy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	grpcPort := freePort(t)
	cf := strings.NewReplacer("http://:8080", fmt.Sprintf("http://:%d", freePort(t)),
		"http://:9000", fmt.Sprintf("http://:%d", freePort(t)),
		"127.0.0.1:8081", fmt.Sprintf("127.0.0.1:%d", grpcPort)).Replace(string(b))
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatal(err)
	}
	cfg = []byte(strings.Replace(string(cfg), `{"apps"`, `{"admin":{"disabled":true},"apps"`, 1))
	loadJSON(t, cfg)
	client := rlsClient(t, grpcPort)
	// What envoy.yaml's rate_limits make of X-Org: acme, X-User: alice.
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		rlsDesc("org", "acme"), rlsDesc("org", "acme", "user", "alice")}}
	for i := range 4 {
		res, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if res.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i+1, res.OverallCode, want)
		}
		if i == 3 {
			var ra, rl string
			for _, h := range res.ResponseHeadersToAdd {
				switch h.Key {
				case "retry-after":
					ra = h.Value
				case "ratelimit":
					rl = h.Value
				}
			}
			if ra != "20" || !strings.HasPrefix(rl, `"user";r=0;t=20`) {
				t.Fatalf("the refusal's headers: retry-after %q ratelimit %q, want 20 s (3/min)", ra, rl)
			}
		}
	}

	y, err := os.ReadFile("examples/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(y, &doc); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml breaks Envoy's rules: %v", err)
	}
	if !strings.Contains(string(js), `"port_value":8081`) || !strings.Contains(string(js), `"domain":"api"`) {
		t.Fatal("envoy.yaml does not point at the Caddyfile's listener and domain")
	}
}

// BenchmarkRLS is Envoy's call to Cascade's rate limit service over
// loopback gRPC, 16 concurrent callers, two descriptors (org, org > user)
// per call, on the memory store and on a real Redis. calls/s beside ns/op.
func BenchmarkRLS(b *testing.B) {
	for _, st := range []string{"memory", "redis"} {
		b.Run(st, func(b *testing.B) {
			grpcPort := freePort(b)
			startCaddy(b, benchSite(b, freePort(b), st, "", "respond 200"), rlsGlobal(grpcPort, "domain api"))
			client := rlsClient(b, grpcPort)
			var n atomic.Int64
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					org := fmt.Sprintf("org%d", i%10)
					res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
						Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", org), rlsDesc("org", org, "user", fmt.Sprintf("u%d", i%1000))}})
					if err != nil || res.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Errorf("%v %v", res, err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
		})
	}
}
