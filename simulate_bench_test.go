package cascade

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/simulate"
)

// benchLog writes n lines of Caddy's JSON access log: 10,000 users of 100
// organisations over a day, in the order their responses ended.
func benchLog(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "access.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC).UnixMicro()
	step := int64(24*time.Hour/time.Microsecond) / int64(n)
	for i := range n {
		user := int(rng.ExpFloat64()*1000) % 10000
		end := base + int64(i)*step
		fmt.Fprintf(w, `{"level":"info","ts":%d.%06d,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"10.0.%d.%d","remote_port":"51234","client_ip":"10.0.%d.%d","proto":"HTTP/1.1","method":"GET","host":"api.example.com","uri":"/v1/items/%d?page=2","headers":{"User-Agent":["client/1.0"],"Accept":["application/json"],"X-Org":["org-%d"],"X-User":["user-%d"]}},"bytes_read":0,"user_id":"","duration":0.000812,"size":512,"status":200,"resp_headers":{"Content-Type":["application/json"]}}`+"\n",
			end/1e6, end%1e6, user/256, user%256, user/256, user%256, i, user%100, user)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkSimulate replays a 1,000,000-line Caddy access log through a
// two-tier tree (per organisation and per user, a GCRA limit and an exact
// sliding window) and reports lines/s and the peak of the live heap
// during the replay (live: as of each collection), and the process's
// peak resident memory.
func BenchmarkSimulate(b *testing.B) {
	const lines = 1_000_000
	log := benchLog(b, lines)
	cf := filepath.Join(b.TempDir(), "Caddyfile")
	if err := os.WriteFile(cf, []byte(`{
	admin off
}
:8080 {
	rate_limit {
		tree api {
			tier org {header.X-Org} {
				limit 10/min
			}
			tier user {header.X-User} {
				limit 1/min burst 3
				limit 20/h sliding
			}
		}
	}
	respond "ok"
}
`), 0o600); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var peak atomic.Uint64
	for range b.N {
		sim, err := loadSimulation(cf, "")
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // samples the live heap
			defer close(done)
			sample := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
			for {
				rtmetrics.Read(sample)
				if v := sample[0].Value.Uint64(); v > peak.Load() {
					peak.Store(v)
				}
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		start := time.Now()
		res, err := simulate.Run(context.Background(), simulate.Options{Files: []string{log}}, sim, nil)
		took := time.Since(start)
		close(stop)
		<-done
		sim.Close()
		if err != nil {
			b.Fatal(err)
		}
		if res.Report.Requests != lines || res.Report.Refused == 0 {
			b.Fatalf("replayed %d requests, %d refused", res.Report.Requests, res.Report.Refused)
		}
		b.ReportMetric(float64(lines)/took.Seconds(), "lines/s")
	}
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-live-heap-MiB")
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		var kb float64
		for _, line := range strings.Split(string(status), "\n") {
			if _, err := fmt.Sscanf(line, "VmHWM: %f kB", &kb); err == nil {
				b.ReportMetric(kb/1024, "peak-RSS-MiB")
			}
		}
	}
}
