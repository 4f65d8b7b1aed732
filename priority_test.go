package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// prioritySite runs two routes on one tree and store, both with max_wait:
// /batch with priority batch and / (interactive, no priority given). It
// returns the site's URL and Caddy's admin endpoint (metrics).
func prioritySite(t *testing.T, limits, maxWait, storeBlock string) (url, api string) {
	t.Helper()
	port, adminPort := freePort(t), freePort(t)
	cfg := priorityConfig(t, limits, maxWait, storeBlock, "ok", port, adminPort)
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d/", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)
}

// priorityConfig is prioritySite's configuration, its upstream answering
// body.
func priorityConfig(t *testing.T, limits, maxWait, storeBlock, body string, port, adminPort int) []byte {
	t.Helper()
	cf := priorityCaddyfile(limits, maxWait, storeBlock, body, port, adminPort)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	return cfg
}

// priorityCaddyfile is priorityConfig's Caddyfile, with /__health outside
// the limits (for caddyProcess).
func priorityCaddyfile(limits, maxWait, storeBlock, body string, port, adminPort int) string {
	// The form docs/shaping.md shows: one snippet of limits, imported by both routes.
	return fmt.Sprintf(`{
%s}
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
	max_wait %s
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
`, globals(adminPort), limits, maxWait, storeBlock, port, body, body)
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
// the memory store and on Redis. With 2 per 4 s (one every 2 s, a burst
// of two) and max_wait 9s, two batch requests go at once and four are
// held (until 2, 4, 6 and 8 s); an interactive request then preempts them
// — they are answered 429 (#preempted, Retry-After) — and goes at 2 s,
// not 10 s; a second goes at 4 s. A batch request arriving while they
// wait is refused at once (it would have gone ahead of later interactive
// ones). The places given back are given back exactly once: a third
// interactive request goes at 6 s (not at 4 s or sooner: no double
// refund; not at 8 s or later: no place lost), and no more requests go
// than the limit allows. Each request is sent once the one before it is
// decided, and the places are 2 s apart, so that a slow machine's delays
// cannot reorder them.
func TestPriorityWait(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		const interval = 2 * time.Second
		url, api := prioritySite(t, "limit 2/4s", "9s", storeBlock)
		start := time.Now()
		var mu sync.Mutex
		var all []answered
		var wg sync.WaitGroup
		defer wg.Wait()
		decided := 0.0
		send := func(name, path string) {
			wg.Go(func() {
				r := do(t, "GET", url+path, "X-User: ann")
				mu.Lock()
				all = append(all, answered{name, r, time.Since(start)})
				mu.Unlock()
			})
		}
		// sendDecided sends a request and waits until it is decided
		// (held, or answered).
		sendDecided := func(name, path string) {
			send(name, path)
			decided++
			awaitMetric(t, name+" decided", decided, decisionsSoFar)
		}
		for i := range 2 {
			if r := do(t, "GET", url+"batch", "X-User: ann"); r.status != 200 {
				t.Fatalf("batch %d within the burst: %d %s", i, r.status, r.body)
			}
			decided++
		}
		for i := range 4 {
			send("held batch "+strconv.Itoa(i), "batch")
		}
		decided += 4
		awaitMetric(t, "the batch requests decided", decided, decisionsSoFar)
		awaitMetric(t, "the batch requests held", 4, heldNow)
		sendDecided("interactive 1", "")
		sendDecided("interactive 2", "")
		sendDecided("late batch", "batch")
		sendDecided("interactive 3", "")
		wg.Wait()
		slices.SortFunc(all, func(a, b answered) int { return int(a.at - b.at) })
		t.Logf("answered: %v", all)

		want := map[string]time.Duration{"interactive 1": interval, "interactive 2": 2 * interval, "interactive 3": 3 * interval}
		var first time.Duration // interactive 1's answer
		for _, a := range all {
			if a.name == "interactive 1" {
				first = a.at
			}
		}
		preempted := 0
		released := []time.Duration{0, 0} // the two batch requests of the burst
		for _, a := range all {
			switch {
			case strings.HasPrefix(a.name, "interactive"):
				// Never before its place; late by up to a second (a slow
				// machine's delay), not by the 2 s of another place.
				if d := a.at - want[a.name]; a.status != 200 || d < -20*time.Millisecond || d > time.Second {
					t.Errorf("%s: %d after %v, want 200 after %v (-20 ms, +1 s) (all: %v)", a.name, a.status, a.at, want[a.name], all)
				}
				released = append(released, a.at)
			case a.name == "late batch":
				if ra, _ := strconv.Atoi(a.header.Get("Retry-After")); a.status != http.StatusTooManyRequests || !strings.Contains(a.body, "#preempted") ||
					a.at > first || ra < 1 || ra > 4 {
					t.Errorf("a batch request while interactive ones wait: %d after %v, Retry-After %q, %s; want 429 #preempted at once (before the first interactive one goes), retry once they have gone (within 4 s)",
						a.status, a.at, a.header.Get("Retry-After"), a.body)
				}
			default: // held batch
				if a.status != http.StatusTooManyRequests || !strings.Contains(a.body, "#preempted") || a.at > first {
					t.Errorf("%s: %d after %v, %s; want 429 #preempted when the interactive request came (before it went at %v)", a.name, a.status, a.at, a.body, first)
					continue
				}
				preempted++
				if ra, _ := strconv.Atoi(a.header.Get("Retry-After")); ra < 1 || ra > 2 {
					t.Errorf("%s: Retry-After %q, want 1-2 s (the interactive request that preempted it goes at 2 s)", a.name, a.header.Get("Retry-After"))
				}
			}
		}
		if preempted != 4 {
			t.Errorf("%d held batch requests preempted, want 4 (all: %v)", preempted, all)
		}
		// Exact: by any time t, at most the burst (2) plus one per 2 s went.
		for i, at := range released {
			if allowed := 2 + int((at+30*time.Millisecond)/interval); i+1 > allowed {
				t.Errorf("%d requests went by %v, the limit allows %d", i+1, at, allowed)
			}
		}
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
	url, _ := prioritySite(t, "limit 2/s", "3s", memoryStore().block(t))
	start := time.Now() // bob's place follows his first request's decision
	for range 2 {
		do(t, "GET", url+"batch", "X-Org: acme", "X-User: bob")
	}
	held := make(chan resp, 1)
	go func() { held <- do(t, "GET", url+"batch", "X-Org: acme", "X-User: bob") }()
	awaitMetric(t, "bob's batch request held", 1, heldNow)
	for range 2 {
		do(t, "GET", url, "X-Org: acme", "X-User: ann")
	}
	if r := do(t, "GET", url, "X-Org: acme", "X-User: ann"); r.status != 200 {
		t.Fatalf("ann's held request: %d", r.status)
	}
	r := <-held
	took := time.Since(start)
	t.Logf("bob's batch request: %d after %v", r.status, took.Round(time.Millisecond))
	if r.status != 200 || took < 450*time.Millisecond {
		t.Fatalf("bob's batch request: %d after %v, want 200 at its time, 0.5 s (not preempted by ann)", r.status, took)
	}
	if p, rel := heldTotal(t, "preempted"), heldTotal(t, "released"); p != 0 || rel != 2 {
		t.Fatalf("held requests: %v preempted, %v released; want none preempted, bob's and ann's released", p, rel)
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
// and goes in their place. One request every 3 s: the reload, however
// slow, is done before the first batch request's time.
func TestPriorityAcrossReload(t *testing.T) {
	port, adminPort := freePort(t), freePort(t)
	storeBlock := memoryStore().block(t)
	if err := caddy.Load(priorityConfig(t, "limit 2/6s", "9s", storeBlock, "old", port, adminPort), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	start := time.Now() // the places follow the first request's decision
	for range 2 {
		do(t, "GET", url+"batch", "X-User: ann")
	}
	held := make(chan resp, 2)
	for range 2 {
		go func() { held <- do(t, "GET", url+"batch", "X-User: ann") }() // until 3 and 6 s
	}
	awaitMetric(t, "the batch requests held", 2, heldNow)
	// The old servers wait for their held requests as they stop: reload
	// meanwhile, as caddy reload does.
	loaded := make(chan error, 1)
	old := caddy.ActiveContext().Context
	go func() {
		loaded <- caddy.Load(priorityConfig(t, "limit 2/6s", "9s", storeBlock, "new", port, adminPort), true)
	}()
	// The new configuration serves once Caddy has made it the active one
	// (on a busy machine provisioning it may take a while). A new
	// connection may meanwhile land on an old server's listening socket,
	// where it waits until that server has stopped (after its held
	// requests): probe, as another user (no batch request waits on its
	// buckets), with a client of one connection, each probe bounded, until
	// one is answered by the new configuration; the interactive request
	// then goes on that connection.
	eventually(t, 30*time.Second, func() bool { return caddy.ActiveContext().Context != old }, "the new configuration active")
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	get := func(user string, within time.Duration) (resp, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("X-User", user)
		res, err := client.Do(req)
		if err != nil {
			return resp{}, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return resp{res.StatusCode, res.Header, string(b)}, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		r, err := get("probe", time.Second)
		if err == nil && r.body == "new" {
			break
		}
		t.Logf("probe %v after the batch requests: %q %v", time.Since(start).Round(time.Millisecond), r.body, err)
		if time.Now().After(deadline) {
			t.Fatal("the new configuration not serving 30 s after the reload began")
		}
	}
	sent := time.Since(start)
	r, err := get("ann", 30*time.Second)
	if err != nil {
		t.Fatalf("the interactive request after the reload: %v", err)
	}
	took := time.Since(start)
	t.Logf("the interactive request: sent %v after the batch ones, answered after %v", sent.Round(time.Millisecond), took.Round(time.Millisecond))
	// Preempting the batch requests, it goes at the first one's time
	// (3 s); after them, it would wait until 9 s.
	if r.status != 200 || r.body != "new" || took > 6*time.Second {
		t.Fatalf("the interactive request after the reload: %d %q after %v, want 200 from the new config at 3 s (not 9 s)", r.status, r.body, took)
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
	url, _ := prioritySite(t, "limit 2/s\n limit 5 tokens/h", "3s", "cost tokens {header.X-Cost} default 0\n "+memoryStore().block(t))
	if r := do(t, "GET", url, "X-User: u", "X-Cost: 5"); r.status != 200 { // tokens spent for an hour
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	var wg sync.WaitGroup
	got := make([]int, 3)
	bodies := make([]string, 3)
	for i := range 3 {
		wg.Go(func() { r := do(t, "GET", url+"batch", "X-User: u", "X-Cost: 0"); got[i], bodies[i] = r.status, r.body })
	}
	awaitMetric(t, "the batch requests decided (one goes, two held)", 4, decisionsSoFar)
	awaitMetric(t, "two batch requests held", 2, heldNow)
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
	if preempted > 0 || heldTotal(t, "preempted") != 0 {
		t.Errorf("a refused interactive request preempted %d held batch requests (cascade_held_requests_total{outcome=preempted} %v)", preempted, heldTotal(t, "preempted"))
	}
}

// TestPriorityAcrossInstances: priority holds between Caddy instances
// sharing a Redis store. Instance B holds batch requests (2 per 4 s,
// max_wait 9s: two go at once, four are held until 2-8 s); an interactive
// request on instance A preempts them — B answers them 429 #preempted —
// and goes at 2 s, not 10 s; a batch request on B while it waits is
// refused at once. No more requests go than the limit allows. Each step
// waits until the instances have told each other (over Redis) what the
// last one holds. On a standalone Redis and on the 3-master Cluster.
func TestPriorityAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	bin := buildCaddy(t)
	for _, dep := range redistest.Deployments() { // standalone and Cluster
		t.Run(dep.Name, func(t *testing.T) {
			addrs, prefix := dep.Addrs(t), fmt.Sprintf("across%d:", testSeq.Add(1))
			storeBlock := fmt.Sprintf("store redis {\n address %s\n key_prefix %s\n }", strings.Join(addrs, " "), prefix)
			holds := watchHolds(t, addrs, dep.Name == "cluster", prefix+waitingChannel)
			priorityAcrossInstances(t, bin, storeBlock, holds)
		})
	}
}

// watchHolds subscribes to the waitlists' channel (as the instances do:
// on a Cluster, a sharded channel) and returns how many "hold" messages
// of batch entries, and of interactive ones, it has heard so far: once it
// has, Redis has sent them to every instance subscribed.
func watchHolds(t *testing.T, addrs []string, cluster bool, channel string) func() (batch, interactive int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var ps *redis.PubSub
	if cluster {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		ps = c.SSubscribe(ctx, channel)
	} else {
		c := redis.NewClient(&redis.Options{Addr: addrs[0]})
		t.Cleanup(func() { c.Close() })
		ps = c.Subscribe(ctx, channel)
	}
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatalf("subscribing to %s: %v", channel, err)
	}
	var mu sync.Mutex
	var batch, interactive int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range ps.Channel() {
			var m struct {
				Kind  string `json:"k"`
				Batch bool   `json:"b"`
			}
			if json.Unmarshal([]byte(msg.Payload), &m) != nil || m.Kind != "hold" {
				continue
			}
			mu.Lock()
			if m.Batch {
				batch++
			} else {
				interactive++
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); ps.Close(); <-done })
	return func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return batch, interactive
	}
}

func priorityAcrossInstances(t *testing.T, bin, storeBlock string, holds func() (batch, interactive int)) {
	const interval = 2 * time.Second
	var ps []*caddyProcess
	for range 2 {
		ps = append(ps, newCaddyProcess(t, bin, func(port, adminPort int) string {
			return priorityCaddyfile("limit 2/4s", "9s", storeBlock, "ok", port, adminPort)
		}))
	}
	a, b := ps[0], ps[1]
	decisions := func(p *caddyProcess) func(*testing.T) float64 {
		return func(t *testing.T) float64 {
			n := 0.0
			for k, v := range scrape(t, p.api+"/metrics") {
				if strings.HasPrefix(k, "cascade_decisions_total") {
					n += v
				}
			}
			return n
		}
	}
	heard := func(what string, batch, interactive int) {
		t.Helper()
		start := time.Now()
		for {
			b, i := holds()
			if b >= batch && i >= interactive {
				return
			}
			if time.Since(start) > propagation {
				t.Fatalf("%s: heard %d batch and %d interactive holds on the channel after %v, want %d and %d", what, b, i, propagation, batch, interactive)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Times are from before the burst: the places follow its first
	// request's decision, which a busy machine may answer late.
	start := time.Now()
	for i := range 2 {
		if r := do(t, "GET", b.site+"batch", "X-User: ann"); r.status != 200 {
			t.Fatalf("batch %d within the burst: %d %s", i, r.status, r.body)
		}
	}
	var mu sync.Mutex
	var all []answered
	var wg sync.WaitGroup
	defer wg.Wait()
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
	awaitMetric(t, "B's batch requests decided", 6, decisions(b))
	heard("B's batch requests held", 4, 0)
	send("interactive", a.site)
	awaitMetric(t, "A's interactive request decided", 1, decisions(a))
	heard("A's interactive request held", 4, 1)
	send("late batch", b.site+"batch")
	wg.Wait()
	slices.SortFunc(all, func(x, y answered) int { return int(x.at - y.at) })
	t.Logf("answered: %v", all)

	var went time.Duration // the interactive request's answer
	for _, r := range all {
		if r.name == "interactive" {
			went = r.at
		}
	}
	preempted := 0
	var released []time.Duration
	for _, r := range all {
		switch {
		case r.name == "interactive":
			// Never before its place (2 s); late by up to a second (a slow
			// machine's delay), not by the 8 s of waiting behind the batch.
			if r.status != 200 || r.at < interval-20*time.Millisecond || r.at > interval+time.Second {
				t.Errorf("the interactive request on A: %d after %v, want 200 at 2 s (ahead of B's held batch requests, not at 10 s)", r.status, r.at)
			}
			released = append(released, r.at)
		case r.name == "late batch":
			if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#preempted") || r.at > went {
				t.Errorf("a batch request on B while A's interactive one waits: %d after %v, %s; want 429 #preempted at once (before the interactive one goes at %v)", r.status, r.at, r.body, went)
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
			if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 1 || ra > 2 {
				t.Errorf("%s: Retry-After %q, want 1-2 s (the interactive request that preempted it goes at 2 s)", r.name, r.header.Get("Retry-After"))
			}
		}
	}
	if preempted != 4 {
		t.Errorf("%d of B's held batch requests preempted by A's interactive one, want 4", preempted)
	}
	// Exact: by any time, at most the burst (2, at the start) plus one per
	// 2 s went.
	slices.Sort(released)
	for i, at := range released {
		if allowed := int((at + 30*time.Millisecond) / interval); i+1 > allowed {
			t.Errorf("%d requests went by %v after the burst, the limit allows %d", i+1, at, allowed)
		}
	}
}
