package cascade

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/crypto/bcrypt"
)

// storeKind is a store an integration scenario runs on.
type storeKind struct {
	name  string
	block func(t *testing.T) string // the `store` line(s) of rate_limit
}

var testSeq atomic.Int64

func memoryStore() storeKind {
	return storeKind{"memory", func(t *testing.T) string {
		return fmt.Sprintf("store memory {\n name t%d\n }", testSeq.Add(1))
	}}
}

// eachStore runs a scenario on the memory store and on a real Redis.
func eachStore(t *testing.T, run func(t *testing.T, storeBlock string)) {
	for _, k := range []storeKind{memoryStore(), redisStore()} {
		t.Run(k.name, func(t *testing.T) { run(t, k.block(t)) })
	}
}

// site is a rate-limited site on a free port, answering 200 "ok" upstream.
func site(t *testing.T, rateLimit string) string {
	t.Helper()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
%s
	}
	respond "ok remaining={http.rate_limit.remaining}" 200
}
`, port, rateLimit))
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

const acmeTree = `
	tree acme {
		tier org {header.X-Org} {
			limit 10000/h
			limit 1000000 tokens/h
		}
		tier team {header.X-Team} {
			limit 5000/h
			limit 500000 tokens/h
			value marketing {
				limit 200000 tokens/h
			}
		}
		tier user {header.X-User} {
			limit 1000/h
			limit 100000 tokens/h
		}
		tier agent {header.X-Agent} {
			missing skip
			limit 200/h
			limit 25000 tokens/h
		}
	}
	cost tokens {header.X-Tokens}
`

func TestAcmeHierarchy(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, acmeTree+storeBlock)
		h := []string{"X-Org: acme-corp", "X-Team: engineering", "X-User: alice", "X-Agent: agent-1", "X-Tokens: 5000"}

		// agent-1 has 25,000 tokens/h: five requests of 5,000.
		if got := admitN(t, 5, url, h...); got != 5 {
			t.Fatalf("admitted %d of 5 within agent-1's tokens", got)
		}
		r := do(t, "GET", url, h...)
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("6th request: status %d, want 429", r.status)
		}
		p := r.problem(t)
		if p["blocked_by"] != "acme/agent" {
			t.Errorf("blocked_by = %v, want acme/agent", p["blocked_by"])
		}
		if !strings.Contains(fmt.Sprint(p["violated_policies"]), "acme/agent.tokens") {
			t.Errorf("violated policies = %v", p["violated_policies"])
		}
		if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra != 720 {
			// 5,000 tokens refill at 25,000/h: 720 s.
			t.Errorf("Retry-After = %q, want 720", r.header.Get("Retry-After"))
		}
		if got := r.header.Get("RateLimit"); got != `"agent.tokens";r=0;t=720` {
			t.Errorf("RateLimit = %q", got)
		}
		policy := r.header.Get("RateLimit-Policy")
		for _, want := range []string{`"org.requests";q=10000;w=3600`, `"org.tokens";q=1000000;w=3600;qu="tokens"`,
			`"team.tokens";q=500000;w=3600;qu="tokens"`, `"agent.tokens";q=25000;w=3600;qu="tokens"`} {
			if !strings.Contains(policy, want) {
				t.Errorf("RateLimit-Policy %q lacks %s", policy, want)
			}
		}

		// All or nothing: the denied request charged nobody. alice, through
		// another agent, still has 100,000 − 25,000 = 75,000 tokens.
		h2 := []string{"X-Org: acme-corp", "X-Team: engineering", "X-User: alice", "X-Agent: agent-2", "X-Tokens: 25000"}
		if got := admitN(t, 3, url, h2...); got != 1 {
			t.Fatalf("agent-2 admitted %d requests of 25,000, want 1 (its own cap)", got)
		}
		// Without an agent header the agent tier is skipped: alice has 50,000 left.
		h3 := []string{"X-Org: acme-corp", "X-Team: engineering", "X-User: alice", "X-Tokens: 25000"}
		if got := admitN(t, 3, url, h3...); got != 2 {
			t.Fatalf("alice without agent admitted %d of 25,000, want 2", got)
		}
		r = do(t, "GET", url, h3...)
		if p := r.problem(t); p["blocked_by"] != "acme/user" {
			t.Errorf("blocked_by = %v, want acme/user", p["blocked_by"])
		}

		// marketing's override: 200,000 tokens/h for the team.
		hm := []string{"X-Org: acme-corp", "X-Team: marketing", "X-Tokens: 100000"}
		for i, u := range []string{"m1", "m2", "m3"} {
			r := do(t, "GET", url, append(hm, "X-User: "+u)...)
			if want := i < 2; (r.status == 200) != want {
				t.Fatalf("marketing user %s: status %d", u, r.status)
			}
			if i == 2 && r.problem(t)["blocked_by"] != "acme/team" {
				t.Errorf("marketing denial blocked_by %v", r.problem(t)["blocked_by"])
			}
		}
	})
}

func TestMissingKeyIsRefused(t *testing.T) {
	url := site(t, acmeTree+memoryStore().block(t))
	r := do(t, "GET", url, "X-Org: acme-corp", "X-Team: engineering", "X-Tokens: 1")
	if r.status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", r.status)
	}
	p := r.problem(t)
	if !strings.HasSuffix(fmt.Sprint(p["type"]), "#missing-key") || p["blocked_by"] != "acme/user" {
		t.Errorf("problem = %v", p)
	}
	r = do(t, "GET", url, "X-Org: acme-corp", "X-Team: engineering", "X-User: bob", "X-Tokens: lots")
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "not a non-negative integer") {
		t.Errorf("bad cost: status %d body %s", r.status, r.body)
	}
}

func TestGlobalAndCategorySliding(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
	tree notify {
		tier global all {
			limit 100/30m sliding
		}
		tier category {header.X-Category} {
			limit 10/30m sliding
		}
	}
`+storeBlock)
		for c := 0; c < 10; c++ {
			cat := fmt.Sprintf("X-Category: c%d", c)
			if got := admitN(t, 11, url, cat); got != 10 {
				t.Fatalf("category %d admitted %d of 11, want 10", c, got)
			}
		}
		r := do(t, "GET", url, "X-Category: fresh")
		if r.status != 429 || r.problem(t)["blocked_by"] != "notify/global" {
			t.Fatalf("101st request: %d %s", r.status, r.body)
		}
	})
}

