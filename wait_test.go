package cascade

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMaxWait: with max_wait 2s and a limit of 2/s, six requests at once
// all get 200, released at GCRA's times (now, now, then one each half
// second: measured, ±80 ms), and a seventh is refused at once with a
// Retry-After after which it would be held no longer than max_wait; on the
// memory store and on Redis. A held client that goes away gives its place
// back: the next request takes it.
func TestMaxWait(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
		tree api {
			tier user {header.X-User} {
				limit 2/s
			}
		}
		max_wait 2s
		`+storeBlock)
		start := time.Now()
		var mu sync.Mutex
		var took []time.Duration
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := do(t, "GET", url, "X-User: ann")
				if r.status != 200 {
					t.Errorf("a held request: %d %s", r.status, r.body)
				}
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			}()
		}
		// The seventh, once the six are decided (the last is held 2s).
		time.Sleep(300 * time.Millisecond)
		sent := time.Now()
		r := do(t, "GET", url, "X-User: ann")
		if r.status != http.StatusTooManyRequests || time.Since(sent) > 200*time.Millisecond || r.header.Get("Retry-After") != "1" {
			t.Errorf("the seventh: %d after %v, Retry-After %q; want 429 at once, retry in 1 s", r.status, time.Since(sent), r.header.Get("Retry-After"))
		}
		wg.Wait()
		slices.Sort(took)
		for i, want := range []time.Duration{0, 0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second} {
			if d := took[i] - want; d < -10*time.Millisecond || d > 80*time.Millisecond {
				t.Errorf("request %d released after %v, want %v ± 80 ms (all: %v)", i, took[i], want, took)
			}
		}
		t.Logf("released after %v", took)

		// A client held for its turn goes away: its place is given back.
		for range 2 {
			do(t, "GET", url, "X-User: bob")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("X-User", "bob")
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
			t.Fatalf("a request held 0.5 s answered %d within 100 ms", res.StatusCode)
		}
		cancel()
		time.Sleep(50 * time.Millisecond) // the server sees the connection close
		sent = time.Now()
		if r := do(t, "GET", url, "X-User: bob"); r.status != 200 || time.Since(sent) > 500*time.Millisecond {
			t.Fatalf("the next request: %d after %v, want 200 in the place given back (within 0.5 s, not 1 s)", r.status, time.Since(sent))
		}
	})
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
// back: the one after it is held in its place.
func TestMaxQueued(t *testing.T) {
	url, api := adminSite(t, `
		tree api {
			tier user {header.X-User} {
				limit 1/s
			}
		}
		max_wait 5s
		max_queued 1
	`)
	if r := do(t, "GET", url, "X-User: ann"); r.status != 200 {
		t.Fatalf("the first: %d", r.status)
	}
	held := make(chan resp, 1)
	go func() { held <- do(t, "GET", url, "X-User: ann") }() // held 1 s
	time.Sleep(200 * time.Millisecond)
	r := do(t, "GET", url, "X-User: ann") // would be held 2 s: the queue is full
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#queue-full") {
		t.Fatalf("beyond max_queued: %d %s, want 429 queue-full", r.status, r.body)
	}
	if r := <-held; r.status != 200 {
		t.Fatalf("the held one: %d", r.status)
	}
	// The refused one gave its place (2 s) back: the next is held about
	// a second (its place at 2 s), not two.
	sent := time.Now()
	if r := do(t, "GET", url, "X-User: ann"); r.status != 200 || time.Since(sent) > 1300*time.Millisecond {
		t.Fatalf("after the queue emptied: %d after %v, want 200 within about a second", r.status, time.Since(sent))
	}
	m := scrape(t, api+"/metrics")
	if m[`cascade_held_requests_total{outcome="queue_full"}`] < 1 || m[`cascade_held_requests_total{outcome="released"}`] < 2 {
		t.Fatalf("held requests' metrics: queue_full %v released %v, want at least 1 and 2",
			m[`cascade_held_requests_total{outcome="queue_full"}`], m[`cascade_held_requests_total{outcome="released"}`])
	}
}
