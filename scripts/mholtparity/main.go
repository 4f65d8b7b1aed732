// Command mholtparity drives the same traffic, at the same instants, to a
// Caddy with mholt/caddy-ratelimit and a Caddy with Cascade, both loaded
// with the Caddyfile that scripts/mholt-parity.sh writes, and prints how
// many requests each admitted per traffic pattern. It exits 1 when any
// count differs. Loopback only; every pattern is bounded in time.
//
//	go run ./scripts/mholtparity -mholt http://127.0.0.1:8001 -cascade http://127.0.0.1:8002
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// A pattern is a sequence of requests to one zone (by path) as one client
// (X-Client), each sent after a pause.
type pattern struct {
	name string
	path string
	// steps: before each request, wait this long (0: at once, a burst)
	steps []time.Duration
}

func burst(n int) []time.Duration { return make([]time.Duration, n) }

func every(d time.Duration, n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}

func seq(parts ...[]time.Duration) []time.Duration {
	var out []time.Duration
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func patterns() []pattern {
	return []pattern{
		// mholt's README example (events 2, window 5s, key {remote_host}):
		// a burst of 8, the same 5.2 s later, then one request every 1.1 s.
		{"README example: 8, 8 after 5.2 s, then 1 per 1.1 s", "/readme",
			seq(burst(8), []time.Duration{5200 * time.Millisecond}, burst(7), every(1100*time.Millisecond, 10))},
		// events 3, window 2s: 3 at once, then one every 0.1 s for 2.5 s.
		{"3/2s: 3, then 1 per 0.1 s", "/z3",
			seq(burst(3), every(100*time.Millisecond, 25))},
		// events 2, window 5s: bursts exactly a window (and 50 ms) apart.
		{"2/5s: bursts of 3 a window + 50 ms apart", "/z2",
			seq(burst(3), []time.Duration{5050 * time.Millisecond}, burst(2), []time.Duration{5050 * time.Millisecond}, burst(2))},
		// events 2, window 5s: steady just above the limit (every 2.2 s,
		// the limit being every 2.5 s) and just below it (every 2.8 s).
		{"2/5s: steady, 1 per 2.2 s (above)", "/z2",
			every(2200*time.Millisecond, 10)},
		{"2/5s: steady, 1 per 2.8 s (below)", "/z2",
			every(2800*time.Millisecond, 8)},
		// events 100, window 10s: a burst of 150, then 12 a second for 12 s.
		{"100/10s: 150, then 12 per second", "/z100",
			seq(burst(150), every(83*time.Millisecond, 144))},
	}
}

func main() {
	mholt := flag.String("mholt", "", "base URL of the Caddy with mholt/caddy-ratelimit")
	cascade := flag.String("cascade", "", "base URL of the Caddy with Cascade")
	flag.Parse()
	if *mholt == "" || *cascade == "" {
		fmt.Fprintln(os.Stderr, "usage: mholtparity -mholt URL -cascade URL")
		os.Exit(2)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ps := patterns()
	type result struct{ mholt, cascade, sent int }
	results := make([]result, len(ps))
	failed := false
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clientKey := fmt.Sprintf("client-%d", i) // each pattern its own bucket
			for _, pause := range p.steps {
				time.Sleep(pause)
				var m, c int
				var both sync.WaitGroup
				both.Add(2)
				send := func(base string, out *int) {
					defer both.Done()
					req, _ := http.NewRequest("GET", base+p.path, nil)
					req.Header.Set("X-Client", clientKey)
					res, err := client.Do(req)
					if err != nil {
						mu.Lock()
						fmt.Fprintf(os.Stderr, "%s: %v\n", p.name, err)
						failed = true
						mu.Unlock()
						return
					}
					res.Body.Close()
					*out = res.StatusCode
				}
				go send(*mholt, &m)
				go send(*cascade, &c)
				both.Wait()
				results[i].sent++
				if m == 200 {
					results[i].mholt++
				}
				if c == 200 {
					results[i].cascade++
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("%-50s %5s %8s %8s\n", "pattern", "sent", "mholt", "Cascade")
	for i, p := range ps {
		r := results[i]
		mark := ""
		if r.mholt != r.cascade {
			mark, failed = "  DIFFERENT", true
		}
		fmt.Printf("%-50s %5d %8d %8d%s\n", p.name, r.sent, r.mholt, r.cascade, mark)
	}
	if failed {
		os.Exit(1)
	}
}