func TestSeed004WildcardAndNamedChildren(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
	tree exchange {
		tier user {header.X-User} {
			limit 30/60s burst 15
		}
		tier action {header.X-Action} {
			missing skip
			value trade {
				limit 10/15s burst 5
			}
			value withdrawal {
				limit 3/h
			}
		}
	}
`+storeBlock)
		if got := admitN(t, 6, url, "X-User: alex", "X-Action: trade"); got != 5 {
			t.Fatalf("trades admitted %d, want 5 (burst)", got)
		}
		if got := admitN(t, 4, url, "X-User: alex", "X-Action: withdrawal"); got != 3 {
			t.Fatalf("withdrawals admitted %d, want 3", got)
		}
		// alex used 8 of 15: 7 more of anything else.
		if got := admitN(t, 9, url, "X-User: alex", "X-Action: balance"); got != 7 {
			t.Fatalf("other actions admitted %d, want 7", got)
		}
		r := do(t, "GET", url, "X-User: alex", "X-Action: balance")
		if r.problem(t)["blocked_by"] != "exchange/user" {
			t.Errorf("blocked_by %v", r.problem(t)["blocked_by"])
		}
		// another user is untouched
		if got := admitN(t, 5, url, "X-User: sam", "X-Action: trade"); got != 5 {
			t.Fatalf("sam's trades admitted %d", got)
		}
	})
}

func TestOverridesAndUnits(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
	tree plans {
		tier org {header.X-Org} {
			limit 2/h
			limit 100000/month
			value bigco {
				limit 5/h
			}
			value internal unlimited
		}
	}
`+storeBlock)
		if got := admitN(t, 6, url, "X-Org: small"); got != 2 {
			t.Errorf("default org admitted %d, want 2", got)
		}
		if got := admitN(t, 6, url, "X-Org: bigco"); got != 5 {
			t.Errorf("enterprise org admitted %d, want 5", got)
		}
		if got := admitN(t, 20, url, "X-Org: internal"); got != 20 {
			t.Errorf("unlimited org admitted %d, want 20", got)
		}
		r := do(t, "GET", url, "X-Org: other")
		if pol := r.header.Get("RateLimit-Policy"); !strings.Contains(pol, `"org.requests.month";q=100000;w=2592000`) {
			t.Errorf("RateLimit-Policy = %q", pol)
		}
		if r.body != "ok remaining=1" {
			t.Errorf("placeholder body = %q", r.body)
		}
	})
}

