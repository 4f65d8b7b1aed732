package cascade

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
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
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/rls"
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
		{"rls {\n\t\tport 8081\n\t}", `unknown option "port": expected listen, tls, domain or config`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig\n\t}", "rls config: give envoyproxy/ratelimit's YAML"},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig /x {\n\t\t\tatomic maybe\n\t\t}\n\t}", `atomic "maybe": use one of on, off`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig /x {\n\t\t\tstore disk\n\t\t}\n\t}", `unknown store "disk"`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig /x {\n\t\t\twatch often\n\t\t}\n\t}", `rls config watch "often": give how often`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig /x {\n\t\t\tbogus\n\t\t}\n\t}", `unknown option "bogus": expected store, atomic, descriptor_limits, max_hits_addend, shadow, headers or watch`},
		{"rls {\n\t\tlisten 127.0.0.1:8081\n\t\tconfig /x {\n\t\t\theaders a b\n\t\t}\n\t}", `rls config headers: no names`},
	} {
		cf := "{\n\tcascade {\n\t\t" + tc.rls + "\n\t}\n}\n" + rlsSite(8080, 1, "")
		_, err := adapt(t, cf)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%q: %v, want an error at its line saying %q", tc.rls, err, tc.says)
		}
	}
	// A dimension the tree does not count fails to start, naming it.
	grpcPort := freePort(t)
	cfg, err := adapt(t, globalOptions(rlsGlobal(grpcPort, "domain api dimension tokens"))+rlsSite(freePort(t), 1, ""))
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

	// The mutual TLS its comment shows, uncommented into the cluster,
	// passes Envoy's rules too.
	text := string(y)
	from, to := strings.Index(text, "    #   transport_socket:"), strings.Index(text, "    - name: cascade_rls")
	if from < 0 || to < from {
		t.Fatal("envoy.yaml no longer shows the cascade_rls cluster's transport_socket for mutual TLS")
	}
	snippet := strings.ReplaceAll(text[from:to], "    #   ", "      ")
	tlsYAML := strings.Replace(text[:from]+text[to:], "    - name: cascade_rls\n      type: STATIC\n", "    - name: cascade_rls\n      type: STATIC\n"+snippet, 1)
	doc = nil
	if err := yaml.Unmarshal([]byte(tlsYAML), &doc); err != nil {
		t.Fatalf("envoy.yaml with mutual TLS: %v\n%s", err, tlsYAML)
	}
	if js, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	bs.Reset()
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml with mutual TLS is not an Envoy bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml with mutual TLS breaks Envoy's rules: %v", err)
	}
	if !strings.Contains(string(js), "transport_socket") || !strings.Contains(string(js), `"alpn_protocols":["h2"]`) {
		t.Fatalf("the mutual TLS snippet did not land in the cluster: %s", js)
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

// rlsCall is a ShouldRateLimit call through client, bounded in time.
func rlsCall(client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return client.ShouldRateLimit(ctx, req)
}

// rlsRemaining is what an uncharged look (a call of 1 hit, minus that hit)
// says is left in org's bucket of the tree api: the bucket's state, read
// through the listener.
func rlsRemaining(t *testing.T, client rlsv3.RateLimitServiceClient, domain, org string) uint32 {
	t.Helper()
	res, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", org)}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Statuses[0].LimitRemaining + 1
}

// TestRLSRefundAttack: a caller that reaches the listener sends
// is_negative_hits to give an org's spent hits back. On a domain without
// allow_refunds the call is INVALID_ARGUMENT naming the option, and the
// bucket is as it was; on a domain that allows them (the same tree), the
// hits come back.
func TestRLSRefundAttack(t *testing.T) {
	grpcPort := freePort(t)
	startCaddy(t, rlsSite(freePort(t), 1000, ""), rlsGlobal(grpcPort, "domain api\n\t\tdomain billing tree api allow_refunds"))
	client := rlsClient(t, grpcPort)
	if _, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 600,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "victim")}}); err != nil {
		t.Fatal(err)
	}
	if got := rlsRemaining(t, client, "api", "victim"); got != 400 {
		t.Fatalf("after 600 hits: %d left, want 400", got)
	}
	reset := rlsDesc("org", "victim")
	reset.IsNegativeHits = true
	reset.HitsAddend = wrapperspb.UInt64(1 << 20)
	_, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{reset}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "allow_refunds") {
		t.Fatalf("a refund on a domain without allow_refunds: %v, want INVALID_ARGUMENT naming allow_refunds", err)
	}
	if got := rlsRemaining(t, client, "api", "victim"); got != 399 {
		t.Fatalf("after the refused refund and a call: %d left, want 399 (nothing given back)", got)
	}
	back := rlsDesc("org", "victim")
	back.IsNegativeHits = true
	back.HitsAddend = wrapperspb.UInt64(100)
	if res, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "billing", Descriptors: []*ratelimitv3.RateLimitDescriptor{back}}); err != nil || res.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a refund on billing (allow_refunds): %v %v", res, err)
	}
	if got := rlsRemaining(t, client, "api", "victim"); got != 498 {
		t.Fatalf("after 100 given back and a call: %d left, want 498", got)
	}
}

