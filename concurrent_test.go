package cascade

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// countingUpstream is an upstream that counts the requests in it at once
// and keeps each until release is closed (or hold has passed).
type countingUpstream struct {
	addr     string
	inFlight atomic.Int64
	most     atomic.Int64
	served   atomic.Int64
	release  chan struct{}
	arrived  chan struct{} // one value per request that arrives
}

func newCountingUpstream(t *testing.T, hold time.Duration) *countingUpstream {
	t.Helper()
	u := &countingUpstream{release: make(chan struct{}), arrived: make(chan struct{}, 1024)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		for {
			m := u.most.Load()
			if n <= m || u.most.CompareAndSwap(m, n) {
				break
			}
		}
		u.served.Add(1)
		select {
		case u.arrived <- struct{}{}:
		default:
		}
		var timeout <-chan time.Time
		if hold > 0 {
			timeout = time.After(hold)
		}
		select {
		case <-u.release:
		case <-timeout:
		case <-r.Context().Done():
		}
		w.Write([]byte("ok"))
	})}
	go srv.Serve(l)
	t.Cleanup(func() {
		u.open()
		srv.Close()
	})
	return u
}

// open lets every request held in the upstream go, now and from now on.
func (u *countingUpstream) open() {
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

// TestConcurrencyLimit: `limit 5 concurrent` keeps at most 5 requests in
// the upstream at any instant (the upstream counts) under 50 concurrent
// slow requests, on both stores; every slot comes back when its response
// ends, or when its client goes away; the headers show the limit.
func TestConcurrencyLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newCountingUpstream(t, 200*time.Millisecond)
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 1000/min
				limit 5 concurrent
			}
		}
		%s
	}
	reverse_proxy %s
}
`, port, storeBlock, up.addr))
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		got := concurrentStatuses(t, []string{url}, 50, "X-User: ann")
		if most := up.most.Load(); most > 5 || most < 1 {
			t.Fatalf("%d requests were in the upstream at once, want at most 5 (and some)", most)
		}
		if got[200] < 5 || got[200]+got[429] != 50 {
			t.Fatalf("answers %v: want at least 5 200s, the rest 429", got)
		}
		t.Logf("50 concurrent: %v, at most %d in the upstream", got, up.most.Load())

		// Every slot came back: 5 at once get through again. (A slot is
		// given back as its handler returns, which may be just after its
		// client has read the answer: the check may be repeated.)
		up.most.Store(0)
		eventually(t, propagation, func() bool {
			return concurrentStatuses(t, []string{url}, 5, "X-User: ann")[200] == 5
		}, "5 at once to get through after the burst (slots not given back?)")

		// The headers name the limit, without a window.
		r := do(t, "GET", url, "X-User: bob")
		if p := r.header.Get("RateLimit-Policy"); !strings.Contains(p, `"user.concurrent";q=5,`) && !strings.HasSuffix(p, `"user.concurrent";q=5`) {
			t.Errorf("RateLimit-Policy %q: want the concurrency limit as q=5 without w", p)
		}

		// A client that goes away while its request is in the upstream
		// gives its slot back.
		up.most.Store(0)
		slow := newCountingUpstream(t, 0) // holds until released
		port2 := freePort(t)
		if err := reload(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 1 concurrent
			}
		}
		%s
	}
	reverse_proxy %s
}
`, port2, storeBlock, slow.addr)); err != nil {
			t.Fatal(err)
		}
		url2 := fmt.Sprintf("http://127.0.0.1:%d/", port2)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", url2, nil)
		req.Header.Set("X-User", "cat")
		done := make(chan struct{})
		go func() {
			defer close(done)
			if res, err := httpClient(t).Do(req); err == nil {
				res.Body.Close()
				t.Errorf("a request held in the upstream answered %d", res.StatusCode)
			}
		}()
		<-slow.arrived
		if r := do(t, "GET", url2, "X-User: cat"); r.status != http.StatusTooManyRequests {
			t.Fatalf("a second request beside one in flight on 1 slot: %d, want 429", r.status)
		}
		cancel()
		<-done
		deadline := time.Now().Add(propagation)
		for {
			slow.open()
			r := do(t, "GET", url2, "X-User: cat")
			if r.status == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the slot of a client that went away did not come back: %d", r.status)
			}
			time.Sleep(10 * time.Millisecond) // the server sees the connection close
		}
	})
}