// TestMholtReadmeExamples runs mholt/caddy-ratelimit's README Caddyfile
// unchanged (but for the ports), including its order line, distributed and
// log_key. Its window is exact, as mholt's: a refused request is told to
// retry in 5 s, when the first of the two leaves the 5 s window.
func TestMholtReadmeExamples(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		port := freePort(t)
		cf := strings.Replace(mholtReadmeCaddyfile, ":80", fmt.Sprintf("http://127.0.0.1:%d", port), 1)
		cf = strings.Replace(cf, "\tlog_key\n}", "\tlog_key\n\t"+storeBlock+"\n}", 1)
		startCaddy(t, cf, "order rate_limit before basicauth")
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		first := time.Now()
		if got := admitN(t, 3, url); got != 2 {
			t.Fatalf("dynamic zone admitted %d of 3, want 2", got)
		}
		r := do(t, "GET", url)
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		// 5 s after the first event, in whole seconds: less only by
		// the whole seconds a busy machine took to get here.
		if r.status != 429 || ra > 5 || ra < 5-int(time.Since(first).Seconds()) {
			t.Fatalf("status %d Retry-After %q, want 5 s after the first request (%v ago)", r.status, r.header.Get("Retry-After"), time.Since(first))
		}
		time.Sleep(time.Duration(ra) * time.Second)
		if r := do(t, "GET", url); r.status != 200 {
			t.Fatalf("retry after %d s: status %d %s", ra, r.status, r.body)
		}
	})
}

func TestRetryAfterIsTrueWithJitter(t *testing.T) {
	url := site(t, `
	zone z {
		key {remote_host}
		events 1
		window 2s
	}
	jitter 0.5
`+memoryStore().block(t))
	first := time.Now()
	if r := do(t, "GET", url); r.status != 200 {
		t.Fatal(r.status)
	}
	r := do(t, "GET", url)
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	// The event leaves the 2 s window 2 s after it came (rounded up to
	// whole seconds; less the whole seconds a busy machine took to send
	// the second request), and the jitter adds up to 50%.
	if r.status != 429 || ra < 2-int(time.Since(first).Seconds()) || ra > 3 {
		t.Fatalf("status %d, Retry-After %d (window 2s, up to 50%% jitter)", r.status, ra)
	}
	time.Sleep(time.Duration(ra) * time.Second)
	if r := do(t, "GET", url); r.status != 200 {
		t.Fatalf("a retry at Retry-After was refused: %d", r.status)
	}
}

// TestExactUnderConcurrency: 200 concurrent clients against capacity 100
// with cost 3 admit exactly 33.
func TestExactUnderConcurrency(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, `
	tree burst {
		tier key fixed {
			limit 100 units/h
		}
	}
	cost units 3
`+storeBlock)
		if got := concurrentAdmits(t, []string{url}, 200); got != 33 {
			t.Fatalf("admitted %d, want exactly 33", got)
		}
	})
}

// concurrentAdmits sends clients requests at once, spread over urls, and
// returns how many were admitted; any answer but 200 or 429 fails t.
func concurrentAdmits(t *testing.T, urls []string, clients int) int64 {
	got := concurrentStatuses(t, urls, clients)
	for status, n := range got {
		if status != 200 && status != 429 {
			t.Errorf("%d answers with status %d", n, status)
		}
	}
	return int64(got[200])
}

