package cascade

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdaptiveThrottle: Caddy in front of an upstream that turns slow, then
// fails, then recovers. The effective limit (RateLimit-Policy q) and the
// admitted burst drop while it is unhealthy and come back after recovery,
// within the configured times.
func TestAdaptiveThrottle(t *testing.T) {
	var mode atomic.Value // "ok", "slow", "fail"
	mode.Store("ok")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "slow":
			time.Sleep(60 * time.Millisecond)
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree t {
			tier all fixed {
				limit 1000/s
				adaptive
			}
		}
		store memory {
			name adaptive%d
		}
	}
	reverse_proxy %s
}
`, port, testSeq.Add(1), strings.TrimPrefix(upstream.URL, "http://")), `cascade {
		adaptive {
			interval 50ms
			cpu off
			latency 20ms 40ms
			error_rate 1 5
			latency_window 1s
			min_requests 5
			recovery_delay 200ms
			recovery_time 1s
		}
	}`)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	quota := func() int {
		r := do(t, "GET", url)
		var q int
		if _, err := fmt.Sscanf(r.header.Get("RateLimit-Policy"), `"all";q=%d`, &q); err != nil {
			t.Fatalf("RateLimit-Policy %q: %v", r.header.Get("RateLimit-Policy"), err)
		}
		return q
	}
	waitFor := func(what string, within time.Duration, cond func(q int) bool) int {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			q := quota()
			if cond(q) {
				return q
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: effective quota still %d after %v", what, q, within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if q := quota(); q != 1000 {
		t.Fatalf("healthy quota %d, want 1000", q)
	}
	mode.Store("slow")
	q := waitFor("slow upstream", 5*time.Second, func(q int) bool { return q <= 500 })
	t.Logf("slow upstream: quota down to %d", q)
	mode.Store("fail")
	q = waitFor("failing upstream", 5*time.Second, func(q int) bool { return q <= 200 })
	t.Logf("failing upstream: quota down to %d", q)
	mode.Store("ok")
	start := time.Now()
	waitFor("recovery", 10*time.Second, func(q int) bool { return q == 1000 })
	t.Logf("recovered to 1000 in %v", time.Since(start).Round(10*time.Millisecond))
}
