package cascade

// Attack tests of plans and entitlements: each fails while the weakness it
// names is there.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/entitle"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

// attackTokensTree: the org tier's pro plan limits requests and tokens.
const attackTokensTree = `
		tree api {
			plan {http.rate_limit.entitlement.customers.plan} default free
			tier org {header.X-Org} {
				plan pro {
					limit 100/day
					limit 10 tokens/day
				}
				limit 100/day
			}
		}
		cost tokens {header.X-Tokens} default 0
`

// TestPlansOwnLimitsKeepOtherDimensions: a value's own limits, from the
// source or set at runtime, and a runtime override, replace the plan's
// limits of the dimensions they name only: the plan's tokens limit stays.
func TestPlansOwnLimitsKeepOtherDimensions(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "entitlements.json")
	writeAtomically(t, file, `{
	"acme":    {"plan": "pro"},
	"initech": {"plan": "pro", "limits": [{"count": 100, "per": "day"}]},
	"hooli":   {"plan": "pro"}
}`)
	site, api := adminSiteThen(t, fmt.Sprintf(`
		entitlements customers {
			source file %s
			key org
		}
%s
		%s`, file, attackTokensTree, memoryStore().block(t)), `respond "ok" 200`)

	tokens := func(org string) int {
		return admitUntilRefused(t, 2, []string{site}, "X-Org: "+org, "X-Tokens: 4")
	}
	if got := tokens("acme"); got != 2 {
		t.Fatalf("acme (pro) admitted %d requests of 4 tokens, want 2 (10 tokens/day)", got)
	}
	if got := tokens("initech"); got != 2 {
		t.Errorf("initech (pro, own limit of requests only) admitted %d requests of 4 tokens, want 2: "+
			"its own requests limit lifted pro's 10 tokens/day", got)
	}

	// The same at runtime: an entitlement with a requests limit lifts the
	// tokens limit.
	if code, body := call(t, "PUT", api+"/rate_limit/entitlements/customers/globex", `{"plan":"pro","limits":[{"count":100,"per":"day"}]}`, nil); code != 200 {
		t.Fatalf("PUT entitlement: %d %s", code, body)
	}
	// And an override of a pro value: keepsDimensions compares it with the
	// tier's own limits, not with the plan's, so it is accepted.
	code, body := call(t, "PUT", api+"/rate_limit/overrides/api/org/hooli", `{"limits":[{"count":100,"per":"day"}]}`, nil)
	t.Logf("override of hooli (pro) with only a requests limit: %d", code)
	time.Sleep(200 * time.Millisecond)
	if got := tokens("globex"); got != 2 {
		t.Errorf("globex (runtime entitlement: pro, own requests limit) admitted %d requests of 4 tokens, want 2: "+
			"the runtime entitlement lifted pro's 10 tokens/day", got)
	}
	if got := tokens("hooli"); code == 200 && got != 2 {
		t.Errorf("hooli (pro, runtime override of requests only, accepted) admitted %d requests of 4 tokens, want 2: "+
			"the override lifted pro's 10 tokens/day, which keepsDimensions refuses for a tier's own limits (%.40s)", got, body)
	}
}