// concurrentStatuses sends clients requests at once, spread over urls,
// with headers ("Name: value"), and counts the answers by status. A 429
// must say when to retry.
func concurrentStatuses(t *testing.T, urls []string, clients int, headers ...string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest("GET", urls[i%len(urls)], nil)
			for _, h := range headers {
				k, v, _ := strings.Cut(h, ":")
				req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			res, err := httpClient(t).Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			if res.StatusCode == http.StatusTooManyRequests && res.Header.Get("Retry-After") == "" {
				t.Error("a refusal without Retry-After")
			}
			mu.Lock()
			got[res.StatusCode]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return got
}

func TestModesAndHeaderSwitches(t *testing.T) {
	url := site(t, `
	tree t {
		tier k fixed {
			limit 1/h
		}
	}
	mode shadow
	headers none
`+memoryStore().block(t))
	for i := 0; i < 3; i++ {
		r := do(t, "GET", url)
		if r.status != 200 || r.header.Get("RateLimit") != "" || r.header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("shadow request %d: %d %v", i, r.status, r.header)
		}
	}
	// shadow mode never refuses, not even a request without its key
	url = site(t, `
	tree t {
		tier user {header.X-User} {
			limit 1/h
		}
	}
	mode shadow
`+memoryStore().block(t))
	if r := do(t, "GET", url); r.status != 200 {
		t.Fatalf("shadow mode refused a request without a key: %d", r.status)
	}
	url = site(t, `
	tree t {
		tier k fixed {
			limit 1/h
		}
	}
	mode warn
	headers x_ratelimit
`+memoryStore().block(t))
	do(t, "GET", url)
	r := do(t, "GET", url)
	if r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "0" || r.header.Get("RateLimit") != "" {
		t.Fatalf("warn mode: %d %v", r.status, r.header)
	}
}

// TestStateSurvivesReload: a config reload must not hand anyone a fresh
// quota. The memory store lives in a usage pool across configs.
func TestStateSurvivesReload(t *testing.T) {
	port := freePort(t)
	name := fmt.Sprintf("reload%d", testSeq.Add(1))
	config := func(body string) string {
		return fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree t {
			tier user {header.X-User} {
				limit 3/h
			}
		}
		store memory {
			name %s
		}
	}
	respond %q
}
`, port, name, body)
	}
	startCaddy(t, config("v1"))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if got := admitN(t, 2, url, "X-User: u"); got != 2 {
		t.Fatalf("admitted %d before reload", got)
	}
	if err := reload(t, config("v2")); err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", url, "X-User: u"); r.status != 200 || r.body != "v2" {
		t.Fatalf("after reload: %d %q", r.status, r.body)
	}
	if r := do(t, "GET", url, "X-User: u"); r.status != http.StatusTooManyRequests {
		t.Fatalf("the reload reset the quota: 4th request got %d", r.status)
	}
}

// TestIdentitiesFromAuthAndPath: with the default directive order,
// rate_limit runs after authentication, so {http.auth.user.id} is there
// for key templates; path segments work as keys too.
func TestIdentitiesFromAuthAndPath(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	basic_auth {
		alice %s
		bob %s
	}
	rate_limit {
		tree t {
			tier user {http.auth.user.id} {
				limit 3/h
			}
			tier tenant {path.1} {
				limit 2/h
			}
		}
		store memory {
			name auth%d
		}
	}
	respond "hi {http.auth.user.id}"
}
`, port, hash, hash, testSeq.Add(1)))
	get := func(user, path string) int {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
		if user != "" {
			req.SetBasicAuth(user, "secret")
		}
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := get("", "/t/acme"); s != http.StatusUnauthorized {
		t.Fatalf("no credentials: %d, want 401 from basic_auth before rate_limit", s)
	}
	for i, want := range []int{200, 200, 429} { // tenant acme: 2/h
		if s := get("alice", "/t/acme"); s != want {
			t.Fatalf("alice request %d on /t/acme: %d, want %d", i, s, want)
		}
	}
	if s := get("alice", "/t/globex"); s != 200 { // alice's 3rd: the 429 charged nothing
		t.Fatalf("alice on /t/globex: %d", s)
	}
	if s := get("alice", "/t/initech"); s != 429 { // alice has used her 3
		t.Fatalf("alice's 4th: %d, want 429", s)
	}
	if s := get("bob", "/t/initech"); s != 200 { // bob is another user
		t.Fatalf("bob: %d", s)
	}
}

