package cascade

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
	"go.uber.org/zap"
)

// planTree is docs/plans.md's worked example in per-day limits (a slow
// machine never refills one): the org tier has free, pro and an unlimited
// enterprise plan and a value block; the key tier has free and pro, and
// its own limit for every other plan. No child is allowed more than its
// parent in any plan.
const planTree = `
		tree api {
			plan {http.rate_limit.entitlement.customers.plan} default free
			tier org {header.X-Org} {
				plan free {
					limit 3/day
				}
				plan pro {
					limit 6/day
				}
				plan enterprise unlimited
				value vip {
					limit 2/day
				}
			}
			tier key {header.X-Key} {
				plan free {
					limit 2/day
				}
				plan pro {
					limit 5/day
				}
				limit 4/day
			}
		}
`

// planHeaders publish the request's entitlement as response headers. The
// header directive is deferred: it reads the placeholders once rate_limit
// has set them.
const planHeaders = `header {
		defer
		X-Plan "{http.rate_limit.entitlement.customers.plan}"
		X-Manager "{http.rate_limit.entitlement.customers.account_manager}"
	}
	`

// planSite runs a site rate-limited by rateLimit (the rate_limit block's
// body) that publishes the customers entitlement (planHeaders), with extra
// global options, and returns its URL.
func planSite(t *testing.T, rateLimit string, global ...string) string {
	t.Helper()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	%s
	rate_limit {
%s
	}
	respond "ok" 200
}
`, port, planHeaders, rateLimit), global...)
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

// quotaRE reads one tier's quota from RateLimit-Policy.
var quotaRE = regexp.MustCompile(`"([^"]+)";q=(\d+)`)

// quota is tier's quota in r's RateLimit-Policy, -1 when the tier is not
// in it (unlimited in the request's plan, or no header at all).
func quota(r resp, tier string) int {
	for _, m := range quotaRE.FindAllStringSubmatch(r.header.Get("RateLimit-Policy"), -1) {
		if m[1] == tier {
			n, _ := strconv.Atoi(m[2])
			return n
		}
	}
	return -1
}