// TestConcurrencyThreeInstances: three Caddy processes sharing one Redis
// (standalone and the 3-master Cluster) keep at most 5 requests in the
// upstream at once under 50 concurrent slow requests; one killed with
// requests in flight frees its slots within the slot TTL (and not at
// once: the others wait for them).
func TestConcurrencyThreeInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) {
			up := newCountingUpstream(t, 300*time.Millisecond)
			// A TTL long enough that the checks just after the kill
			// (slots still held) finish well before the slots' expiry
			// (at least two thirds of it away) on a busy machine.
			const ttl = 6 * time.Second
			block := fmt.Sprintf(`
			tree api {
				tier global fixed {
					limit 5 concurrent
				}
			}
			store redis {
				address %s
				key_prefix conc%d:
				slot_ttl %v
			}`, strings.Join(dep.Addrs(t), " "), testSeq.Add(1), ttl)
			ps := startProxies(t, 3, block, up.addr)
			var urls []string
			for _, p := range ps {
				urls = append(urls, p.site)
			}
			got := concurrentStatuses(t, urls, 50)
			if most := up.most.Load(); most > 5 || most < 1 {
				t.Fatalf("%d requests were in the upstream at once, want at most 5", most)
			}
			if got[200] < 5 || got[200]+got[429] != 50 {
				t.Fatalf("answers %v: want at least 5 200s, the rest 429", got)
			}
			t.Logf("50 concurrent through 3 instances: %v, at most %d in the upstream", got, up.most.Load())

			// Instance 0 takes 3 slots with requests that stay in the
			// upstream, then dies.
			stuck := newCountingUpstream(t, 0)
			ps0 := startProxies(t, 1, block, stuck.addr)[0]
			for range 3 {
				go func() {
					if res, err := httpClient(t).Get(ps0.site); err == nil {
						res.Body.Close()
					}
				}()
				<-stuck.arrived
			}
			// Slots renewed at least once (every third of the TTL) before
			// the kill: what comes back comes back by expiry, not by luck.
			time.Sleep(ttl/3 + time.Second)
			ps0.stop()
			killed := time.Now()
			if got := concurrentStatuses(t, urls[:1], 5); got[200] != 2 {
				t.Fatalf("5 at once beside 3 slots of a dead instance: %v, want 2 admitted", got)
			}
			for {
				if got := concurrentStatuses(t, urls[:1], 5); got[200] == 5 {
					break
				}
				if time.Since(killed) > ttl+propagation {
					t.Fatalf("the dead instance's slots were not back %v after it died (slot_ttl %v)", time.Since(killed), ttl)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("the dead instance's slots came back %v after it died (slot_ttl %v)", time.Since(killed).Round(time.Millisecond), ttl)
			if time.Since(killed) < ttl/3 {
				t.Fatalf("the dead instance's slots came back after %v, sooner than any renewal could lapse", time.Since(killed))
			}
		})
	}
}

// TestConcurrencyErrors: what cannot hold a concurrency limit says so.
func TestConcurrencyErrors(t *testing.T) {
	for _, tt := range []struct{ name, tier, handler, want string }{
		{"with a period", "limit 5 concurrent 1m", "", "takes no period"},
		{"with a dimension", "limit 5 tokens concurrent", "", "no period"},
		{"zero slots", "limit 0 concurrent", "", "positive whole number"},
		{"behind a decision endpoint", "limit 5 concurrent", "forwarded", "decision endpoint"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := configError(t, tt.tier, tt.handler)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestConcurrencyAdmin: the admin API shows a concurrency limit like any
// other (the slots free while requests are in flight, no refill time), an
// override changes it at runtime, and a reset frees its slots.
func TestConcurrencyAdmin(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newCountingUpstream(t, 0)
		port, adminPort := freePort(t), freePort(t)
		cfg, err := adapt(t, fmt.Sprintf(`{
%s}
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 3 concurrent
			}
		}
		%s
	}
	reverse_proxy %s
}
`, globals(adminPort), port, storeBlock, up.addr))
		if err != nil {
			t.Fatal(err)
		}
		if err := caddy.Load(cfg, true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = caddy.Stop() })
		site, api := fmt.Sprintf("http://127.0.0.1:%d/", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer up.open()
		for range 2 {
			wg.Go(func() { do(t, "GET", site, "X-User: ann") })
			<-up.arrived
		}
		inspect := func() admin.Bucket {
			t.Helper()
			var b admin.Buckets
			if code, body := call(t, "GET", api+"/rate_limit/buckets?tree=api&user=ann", nil, &b); code != 200 || len(b.Buckets) != 1 {
				t.Fatalf("inspect: %d %s", code, body)
			}
			return b.Buckets[0]
		}
		if b := inspect(); b.Remaining != 1 || b.Capacity != 3 || b.Limit != "3 concurrent" || b.FullIn != 0 {
			t.Fatalf("two in flight of 3: %+v", b)
		}
		if b := inspect(); b.Remaining != 1 {
			t.Fatalf("inspecting took a slot: %+v", b)
		}
		// An override of 1 slot: the two in flight already exceed it.
		if code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/ann", `{"limits":[{"count":1,"algorithm":"concurrent"}]}`, nil); code != 200 {
			t.Fatalf("override: %d %s", code, body)
		}
		if r := do(t, "GET", site, "X-User: ann"); r.status != http.StatusTooManyRequests {
			t.Fatalf("a third in flight with 1 slot: %d", r.status)
		}
		if code, body := call(t, "DELETE", api+"/rate_limit/overrides/api/user/ann", nil, nil); code != 200 {
			t.Fatalf("delete override: %d %s", code, body)
		}
		// A reset frees the slots (the two in flight give theirs back to
		// nothing when they end).
		if code, body := call(t, "POST", api+"/rate_limit/reset?tree=api&user=ann", nil, nil); code != 200 {
			t.Fatalf("reset: %d %s", code, body)
		}
		if b := inspect(); b.Remaining != 3 {
			t.Fatalf("after a reset: %+v, want 3 free", b)
		}
		up.open()
		wg.Wait()
		if b := inspect(); b.Remaining != 3 {
			t.Fatalf("after the reset requests ended: %+v, want 3 free (never more)", b)
		}
	})
}