// TestPlaceholdersShowTheLastHandler: with two rate_limit handlers on one
// request, the placeholders show the decision of the one that refused it,
// not the first one's (Caddy's replacer answers from its first provider).
func TestPlaceholdersShowTheLastHandler(t *testing.T) {
	port := freePort(t)
	st := memoryStore().block(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	route {
		rate_limit {
			tree outer {
				tier all global {
					limit 1000/min
				}
			}
			%s
		}
		rate_limit {
			tree inner {
				tier user {header.X-User} {
					limit 1/min
				}
			}
			use_error_routes
			%s
		}
		respond "ok {http.rate_limit.tier}"
	}
	handle_errors {
		respond "blocked_by={http.rate_limit.blocked_by} allowed={http.rate_limit.allowed} zone={http.rate_limit.exceeded.name}" 429
	}
}`, port, st, st))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if r := do(t, "GET", url, "X-User: u"); r.body != "ok user" {
		t.Fatalf("admitted: status %d body %q, want the inner handler's tier", r.status, r.body)
	}
	if r := do(t, "GET", url, "X-User: u"); r.body != "blocked_by=inner/user allowed=false zone=inner" {
		t.Fatalf("status %d, body %q; want blocked_by=inner/user allowed=false zone=inner", r.status, r.body)
	}
}

// TestPlaceholdersOfANamedRouteInvokedTwice: a handler in a named route
// invoked twice in one request decides twice, and the placeholders show
// its second decision, though it is the only rate_limit handler.
func TestPlaceholdersOfANamedRouteInvokedTwice(t *testing.T) {
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
&(limited) {
	rate_limit {
		tree twice {
			tier user {header.X-User} {
				limit 10/min
			}
		}
		%s
	}
}

http://127.0.0.1:%d {
	route {
		invoke limited
		invoke limited
		respond "remaining={http.rate_limit.remaining}"
	}
}`, memoryStore().block(t), port))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if r := do(t, "GET", url, "X-User: u"); r.body != "remaining=8" {
		t.Fatalf("status %d body %q, want remaining=8 (the second of two decisions)", r.status, r.body)
	}
}

// TestPlaceholdersRefusedOnly: with placeholders refused, an admitted
// request publishes none (an earlier handler's stay), and a refused one,
// one passed over its limit in mode shadow, or one held for its turn
// (max_wait: its wait may end in a refusal) publishes them as by default.
func TestPlaceholdersRefusedOnly(t *testing.T) {
	port := freePort(t)
	st := memoryStore().block(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	route /held {
		rate_limit {
			tree held {
				tier user {header.X-User} {
					limit 2/s
				}
			}
			max_wait 2s
			placeholders refused
			%s
		}
		respond "allowed={http.rate_limit.allowed} reason={http.rate_limit.reason}"
	}
	route /shadow {
		rate_limit {
			zone quiet {
				key {http.request.header.X-User}
				events 1
				window 1m
			}
			mode shadow
			placeholders refused
			%s
		}
		respond "allowed={http.rate_limit.allowed} reason={http.rate_limit.reason}"
	}
	route /earlier {
		rate_limit {
			tree outer {
				tier all global {
					limit 1000/min
				}
			}
			%s
		}
		rate_limit {
			zone inner {
				key {http.request.header.X-User}
				events 1
				window 1m
			}
			placeholders refused
			%s
		}
		respond "tier={http.rate_limit.tier}"
	}
	route {
		rate_limit {
			zone myzone {
				key {http.request.header.X-User}
				events 1
				window 1m
			}
			placeholders refused
			use_error_routes
			%s
		}
		respond "remaining={http.rate_limit.remaining}"
	}
	handle_errors {
		respond "zone={http.rate_limit.exceeded.name} remaining={http.rate_limit.remaining}" 429
	}
}`, port, st, st, st, st, st))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	for i, want := range []string{ // a burst of 2, then half a second's wait
		"allowed={http.rate_limit.allowed} reason={http.rate_limit.reason}",
		"allowed={http.rate_limit.allowed} reason={http.rate_limit.reason}",
		"allowed=true reason=ok",
	} {
		if r := do(t, "GET", url+"/held", "X-User: h"); r.status != 200 || r.body != want {
			t.Fatalf("held route, request %d: status %d body %q, want %q", i+1, r.status, r.body, want)
		}
	}
	if r := do(t, "GET", url+"/", "X-User: u"); r.status != 200 || r.body != "remaining={http.rate_limit.remaining}" {
		t.Fatalf("admitted: status %d body %q, want no placeholder published", r.status, r.body)
	}
	if r := do(t, "GET", url+"/", "X-User: u"); r.status != 429 || r.body != "zone=myzone remaining=0" {
		t.Fatalf("refused: status %d body %q, want zone=myzone remaining=0", r.status, r.body)
	}
	if r := do(t, "GET", url+"/shadow", "X-User: s"); r.body != "allowed={http.rate_limit.allowed} reason={http.rate_limit.reason}" {
		t.Fatalf("shadow, within the limit: body %q, want no placeholder published", r.body)
	}
	if r := do(t, "GET", url+"/shadow", "X-User: s"); r.status != 200 || r.body != "allowed=false reason=limited" {
		t.Fatalf("shadow, over the limit: status %d body %q, want allowed=false reason=limited", r.status, r.body)
	}
	if r := do(t, "GET", url+"/earlier", "X-User: e"); r.status != 200 || r.body != "tier=all" {
		t.Fatalf("two handlers: status %d body %q, want the first handler's tier (all)", r.status, r.body)
	}
}

// TestMholtExceededNamePlaceholder: mholt/caddy-ratelimit's
// {http.rate_limit.exceeded.name} names the zone that refused.
func TestMholtExceededNamePlaceholder(t *testing.T) {
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		zone myzone {
			key {remote_host}
			events 1
			window 1m
		}
		use_error_routes
		%s
	}
	respond "ok"
	handle_errors {
		respond "zone={http.rate_limit.exceeded.name}" 429
	}
}`, port, memoryStore().block(t)))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if r := do(t, "GET", url); r.status != 200 {
		t.Fatalf("first request: %d", r.status)
	}
	if r := do(t, "GET", url); r.body != "zone=myzone" {
		t.Fatalf("status %d body %q, want zone=myzone", r.status, r.body)
	}
}

