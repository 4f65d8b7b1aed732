package cascade

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestStoreRoutes: a tenant routed to a Redis of its own has every bucket
// there (the others' in the handler's store), is exact in it, shows it in
// the admin API, and when its store stops (SIGSTOP) follows its route's
// on_store_error while the other tenants keep deciding in their store,
// without waiting for the stopped one, and keep their exactness.
func TestStoreRoutes(t *testing.T) {
	shared, own := redistest.Start(t), redistest.Start(t)
	port, adminPort := freePort(t), freePort(t)
	prefix := fmt.Sprintf("routes%d:", testSeq.Add(1))
	cfg, err := adapt(t, fmt.Sprintf(`{
%s}
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier global fixed {
				limit 1000/min
			}
			tier org {header.X-Org} {
				limit 5/h
			}
			tier user {header.X-User} {
				limit 100/min
			}
		}
		store redis {
			address %s
			key_prefix %s
			timeout 1s
		}
		store redis enterprise {
			address %s
			key_prefix %s
			timeout 1s
			breaker off
		}
		route org bigco enterprise {
			on_store_error deny
		}
		route org megacorp enterprise {
			on_store_error local
		}
		on_store_error allow
	}
	respond "ok"
}
`, globals(adminPort), port, shared.Addr(), prefix, own.Addr(), prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url, api := fmt.Sprintf("http://127.0.0.1:%d/", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)

	// Exact in each store: 5 an hour each (none comes back while the test
	// runs, however slowly).
	for _, org := range []string{"acme", "bigco"} {
		if got := admitN(t, 7, url, "X-Org: "+org, "X-User: u"); got != 5 {
			t.Fatalf("%s: %d of 7 admitted, want 5", org, got)
		}
	}
	// Every bucket of a routed path lives in its store (the global
	// ceiling's too), the others' in the handler's.
	keys := func(s *redistest.Server) []string {
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		defer c.Close()
		ks, err := c.Keys(context.Background(), prefix+"{*").Result() // buckets (not the instances' heartbeats)
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	sk, ok := keys(shared), keys(own)
	if len(ok) != 3 || slices.ContainsFunc(ok, func(k string) bool { return strings.Contains(k, "acme") }) {
		t.Fatalf("the routed store holds %v, want bigco's 3 buckets", ok)
	}
	if len(sk) != 3 || slices.ContainsFunc(sk, func(k string) bool { return strings.Contains(k, "bigco") }) {
		t.Fatalf("the handler's store holds %v, want acme's 3 buckets", sk)
	}
	// The admin API says where a path lives.
	var b admin.Buckets
	if code, body := call(t, "GET", api+"/rate_limit/buckets?tree=api&global=fixed&org=bigco&user=u", nil, &b); code != 200 || !strings.HasPrefix(b.Store, "enterprise") || b.Buckets[1].Remaining != 0 {
		t.Fatalf("inspect bigco: %d %s (store %q)", code, body, b.Store)
	}
	if code, body := call(t, "GET", api+"/rate_limit/buckets?tree=api&global=fixed&org=acme&user=u", nil, &b); code != 200 || strings.HasPrefix(b.Store, "enterprise") {
		t.Fatalf("inspect acme: %d %s (store %q)", code, body, b.Store)
	}
	// A ceiling above the tenants has a bucket in each store: resetting
	// it resets both.
	var reset admin.Reset
	if code, body := call(t, "POST", api+"/rate_limit/reset?tree=api&global=fixed", nil, &reset); code != 200 || reset.Buckets != 2 {
		t.Fatalf("reset the ceiling: %d %s, want 2 buckets reset (one per store)", code, body)
	}
	if sk, ok := keys(shared), keys(own); len(sk) != 2 || len(ok) != 2 {
		t.Fatalf("after resetting the ceiling: the stores hold %v and %v, want 2 buckets each", sk, ok)
	}

	// The other tenants' decision latency before the routed store stops.
	p99 := func() (time.Duration, time.Duration) {
		t.Helper()
		var took []time.Duration
		for i := range 200 {
			org := fmt.Sprintf("t%d", i%8)
			start := time.Now()
			r := do(t, "GET", url, "X-Org: "+org, "X-User: w"+fmt.Sprint(i))
			took = append(took, time.Since(start))
			if r.status != 200 && r.status != 429 {
				t.Fatalf("%s: %d", org, r.status)
			}
		}
		slices.Sort(took)
		return took[len(took)*99/100], took[len(took)-1]
	}
	before, _ := p99()

	// The routed tenants' store stops: their requests follow their
	// routes' policies, the others keep deciding on theirs, without
	// waiting.
	own.Pause()
	defer own.Resume()
	start := time.Now()
	if r := do(t, "GET", url, "X-Org: bigco", "X-User: v"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("bigco with its store stopped: %d, want 503 (its route's on_store_error deny, not the handler's allow)", r.status)
	}
	t.Logf("bigco refused after %v (its store's timeout 1s)", time.Since(start).Round(time.Millisecond))
	if got := admitN(t, 7, url, "X-Org: megacorp", "X-User: v"); got != 5 {
		t.Fatalf("megacorp with its store stopped (on_store_error local): %d of 7 admitted, want its 5 decided in memory", got)
	}
	// Metrics of the decisions by store: the other tenants' are decided
	// in the handler's store, none waits for (or fails on) the routed one.
	storeDecisions := func() (routed, routedErrors, sharedAll float64) {
		for k, v := range scrape(t, api+"/metrics") {
			if !strings.HasPrefix(k, "cascade_store_decisions_total{") {
				continue
			}
			switch {
			case strings.Contains(k, `store="enterprise`):
				routed += v
				if strings.Contains(k, `result="store_error"`) {
					routedErrors += v
				}
			case strings.Contains(k, `store="redis/`+shared.Addr()):
				sharedAll += v // admitted or refused (the t orgs are spent by now)
			}
		}
		return
	}
	routedBefore, _, sharedBefore := storeDecisions()
	during, slowest := p99()
	t.Logf("the other tenants' p99: %v before, %v while the routed store is stopped (slowest %v)", before.Round(time.Microsecond), during.Round(time.Microsecond), slowest.Round(time.Microsecond))
	routed, routedErrors, sharedAll := storeDecisions()
	if routed != routedBefore || sharedAll < sharedBefore+200 {
		t.Fatalf("the other tenants' 200 requests while the routed store is stopped: %v decisions of the routed store (%v before), %v in the handler's (%v before); want none in the routed store, all 200 in the handler's",
			routed, routedBefore, sharedAll, sharedBefore)
	}
	if routedErrors == 0 {
		t.Fatalf("per-store metrics: no store error counted for the routed store (bigco's refusal)")
	}
	if got := admitN(t, 3, url, "X-Org: acme", "X-User: u"); got != 0 {
		t.Fatalf("acme, spent, while bigco's store is stopped: %d admitted, want 0 (still exact)", got)
	}
}

// TestStoreRouteErrors: routes' configuration errors name the fix.
func TestStoreRouteErrors(t *testing.T) {
	for _, tt := range []struct{ name, handler, want string }{
		{"unknown store", "store redis {\n address 127.0.0.1:1\n }\n route k a nowhere", `no store named "nowhere"`},
		{"not a tenant tier", "store redis {\n address 127.0.0.1:1\n }\n store redis own {\n address 127.0.0.1:2\n }\n route other a own", "tree t's tenant tier is not other"},
		{"unused store", "store redis {\n address 127.0.0.1:1\n }\n store redis own {\n address 127.0.0.1:2\n }", "no route or entitlements source uses them"},
		{"bad policy", "store redis {\n address 127.0.0.1:1\n }\n store redis own {\n address 127.0.0.1:2\n }\n route k a own {\n on_store_error maybe\n }", `on_store_error "maybe"`},
		{"named memory", "store memory own", "only redis stores are named"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := configError(t, "", tt.handler)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestStoreRouteTreeErrors: a handler with routes decides a request's
// path across all its trees in one store, so every tree must have the
// routed tenant tier, keyed alike, and a tenant is routed once.
func TestStoreRouteTreeErrors(t *testing.T) {
	const stores = "store redis {\n address 127.0.0.1:1\n }\n store redis own {\n address 127.0.0.1:2\n }\n store redis other {\n address 127.0.0.1:3\n }\n"
	for _, tt := range []struct{ name, handler, want string }{
		{"tree without the tier", "tree a {\n tier org {header.X-Org} {\n limit 1/s\n }\n }\n tree b {\n tier ip {remote_host} {\n limit 1/s\n }\n }\n" + stores + "route org x own\n route org y other",
			"tree b's tenant tier is not org"},
		{"keyed differently", "tree a {\n tier org {header.X-Org} {\n limit 1/s\n }\n }\n tree b {\n tier org {header.X-Team} {\n limit 1/s\n }\n }\n" + stores + "route org x own\n route org y other",
			"routed tenants need one key"},
		{"routed twice", "tree a {\n tier org {header.X-Org} {\n limit 1/s\n }\n }\n" + stores + "route org x own\n route org x other",
			"org x is routed twice"},
		{"local without instances", "tree a {\n tier org {header.X-Org} {\n limit 1/s\n }\n }\n store redis own {\n address 127.0.0.1:2\n }\n route org x own {\n on_store_error local\n }",
			"give local_instances"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := adapt(t, globalOptions("")+"http://127.0.0.1:1 {\n rate_limit {\n "+tt.handler+"\n }\n}")
			if err == nil {
				err = caddy.Validate(mustConfig(t, cfg))
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestStoreRoutesThreeInstances: three Caddy processes sharing two Redis
// servers, one tenant routed to the second: 256 concurrent clients of each
// tenant against 100 units at 7 each admit exactly floor(100/7) = 14, in
// each store.
func TestStoreRoutesThreeInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	shared, own := redistest.Start(t), redistest.Start(t)
	ps := startRateLimited(t, 3, fmt.Sprintf(`
			tree api {
				tier org {header.X-Org} {
					limit 100 units/day
				}
			}
			cost units 7
			store redis {
				address %s
				key_prefix routes3:
			}
			store redis enterprise {
				address %s
				key_prefix routes3:
			}
			route org bigco enterprise`, shared.Addr(), own.Addr()))
	var urls []string
	for _, p := range ps {
		urls = append(urls, p.site)
	}
	for _, org := range []string{"acme", "bigco"} {
		got := concurrentStatuses(t, urls, 256, "X-Org: "+org)
		if got[200] != 14 || got[200]+got[429] != 256 {
			t.Fatalf("%s: %v, want exactly 14 admitted of 256", org, got)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: own.Addr()})
	defer c.Close()
	if ks, _ := c.Keys(context.Background(), "routes3:{*").Result(); len(ks) != 1 || !strings.Contains(ks[0], "bigco") {
		t.Fatalf("the routed store holds %v, want bigco's bucket", ks)
	}
}

// TestTenantInFlight: with tenant_in_flight 1, a tenant's second decision
// while its first waits for a stalled Redis fails at once (on_store_error
// applies to it), another tenant's does not, and both waiting decisions
// are answered once Redis is back. Caddy reaches Redis through a tap that
// tells when the first decision has been sent.
func TestTenantInFlight(t *testing.T) {
	srv := redistest.Start(t)
	tap := newRedisTap(t, srv.Addr(), "alpha")
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier org {header.X-Org} {
				limit 100/min
			}
		}
		store redis {
			address %s
			key_prefix inflight%d:
			timeout 5s
			breaker off
			tenant_in_flight 1
		}
		on_store_error deny
	}
	respond "ok"
}`, port, tap.addr, testSeq.Add(1)))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if got := admitN(t, 1, url, "X-Org: warmup"); got != 1 { // scripts loaded
		t.Fatalf("before: %d admitted", got)
	}
	get := func(org string) <-chan int {
		ch := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-Org", org)
			res, err := httpClient(t).Do(req)
			if err != nil {
				ch <- -1
				return
			}
			res.Body.Close()
			ch <- res.StatusCode
		}()
		return ch
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	first := get("alpha")
	select { // alpha's first decision is on its way to the stopped Redis
	case <-tap.seen:
	case <-time.After(30 * time.Second):
		t.Fatal("alpha's first decision not sent to Redis within 30 s")
	}
	other := get("beta")
	if r := do(t, "GET", url, "X-Org: alpha"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("alpha's second request while its first waits: %d, want 503 (its tenant's cap)", r.status)
	}
	select {
	case code := <-first:
		t.Fatalf("alpha's first request answered %d before Redis came back: the second was not shed while it waited", code)
	case code := <-other:
		t.Fatalf("beta's request answered %d before Redis came back: another tenant must not be shed", code)
	default:
	}
	srv.Resume()
	resumed = true
	for name, ch := range map[string]<-chan int{"alpha's first": first, "beta's": other} {
		if code := <-ch; code != http.StatusOK {
			t.Fatalf("%s request after Redis came back: %d, want 200", name, code)
		}
	}
}

// redisTap is a TCP proxy in front of a Redis server: seen is closed once
// a client has sent a command containing marker.
type redisTap struct {
	addr string
	seen chan struct{}
	once sync.Once
}

func newRedisTap(t *testing.T, target, marker string) *redisTap {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tap := &redisTap{addr: l.Addr().String(), seen: make(chan struct{})}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, r)
			mu.Unlock()
			go func() { io.Copy(c, r); c.Close() }()
			go func() {
				defer r.Close()
				buf, tail := make([]byte, 32<<10), []byte(nil)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						tail = append(tail, buf[:n]...)
						if bytes.Contains(tail, []byte(marker)) {
							tap.once.Do(func() { close(tap.seen) })
						}
						tail = tail[max(0, len(tail)-len(marker)):]
						if _, err := r.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return tap
}
