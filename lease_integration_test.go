package cascade

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestLeaseThreeInstances: three Caddy processes lease capacity from one
// Redis (standalone, then the 3-master Cluster, where the two tiers' keys
// are in different slots: leased slot by slot). 256 concurrent clients
// against 1000 units a day at 7 units each never get more than
// floor(1000/7) = 142 through; once the leases have ended (TTL) and
// given back what they held, one client takes what is left, and the total
// is exactly 142: nothing over-admitted, nothing lost.
func TestLeaseThreeInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) {
			ps := startRateLimited(t, 3, fmt.Sprintf(`
			tree burst {
				tier everyone global {
					limit 100000 units/day
				}
				tier key fixed {
					limit 1000 units/day
				}
			}
			cost units 7
			store redis {
				address %s
				key_prefix lease%d:
				lease {
					ttl 500ms
				}
			}`, strings.Join(dep.Addrs(t), " "), testSeq.Add(1)))
			var urls []string
			for _, p := range ps {
				urls = append(urls, p.site)
			}
			first := concurrentAdmits(t, urls, 256)
			if first > 142 {
				t.Fatalf("three instances admitted %d at once, more than floor(1000/7) = 142", first)
			}
			total := first + int64(leftAfterLeases(t, 142-int(first), urls[:1]))
			if total != 142 {
				t.Fatalf("admitted %d in all (%d in the burst), want exactly 142", total, first)
			}
			var local, calls float64
			for _, p := range ps {
				m := scrape(t, p.api+"/metrics")
				local += m[`cascade_lease_decisions_total{store="redis/`+strings.Join(dep.Addrs(t), ",")+`",where="local"}`]
				for _, where := range []string{"grant", "strict"} {
					calls += m[`cascade_lease_decisions_total{store="redis/`+strings.Join(dep.Addrs(t), ",")+`",where="`+where+`"}`]
				}
			}
			if local == 0 {
				t.Fatal("no decision was made on a lease (cascade_lease_decisions_total{where=\"local\"})")
			}
			t.Logf("burst admitted %d of 142; %v decisions on leases, %v in Redis", first, local, calls)
		})
	}
}

// TestLeaseSoak: three Caddy processes leasing from one Redis, offered
// four times the limit (60/s, burst 600) at a steady pace for CASCADE_SOAK
// (default 8s; run it for 60s too): what they admit together is no more
// than the capacity plus the refill over the run, and no less than 90% of
// it over a minute or more (85% in shorter runs: see below). Leases decide while the burst lasts; near exhaustion every request
// goes to Redis.
func TestLeaseSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	soak := 8 * time.Second
	if v := os.Getenv("CASCADE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CASCADE_SOAK=%q: %v", v, err)
		}
		soak = d
	}
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) {
			ps := startRateLimited(t, 3, fmt.Sprintf(`
			tree soak {
				tier key fixed {
					limit 60/s burst 600
				}
			}
			store redis {
				address %s
				key_prefix soak%d:
				lease {
					ttl 200ms
				}
			}`, strings.Join(dep.Addrs(t), " "), testSeq.Add(1)))
			var admitted, sent atomic.Int64
			var wg sync.WaitGroup
			begin := time.Now()
			for _, p := range ps {
				for w := 0; w < 8; w++ { // 8 senders of 10/s per instance: 240/s in all
					wg.Add(1)
					go func() {
						defer wg.Done()
						tick := time.NewTicker(100 * time.Millisecond)
						defer tick.Stop()
						for time.Since(begin) < soak {
							<-tick.C
							res, err := httpClient(t).Get(p.site)
							if err != nil {
								t.Error(err)
								return
							}
							res.Body.Close()
							sent.Add(1)
							switch res.StatusCode {
							case 200:
								admitted.Add(1)
							case 429:
							default:
								t.Errorf("status %d", res.StatusCode)
							}
						}
					}()
				}
			}
			wg.Wait()
			elapsed := time.Since(begin)
			limit := 600 + 60*elapsed.Seconds()
			got := float64(admitted.Load())
			var local float64
			for _, p := range ps {
				local += scrape(t, p.api+"/metrics")[`cascade_lease_decisions_total{store="redis/`+strings.Join(dep.Addrs(t), ",")+`",where="local"}`]
			}
			t.Logf("%v: %d sent, %v admitted of at most %.0f (%.1f%%), %v decided on leases", elapsed.Round(time.Millisecond), sent.Load(), got, limit, 100*got/limit, local)
			if got > limit {
				t.Fatalf("admitted %v, more than capacity + refill = %.0f", got, limit)
			}
			// What leases leave unused is about a fixed amount, spent while
			// the burst lasts (chiefly give-backs withheld beneath another
			// instance's later lease): ~110 units here, 2.6% of a 60 s run
			// but 10% of the default 8 s one, which is held to 85%.
			floor := 0.9
			if soak < time.Minute {
				floor = 0.85
			}
			if got < floor*limit {
				t.Fatalf("admitted %v, less than %.0f%% of %.0f", got, 100*floor, limit)
			}
		})
	}
}