// TestPolicyHeaderNamesAndWindows: q/w is each limit's sustained rate (a
// burst advertises its refill time), and a tier name two trees share is
// qualified by the tree.
func TestPolicyHeaderNamesAndWindows(t *testing.T) {
	url := site(t, `
	tree a {
		tier user {header.X-User} {
			limit 10/min burst 100
		}
	}
	tree b {
		tier user {header.X-User} {
			limit 3/min
		}
	}
`+memoryStore().block(t))
	r := do(t, "GET", url, "X-User: u")
	want := `"a/user";q=100;w=600, "b/user";q=3;w=60`
	if p := r.header.Get("RateLimit-Policy"); p != want {
		t.Errorf("RateLimit-Policy: %s\nwant %s", p, want)
	}
	if rl := r.header.Get("RateLimit"); !strings.HasPrefix(rl, `"b/user";r=2;`) {
		t.Errorf("RateLimit: %s, want the b/user policy", rl)
	}
}

// storeSites is a Caddyfile of two rate_limit handlers, /a and /b, that
// share the memory store name, with the given option lines (max_keys …)
// each. They are routes of one server, or with twoServers two sites on
// ports[0] and ports[1]; extra goes into /a's route (a broken handler).
func storeSites(ports [2]int, twoServers bool, name string, opts [2]string, extra string) string {
	handler := func(tree, opt string) string {
		return fmt.Sprintf(`rate_limit {
			tree %s {
				tier user {header.X-User} {
					limit 1/h
				}
			}
			store memory {
				name %s
				%s
			}
		}`, tree, name, opt)
	}
	if twoServers {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\t%s\n\t%s\n\trespond \"a\"\n}\nhttp://127.0.0.1:%d {\n\t%s\n\trespond \"b\"\n}",
			ports[0], handler("a", opts[0]), extra, ports[1], handler("b", opts[1]))
	}
	return fmt.Sprintf("http://127.0.0.1:%d {\n\troute /a {\n\t%s\n\t%s\n\trespond \"a\"\n\t}\n\troute /b {\n\t%s\n\trespond \"b\"\n\t}\n}",
		ports[0], handler("a", opts[0]), extra, handler("b", opts[1]))
}

