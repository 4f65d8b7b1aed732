package cascade

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/store"
)

// TestDeadRedis: when Redis dies, requests get the declared policy within
// the store timeout, never a hang, and come back when Redis does.
func TestDeadRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, policy := range []string{"deny", "allow"} {
		t.Run(policy, func(t *testing.T) {
			url := site(t, fmt.Sprintf(`
	tree t {
		tier user {header.X-User} {
			limit 100/h
		}
	}
	store redis {
		address %s
		key_prefix dead%d:
		timeout 200ms
	}
	on_store_error %s
`, srv.Addr(), testSeq.Add(1), policy))
			if r := do(t, "GET", url, "X-User: a"); r.status != 200 {
				t.Fatalf("with Redis up: %d", r.status)
			}
			srv.Pause() // a hung Redis: the worst case for timeouts
			start := time.Now()
			r := do(t, "GET", url, "X-User: a")
			took := time.Since(start)
			srv.Resume()
			if took > 10*time.Second { // fifty times the timeout: a hang, not a slow machine
				t.Errorf("a request took %v with Redis hung; the store timeout is 200ms", took)
			}
			want := map[string]int{"deny": http.StatusServiceUnavailable, "allow": http.StatusOK}[policy]
			if r.status != want {
				t.Fatalf("with Redis hung: status %d, want %d (%s)", r.status, want, r.body)
			}
			if policy == "deny" {
				if p := r.problem(t); !strings.HasSuffix(fmt.Sprint(p["type"]), "#store-unavailable") || r.header.Get("Retry-After") == "" {
					t.Errorf("problem %v, Retry-After %q", p, r.header.Get("Retry-After"))
				}
			}
			srv.Kill()
			if r := do(t, "GET", url, "X-User: a"); r.status != want {
				t.Fatalf("with Redis dead: status %d, want %d", r.status, want)
			}
			srv.Restart(t)
			if r := do(t, "GET", url, "X-User: a"); r.status != 200 {
				t.Fatalf("after Redis came back: %d %s", r.status, r.body)
			}
		})
	}
}

// TestThreeInstancesShareOneRedis: three separate Caddy processes, one
// Redis, 200 concurrent clients spread over them: exactly floor(C/k) pass.
func TestThreeInstancesShareOneRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three Caddy processes")
	}
	srv := redistest.Shared(t)
	var urls []string
	for _, p := range startRateLimited(t, 3, fmt.Sprintf(`
			tree burst {
				tier key fixed {
					limit 100 units/h
				}
			}
			cost units 3
			store redis {
				address %s
				key_prefix multi%d:
			}`, srv.Addr(), testSeq.Add(1))) {
		urls = append(urls, p.site)
	}
	if got := concurrentAdmits(t, urls, 200); got != 33 {
		t.Fatalf("three instances admitted %d, want exactly 33", got)
	}
}

// TestAdaptiveFactorSharedThroughRedis: another instance publishing a low
// factor lowers this instance's effective limits; when it stops, they
// come back.
func TestAdaptiveFactorSharedThroughRedis(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := fmt.Sprintf("share%d:", testSeq.Add(1))
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
			name share%d
		}
	}
	respond "ok"
}
`, port, testSeq.Add(1)), fmt.Sprintf(`cascade {
		adaptive {
			interval 50ms
			cpu off
			latency off
			error_rate off
			share {
				address %s
				key_prefix %s
			}
		}
	}`, srv.Addr(), prefix))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	quota := func() string { return do(t, "GET", url).header.Get("RateLimit-Policy") }
	if q := quota(); q != `"all";q=1000;w=1` {
		t.Fatalf("healthy: %s", q)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a stressed peer instance, publishing every 20ms
		defer close(done)
		for {
			if err := lua.Factor.Run(context.Background(), c, []string{prefix + "adaptive-factor"}, "peer", "0.5", 150000).Err(); err != nil && err != redis.Nil {
				t.Error(err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	eventually(t, 5*time.Second, func() bool { return quota() == `"all";q=500;w=1` }, "the peer's factor 0.5 to apply")
	close(stop)
	<-done
	eventually(t, 5*time.Second, func() bool { return quota() == `"all";q=1000;w=1` }, "the limit to recover when the peer stopped")
}

func eventually(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRedisBreaker: with Redis hung, requests wait out the store's timeout
// until the breaker opens; then they get on_store_error without calling
// Redis (the breaker stays open, trips no more, and the request returns
// before the timeout); when Redis answers again the breaker closes
// and decisions go back to Redis. The transitions are in the metrics. The
// timeout is long (2 s) so that waiting it out and not waiting at all are
// told apart by a margin no busy machine blurs.
func TestRedisBreaker(t *testing.T) {
	srv := redistest.Start(t)
	url := site(t, fmt.Sprintf(`
	tree t {
		tier user {header.X-User} {
			limit 100/h
		}
	}
	store redis {
		address %s
		key_prefix breaker%d:
		timeout 2s
		breaker 2 100ms
	}
	on_store_error deny