// scrape reads a Prometheus exposition's counters and gauges, by their
// name and labels as the text format writes them (labels sorted by name).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	res, err := httpClient(t).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// TestLeaseRedisFaults: a Caddy leasing from a Redis that is stopped
// (SIGSTOP), then killed, with on_store_error local 2. Before the faults,
// the leases' capacity is all accounted for: what was admitted and what
// Redis holds add up to the limit. During each fault, once the breaker is
// open, requests are answered without calling Redis (the breaker stays
// open and never trips again, every decision is local, none waits out the
// store's timeout), on the local half of the limit, exactly; when Redis is
// back, decisions are on it again.
func TestLeaseRedisFaults(t *testing.T) {
	srv := redistest.Start(t)
	url := site(t, fmt.Sprintf(`
	tree t {
		tier user {header.X-User} {
			limit 40/day
		}
	}
	store redis {
		address %s
		key_prefix leasefault%d:
		timeout 3s
		breaker 1 100ms
		lease {
			ttl 300ms
		}
	}
	on_store_error local 2
`, srv.Addr(), testSeq.Add(1)))
	metric := func(name string, labels ...string) float64 { return storeMetric(t, name, srv.Addr(), labels...) }
	if got := admitN(t, 30, url, "X-User: a"); got != 30 {
		t.Fatalf("with Redis up: %d of 30 admitted", got)
	}
	if metric("cascade_lease_decisions_total", "local") == 0 {
		t.Fatal("no request was decided on a lease")
	}
	if got := 30 + leftAfterLeases(t, 40-30, []string{url}, "X-User: a"); got != 40 {
		t.Fatalf("after the leases ended: %d admitted in all, want 40", got)
	}

	// The same clients with Redis up (on leases), for the time a request
	// takes at the client on this machine whatever is decided.
	_, up := clients(t, url, "up", 8, 30, func(int) {})
	if len(up) == 0 {
		t.Fatal("no request answered with Redis up")
	}

	for _, fault := range []string{"stop", "kill"} {
		t.Run(fault, func(t *testing.T) {
			time.Sleep(500 * time.Millisecond) // the leases of "up" end (no assertion depends on it)
			user := "X-User: " + fault
			if fault == "stop" {
				srv.Pause()
				defer srv.Resume()
			} else {
				srv.Kill()
			}
			// The first request fails on Redis (a timeout, or a refused
			// connection), opens the breaker and is decided locally. Then
			// 8 concurrent clients send 30 requests each: none waits for
			// Redis, and together they get what is left of the local share
			// (20), exactly.
			if r := do(t, "GET", url, user); r.status != 200 {
				t.Fatalf("with Redis %s: %d %s", fault, r.status, r.body)
			}
			if metric("cascade_store_breaker_open") != 1 {
				t.Fatal("the breaker did not open")
			}
			trips, local := metric("cascade_store_breaker_trips_total"), localDecisions(t)
			before := decisionTimes(t)
			admitted, took := clients(t, url, fault, 8, 30, func(status int) {
				if status != 200 && status != http.StatusTooManyRequests {
					t.Errorf("with Redis %s: status %d", fault, status)
				}
			})
			if got := admitted + 1; got != 20 {
				t.Fatalf("with Redis %s: %d admitted, want the local share, 20", fault, got)
			}
			// None called Redis: the breaker stayed open and did not trip
			// again, and each of the 240 was decided locally. None waited
			// out the store's 3 s timeout either (a busy machine has been
			// seen to delay a request by 0.4 s); the times themselves are
			// logged, not asserted.
			if metric("cascade_store_breaker_open") != 1 || metric("cascade_store_breaker_trips_total") != trips {
				t.Fatalf("with Redis %s the breaker closed or tripped again: a call reached Redis", fault)
			}
			if n := localDecisions(t) - local; n != 240 {
				t.Fatalf("with Redis %s: %v of 240 decisions made locally", fault, n)
			}
			if len(took) != 240 {
				t.Fatalf("with Redis %s: %d of 240 requests answered", fault, len(took))
			}
			p50, p99, slowest := took[len(took)/2], took[len(took)*99/100], took[len(took)-1]
			if slowest >= 3*time.Second {
				t.Fatalf("with the breaker open a request took %v, the store's timeout: it waited for Redis", slowest)
			}
			after := decisionTimes(t)
			t.Logf("Redis %s, breaker open, 8 concurrent clients: %d of %d decisions within 5 ms, %d within 50 ms; at the client p50 %v, p99 %v, slowest %v (with Redis up: %v, %v, %v)",
				fault, after.within5ms-before.within5ms, after.total-before.total, after.within50ms-before.within50ms,
				p50, p99, slowest, up[len(up)/2], up[len(up)*99/100], up[len(up)-1])
			back := time.Now()
			if fault == "stop" {
				srv.Resume()
			} else {
				srv.Restart(t)
			}
			for i := 0; ; i++ {
				r := do(t, "GET", url, fmt.Sprintf("X-User: fresh-%s-%d", fault, i))
				if r.status == 200 && strings.Contains(r.header.Get("RateLimit-Policy"), "q=40;") {
					break
				}
				if time.Since(back) > propagation {
					t.Fatalf("not deciding on Redis %v after it came back: %d %v", propagation, r.status, r.header)
				}
				time.Sleep(10 * time.Millisecond) // waiting for the breaker's ping, not timing an algorithm
			}
			t.Logf("Redis %s: deciding on Redis again %v after it came back", fault, time.Since(back).Round(time.Millisecond))
			// What the outage's user holds in Redis: nothing the local
			// share admitted (it is not copied there), but the first
			// request's decision if Redis ran it on waking (it had been
			// sent before the breaker opened); a killed Redis lost all.
			got := admitN(t, 45, url, user)
			if want := 40; got != want && (fault != "stop" || got != want-1) {
				t.Fatalf("back on Redis: %d admitted, want %d (39 if Redis ran the timed-out call)", got, want)
			}
		})
	}
}

