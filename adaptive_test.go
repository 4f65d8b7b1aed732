package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/engine"
)

// TestAdaptiveThrottle: Caddy in front of an upstream that turns slow, then
// fails, then recovers. The effective limit (RateLimit-Policy q) and the
// admitted burst drop while it is unhealthy and come back after recovery.
// Slow is 300 ms against thresholds of 100 and 200 ms, so that a busy
// machine's own delays neither make a healthy upstream look slow nor
// stall its recovery; how long each step took is logged.
func TestAdaptiveThrottle(t *testing.T) {
	var mode atomic.Value // "ok", "slow", "fail"
	mode.Store("ok")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "slow":
			time.Sleep(300 * time.Millisecond)
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	port := freePort(t)
	name := testSeq.Add(1)
	sites := fmt.Sprintf(`
http://127.0.0.1:%d {
	handle /batch {
		rate_limit {
			tree b {
				tier all fixed {
					limit 1000/s
					adaptive
				}
			}
			priority batch
			shed_at_floor
			store memory {
				name adaptive%d
			}
		}
		reverse_proxy %s
	}
	handle {
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
}
`, port, name, strings.TrimPrefix(upstream.URL, "http://"), name, strings.TrimPrefix(upstream.URL, "http://"))
	global := `cascade {
		adaptive {
			interval 50ms
			floor 0.2
			cpu off
			latency 100ms 200ms
			error_rate 1 5
			latency_window 2s
			min_requests 5
			recovery_delay 200ms
			recovery_time 1s
		}
	}`
	startCaddy(t, sites, global)
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
	start := time.Now()
	q := waitFor("slow upstream", 30*time.Second, func(q int) bool { return q <= 500 })
	t.Logf("slow upstream: quota down to %d in %v", q, time.Since(start).Round(10*time.Millisecond))
	mode.Store("fail")
	start = time.Now()
	q = waitFor("failing upstream", 30*time.Second, func(q int) bool { return q <= 200 })
	t.Logf("failing upstream: quota down to %d in %v", q, time.Since(start).Round(10*time.Millisecond))

	// Batch traffic (factor², floored at 0.2) is at the floor: shed with 503.
	if r := do(t, "GET", url+"batch"); r.status != http.StatusServiceUnavailable ||
		!strings.HasSuffix(fmt.Sprint(r.problem(t)["type"]), "#temporary-reduced-capacity") || r.header.Get("Retry-After") == "" {
		t.Fatalf("batch at the floor: %d %s", r.status, r.body)
	}

	// A reload keeps the controller, and so the throttling, in place.
	if err := reload(t, sites, global); err != nil {
		t.Fatal(err)
	}
	if q := quota(); q > 250 {
		t.Fatalf("after a reload the effective quota jumped back to %d", q)
	}
	mode.Store("ok")
	start = time.Now()
	waitFor("recovery", 30*time.Second, func(q int) bool { return q == 1000 })
	t.Logf("recovered to 1000 in %v", time.Since(start).Round(10*time.Millisecond))
}

// TestShedAtFloorOnlyWhenReduced: shed_at_floor never sheds a healthy
// upstream's traffic with a floor of 1 (nothing is ever reduced), and never
// in mode shadow or warn, which refuse nothing.
func TestShedAtFloorOnlyWhenReduced(t *testing.T) {
	for _, mode := range []string{"enforce", "shadow"} {
		t.Run(mode, func(t *testing.T) {
			port := freePort(t)
			startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree a {
			tier user {header.X-User} {
				limit 100/min
				adaptive
			}
		}
		mode %s
		shed_at_floor
		%s
	}
	respond "ok"
}`, port, mode, memoryStore().block(t)), "cascade {\n adaptive {\n  floor 1\n }\n}")
			if r := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), "X-User: u"); r.status != 200 {
				t.Fatalf("floor 1, healthy upstream, mode %s: status %d %s", mode, r.status, r.body)
			}
		})
	}
}

// TestStreamLatencyIsTimeToHeader: a streamed response whose header comes
// at once is not a slow upstream, however long the stream lasts
// (adaptive.Controller.Record records the time to the response header).
func TestStreamLatencyIsTimeToHeader(t *testing.T) {
	c, err := adaptive.New(adaptive.Config{MinRequests: 1, CPU: adaptive.Thresholds{Disabled: true},
		Latency: adaptive.LatencyThresholds{Warn: time.Second, Critical: 2 * time.Second}}, adaptive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{controller: c}
	now := time.Now()
	c.Sample(now)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for range 3 {
			time.Sleep(700 * time.Millisecond) // tokens trickling out: the stream lasts 2.1 s, past critical
			w.Write([]byte("data: x\n\n"))
		}
		return nil
	})
	if err := h.pass(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), next); err != nil {
		t.Fatal(err)
	}
	// The header came at once: recorded well below the 1 s of warn even
	// on a slow machine; the stream's 2.1 s would be past critical.
	if s := c.Sample(now.Add(time.Second)); s.Requests != 1 || s.LatencyP99.Value >= 1 || s.Factor < 1 {
		t.Fatalf("a stream whose header came at once: %d requests recorded, %.3f s of latency; factor %.3f (want 1, under 1 s, factor 1)", s.Requests, s.LatencyP99.Value, s.Factor)
	}
}

// TestReducedLimitIsNotImpossible: a cost that only the adaptive factor
// puts above a limit's capacity is refused as limited, with a Retry-After,
// not as impossible (which tells clients never to retry); a cost above the
// full capacity is still impossible.
func TestReducedLimitIsNotImpossible(t *testing.T) {
	raw := `{"trees":[{"name":"api","tiers":[{"name":"user","key":"{http.request.header.X-User}","adaptive":true,
		"limits":[{"count":100,"per":"min","dimension":"tokens"}]}]}],
		"costs":[{"dimension":"tokens","value":"{http.request.header.X-Tokens}"}],
		"store":{"memory":{"name":"reduced-not-impossible"}}}`
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		t.Fatal(err)
	}
	h.Trees[0].Tiers[0].Adaptive = false // provisioned without the cascade app...
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	// ...then given a controller whose CPU is critical: the factor halves
	// at each sample, down to its floor.
	c, err := adaptive.New(adaptive.Config{}, adaptive.Options{CPU: adaptive.SourceFunc(func(time.Time) (float64, error) { return 99, nil })})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := 0; i < 6; i++ {
		c.Sample(now.Add(time.Duration(i) * time.Second))
	}
	h.controller, h.trees[0].Tiers[0].Adaptive = c, true
	cfg := h.engine.Config()
	cfg.Controller = c
	h.engine.Close()
	h.engine = engine.New(cfg)
	if f := c.FactorFor(h.priority); f > 0.2 {
		t.Fatalf("factor %v, want the floor", f)
	}
	for _, tc := range []struct {
		tokens string
		reason string
		retry  bool
	}{
		{"50", "limited", true},      // above 100 × factor, within 100
		{"150", "impossible", false}, // above 100 whatever the factor
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "u")
		r.Header.Set("X-Tokens", tc.tokens)
		repl := caddyhttp.NewTestReplacer(r)
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			t.Fatal(err)
		}
		reason, _ := repl.GetString("http.rate_limit.reason")
		if w.Code != http.StatusTooManyRequests || reason != tc.reason || (w.Header().Get("Retry-After") != "") != tc.retry {
			t.Errorf("%s tokens at the floor: %d, reason %q, Retry-After %q; want 429, %s, Retry-After %v",
				tc.tokens, w.Code, reason, w.Header().Get("Retry-After"), tc.reason, tc.retry)
		}
	}
}
