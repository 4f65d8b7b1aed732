package cascade

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// prioritySite runs two routes on one tree and store, both with max_wait:
// /batch with priority batch and / (interactive, no priority given). It
// returns the site's URL and Caddy's admin endpoint (metrics).
func prioritySite(t *testing.T, limits, storeBlock string) (url, api string) {
	t.Helper()
	port, adminPort := freePort(t), freePort(t)
	cfg := priorityConfig(t, limits, storeBlock, "ok", port, adminPort)
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d/", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)
}

// priorityConfig is prioritySite's configuration, its upstream answering
// body.
func priorityConfig(t *testing.T, limits, storeBlock, body string, port, adminPort int) []byte {
	t.Helper()
	cf := priorityCaddyfile(limits, storeBlock, body, port, adminPort)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	return cfg
}

// priorityCaddyfile is priorityConfig's Caddyfile, with /__health outside
// the limits (for caddyProcess).
func priorityCaddyfile(limits, storeBlock, body string, port, adminPort int) string {
	// The README's form: one snippet of limits, imported by both routes.
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	skip_install_trust
	auto_https off
	persist_config off
}
(api_limits) {
	tree api {
		tier org {header.X-Org} {
			missing shared
			limit 1000/s
		}
		tier user {header.X-User} {
			%s
		}
	}
	max_wait 3s
	%s
}
http://127.0.0.1:%d {
	handle /__health {
		respond "up"
	}
	handle /batch {
		rate_limit {
			import api_limits
			priority batch
		}
		respond "%s" 200
	}
	handle {
		rate_limit {
			import api_limits
		}
		respond "%s" 200
	}
}
`, adminPort, limits, storeBlock, port, body, body)
}

// answered is a response and when it came, from the scenario's start.
type answered struct {
	name string
	resp
	at time.Duration
}

func (a answered) String() string {
	return fmt.Sprintf("%s: %d at %v", a.name, a.status, a.at.Round(time.Millisecond))
}

// TestPriorityWait: interactive requests overtake waiting batch ones, on
// the memory store and on Redis. With 2/s and max_wait 3s, two batch
// requests go at once and four are held (until 0.5, 1, 1.5 and 2 s); an
// interactive request at 0.2 s preempts them — they are answered 429
// (#preempted, Retry-After) — and goes at 0.5 s, not 2.5 s; a second
// goes at 1 s. A batch request arriving while they wait is refused at
// once (it would have gone ahead of later interactive ones). The places
// given back are given back exactly once: an interactive request at
// 1.2 s goes at 1.5 s (not at once: no double refund; not at 2 s or
// later: no place lost), and no more requests go than the limit allows.
func TestPriorityWait(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url, api := prioritySite(t, "limit 2/s", storeBlock)
		start := time.Now()
		var mu sync.Mutex
		var all []answered
		var wg sync.WaitGroup
		send := func(name, path string) {
			wg.Go(func() {
				r := do(t, "GET", url+path, "X-User: ann")
				mu.Lock()
				all = append(all, answered{name, r, time.Since(start)})
				mu.Unlock()
			})
		}
		for i := range 2 {
			if r := do(t, "GET", url+"batch", "X-User: ann"); r.status != 200 {
				t.Fatalf("batch %d within the burst: %d %s", i, r.status, r.body)
			}
		}
		for i := range 4 {
			send("held batch "+strconv.Itoa(i), "batch")
		}
		time.Sleep(200 * time.Millisecond)
		send("interactive 1", "")
		time.Sleep(50 * time.Millisecond)
		send("interactive 2", "")
		time.Sleep(100 * time.Millisecond)
		sent := time.Since(start)
		send("late batch", "batch")
		time.Sleep(850 * time.Millisecond) // 1.2 s
		send("interactive 3", "")
		wg.Wait()
		slices.SortFunc(all, func(a, b answered) int { return int(a.at - b.at) })

		want := map[string]time.Duration{"interactive 1": 500 * time.Millisecond, "interactive 2": time.Second, "interactive 3": 1500 * time.Millisecond}
		preempted := 0
		released := []time.Duration{0, 0} // the two batch requests of the burst
		for _, a := range all {
			switch {
			case strings.HasPrefix(a.name, "interactive"):
				// Late by up to 200 ms: under -race, with the other
				// packages' tests on two cores, a release 118 ms late was
				// seen; the next release is 500 ms away.
				if d := a.at - want[a.name]; a.status != 200 || d < -20*time.Millisecond || d > 200*time.Millisecond {
					t.Errorf("%s: %d after %v, want 200 after %v (-20, +200 ms) (all: %v)", a.name, a.status, a.at, want[a.name], all)
				}
				released = append(released, a.at)
			case a.name == "late batch":
				if a.status != http.StatusTooManyRequests || !strings.Contains(a.body, "#preempted") || a.at-sent > 150*time.Millisecond ||
					a.header.Get("Retry-After") != "1" {
					t.Errorf("a batch request while interactive ones wait: %d after %v, Retry-After %q, %s; want 429 #preempted at once, retry in 1 s",
						a.status, a.at-sent, a.header.Get("Retry-After"), a.body)
				}
			default: // held batch
				if a.status != http.StatusTooManyRequests || !strings.Contains(a.body, "#preempted") || a.at > 400*time.Millisecond {
					t.Errorf("%s: %d after %v, %s; want 429 #preempted when the interactive request came", a.name, a.status, a.at, a.body)
					continue
				}
				preempted++
				if a.header.Get("Retry-After") != "1" {
					t.Errorf("%s: Retry-After %q, want 1 s (the interactive request that preempted it goes at 0.5 s)", a.name, a.header.Get("Retry-After"))
				}
			}
		}
		if preempted != 4 {
			t.Errorf("%d held batch requests preempted, want 4 (all: %v)", preempted, all)
		}
		// Exact: by any time t, at most the burst (2) plus 2/s went.
		for i, at := range released {
			if allowed := 2 + int(2*(at+30*time.Millisecond).Seconds()); i+1 > allowed {
				t.Errorf("%d requests went by %v, the limit allows %d", i+1, at, allowed)
			}
		}
		t.Logf("answered: %v", all)
		m := scrape(t, api+"/metrics")
		if m[`cascade_held_requests_total{outcome="preempted"}`] != 4 || m[`cascade_held_requests_total{outcome="yielded"}`] != 1 ||
			m[`cascade_held_requests_total{outcome="released"}`] != 3 {
			t.Errorf("held requests' metrics: preempted %v yielded %v released %v, want 4, 1 and 3",
				m[`cascade_held_requests_total{outcome="preempted"}`], m[`cascade_held_requests_total{outcome="yielded"}`],
				m[`cascade_held_requests_total{outcome="released"}`])
		}
	})
}

// TestPriorityOtherBuckets: a batch request held on its own user's limit
// is not preempted by an interactive request of another user (they share
// only an organisation with room to spare), and batch requests wait as
// without priorities while no interactive request waits.
func TestPriorityOtherBuckets(t *testing.T) {
	url, _ := prioritySite(t, "limit 2/s", memoryStore().block(t))
	for range 2 {
		do(t, "GET", url+"batch", "X-Org: acme", "X-User: bob")
	}
	held := make(chan resp, 1)
	start := time.Now()
	go func() { held <- do(t, "GET", url+"batch", "X-Org: acme", "X-User: bob") }()
	time.Sleep(100 * time.Millisecond)
	for range 2 {
		do(t, "GET", url, "X-Org: acme", "X-User: ann")
	}
	if r := do(t, "GET", url, "X-Org: acme", "X-User: ann"); r.status != 200 {
		t.Fatalf("ann's held request: %d", r.status)
	}
	r := <-held
	if took := time.Since(start); r.status != 200 || took < 450*time.Millisecond || took > 900*time.Millisecond {
		t.Fatalf("bob's batch request: %d after %v, want 200 at its time, 0.5 s (not preempted by ann)", r.status, took)
	}
}

// TestPriorityErrors: priority needs max_wait or an adaptive tier, and
// the error says so, from the Caddyfile and from JSON.
func TestPriorityErrors(t *testing.T) {
	const handler = `{"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:1"],"routes":[{"handle":[` +
		`{"handler":"rate_limit","priority":"batch"%s,"trees":[{"name":"t","tiers":[{"key":"fixed","limits":[{"count":1,"per":"s"}],"name":"k"}]}]}]}]}}}}}`
	if err := caddy.Validate(mustConfig(t, []byte(fmt.Sprintf(handler, `,"max_wait":"2s"`)))); err != nil {
		t.Fatalf("JSON priority with max_wait: %v", err)
	}
	if err := caddy.Validate(mustConfig(t, []byte(fmt.Sprintf(handler, "")))); err == nil || !strings.Contains(err.Error(), "priority needs a tier marked adaptive, or max_wait") {
		t.Fatalf("JSON priority without max_wait nor adaptive tier: %v", err)
	}
	if err := configError(t, "", "priority batch"); err == nil || !strings.Contains(err.Error(), "priority needs a tier marked adaptive, or max_wait") {
		t.Fatalf("priority without max_wait nor adaptive tier: %v", err)
	}
	if err := configError(t, "", "priority batch\n max_wait 1s"); err != nil {
		t.Fatalf("priority with max_wait: %v", err)
	}
	if err := configError(t, "", "shed_at_floor\n max_wait 1s"); err == nil || !strings.Contains(err.Error(), "shed_at_floor needs a tier marked adaptive") {
		t.Fatalf("shed_at_floor without an adaptive tier: %v", err)
	}
}

// TestPriorityAcrossReload: the requests held by a configuration's
// handlers are seen by the next configuration's: after a reload, an
// interactive request preempts the batch requests the old handlers hold,
// and goes in their place.
func TestPriorityAcrossReload(t *testing.T) {
	port, adminPort := freePort(t), freePort(t)
	storeBlock := memoryStore().block(t)
	if err := caddy.Load(priorityConfig(t, "limit 2/s", storeBlock, "old", port, adminPort), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	for range 2 {
		do(t, "GET", url+"batch", "X-User: ann")
	}
	start := time.Now()
	held := make(chan resp, 2)
	for range 2 {
		go func() { held <- do(t, "GET", url+"batch", "X-User: ann") }() // until 0.5 and 1 s
	}
	time.Sleep(100 * time.Millisecond)
	// The old servers wait for their held requests as they stop: reload
	// meanwhile, as caddy reload does.
	loaded := make(chan error, 1)
	old := caddy.ActiveContext().Context
	go func() { loaded <- caddy.Load(priorityConfig(t, "limit 2/s", storeBlock, "new", port, adminPort), true) }()
	// The new configuration serves once Caddy has made it the active one
	// (then the old servers stop accepting, at once): on a busy machine
	// provisioning it may take longer than the wait before it.
	eventually(t, 5*time.Second, func() bool { return caddy.ActiveContext().Context != old }, "the new configuration active")
	time.Sleep(20 * time.Millisecond)
	reloaded()
	r := do(t, "GET", url, "X-User: ann")
	took := time.Since(start)
	// Preempting the batch requests, it goes at the first one's time
	// (0.5 s); after them, it would wait until past 1 s.
	if r.status != 200 || r.body != "new" || took > 900*time.Millisecond {
		t.Fatalf("the interactive request after the reload: %d %q after %v, want 200 from the new config at 0.5 s", r.status, r.body, took)
	}
	for range 2 {
		if b := <-held; b.status != http.StatusTooManyRequests || !strings.Contains(b.body, "#preempted") {
			t.Errorf("a batch request held by the old config: %d %s, want 429 preempted", b.status, b.body)
		}
	}
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
}

// TestPriorityRefusedInteractiveLeavesBatch: an interactive request
// refused by a bucket no batch request holds (its own tokens, spent for
// far longer than max_wait) makes no held batch request give way.
func TestPriorityRefusedInteractiveLeavesBatch(t *testing.T) {
	url, _ := prioritySite(t, "limit 2/s\n limit 5 tokens/h", "cost tokens {header.X-Cost} default 0\n store memory {\n name rp1\n }")
	if r := do(t, "GET", url, "X-User: u", "X-Cost: 5"); r.status != 200 { // tokens spent for an hour
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	var wg sync.WaitGroup
	got := make([]int, 3)
	bodies := make([]string, 3)
	for i := range 3 {
		wg.Go(func() { r := do(t, "GET", url+"batch", "X-User: u", "X-Cost: 0"); got[i], bodies[i] = r.status, r.body })
	}
	time.Sleep(150 * time.Millisecond) // the batch requests are decided and held
	r := do(t, "GET", url, "X-User: u", "X-Cost: 1")
	wg.Wait()
	t.Logf("interactive (tokens spent for ~12 min): %d; batch: %v %v", r.status, got, bodies)
	preempted := 0
	for _, s := range got {
		if s == 429 {
			preempted++
		}
	}
	if r.status != 429 {
		t.Fatalf("the interactive request with its tokens spent: %d, want 429", r.status)
	}
	if preempted > 0 {
		t.Errorf("a refused interactive request preempted %d held batch requests", preempted)
	}
}

// TestPriorityAcrossInstances: priority holds between Caddy instances
// sharing a Redis store. Instance B holds batch requests (2/s, max_wait
// 3s: two go at once, four are held until 0.5–2 s); an interactive
// request on instance A at 0.2 s preempts them — B answers them 429
// #preempted — and goes at 0.5 s, not 2.5 s; a batch request on B while
// it waits is refused at once. No more requests go than the limit allows.
// On a standalone Redis and on the 3-master Cluster.
func TestPriorityAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	bin := buildCaddy(t)
	for _, dep := range redistest.Deployments() { // standalone and Cluster
		t.Run(dep.Name, func(t *testing.T) {
			storeBlock := fmt.Sprintf("store redis {\n address %s\n key_prefix across%d:\n }", strings.Join(dep.Addrs(t), " "), testSeq.Add(1))
			priorityAcrossInstances(t, bin, storeBlock)
		})
	}
}

func priorityAcrossInstances(t *testing.T, bin, storeBlock string) {
	var ps []*caddyProcess
	for range 2 {
		dir := t.TempDir()
		port, adminPort := freePort(t), freePort(t)
		p := &caddyProcess{bin: bin, config: filepath.Join(dir, "Caddyfile"),
			site: fmt.Sprintf("http://127.0.0.1:%d/", port), api: fmt.Sprintf("http://127.0.0.1:%d", adminPort)}
		if err := os.WriteFile(p.config, []byte(priorityCaddyfile("limit 2/s", storeBlock, "ok", port, adminPort)), 0o644); err != nil {
			t.Fatal(err)
		}
		p.start(t)
		ps = append(ps, p)
	}
	a, b := ps[0], ps[1]

	for i := range 2 {
		if r := do(t, "GET", b.site+"batch", "X-User: ann"); r.status != 200 {
			t.Fatalf("batch %d within the burst: %d %s", i, r.status, r.body)
		}
	}
	start := time.Now()
	var mu sync.Mutex
	var all []answered
	var wg sync.WaitGroup
	send := func(name, url string) {
		wg.Go(func() {
			r := do(t, "GET", url, "X-User: ann")
			mu.Lock()
			all = append(all, answered{name, r, time.Since(start)})
			mu.Unlock()
		})
	}
	for i := range 4 {
		send("held batch "+strconv.Itoa(i), b.site+"batch")
	}
	time.Sleep(200 * time.Millisecond)
	send("interactive", a.site)
	time.Sleep(100 * time.Millisecond)
	sent := time.Since(start)
	send("late batch", b.site+"batch")
	wg.Wait()
	slices.SortFunc(all, func(x, y answered) int { return int(x.at - y.at) })
	t.Logf("answered: %v", all)

	preempted := 0
	var released []time.Duration
	for _, r := range all {
		switch {
		case r.name == "interactive":
			if r.status != 200 || r.at < 450*time.Millisecond || r.at > 650*time.Millisecond {
				t.Errorf("the interactive request on A: %d after %v, want 200 at 0.5 s (ahead of B's held batch requests, not at 2.5 s)", r.status, r.at)
			}
			released = append(released, r.at)
		case r.name == "late batch":
			if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#preempted") || r.at-sent > 150*time.Millisecond {
				t.Errorf("a batch request on B while A's interactive one waits: %d after %v, %s; want 429 #preempted at once", r.status, r.at-sent, r.body)
			}
		default:
			if r.status == 200 {
				released = append(released, r.at)
				continue
			}
			if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#preempted") {
				t.Errorf("%s: %d %s, want 429 #preempted", r.name, r.status, r.body)
				continue
			}
			preempted++
			if r.header.Get("Retry-After") != "1" {
				t.Errorf("%s: Retry-After %q, want 1 s (the interactive request that preempted it goes at 0.5 s)", r.name, r.header.Get("Retry-After"))
			}
		}
	}
	if preempted != 4 {
		t.Errorf("%d of B's held batch requests preempted by A's interactive one, want 4", preempted)
	}
	// Exact: by any time, at most the burst (2, at the start) plus 2/s went.
	slices.Sort(released)
	for i, at := range released {
		if allowed := int(2 * (at + 30*time.Millisecond).Seconds()); i+1 > allowed {
			t.Errorf("%d requests went by %v after the burst, the limit allows %d", i+1, at, allowed)
		}
	}
}