// TestLeaseGivenBackOnReload: leases held when a reload changes the store
// (here its lease options) are given back when the old store closes, so
// the new configuration finds all of the limit that was not spent.
func TestLeaseGivenBackOnReload(t *testing.T) {
	srv := redistest.Shared(t)
	port := freePort(t)
	sites := func(ttl string) string {
		return fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree t {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		store redis {
			address %s
			key_prefix reloadlease%d:
			lease {
				ttl %s
				max_share 0.5
			}
		}
	}
	respond "ok"
}
`, port, srv.Addr(), port, ttl)
	}
	startCaddy(t, sites("50s"))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if got := admitN(t, 10, url, "X-User: a"); got != 10 {
		t.Fatalf("%d of 10 admitted", got)
	}
	if storeMetric(t, "cascade_lease_grants_total", srv.Addr()) == 0 {
		t.Fatal("no lease was granted")
	}
	// A 50 s lease holds capacity the new store must get back.
	if err := reload(t, sites("40s")); err != nil {
		t.Fatal(err)
	}
	if got := admitN(t, 100, url, "X-User: a"); got != 90 {
		t.Fatalf("after the reload: %d admitted, want the 90 left of 100", got)
	}
}

// TestLeaseResetAcrossInstances: a reset through one instance's admin API
// revokes the leases another instance holds on the reset bucket (told
// over Redis Pub/Sub), so that the two admit exactly the fresh capacity
// afterwards: without it the other would spend what its lease held (a
// lease here lasts 30 s), charged before the reset and wiped by it.
func TestLeaseResetAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) {
			addrs := strings.Join(dep.Addrs(t), " ")
			ps := startRateLimited(t, 2, fmt.Sprintf(`
			tree acme {
				tier user {header.X-User} {
					limit 100/day
				}
			}
			store redis {
				address %s
				key_prefix leasereset%d:
				lease {
					ttl 30s
					max_share 0.5
				}
			}`, addrs, testSeq.Add(1)))
			a, b := ps[0], ps[1]
			metric := func(p *caddyProcess, name string) float64 {
				return scrape(t, p.api+"/metrics")[name+`{store="redis/`+strings.Join(dep.Addrs(t), ",")+`"}`]
			}
			for range 30 {
				if r := do(t, "GET", b.site, "X-User: ann"); r.status != 200 {
					t.Fatalf("b: %d %s", r.status, r.body)
				}
			}
			if metric(b, "cascade_lease_grants_total") == 0 {
				t.Fatal("b took no lease")
			}
			var reset struct{ Buckets int }
			if code, body := call(t, "POST", a.api+"/rate_limit/reset?tree=acme&user=ann", nil, &reset); code != 200 {
				t.Fatalf("reset through a: %d %s", code, body)
			}
			eventually(t, propagation, func() bool { return metric(b, "cascade_lease_peer_resets_total") > 0 }, "b to be told of a's reset")
			if admitted := admitUntilRefused(t, 6, []string{a.site, b.site}, "X-User: ann"); admitted != 100 {
				t.Fatalf("after the reset the two instances admitted %d, want exactly the fresh capacity, 100", admitted)
			}
		})
	}
}

// clients sends n requests from each of c concurrent clients as user, and
// returns how many were admitted and each request's time at the client,
// sorted; check sees each status.
func clients(t *testing.T, url, user string, c, n int, check func(status int)) (admitted int64, took []time.Duration) {
	t.Helper()
	var ok atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("X-User", user)
				start := time.Now()
				res, err := httpClient(t).Do(req)
				d := time.Since(start)
				if err != nil {
					t.Error(err)
					return
				}
				res.Body.Close()
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
				if res.StatusCode == 200 {
					ok.Add(1)
				}
				check(res.StatusCode)
			}
		}()
	}
	wg.Wait()
	slices.Sort(took)
	return ok.Load(), took
}

// decisionTimes reads cascade_decision_duration_seconds: how many
// decisions were timed, and how many of them within 5 ms and 50 ms.
func decisionTimes(t *testing.T) (d struct{ total, within5ms, within50ms uint64 }) {
	t.Helper()
	for _, m := range runningMetrics(t, "cascade_decision_duration_seconds") {
		h := m.GetHistogram()
		d.total += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			switch b.GetUpperBound() {
			case 0.005:
				d.within5ms += b.GetCumulativeCount()
			case 0.05:
				d.within50ms += b.GetCumulativeCount()
			}
		}
	}
	return d
}

// localDecisions reads cascade_local_decisions_total: decisions made in
// memory on a local share because the store could not decide.
func localDecisions(t *testing.T) float64 {
	t.Helper()
	return metricTotal(t, "cascade_local_decisions_total")
}

// leftAfterLeases takes, through urls, the capacity left after the leases
// taken so far: it admits until refused, again and again as the leases
// end and give back what they held, until it has taken want, or until
// propagation has passed (then the caller sees less). It fails t at once
// if it takes more than want: over-admission is never a matter of time.
func leftAfterLeases(t *testing.T, want int, urls []string, headers ...string) int {
	t.Helper()
	got := 0
	deadline := time.Now().Add(propagation)
	for got < want && time.Now().Before(deadline) {
		got += admitUntilRefused(t, 3, urls, headers...)
		if got > want {
			t.Fatalf("took %d after the leases, more than the %d left", got, want)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the leases to end, not timing an algorithm
	}
	return got
}
