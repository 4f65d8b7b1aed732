package cascade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMaxWait: with max_wait 4s and a limit of 1 per 2 s, three requests
// at once all get 200, released at GCRA's times (now, then one every 2 s:
// none before its time, none near the next one's), and a fourth is refused
// at once with a Retry-After after which it would be held no longer than
// max_wait; on the memory store and on Redis. A held client that goes
// away gives its place back: the next request takes it, where it would
// otherwise be refused (held beyond max_wait). The period is 2 s so that
// a scheduling delay of a slow machine cannot move a request into
// another's place.
func TestMaxWait(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
		tree api {
			tier user {header.X-User} {
				limit 1/2s
			}
		}
		max_wait 4s
		`+storeBlock)
		start := time.Now()
		var mu sync.Mutex
		var took []time.Duration
		var wg sync.WaitGroup
		defer wg.Wait()
		for range 3 {
			wg.Go(func() {
				r := do(t, "GET", url, "X-User: ann")
				if r.status != 200 {
					t.Errorf("a held request: %d %s", r.status, r.body)
				}
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			})
		}
		// The fourth, once the three are decided (the last is held until
		// 4 s): its place, at 6 s, is beyond max_wait until 2 s.
		awaitMetric(t, "the three requests decided", 3, decisionsSoFar)
		sent := time.Now()
		r := do(t, "GET", url, "X-User: ann")
		answered := time.Since(sent)
		if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); r.status != http.StatusTooManyRequests || ra < 1 || ra > 2 || answered > 2*time.Second {
			t.Errorf("the fourth: %d after %v, Retry-After %q; want 429 at once (not held: sooner than its 4 s max_wait), retry in 1-2 s",
				r.status, answered, r.header.Get("Retry-After"))
		}
		t.Logf("the fourth refused %v after the start, in %v", sent.Sub(start).Round(time.Millisecond), answered.Round(time.Millisecond))
		// Meanwhile, a client held for its turn goes away: its place is
		// given back. bob's first goes at once, his second is held until 2 s, his third
		// (until 4 s) goes away; the next takes its place at 4 s — without
		// it, its place would be at 6 s, beyond max_wait: refused.
		base := decisionsSoFar(t)
		if r := do(t, "GET", url, "X-User: bob"); r.status != 200 {
			t.Fatalf("bob's first: %d", r.status)
		}
		bobStart := time.Now()
		second := make(chan resp, 1)
		go func() { second <- do(t, "GET", url, "X-User: bob") }()
		awaitMetric(t, "bob's second decided (held)", base+2, decisionsSoFar)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("X-User", "bob")
		gone := make(chan error, 1)
		go func() {
			res, err := httpClient(t).Do(req)
			if err == nil {
				res.Body.Close()
				err = fmt.Errorf("answered %d", res.StatusCode)
			}
			gone <- err
		}()
		awaitMetric(t, "bob's third decided (held)", base+3, decisionsSoFar)
		cancel()
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Fatalf("bob's third, held until 4 s, its client gone: %v, want it cancelled", err)
		}
		awaitMetric(t, "the server to see bob's third gone", 1, func(t *testing.T) float64 { return heldTotal(t, "gone") })
		sent = time.Now()
		r = do(t, "GET", url, "X-User: bob")
		t.Logf("bob's next: %d, decided %v after his first, answered after %v", r.status, sent.Sub(bobStart).Round(time.Millisecond), time.Since(sent).Round(time.Millisecond))
		if r.status != 200 {
			t.Fatalf("the next request: %d %s, want 200 in the place given back (held until 4 s, not refused for a place at 6 s)", r.status, r.body)
		}
		if r := <-second; r.status != 200 {
			t.Fatalf("bob's second: %d", r.status)
		}

		wg.Wait()
		slices.Sort(took)
		t.Logf("released after %v", took)
		// None released before its time (the window starts after start);
		// each well before the next request's time, 2 s later.
		for i, want := range []time.Duration{0, 2 * time.Second, 4 * time.Second} {
			if d := took[i] - want; d < -10*time.Millisecond || d > 1500*time.Millisecond {
				t.Errorf("request %d released after %v, want %v (not before, not near the next place %v later) (all: %v)", i, took[i], want, 2*time.Second, took)
			}
		}
		if got := heldTotal(t, "released"); got != 4 {
			t.Errorf("cascade_held_requests_total{outcome=released} %v, want 4 (ann's two held, bob's second and next; the first of each went at once)", got)
		}
	})
}

// decisionsSoFar is how many requests the running Caddy's rate_limit
// handlers decided (cascade_decisions_total, all results): a request held
// for its turn is counted once decided, before it is held.
func decisionsSoFar(t *testing.T) float64 {
	t.Helper()
	return metricTotal(t, "cascade_decisions_total")
}

// heldTotal is the running Caddy's cascade_held_requests_total{outcome}.
func heldTotal(t *testing.T, outcome string) float64 {
	t.Helper()
	for _, m := range runningMetrics(t, "cascade_held_requests_total") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// heldNow is the running Caddy's cascade_held_requests: requests held
// with their place in line.
func heldNow(t *testing.T) float64 {
	t.Helper()
	return metricTotal(t, "cascade_held_requests")
}

// awaitMetric polls read until it reaches want: the condition a scenario's
// next step depends on, bounded by what a slow machine cannot reach.
func awaitMetric(t *testing.T, what string, want float64, read func(t *testing.T) float64) {
	t.Helper()
	start := time.Now()
	for {
		got := read(t)
		if got >= want {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%s: %v after %v, want %v", what, got, time.Since(start).Round(time.Millisecond), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxWaitErrors: max_wait's configuration errors name the fix.
func TestMaxWaitErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"no duration", "max_wait", "usage: max_wait <duration>"},
		{"bad duration", "max_wait soon", `max_wait "soon": give how long a request may be held`},
		{"bad queue", "max_wait 1s\n max_queued none", `max_queued "none": give how many requests may be held at once`},
		{"with forwarded", "max_wait 1s\n forwarded", "max_wait holds the request in front of the upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := configError(t, "", tc.body); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestMaxQueued: beyond max_queued requests held at once, one that would
// wait is refused (problem type queue-full), and its reservation given
// back: the one after it is held in its place. One request per 2 s, so
// that the steps are seconds apart.
func TestMaxQueued(t *testing.T) {
	url, api := adminSite(t, `
		tree api {
			tier user {header.X-User} {
				limit 1/2s
			}
		}
		max_wait 5s
		max_queued 1
	`)
	start := time.Now()
	if r := do(t, "GET", url, "X-User: ann"); r.status != 200 {
		t.Fatalf("the first: %d", r.status)
	}
	held := make(chan resp, 1)
	go func() { held <- do(t, "GET", url, "X-User: ann") }() // held until 2 s
	awaitMetric(t, "the second held", 1, heldNow)
	r := do(t, "GET", url, "X-User: ann") // would be held until 4 s: the queue is full
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#queue-full") {
		t.Fatalf("beyond max_queued (%v after the first): %d %s, want 429 queue-full", time.Since(start).Round(time.Millisecond), r.status, r.body)
	}
	if r := <-held; r.status != 200 {
		t.Fatalf("the held one: %d", r.status)
	}
	// The refused one gave its place (4 s) back: the next is held until
	// 4 s, not 6 s.
	sent := time.Now()
	r = do(t, "GET", url, "X-User: ann")
	t.Logf("after the queue emptied: sent %v after the first, released after %v", sent.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); r.status != 200 || took > 5*time.Second {
		t.Fatalf("after the queue emptied: %d after %v from the first, want 200 at 4 s (in the place given back, not at 6 s)", r.status, took)
	}
	m := scrape(t, api+"/metrics")
	if m[`cascade_held_requests_total{outcome="queue_full"}`] != 1 || m[`cascade_held_requests_total{outcome="released"}`] != 2 {
		t.Fatalf("held requests' metrics: queue_full %v released %v, want 1 and 2",
			m[`cascade_held_requests_total{outcome="queue_full"}`], m[`cascade_held_requests_total{outcome="released"}`])
	}
}
