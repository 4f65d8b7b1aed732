package cascade

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// BenchmarkFrontEnds is the throughput of one decision over HTTP through a
// real Caddy in this process, on loopback, with 16 concurrent clients: the
// rate_limit handler in front of `respond` (the Caddy front end), and the
// decision endpoint (`forwarded`) asked as Traefik and nginx ask it. Both on
// the memory store and on a real Redis. Client and server share the
// machine's two cores, so the numbers are relative: compare the front ends
// with each other, not with another machine. calls/s is reported beside
// ns/op.
func BenchmarkFrontEnds(b *testing.B) {
	for _, st := range []string{"memory", "redis"} {
		for _, front := range []string{"handler", "endpoint"} {
			b.Run(st+"/"+front, func(b *testing.B) {
				option, respond, global := "", "respond 200", ""
				if front == "endpoint" {
					// the endpoint answers only the proxies its server trusts
					option, respond, global = "forwarded", "", "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}"
				}
				port := freePort(b)
				startCaddy(b, benchSite(b, port, st, option, respond), global)
				url := fmt.Sprintf("http://127.0.0.1:%d/v1/things", port)
				var n atomic.Int64
				b.SetParallelism(8) // 16 clients on 2 cores
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := n.Add(1)
						req, _ := http.NewRequest("GET", url, nil)
						req.Header.Set("X-Org", fmt.Sprintf("org%d", i%10))
						req.Header.Set("X-User", fmt.Sprintf("user%d", i%1000))
						if front == "endpoint" {
							req.Header.Set("X-Forwarded-Method", "GET")
							req.Header.Set("X-Forwarded-Uri", "/v1/things")
							req.Header.Set("X-Forwarded-For", "10.0.0.1")
						}
						res, err := httpClient(b).Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							b.Errorf("status %d", res.StatusCode)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
			})
		}
	}
}

// benchSite is a site on port whose rate_limit handler (with option) holds
// the tree api, org > user, limited far above any load, on the store st
// (memory, or redis: the shared test server, with keys of its own),
// followed by then.
func benchSite(b *testing.B, port int, st, option, then string) string {
	storeCfg := ""
	if st == "redis" {
		storeCfg = redisBlock(b, "bench")
	}
	return fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		%s
		%s
		tree api {
			tier org {header.X-Org} {
				limit 1000000000/h
			}
			tier user {header.X-User} {
				limit 1000000000/h
			}
		}
	}
	%s
}`, port, option, storeCfg, then)
}

// redisBlock is a `store redis` block on the shared test server, its keys
// under a prefix of their own.
func redisBlock(tb testing.TB, prefix string) string {
	srv := redistest.Shared(tb)
	return fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\tkey_prefix %s%d:\n\t\t}", srv.Addr(), prefix, time.Now().UnixNano())
}