`, srv.Addr(), testSeq.Add(1)))
	if r := do(t, "GET", url, "X-User: a"); r.status != 200 {
		t.Fatalf("with Redis up: %d", r.status)
	}
	metric := func(name string) float64 { return storeMetric(t, name, srv.Addr()) }
	srv.Pause()
	for i := range 2 {
		start := time.Now()
		r := do(t, "GET", url, "X-User: a")
		if took := time.Since(start); r.status != http.StatusServiceUnavailable || took < time.Second {
			t.Fatalf("request %d with Redis hung: %d after %v, want 503 after the 2 s timeout", i+1, r.status, took)
		}
	}
	if metric("cascade_store_breaker_open") != 1 || metric("cascade_store_breaker_trips_total") != 1 {
		t.Fatal("two failures in a row did not open the breaker")
	}
	start := time.Now()
	r := do(t, "GET", url, "X-User: a")
	if took := time.Since(start); r.status != http.StatusServiceUnavailable || took >= 2*time.Second || r.header.Get("Retry-After") == "" {
		t.Fatalf("with the breaker open: %d after %v, want 503 (with Retry-After) without waiting for Redis", r.status, took)
	}
	if metric("cascade_store_breaker_open") != 1 || metric("cascade_store_breaker_trips_total") != 1 {
		t.Fatal("a request with the breaker open closed it or tripped it again")
	}
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for do(t, "GET", url, "X-User: a").status != 200 {
		if time.Now().After(deadline) {
			t.Fatal("no decision from Redis 10 s after it came back")
		}
		time.Sleep(20 * time.Millisecond) // waiting for the background ping, not timing an algorithm
	}
	if metric("cascade_store_breaker_open") != 0 || metric("cascade_store_breaker_trips_total") != 1 {
		t.Fatal("the breaker did not close")
	}
}

// storeMetric reads the running Caddy's metric name for the store whose
// name holds addr.
func storeMetric(t *testing.T, name, addr string, labels ...string) float64 {
	t.Helper()
metrics:
	for _, m := range runningMetrics(t, name) {
		if !strings.Contains(m.GetLabel()[0].GetValue(), addr) {
			continue
		}
		for i, want := range labels {
			if m.GetLabel()[i+1].GetValue() != want {
				continue metrics
			}
		}
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no %s%v for the store at %s", name, labels, addr)
	return 0
}

// TestStoreErrorLocal: with on_store_error local 2, a hung Redis (breaker
// open) leaves each instance its half of each limit, decided in memory:
// exact against that share, with its headers and Retry-After; when Redis
// answers again the decisions go back to it, and the state it kept.
func TestStoreErrorLocal(t *testing.T) {
	cfg, err := adapt(t, globalOptions("")+`http://127.0.0.1:1 {
	rate_limit {
		tree t {
			tier user {header.X-User} {
				limit 10/h
			}
		}
		on_store_error local 2
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(mustConfig(t, cfg)); err == nil || !strings.Contains(err.Error(), "on_store_error local decides in memory when Redis cannot: it needs store redis") {
		t.Fatalf("local on the memory store: %v", err)
	}
	srv := redistest.Start(t)
	url := site(t, fmt.Sprintf(`
	tree t {
		tier user {header.X-User} {
			limit 10/h
		}
	}
	store redis {
		address %s
		key_prefix local%d:
		timeout 200ms
		breaker 1 100ms
	}
	on_store_error local 2
`, srv.Addr(), testSeq.Add(1)))
	for range 3 {
		if r := do(t, "GET", url, "X-User: a"); r.status != 200 {
			t.Fatalf("with Redis up: %d", r.status)
		}
	}
	srv.Pause()
	defer srv.Resume()
	// The first request waits out the timeout, opens the breaker and is
	// decided locally; then the local half of 10 (5) is all there is.
	admitted := 0
	var last resp
	for range 8 {
		last = do(t, "GET", url, "X-User: a")
		switch last.status {
		case 200:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("with Redis hung: %d %s", last.status, last.body)
		}
	}
	if admitted != 5 {
		t.Fatalf("%d admitted on the local share, want 5 (10 / 2 instances)", admitted)
	}
	if last.header.Get("Retry-After") == "" || !strings.Contains(last.header.Get("RateLimit-Policy"), "q=5;") {
		t.Fatalf("a local refusal: Retry-After %q, RateLimit-Policy %q (want the share, q=5)",
			last.header.Get("Retry-After"), last.header.Get("RateLimit-Policy"))
	}
	srv.Resume()
	// Back on Redis: 3 of 10 were used there (the local ones were not:
	// Redis never saw them), so 7 more.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := do(t, "GET", url, "X-User: b") // a fresh user shows when Redis decides again
		if r.status == 200 && strings.Contains(r.header.Get("RateLimit-Policy"), "q=10;") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not back on Redis 10 s after it came back: %d %v", r.status, r.header)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the breaker's ping, not timing an algorithm
	}
	// 6 when Redis, on waking, ran the script of the request that timed
	// out (sent before the breaker opened): never more than 7.
	if got := admitN(t, 10, url, "X-User: a"); got != 7 && got != 6 {
		t.Fatalf("back on Redis: %d admitted, want 7 (3 of 10 used before the outage; 6 if the timed-out call ran)", got)
	}
}