// evicted tells whether a user's bucket (limit 1/h) is lost once 2,000
// other users have come: whether the store's cap is far below 2,000.
func evicted(t *testing.T, url string) bool {
	t.Helper()
	if r := do(t, "GET", url, "X-User: victim"); r.status != 200 {
		t.Fatalf("first request: %d", r.status)
	}
	for i := 0; i < 2000; i++ {
		do(t, "GET", url, fmt.Sprintf("X-User: u%d", i))
	}
	return do(t, "GET", url, "X-User: victim").status != http.StatusTooManyRequests
}

// TestStoreSettingsOfTheLiveConfig: a shared memory store's settings are
// those of the live configuration as a whole. On a first load they apply
// at once, whichever handler gives them and on whichever server (each has
// its own context). After a reload they apply once any handler of the new
// configuration serves: a raised cap, a dropped setting (back to its
// default), a setting on a route that has not served yet. A reload that
// fails changes nothing, and two handlers of one configuration cannot
// disagree.
func TestStoreSettingsOfTheLiveConfig(t *testing.T) {
	const brokenHandler = "rate_limit {\n tree x {\n tier all k {\n limit 10/min\n }\n }\n store redis {\n key_prefix {x}\n }\n }"
	for _, tc := range []struct {
		name         string
		twoServers   bool
		first, after [2]string // the option lines of /a and /b, before and after the reload
		reload       bool
		broken       bool   // the reload fails to provision
		serve        string // the handler that serves: a or b
		evicted      bool
	}{
		{"first load: a cap set by a handler that does not serve", true, [2]string{"", "max_keys 64"}, [2]string{}, false, false, "a", true},
		{"reload raises the cap", false, [2]string{"max_keys 64", ""}, [2]string{"max_keys 1000000", ""}, true, false, "a", false},
		{"reload drops the setting: the default", false, [2]string{"max_keys 64", ""}, [2]string{"", ""}, true, false, "b", false},
		{"reload sets it on a route that has not served", false, [2]string{"max_keys 64", ""}, [2]string{"max_keys 1000000", ""}, true, false, "b", false},
		{"a reload that fails changes nothing", false, [2]string{"max_keys 1000000", ""}, [2]string{"max_keys 64", ""}, true, true, "b", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ports, name := [2]int{freePort(t), freePort(t)}, fmt.Sprintf("live%d", testSeq.Add(1))
			startCaddy(t, storeSites(ports, tc.twoServers, name, tc.first, ""))
			if tc.reload {
				extra := ""
				if tc.broken {
					extra = brokenHandler
				}
				if err := reload(t, storeSites(ports, tc.twoServers, name, tc.after, extra)); (err != nil) != tc.broken {
					t.Fatalf("reload: %v (want it to fail: %v)", err, tc.broken)
				}
			}
			url := fmt.Sprintf("http://127.0.0.1:%d/%s", ports[0], tc.serve)
			if tc.twoServers && tc.serve == "b" {
				url = fmt.Sprintf("http://127.0.0.1:%d/", ports[1])
			}
			if got := evicted(t, url); got != tc.evicted {
				t.Fatalf("a user's bucket evicted after 2,000 others: %v, want %v", got, tc.evicted)
			}
		})
	}
	t.Run("two handlers disagree", func(t *testing.T) {
		sites := storeSites([2]int{freePort(t)}, false, "disagree", [2]string{"max_keys 64", "max_keys 128"}, "")
		cfg, err := adapt(t, globalOptions("")+sites)
		if err == nil {
			err = caddy.Validate(mustConfig(t, cfg))
		}
		if err == nil || !strings.Contains(err.Error(), "max_keys 128 here, 64 in another handler") {
			t.Fatalf("error %v, want one naming both values", err)
		}
	})
	t.Run("two handlers disagree on max_replay_bytes", func(t *testing.T) {
		sites := storeSites([2]int{freePort(t)}, false, "disagree2", [2]string{"max_replay_bytes 1MiB", "max_replay_bytes 2MiB"}, "")
		cfg, err := adapt(t, globalOptions("")+sites)
		if err == nil {
			err = caddy.Validate(mustConfig(t, cfg))
		}
		if err == nil || !strings.Contains(err.Error(), "max_replay_bytes 2097152 here, 1048576 in another handler") {
			t.Fatalf("error %v, want one naming both values", err)
		}
	})
}