// seenWithin polls cond until it holds, failing t after within; it logs how
// long it took. The bound is one a slow machine cannot miss, not a timing
// the test measures.
func seenWithin(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// writeAtomically replaces path's content as an operator should: a
// temporary file renamed over it, so no reader sees half of it.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// keys makes fresh X-Key values: each request of a poll its own key, so
// that polling never exhausts a key's limit.
type keys struct {
	prefix string
	n      int
}

func (k *keys) next() string {
	k.n++
	return fmt.Sprintf("X-Key: %s-%d", k.prefix, k.n)
}

// logLines are the lines of a JSON log file that contain every one of
// parts.
func logLines(t *testing.T, path string, parts ...string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		all := l != ""
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// TestPlansFromFile: docs/plans.md's worked example on a JSON file. Each
// org runs on its plan's limits in every tier; a value's own limits beat
// its plan's, a value block beats both; an unknown org and an unknown plan
// run on the default plan (the unknown plan logged once); the entitlement
// is published as placeholders. An atomic rewrite of the file applies
// after ttl, the counters kept; a broken rewrite keeps the last good file.
func TestPlansFromFile(t *testing.T) {
	dir := t.TempDir()
	file, logFile := filepath.Join(dir, "entitlements.json"), filepath.Join(dir, "caddy.log")
	writeAtomically(t, file, `{
	"acme":     {"plan": "pro"},
	"globex":   {"plan": "enterprise", "account_manager": "dana"},
	"initech":  {"plan": "pro", "limits": [{"count": 1, "per": "day"}]},
	"vip":      {"plan": "pro", "limits": [{"count": 4, "per": "day"}]},
	"hooli":    {"plan": "platinum"},
	"switcher": {"plan": "free"}
}`)
	url := planSite(t, fmt.Sprintf(`
		entitlements customers {
			source file %s
			key org
			ttl 1s
		}
%s
		%s`, file, planTree, memoryStore().block(t)),
		fmt.Sprintf("log {\n\toutput file %s\n\tformat json\n\tlevel WARN\n}", logFile))
	admitted := func(org, key string) int {
		return admitUntilRefused(t, 2, []string{url}, "X-Org: "+org, "X-Key: "+key)
	}

	for _, tc := range []struct {
		org                  string
		keys                 []string
		admitted             []int // per key, in turn
		orgQuota, keyQuota   int   // in RateLimit-Policy, -1: absent
		plan, manager, block string
	}{
		// pro in both tiers: a key's 5, then the org's 6.
		{"acme", []string{"a1", "a2"}, []int{5, 1}, 6, 5, "pro", "", "api/org"},
		// enterprise: the org unlimited; the key tier names no enterprise
		// plan, so its own limit.
		{"globex", []string{"g1", "g2"}, []int{4, 4}, -1, 4, "enterprise", "dana", "api/key"},
		// its own limit for the org beats pro's; the key stays on pro.
		{"initech", []string{"i1"}, []int{1}, 1, 5, "pro", "", "api/org"},
		// the value block beats its own limits and its plan.
		{"vip", []string{"v1"}, []int{2}, 2, 5, "pro", "", "api/org"},
		// not in the file: the default plan, free.
		{"nobody", []string{"n1", "n2"}, []int{2, 1}, 3, 2, "", "", "api/org"},
		// a plan no tier names: the default plan, free.
		{"hooli", []string{"h1", "h2"}, []int{2, 1}, 3, 2, "platinum", "", "api/org"},
	} {
		for i, key := range tc.keys {
			if got := admitted(tc.org, key); got != tc.admitted[i] {
				t.Errorf("%s, key %s: admitted %d, want %d", tc.org, key, got, tc.admitted[i])
			}
		}
		r := do(t, "GET", url, "X-Org: "+tc.org, "X-Key: "+tc.keys[len(tc.keys)-1])
		if r.status != http.StatusTooManyRequests || r.problem(t)["blocked_by"] != tc.block {
			t.Errorf("%s: after its limits, status %d %s, want 429 blocked by %s", tc.org, r.status, r.body, tc.block)
		}
		if o, k := quota(r, "org"), quota(r, "key"); o != tc.orgQuota || k != tc.keyQuota {
			t.Errorf("%s: RateLimit-Policy %q: org %d, key %d, want %d and %d", tc.org, r.header.Get("RateLimit-Policy"), o, k, tc.orgQuota, tc.keyQuota)
		}
		if p, m := r.header.Get("X-Plan"), r.header.Get("X-Manager"); p != tc.plan || m != tc.manager {
			t.Errorf("%s: X-Plan %q, X-Manager %q, want %q and %q", tc.org, p, m, tc.plan, tc.manager)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if lines := logLines(t, logFile, "a plan no tier names", `"plan":"platinum"`); len(lines) != 1 {
		t.Errorf("the unknown plan logged %d times, want once: %q", len(lines), lines)
	}
	if r := do(t, "GET", url, "X-Org: switcher", "X-Key: s0"); r.status != 200 || quota(r, "org") != 3 {
		t.Fatalf("switcher before the change: %d, policy %q: want 200 on free", r.status, r.header.Get("RateLimit-Policy"))
	}

	// switcher upgraded to enterprise, acme downgraded to free: each seen
	// after ttl (the file's poll, then the cache's), the counters kept.
	writeAtomically(t, file, `{
	"acme":     {"plan": "free"},
	"globex":   {"plan": "enterprise", "account_manager": "dana"},
	"switcher": {"plan": "enterprise"}
}`)
	poll := &keys{prefix: "poll"}
	seenWithin(t, 10*time.Second, "switcher on enterprise", func() bool {
		r := do(t, "GET", url, "X-Org: switcher", poll.next())
		return r.header.Get("X-Plan") == "enterprise" && quota(r, "org") == -1
	})
	seenWithin(t, 10*time.Second, "acme on free", func() bool {
		return quota(do(t, "GET", url, "X-Org: acme", poll.next()), "org") == 3
	})
	// switcher's org is unlimited now: two fresh keys get their 4 each,
	// past free's 3 for the org.
	if a, b := admitted("switcher", "s1"), admitted("switcher", "s2"); a != 4 || b != 4 {
		t.Errorf("switcher on enterprise: keys admitted %d and %d, want 4 each", a, b)
	}
	// acme used 6 of pro's: free's 3 are gone.
	if r := do(t, "GET", url, "X-Org: acme", "X-Key: a3"); r.status != http.StatusTooManyRequests || r.problem(t)["blocked_by"] != "api/org" {
		t.Errorf("acme on free with 6 used: %d %s, want 429 by api/org", r.status, r.body)
	}

	// A broken rewrite (which would put switcher back on free) is refused
	// and logged; past ttl, the last good file still applies.
	writeAtomically(t, file, `{"switcher": {"plan": "free"}, "globex": {"plan": `)
	seenWithin(t, 10*time.Second, "the broken file logged", func() bool {
		return len(logLines(t, logFile, "the file cannot be read; the last good one is used")) > 0
	})
	time.Sleep(1500 * time.Millisecond) // past ttl: every cached answer was looked up again in the file
	for i := 0; i < 3; i++ {
		r := do(t, "GET", url, "X-Org: switcher", poll.next())
		if r.status != 200 || r.header.Get("X-Plan") != "enterprise" || quota(r, "org") != -1 {
			t.Fatalf("switcher after a broken file: %d, X-Plan %q, policy %q: want 200 on enterprise", r.status, r.header.Get("X-Plan"), r.header.Get("RateLimit-Policy"))
		}
		if r := do(t, "GET", url, "X-Org: globex", poll.next()); r.status != 200 || r.header.Get("X-Manager") != "dana" {
			t.Fatalf("globex after a broken file: %d, X-Manager %q", r.status, r.header.Get("X-Manager"))
		}
	}
}

// TestPlansFromRedis: a hash per org in the handler's Redis store; a
// changed hash applies after ttl. A runtime entitlement set through the
// admin API applies at once and wins over the hash; deleted, the hash's
// plan is back. A plan no tree names is refused.
func TestPlansFromRedis(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	seq := testSeq.Add(1)
	prefix := fmt.Sprintf("plans%d", seq)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	hset := func(org string, fields ...any) {
		t.Helper()
		if err := rdb.HSet(ctx, prefix+":org:"+org, fields...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hset("acme", "plan", "free", "account_manager", "dana")

	site, api := adminSiteThen(t, fmt.Sprintf(`
		entitlements customers {
			source redis %s:org:{value}
			key org
			ttl 1s
		}
%s
		store redis {
			address %s
			key_prefix t%d:
			timeout 2s
		}`, prefix, planTree, addr, seq), planHeaders+`respond "ok" 200`)
	poll := &keys{prefix: "k"}
	get := func(org string) resp { return do(t, "GET", site, "X-Org: "+org, poll.next()) }

	if r := get("acme"); r.status != 200 || quota(r, "org") != 3 || r.header.Get("X-Plan") != "free" || r.header.Get("X-Manager") != "dana" {
		t.Fatalf("acme from its hash: %d, policy %q, X-Plan %q, X-Manager %q: want free, dana",
			r.status, r.header.Get("RateLimit-Policy"), r.header.Get("X-Plan"), r.header.Get("X-Manager"))
	}
	if r := get("nobody"); r.status != 200 || quota(r, "org") != 3 || r.header.Get("X-Plan") != "" {
		t.Fatalf("an org without a hash: %d, policy %q, X-Plan %q: want the default plan", r.status, r.header.Get("RateLimit-Policy"), r.header.Get("X-Plan"))
	}

	hset("acme", "plan", "pro")
	seenWithin(t, 10*time.Second, "acme's new plan from its hash", func() bool {
		r := get("acme")
		return quota(r, "org") == 6 && r.header.Get("X-Plan") == "pro"
	})

	if code, body := call(t, "PUT", api+"/rate_limit/entitlements/customers/acme", `{"plan":"enterprise"}`, nil); code != 200 {
		t.Fatalf("PUT enterprise: %d %s", code, body)
	}
	seenWithin(t, 2*time.Second, "the runtime entitlement", func() bool {
		r := get("acme")
		return quota(r, "org") == -1 && r.header.Get("X-Plan") == "enterprise"
	})
	// Past pro's 6 for the org (the polls used them): two fresh keys get
	// their own limit's 4 each.
	if a, b := admitUntilRefused(t, 2, []string{site}, "X-Org: acme", "X-Key: e1"), admitUntilRefused(t, 2, []string{site}, "X-Org: acme", "X-Key: e2"); a != 4 || b != 4 {
		t.Errorf("acme on enterprise: keys admitted %d and %d, want 4 each", a, b)
	}
	if code, body := call(t, "GET", api+"/rate_limit/entitlements/customers/acme", nil, nil); code != 200 || !strings.Contains(body, `"enterprise"`) {
		t.Errorf("GET the runtime entitlement: %d %s", code, body)
	}

	code, body := call(t, "PUT", api+"/rate_limit/entitlements/customers/acme", `{"plan":"platinum"}`, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "platinum") || !strings.Contains(body, "enterprise, free, pro") {
		t.Errorf("PUT a plan no tree names: %d %s, want 400 naming the known plans", code, body)
	}
	if r := get("acme"); quota(r, "org") != -1 {
		t.Errorf("the refused PUT changed acme's plan: policy %q", r.header.Get("RateLimit-Policy"))
	}

	if code, body := call(t, "DELETE", api+"/rate_limit/entitlements/customers/acme", nil, nil); code != 200 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	seenWithin(t, 2*time.Second, "back to the hash's plan", func() bool {
		r := get("acme")
		return quota(r, "org") == 6 && r.header.Get("X-Plan") == "pro"
	})
	if code, body := call(t, "GET", api+"/rate_limit/entitlements/customers/acme", nil, nil); code != http.StatusNotFound {
		t.Errorf("GET after DELETE: %d %s, want 404", code, body)
	}
}

// entitlementService is a billing service answering GET
// /entitlements/<org> with the org's JSON, 404 for an org it does not
// know, each org's answer after its delay (or when the caller gives up).
type entitlementService struct {
	*httptest.Server
	mu      sync.Mutex
	answers map[string]string
	delays  map[string]time.Duration
	calls   map[string]int
}

func newEntitlementService(t *testing.T, answers map[string]string, delays map[string]time.Duration) *entitlementService {
	s := &entitlementService{answers: answers, delays: delays, calls: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		org, ok := strings.CutPrefix(r.URL.Path, "/entitlements/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		s.mu.Lock()
		s.calls[org]++
		answer, known := s.answers[org]
		delay := s.delays[org]
		s.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		if !known {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *entitlementService) callsOf(org string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[org]
}

// TestPlansFromHTTP: an HTTP entitlement service is asked once for a
// thousand concurrent requests of a new org; a slow one does not hold a
// request past timeout (it runs on the default plan) nor is asked again
// at once; a stopped one's last answer applies for stale past ttl, then
// the default plan.
func TestPlansFromHTTP(t *testing.T) {
	block := func(url, options string) string {
		return fmt.Sprintf(`
		entitlements customers {
			source http %s/entitlements/{value}
			key org
			%s
		}
%s
		%s`, url, options, planTree, memoryStore().block(t))
	}

	t.Run("a thousand requests, one lookup", func(t *testing.T) {
		// The service answers after 100ms, so that most requests come while
		// the lookup is in flight; timeout 5s, so that none gives up on it.
		svc := newEntitlementService(t, map[string]string{"newco": `{"plan":"pro","limits":[{"count":6,"per":"day"}]}`}, map[string]time.Duration{"newco": 100 * time.Millisecond})
		url := planSite(t, block(svc.URL, "ttl 1h\n\t\t\ttimeout 5s"))
		const n = 1000
		type result struct {
			status int
			plan   string
			err    error
		}
		results := make([]result, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("X-Org", "newco")
				req.Header.Set("X-Key", fmt.Sprintf("k%d", i))
				<-start
				res, err := httpClient(t).Do(req)
				if err != nil {
					results[i].err = err
					return
				}
				res.Body.Close()
				results[i] = result{status: res.StatusCode, plan: res.Header.Get("X-Plan")}
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for i, r := range results {
			switch {
			case r.err != nil:
				t.Fatalf("request %d: %v", i, r.err)
			case r.plan != "pro" || (r.status != 200 && r.status != http.StatusTooManyRequests):
				t.Fatalf("request %d: status %d, X-Plan %q: want pro", i, r.status, r.plan)
			case r.status == 200:
				ok++
			}
		}
		if got := svc.callsOf("newco"); got != 1 {
			t.Errorf("%d concurrent requests of a new org: %d lookups, want 1", n, got)
		}
		if ok != 6 {
			t.Errorf("admitted %d, want pro's 6 for the org", ok)
		}
	})

	t.Run("a slow service", func(t *testing.T) {
		svc := newEntitlementService(t, map[string]string{"slowco": `{"plan":"pro"}`}, map[string]time.Duration{"slowco": 3 * time.Second})
		url := planSite(t, block(svc.URL, "ttl 1h\n\t\t\ttimeout 200ms"))
		for i := 1; i <= 2; i++ {
			start := time.Now()
			r := do(t, "GET", url, "X-Org: slowco", fmt.Sprintf("X-Key: s%d", i))
			took := time.Since(start)
			if took > 2*time.Second {
				t.Fatalf("request %d waited %v for a service past timeout 200ms", i, took)
			}
			if r.status != 200 || quota(r, "org") != 3 || quota(r, "key") != 2 || r.header.Get("X-Plan") != "" {
				t.Fatalf("request %d: %d, policy %q, X-Plan %q: want 200 on the default plan (free)", i, r.status, r.header.Get("RateLimit-Policy"), r.header.Get("X-Plan"))
			}
			t.Logf("request %d answered in %v on the default plan", i, took.Round(time.Millisecond))
		}
		// The failed value is not looked up again for a tenth of ttl: the
		// second request asked nothing.
		if got := svc.callsOf("slowco"); got != 1 {
			t.Errorf("lookups of slowco: %d, want 1", got)
		}
	})

	t.Run("stopped, within stale", func(t *testing.T) {
		svc := newEntitlementService(t, map[string]string{"steady": `{"plan":"pro"}`}, nil)
		url := planSite(t, block(svc.URL, "ttl 1s\n\t\t\tstale 1h\n\t\t\ttimeout 200ms"))
		poll := &keys{prefix: "k"}
		if r := do(t, "GET", url, "X-Org: steady", poll.next()); r.header.Get("X-Plan") != "pro" || quota(r, "org") != 6 {
			t.Fatalf("steady: X-Plan %q, policy %q: want pro", r.header.Get("X-Plan"), r.header.Get("RateLimit-Policy"))
		}
		svc.Close()
		// For 3 s past the service's end (3 ttls), the cached answer
		// applies.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			if r := do(t, "GET", url, "X-Org: steady", poll.next()); r.header.Get("X-Plan") != "pro" || quota(r, "org") != 6 {
				t.Fatalf("steady, the service stopped: X-Plan %q, policy %q: want the stale answer, pro", r.header.Get("X-Plan"), r.header.Get("RateLimit-Policy"))
			}
		}
		if got := svc.callsOf("steady"); got != 1 {
			t.Errorf("lookups answered: %d, want 1 (the service stopped after it)", got)
		}
	})

	t.Run("stopped, past stale", func(t *testing.T) {
		svc := newEntitlementService(t, map[string]string{"steady": `{"plan":"pro"}`}, nil)
		url := planSite(t, block(svc.URL, "ttl 1s\n\t\t\tstale 500ms\n\t\t\ttimeout 200ms"))
		poll := &keys{prefix: "k"}
		if r := do(t, "GET", url, "X-Org: steady", poll.next()); r.header.Get("X-Plan") != "pro" || quota(r, "org") != 6 {
			t.Fatalf("steady: X-Plan %q, policy %q: want pro", r.header.Get("X-Plan"), r.header.Get("RateLimit-Policy"))
		}
		svc.Close()
		seenWithin(t, 10*time.Second, "the default plan once stale is over", func() bool {
			r := do(t, "GET", url, "X-Org: steady", poll.next())
			return quota(r, "org") == 3 && r.header.Get("X-Plan") == ""
		})
	})
}

// TestPlansAllOrNothing: two trees whose plans differ for one request
// (tree a's from the entitlement, tree b's from a header): when either
// refuses, the other is not charged.
func TestPlansAllOrNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		file := filepath.Join(t.TempDir(), "entitlements.json")
		writeAtomically(t, file, `{"acme": {"plan": "pro"}, "tiny": {"plan": "free"}}`)
		url := site(t, fmt.Sprintf(`
		entitlements customers {
			source file %s
			key org
			ttl 1h
		}
		tree a {
			plan {http.rate_limit.entitlement.customers.plan} default free
			tier org {header.X-Org} {
				plan free {
					limit 2/day
				}
				plan pro {
					limit 5/day
				}
			}
		}
		tree b {
			plan {http.request.header.X-Plan} default free
			tier user {header.X-User} {
				plan free {
					limit 1/day
				}
				plan pro {
					limit 10/day
				}
			}
		}
		%s`, file, storeBlock))
		send := func(org, user, plan string) resp {
			return do(t, "GET", url, "X-Org: "+org, "X-User: "+user, "X-Plan: "+plan)
		}

		// Tree b refuses u1 (free: 1/day) where tree a (acme, pro) allows.
		if r := send("acme", "u1", "free"); r.status != 200 {
			t.Fatalf("acme/u1: %d %s", r.status, r.body)
		}
		if r := send("acme", "u1", "free"); r.status != http.StatusTooManyRequests || r.problem(t)["blocked_by"] != "b/user" {
			t.Fatalf("acme/u1 again: %d %s, want 429 by b/user", r.status, r.body)
		}
		// acme was charged once, not for the refusal: 4 of pro's 5 left.
		left := 0
		for i := 0; i < 7; i++ {
			if send("acme", fmt.Sprintf("p%d", i), "pro").status == 200 {
				left++
			}
		}
		if left != 4 {
			t.Errorf("acme after tree b's refusal: %d admitted, want 4 (5 − 1: the refusal charged nothing)", left)
		}

		// Tree a refuses tiny (free: 2/day) where tree b (u9, pro) allows.
		for _, u := range []string{"t1", "t2"} {
			if r := send("tiny", u, "pro"); r.status != 200 {
				t.Fatalf("tiny/%s: %d %s", u, r.status, r.body)
			}
		}
		if r := send("tiny", "u9", "free"); r.status != http.StatusTooManyRequests || r.problem(t)["blocked_by"] != "a/org" {
			t.Fatalf("tiny/u9: %d %s, want 429 by a/org", r.status, r.body)
		}
		// u9 was not charged: its one request a day on free is still there.
		if r := send("nobody", "u9", "free"); r.status != 200 {
			t.Fatalf("u9 after tree a's refusal: %d %s, want 200 (the refusal charged nothing)", r.status, r.body)
		}
		if r := send("nobody", "u9", "free"); r.status != http.StatusTooManyRequests || r.problem(t)["blocked_by"] != "b/user" {
			t.Fatalf("u9 again: %d %s, want 429 by b/user", r.status, r.body)
		}
	})
}

// TestPlansAcrossInstances: a runtime entitlement set through one
// instance's admin API applies on another sharing its Redis store within
// 2 s; deleted there, the other drops its cached answer and asks the
// source again.
func TestPlansAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	addr, seq := redistest.Shared(t).Addr(), testSeq.Add(1)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	hash := fmt.Sprintf("ents%d:org:acme", seq)
	if err := rdb.HSet(context.Background(), hash, "plan", "pro").Err(); err != nil {
		t.Fatal(err)
	}
	ps := startRateLimited(t, 2, fmt.Sprintf(`
			entitlements customers {
				source redis ents%d:org:{value}
				key org
			}
%s
			store redis {
				address %s
				key_prefix plans%d:
			}`, seq, planTree, addr, seq))
	a, b := ps[0], ps[1]
	poll := &keys{prefix: "k"}
	orgQuota := func() int { return quota(do(t, "GET", b.site, "X-Org: acme", poll.next()), "org") }
	if q := orgQuota(); q != 6 {
		t.Fatalf("acme on B: org quota %d, want pro's 6", q)
	}
	// The hash changes; B keeps its answer for ttl (5m).
	if err := rdb.HSet(context.Background(), hash, "plan", "free").Err(); err != nil {
		t.Fatal(err)
	}
	if q := orgQuota(); q != 6 {
		t.Fatalf("acme on B after its hash changed: org quota %d, want the cached pro's 6", q)
	}
	if code, body := call(t, "PUT", a.api+"/rate_limit/entitlements/customers/acme", `{"plan":"enterprise","note":"trial"}`, nil); code != 200 {
		t.Fatalf("PUT through A: %d %s", code, body)
	}
	seenWithin(t, 2*time.Second, "A's entitlement on B", func() bool { return orgQuota() == -1 })
	if code, body := call(t, "DELETE", a.api+"/rate_limit/entitlements/customers/acme", nil, nil); code != 200 {
		t.Fatalf("DELETE through A: %d %s", code, body)
	}
	seenWithin(t, 2*time.Second, "A's deletion on B, the hash read again", func() bool { return orgQuota() == 3 })
}

// TestPlansConfigErrors: each mistake in entitlements and plans is a
// configuration error naming the fix.
func TestPlansConfigErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "entitlements.json")
	writeAtomically(t, file, `{"acme": {"plan": "pro"}}`)
	other := filepath.Join(t.TempDir(), "other.json")
	writeAtomically(t, other, `{"globex": {"plan": "pro"}}`)
	broken := filepath.Join(t.TempDir(), "broken.json")
	writeAtomically(t, broken, `{"acme": {"plan": `)
	ents := func(lines string) string {
		return "entitlements customers {\n" + lines + "\n}\n"
	}
	redisStoreBlock := fmt.Sprintf("store redis {\n address %s\n key_prefix plans%d:\n }", "127.0.0.1:1", testSeq.Add(1))
	for _, tc := range []struct {
		name, rateLimit string
		want            []string
	}{
		{"key names no tier",
			ents("source file "+file+"\nkey team") + planTree,
			[]string{"entitlements customers", "no tree has a tier team"}},
		{"source redis with a memory store",
			ents("source redis billing:org:{value}\nkey org") + planTree + "store memory",
			[]string{"give the handler store redis, or use source file or http"}},
		{"two sources",
			ents("source file "+file+"\nsource http http://127.0.0.1:1/e/{value}\nkey org") + planTree,
			[]string{"give one source"}},
		// Accepted today: the second line silently replaces the first.
		{"two sources of one kind",
			ents("source file "+file+"\nsource file "+other+"\nkey org") + planTree,
			[]string{"give one source"}},
		{"a redis template without {value}",
			ents("source redis billing:org\nkey org") + planTree + redisStoreBlock,
			[]string{"must contain {value}"}},
		{"an http template without {value}",
			ents("source http http://127.0.0.1:1/e\nkey org") + planTree,
			[]string{"must contain {value}"}},
		{"a file that cannot be read",
			ents("source file "+file+".missing\nkey org") + planTree,
			[]string{"entitlements customers", file + ".missing"}},
		{"a file that is not JSON",
			ents("source file "+broken+"\nkey org") + planTree,
			[]string{"entitlements customers", broken}},
		{"plan without default",
			strings.Replace(planTree, "default free", "", 1),
			[]string{"plan needs a default", "default <plan>"}},
		{"strict_allocation with a child above its parent",
			strings.Replace(strings.Replace(planTree, "plan {", "strict_allocation\n\t\t\tplan {", 1), "limit 5/day", "limit 7/day", 1),
			[]string{"strict_allocation", "plan pro", "tier key allows 7/day of requests, more than its parent org's 6/day"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := globalOptions() + fmt.Sprintf("http://127.0.0.1:%d {\n rate_limit {\n%s\n }\n respond \"ok\"\n}\n", freePort(t), tc.rateLimit)
			cfg, err := adapt(t, cf)
			if err == nil {
				err = caddy.Validate(mustConfig(t, cfg))
			}
			if err == nil {
				t.Fatalf("no error, want one saying %q\n%s", tc.want, cf)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestPlansOwnLimitsConcurrently: the first requests of a value with
// limits of its own, arriving together, each get them. The limits are the
// cached answer's, shared by every request of the value (entitle says to
// treat them as read-only): compiling them must not write them from two
// requests at once, which -race reports.
func TestPlansOwnLimitsConcurrently(t *testing.T) {
	tree := &Tree{Tree: hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: "org", Key: "{x}", Limits: []*hierarchy.Limit{{Count: 10, Per: "h"}}}}}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	p := &planState{logger: zap.NewNop()}
	for v := range 500 { // a value's first requests together, 500 times: the window is narrow
		limits := []*hierarchy.Limit{{Count: 6, Per: "day"}} // one cached answer's
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if o := p.ownOverride(tree, tree.Tiers[0], strconv.Itoa(v), "", limits); o == nil || len(o.Limits) != 1 || o.Limits[0].Count != 6 {
					t.Errorf("value %d: own limits %+v, want 6/day", v, o)
				}
			}()
		}
		close(start)
		wg.Wait()
	}
}