// TestStoreErrorLocalCounted: with on_store_error local and no count, the
// share is one over the instances heard from on the Redis store: here
// this Caddy and a peer sending heartbeats (as another Caddy does), so a
// hung Redis leaves this one half of each limit.
func TestStoreErrorLocalCounted(t *testing.T) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("counted%d:", testSeq.Add(1))
	url := site(t, fmt.Sprintf(`
	tree t {
		tier user {header.X-User} {
			limit 10/h
		}
	}
	store redis {
		address %s
		key_prefix %s
		timeout 200ms
		breaker 1 100ms
	}
	on_store_error local
`, srv.Addr(), prefix))
	peerStore, err := store.NewRedis(context.Background(), store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer peerStore.Close()
	peer := peerStore.NewPresence(100 * time.Millisecond) // a peer heard from every 100ms (fresh for 300ms)
	defer peer.Close()
	stop, beats := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(beats)
		for {
			_ = peer.Beat(context.Background())
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); <-beats }()
	eventually(t, 5*time.Second, func() bool {
		do(t, "GET", url, "X-User: warm")
		return storeMetric(t, "cascade_store_instances", srv.Addr()) == 2
	}, "this instance to count the peer")
	srv.Pause()
	defer srv.Resume()
	admitted := 0
	for range 8 {
		if r := do(t, "GET", url, "X-User: a"); r.status == 200 {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("%d admitted on the local share, want 5 (10 / 2 instances counted)", admitted)
	}
}