// TestPlansLookupsBounded: a flood of distinct values (random API keys)
// makes at most MaxLookups lookups at once at the source; the rest run on
// the default plan at once.
func TestPlansLookupsBounded(t *testing.T) {
	var inFlight, peak, calls atomic.Int64
	release := make(chan struct{})
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select { // a slow (or overloaded) service
		case <-release:
		case <-r.Context().Done():
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(svc.Close)
	t.Cleanup(func() { close(release) })

	url := planSite(t, fmt.Sprintf(`
		entitlements customers {
			source http %s/entitlements/{value}
			key org
			timeout 2s
		}
%s
		%s`, svc.URL, planTree, memoryStore().block(t)))

	const n = 300
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-Org", fmt.Sprintf("random-%d", i))
			req.Header.Set("X-Key", "k")
			<-start
			if res, err := httpClient(t).Do(req); err == nil {
				res.Body.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("%d requests of distinct orgs: %d lookups, %d at once at the service", n, calls.Load(), peak.Load())
	if p := peak.Load(); p > 64 {
		t.Errorf("%d lookups in flight at once at the entitlement service for %d requests: want a bound (at most 64)", p, n)
	}
}

// TestPlansHTTPTemplateEscaping: a value goes into an HTTP source's URL
// escaped for where it goes (a query parameter cannot add another, "." and
// ".." name no other path).
func TestPlansHTTPTemplateEscaping(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	answers := map[string]string{"globex": `{"plan":"enterprise"}`}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		mu.Unlock()
		orgs := r.URL.Query()["org"]
		if len(orgs) == 0 {
			http.NotFound(w, r)
			return
		}
		answer, ok := answers[orgs[len(orgs)-1]] // the last, as PHP and Rails read it
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, answer)
	}))
	t.Cleanup(svc.Close)

	t.Run("query", func(t *testing.T) {
		url := planSite(t, fmt.Sprintf(`
		entitlements customers {
			source http %s/lookup?org={value}
			key org
			timeout 2s
		}
%s
		%s`, svc.URL, planTree, memoryStore().block(t)))
		r := do(t, "GET", url, "X-Org: mallory&org=globex", "X-Key: k")
		mu.Lock()
		t.Logf("the service was asked %v", seen)
		mu.Unlock()
		if plan := r.header.Get("X-Plan"); plan == "enterprise" || quota(r, "org") == -1 {
			t.Errorf("org %q runs on %q (org quota %d): the client chose globex's plan for a bucket of its own", "mallory&org=globex", plan, quota(r, "org"))
		}
	})

	t.Run("dot segment", func(t *testing.T) {
		var paths []string
		src, err := entitle.NewHTTP(svc.URL+"/orgs/{value}/plan", entitle.HTTPOptions{Client: &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		seen = nil
		mu.Unlock()
		_, _, _ = src.Lookup(t.Context(), "..")
		mu.Lock()
		paths = append(paths, seen...)
		mu.Unlock()
		for _, p := range paths {
			u, _, _ := strings.Cut(p, "?")
			if clean := path.Clean(u); !strings.HasPrefix(clean, "/orgs/") {
				t.Errorf("value \"..\": the service was asked %s, which resolves to %s, outside /orgs/<value>/plan", p, clean)
			}
		}
	})
}

// TestPlansFileErrorsShowFingerprints: a bad entry of a file keyed by API
// keys (a sensitive tier) is logged by its fingerprint, never the key.
func TestPlansFileErrorsShowFingerprints(t *testing.T) {
	const secret = "sk_live_TOPSECRET0123456789"
	dir := t.TempDir()
	file, logFile := filepath.Join(dir, "entitlements.json"), filepath.Join(dir, "caddy.log")
	writeAtomically(t, file, `{"`+secret+`": {"plan": "pro"}}`)
	url := planSite(t, fmt.Sprintf(`
		entitlements customers {
			source file %s
			key key
		}
		tree api {
			plan {http.rate_limit.entitlement.customers.plan} default free
			tier key {header.X-Api-Key} {
				plan pro {
					limit 5/day
				}
				limit 2/day
			}
		}
		%s`, file, memoryStore().block(t)),
		fmt.Sprintf("log {\n\toutput file %s\n\tformat json\n\tlevel WARN\n}", logFile))
	if r := do(t, "GET", url, "X-Api-Key: "+secret); r.header.Get("X-Plan") != "pro" {
		t.Fatalf("the key's plan: %q, want pro", r.header.Get("X-Plan"))
	}
	writeAtomically(t, file, `{"`+secret+`": {"plan": "pro", "limits": [{"count": 5, "per": "day", "cuont": 1}]}}`)
	seenWithin(t, 10*time.Second, "the bad rewrite logged", func() bool {
		return len(logLines(t, logFile, "the file cannot be read")) > 0
	})
	if lines := logLines(t, logFile, secret); len(lines) > 0 {
		t.Errorf("a sensitive tier's value (an API key) is logged in clear: %s", lines[0])
	}
}

// TestPlansSourceFailuresLogged: a source that fails (a 500, a bad answer)
// is logged (at WARN, at most once a minute with a count), never silent.
func TestPlansSourceFailuresLogged(t *testing.T) {
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/acme") {
			fmt.Fprint(w, `{"plan": 5}`) // not an entitlement
			return
		}
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	t.Cleanup(svc.Close)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	url := planSite(t, fmt.Sprintf(`
		entitlements customers {
			source http %s/entitlements/{value}
			key org
			timeout 2s
		}
%s
		%s`, svc.URL, planTree, memoryStore().block(t)),
		fmt.Sprintf("log {\n\toutput file %s\n\tformat json\n\tlevel WARN\n}", logFile))
	for _, org := range []string{"acme", "globex"} {
		if r := do(t, "GET", url, "X-Org: "+org, "X-Key: k-"+org); r.status != 200 || r.header.Get("X-Plan") != "" {
			t.Fatalf("%s: %d, X-Plan %q: want 200 on the default plan", org, r.status, r.header.Get("X-Plan"))
		}
	}
	time.Sleep(500 * time.Millisecond)
	if lines := logLines(t, logFile, "entitle"); len(lines) == 0 {
		t.Errorf("the entitlement source failed for every lookup (500, a bad answer): nothing in the log at WARN")
	}
}

