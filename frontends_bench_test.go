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
	stores := []struct{ name, cfg string }{
		{"memory", ""},
		{"redis", ""},
	}
	for _, st := range stores {
		for _, front := range []string{"handler", "endpoint"} {
			b.Run(st.name+"/"+front, func(b *testing.B) {
				storeCfg := st.cfg
				if st.name == "redis" {
					srv := redistest.Shared(b)
					storeCfg = fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\tkey_prefix bench%d:\n\t\t}", srv.Addr(), time.Now().UnixNano())
				}
				option, respond := "", "respond 200"
				if front == "endpoint" {
					option, respond = "forwarded", ""
				}
				port := freePort(b)
				startCaddy(b, fmt.Sprintf(`http://127.0.0.1:%d {
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
}`, port, option, storeCfg, respond))
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
						res, err := client.Do(req)
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