// TestRLSConstantTierAttack: a descriptor that names the global ceiling's
// tier with a value of its own stays in the one ceiling bucket: 5 calls a
// minute in all, whatever each says.
func TestRLSConstantTierAttack(t *testing.T) {
	grpcPort := freePort(t)
	startCaddy(t, fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier global fixed {
				limit 5/min
			}
			tier org {header.X-Org} {
				limit 100/min
			}
		}
	}
	respond 200
}`, freePort(t)), rlsGlobal(grpcPort, "domain api"))
	client := rlsClient(t, grpcPort)
	admitted := 0
	for i := range 20 {
		res, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			rlsDesc("global", fmt.Sprint("my-own-ceiling-", i), "org", fmt.Sprint("org", i))}})
		if err != nil {
			t.Fatal(err)
		}
		if res.OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("%d of 20 calls naming ceilings of their own admitted, want 5 (the one ceiling)", admitted)
	}
}

// TestRLSAddendAttack: a descriptor's hits_addend of 2^40 (a charge no
// limit takes, or a refund that resets any bucket) is refused as invalid,
// as is one above a domain's max_hits_addend; a descriptor's 0 counts 1,
// as the call's does.
func TestRLSAddendAttack(t *testing.T) {
	grpcPort := freePort(t)
	startCaddy(t, rlsSite(freePort(t), 1000, ""), rlsGlobal(grpcPort, "domain api\n\t\tdomain small tree api max_hits_addend 100"))
	client := rlsClient(t, grpcPort)
	huge := rlsDesc("org", "acme")
	huge.HitsAddend = wrapperspb.UInt64(1 << 40)
	_, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_hits_addend") {
		t.Fatalf("hits_addend 2^40: %v, want INVALID_ARGUMENT naming max_hits_addend", err)
	}
	_, err = rlsCall(client, &rlsv3.RateLimitRequest{Domain: "small", HitsAddend: 101, Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "acme")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 100: max_hits_addend") {
		t.Fatalf("hits_addend 101 on a domain of max_hits_addend 100: %v", err)
	}
	zero := rlsDesc("org", "acme")
	zero.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		if _, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "small", HitsAddend: 100, Descriptors: []*ratelimitv3.RateLimitDescriptor{zero}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := rlsRemaining(t, client, "api", "acme"); got != 997 {
		t.Fatalf("after refused calls and 3 of a descriptor's 0: %d left, want 997", got)
	}
}

// TestRLSMessageBounds: a call larger than MaxRecvMsgSize is refused
// before it is decoded, and the server says how many calls a connection
// may carry at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
func TestRLSMessageBounds(t *testing.T) {
	grpcPort := freePort(t)
	startCaddy(t, rlsSite(freePort(t), 1000, ""), rlsGlobal(grpcPort, "domain api"))
	client := rlsClient(t, grpcPort)
	_, err := rlsCall(client, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		rlsDesc("org", strings.Repeat("x", rls.MaxRecvMsgSize+1))}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a call of %d bytes: %v, want RESOURCE_EXHAUSTED", rls.MaxRecvMsgSize+1, err)
	}
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", grpcPort), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok {
		t.Fatalf("the server's first frame: %v, want SETTINGS", f)
	}
	if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != rls.MaxConcurrentStreams {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (set: %v), want %d", v, ok, rls.MaxConcurrentStreams)
	}
}

// rlsPKI is a CA, a server certificate for 127.0.0.1 and client
// certificates, written as PEM files into a test's temporary directory.
type rlsPKI struct {
	dir                       string
	ca, serverCert, serverKey string // files
	clientCert, clientKey     string // issued by ca
	strangerCert, strangerKey string // issued by another CA
	caPool                    *x509.CertPool
}

func newRLSPKI(t *testing.T) *rlsPKI {
	t.Helper()
	p := &rlsPKI{dir: t.TempDir()}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(p.dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	serial := int64(0)
	issue := func(tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key, der, keyDER
	}
	caTmpl := func(cn string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	}
	leaf := func(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	}
	ca, caKey, caDER, _ := issue(caTmpl("cascade test CA"), nil, nil)
	p.ca = write("ca.crt", "CERTIFICATE", caDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(ca)
	_, _, der, keyDER := issue(leaf("cascade rls", x509.ExtKeyUsageServerAuth), ca, caKey)
	p.serverCert, p.serverKey = write("server.crt", "CERTIFICATE", der), write("server.key", "EC PRIVATE KEY", keyDER)
	_, _, der, keyDER = issue(leaf("envoy", x509.ExtKeyUsageClientAuth), ca, caKey)
	p.clientCert, p.clientKey = write("client.crt", "CERTIFICATE", der), write("client.key", "EC PRIVATE KEY", keyDER)
	other, otherKey, _, _ := issue(caTmpl("another CA"), nil, nil)
	_, _, der, keyDER = issue(leaf("stranger", x509.ExtKeyUsageClientAuth), other, otherKey)
	p.strangerCert, p.strangerKey = write("stranger.crt", "CERTIFICATE", der), write("stranger.key", "EC PRIVATE KEY", keyDER)
	return p
}

// client dials port over TLS, trusting the CA, presenting the certificate
// in certFile and keyFile unless they are empty.
func (p *rlsPKI) client(t *testing.T, port int, certFile, keyFile string) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.caPool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func (p *rlsPKI) tlsBlock(clientCA bool) string {
	ca := ""
	if clientCA {
		ca = "\n\t\t\tclient_ca " + p.ca
	}
	return fmt.Sprintf("tls {\n\t\t\tcert %s\n\t\t\tkey %s%s\n\t\t}\n\t\tdomain api", p.serverCert, p.serverKey, ca)
}

// TestRLSTLSAttack: with tls, a plaintext caller gets nothing decided;
// with client_ca (mutual TLS, after a reload on the same listener), a
// caller without a certificate, or with one from another CA, gets nothing
// decided either, and Envoy's certificate (from client_ca) is served. No
// refused caller charged anything.
func TestRLSTLSAttack(t *testing.T) {
	p := newRLSPKI(t)
	grpcPort, site := freePort(t), freePort(t)
	startCaddy(t, rlsSite(site, 1000, ""), rlsGlobal(grpcPort, p.tlsBlock(false)))
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("org", "tls")}}
	if _, err := rlsCall(rlsClient(t, grpcPort), req); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext against tls: %v, want UNAVAILABLE (no connection)", err)
	}
	if _, err := rlsCall(p.client(t, grpcPort, "", ""), req); err != nil {
		t.Fatalf("tls without client_ca, a client without a certificate: %v", err)
	}

	if err := reload(t, rlsSite(site, 1000, ""), rlsGlobal(grpcPort, p.tlsBlock(true))); err != nil {
		t.Fatal(err)
	}
	for name, client := range map[string]rlsv3.RateLimitServiceClient{
		"plaintext":           rlsClient(t, grpcPort),
		"no certificate":      p.client(t, grpcPort, "", ""),
		"another CA's client": p.client(t, grpcPort, p.strangerCert, p.strangerKey),
	} {
		if _, err := rlsCall(client, req); status.Code(err) != codes.Unavailable {
			t.Errorf("%s against mutual tls: %v, want UNAVAILABLE (no connection)", name, err)
		}
	}
	envoy := p.client(t, grpcPort, p.clientCert, p.clientKey)
	res, err := rlsCall(envoy, req)
	if err != nil || res.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("Envoy's certificate against mutual tls: %v %v", res, err)
	}
	if got := res.Statuses[0].LimitRemaining; got != 1000-2 {
		t.Fatalf("org tls: %d left after the two calls served, want 998 (refused callers charge nothing)", got)
	}

	// A reload to plaintext that fails to start (its site's port is
	// taken) leaves mutual TLS in place, whether the rate limit service
	// had started under it or not (Caddy starts apps in any order).
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	for i := range 6 {
		if err := reload(t, rlsSite(site, 1000, "")+"\n"+rlsSite(taken, 1000, ""), rlsGlobal(grpcPort, "domain api")); err == nil {
			t.Fatal("a reload onto a taken port loaded")
		}
		if _, err := rlsCall(rlsClient(t, grpcPort), req); status.Code(err) != codes.Unavailable {
			t.Fatalf("after failed reload %d, plaintext: %v, want UNAVAILABLE", i, err)
		}
		if _, err := rlsCall(envoy, req); err != nil {
			t.Fatalf("after failed reload %d, Envoy's certificate: %v", i, err)
		}
	}
	// Unloaded, the last configuration closes the listener.
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", grpcPort))
	if err != nil {
		t.Fatalf("the rate limit service's port after Caddy stopped: %v", err)
	}
	ln.Close()
}

// TestRLSTLSErrors: a tls block that cannot serve fails the configuration,
// naming the option and the file; one half given fails the Caddyfile at
// its line.
func TestRLSTLSErrors(t *testing.T) {
	p := newRLSPKI(t)
	garbage := filepath.Join(p.dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(p.dir, "missing.pem")
	for _, tc := range []struct{ cert, key, ca, says string }{
		{missing, p.serverKey, "", "tls cert: open " + missing},
		{p.serverCert, missing, "", "tls key: open " + missing},
		{p.serverCert, p.clientKey, "", "tls cert " + p.serverCert + " and key " + p.clientKey},
		{p.serverCert, p.serverKey, missing, "tls client_ca: open " + missing},
		{p.serverCert, p.serverKey, garbage, "tls client_ca " + garbage + ": no PEM certificate in it"},
	} {
		block := fmt.Sprintf("tls {\n\t\t\tcert %s\n\t\t\tkey %s\n", tc.cert, tc.key)
		if tc.ca != "" {
			block += "\t\t\tclient_ca " + tc.ca + "\n"
		}
		cfg, err := adapt(t, globalOptions(rlsGlobal(freePort(t), block+"\t\t}\n\t\tdomain api"))+rlsSite(freePort(t), 1, ""))
		if err != nil {
			t.Fatal(err)
		}
		err = caddy.Load(cfg, true)
		_ = caddy.Stop()
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.says, err, tc.says)
		}
	}
	for _, tc := range []struct{ rls, says string }{
		{"tls {\n\t\t\tcert a.pem\n\t\t}", "cert is set but key is not"},
		{"tls {\n\t\t\tkey a.pem\n\t\t}", "key is set but cert is not"},
		{"tls {\n\t\t}", "cert and key are required"},
		{"tls {\n\t\t\tca a.pem\n\t\t}", `unknown option "ca": expected cert, key or client_ca`},
		{"tls a.pem", "expected a block"},
		{"domain api max_hits_addend 0", `max_hits_addend "0"`},
		{"domain api max_hits_addend lots", `max_hits_addend "lots"`},
		{"domain api allow_refunds max_hits_addend", "max_hits_addend needs a value"},
	} {
		cf := fmt.Sprintf("{\n\tcascade {\n\t\trls {\n\t\tlisten 127.0.0.1:8081\n\t\t%s\n\t\t}\n\t}\n}\n", tc.rls) + rlsSite(8080, 1, "")
		_, err := adapt(t, cf)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%q: %v, want an error at its line saying %q", tc.rls, err, tc.says)
		}
	}
}

// TestRLSPlaintextWarning: a plaintext listener on an address others may
// reach is warned about at start, naming the fix; on loopback it is not.
func TestRLSPlaintextWarning(t *testing.T) {
	for _, host := range []string{"0.0.0.0", "127.0.0.1"} {
		t.Run(host, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			grpcPort := freePort(t)
			startCaddy(t, rlsSite(freePort(t), 1000, ""),
				fmt.Sprintf("log {\n\toutput file %s\n\tformat json\n\tlevel WARN\n}", logFile),
				fmt.Sprintf("cascade {\n\trls {\n\t\tlisten %s:%d\n\t\tdomain api\n\t}\n}", host, grpcPort))
			b, _ := os.ReadFile(logFile) // Start has logged by the time Load returns
			warned := strings.Contains(string(b), "listens in plaintext on an address others may reach") && strings.Contains(string(b), "tls")
			if warned != (host == "0.0.0.0") {
				t.Fatalf("listening on %s: warned %v; log:\n%s", host, warned, b)
			}
		})
	}
}