// TestPlansOwnLimitsBounded: the compiled own limits of values are kept
// for a bounded number of values, however many a source names.
func TestPlansOwnLimitsBounded(t *testing.T) {
	tree := &Tree{Tree: hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: "org", Key: "{x}", Limits: []*hierarchy.Limit{{Count: 10, Per: "h"}}}}}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	p := &planState{logger: zap.NewNop()}
	limits := []*hierarchy.Limit{{Count: 6, Per: "day"}}
	const n = entitle.DefaultMaxEntries + 10_000
	for v := range n {
		p.ownOverride(tree, tree.Tiers[0], "v"+strconv.Itoa(v), "", limits)
	}
	kept := 0
	p.own.Range(func(any, any) bool { kept++; return true })
	if kept > entitle.DefaultMaxEntries {
		t.Errorf("%d values' own limits kept compiled, more than the %d answers the cache itself may hold", kept, entitle.DefaultMaxEntries)
	}
}

// TestPlansMetrics: an entitlements block's cache is exported: requests by
// answer, lookups, values cached.
func TestPlansMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "entitlements.json")
	if err := os.WriteFile(path, []byte(`{"acme": {"plan": "pro"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	site, api := adminSite(t, fmt.Sprintf(`
		entitlements metered {
			source file %s
			key org
		}
		tree metered {
			plan {http.rate_limit.entitlement.metered.plan} default free
			tier org {header.X-Org} {
				plan free {
					limit 100/day
				}
				plan pro {
					limit 1000/day
				}
			}
		}
		%s`, path, memoryStore().block(t)))
	admitN(t, 3, site, "X-Org: acme")
	admitN(t, 1, site, "X-Org: nobody")
	_, body := call(t, "GET", api+"/metrics", nil, nil)
	for _, want := range []string{
		`cascade_entitlement_requests_total{answer="cached",entitlements="metered"} 2`,
		`cascade_entitlement_requests_total{answer="looked_up",entitlements="metered"} 2`,
		`cascade_entitlement_lookups_total{entitlements="metered",result="started"} 2`,
		`cascade_entitlement_lookups_total{entitlements="metered",result="failed"} 0`,
		`cascade_entitlement_cached{entitlements="metered"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics:\n%s", want, grepLines(body, "cascade_entitlement"))
		}
	}
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPlansFromNamedRedis: a redis source reads a Redis of its own (a
// named store), the handler's counters on the memory store.
func TestPlansFromNamedRedis(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := fmt.Sprintf("named%d", testSeq.Add(1))
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	if err := client.HSet(context.Background(), prefix+":org:acme", "plan", "pro").Err(); err != nil {
		t.Fatal(err)
	}
	site := site(t, fmt.Sprintf(`
		entitlements named {
			source redis %s:org:{value} store billing
			key org
		}
		tree named {
			plan {http.rate_limit.entitlement.named.plan} default free
			tier org {header.X-Org} {
				plan free {
					limit 1/day
				}
				plan pro {
					limit 3/day
				}
			}
		}
		store redis billing {
			address %s
		}
		%s`, prefix, srv.Addr(), memoryStore().block(t)))
	if n := admitN(t, 5, site, "X-Org: acme"); n != 3 {
		t.Fatalf("acme, pro in the named Redis: %d admitted, want 3", n)
	}
	if n := admitN(t, 5, site, "X-Org: other"); n != 1 {
		t.Fatalf("an org the named Redis does not know: %d admitted, want 1 (free)", n)
	}
}

// TestPlansPlaceholdersOfSourcesNotLookedUp: of a handler's several
// sources, only those a request looked up show as placeholders; another's
// stay unknown (a header that names one keeps its text), whichever others
// were looked up.
func TestPlansPlaceholdersOfSourcesNotLookedUp(t *testing.T) {
	dir := t.TempDir()
	sources := map[string]string{"a": "pro", "b": "gold", "c": "silver"}
	var ents []string
	for name, plan := range sources {
		file := filepath.Join(dir, name+".json")
		if err := os.WriteFile(file, []byte(fmt.Sprintf(`{"v%s": {"plan": %q, "who": %q}}`, name, plan, name)), 0o644); err != nil {
			t.Fatal(err)
		}
		ents = append(ents, fmt.Sprintf(`{"name": %q, "source": {"file": %q}, "key": "k%s"}`, name, file, name))
	}
	tier := func(name string) string {
		return fmt.Sprintf(`{"name": "k%s", "key": "{http.request.header.X-%s}", "limits": [{"count": 1000, "per": "h"}]}`, name, name)
	}
	tests := []struct {
		name   string
		treeB  string // tree b's plan ("": none, so source b is not looked up)
		shown  []string
		hidden []string
	}{
		{"only a looked up", "", []string{"a"}, []string{"b", "c"}},
		{"a and b looked up", "{http.rate_limit.entitlement.b.plan}", []string{"a", "b"}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			treeB := fmt.Sprintf(`{"name": "tb", "tiers": [%s, %s]`, tier("b"), tier("c"))
			if tt.treeB != "" {
				treeB += fmt.Sprintf(`, "plan": %q, "default_plan": "free"`, tt.treeB)
			}
			cfg := fmt.Sprintf(`{"store": {"memory": {"name": %q}}, "entitlements": [%s], "trees": [
				{"name": "ta", "tiers": [%s], "plan": "{http.rate_limit.entitlement.a.plan}", "default_plan": "free"},
				%s}]}`, t.Name(), strings.Join(ents, ","), tier("a"), treeB)
			h := provisionJSON(t, cfg)
			r := httptest.NewRequest("GET", "/", nil)
			for name := range sources {
				r.Header.Set("X-"+name, "v"+name)
			}
			repl := caddy.NewReplacer()
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			if err := h.ServeHTTP(&headerWriter{hdr: http.Header{}}, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
				t.Fatal(err)
			}
			for _, name := range tt.shown {
				if v, ok := repl.Get("http.rate_limit.entitlement." + name + ".who"); !ok || v != name {
					t.Errorf("source %s looked up: who = %v, %v; want %q", name, v, ok, name)
				}
			}
			for _, name := range tt.hidden {
				if v, ok := repl.Get("http.rate_limit.entitlement." + name + ".plan"); ok {
					t.Errorf("source %s not looked up: plan = %q, known; want unknown", name, v)
				}
			}
		})
	}
}
