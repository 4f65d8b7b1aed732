package cascade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// provisionJSON provisions a handler from its JSON config on a memory store
// of its own.
func provisionJSON(t *testing.T, cfg string) *Handler {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return provisionIn(t, ctx, cfg)
}

// provisionIn provisions a handler from its JSON config in ctx: handlers
// provisioned in one context are one configuration's.
func provisionIn(t *testing.T, ctx caddy.Context, cfg string) *Handler {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(cfg), h); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	return h
}

var placeholderNames = []string{"allowed", "reason", "blocked_by", "retry_after", "policy", "tier", "limit", "remaining", "reset"}

// readPlaceholders renders every {http.rate_limit.*} placeholder.
func readPlaceholders(repl *caddy.Replacer) map[string]string {
	out := map[string]string{}
	for _, name := range placeholderNames {
		out[name] = repl.ReplaceAll("{http.rate_limit."+name+"}", "")
	}
	return out
}

// TestPlaceholdersOutliveTheRequest: Caddy reads the placeholders after
// ServeHTTP has returned (access logs), when the decision's pooled memory
// already serves other requests. Each request's placeholders must still
// show its own decision, read however late, while other requests (with
// other paths, limits and outcomes) run concurrently.
func TestPlaceholdersOutliveTheRequest(t *testing.T) {
	h := provisionJSON(t, `{
		"trees": [{"name": "pool", "tiers": [
			{"name": "org", "key": "{http.request.header.X-Org}", "limits": [{"count": 1000, "per": "h"}]},
			{"name": "user", "key": "{http.request.header.X-User}", "limits": [{"count": 3, "per": "min"}],
			 "values": {"vip": {"limits": [{"count": 50, "per": "s"}, {"count": 500, "per": "h"}]}}}
		]}],
		"store": {"memory": {"name": "TestPlaceholdersOutliveTheRequest"}}
	}`)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	serve := func(org, user string) (*caddy.Replacer, int) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Org", org)
		r.Header.Set("X-User", user)
		repl := caddy.NewReplacer()
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Error(err)
		}
		return repl, w.Code
	}

	const workers, rounds = 4, 50
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			type kept struct {
				repl *caddy.Replacer
				want map[string]string
			}
			var all []kept
			for i := 0; i < rounds; i++ {
				user := fmt.Sprintf("u%d-%d", g, i%5) // limited after 3 requests a minute
				if i%3 == 0 {
					user = "vip"
				}
				repl, _ := serve(fmt.Sprintf("o%d", g), user)
				all = append(all, kept{repl, readPlaceholders(repl)})
			}
			for i, k := range all { // read again, long after other requests reused the memory
				if got := readPlaceholders(k.repl); fmt.Sprint(got) != fmt.Sprint(k.want) {
					t.Errorf("worker %d request %d: placeholders changed after the request:\n got %v\nwant %v", g, i, got, k.want)
				}
			}
		}()
	}
	wg.Wait()

	// And the values are the decision's own.
	repl, code := serve("fresh", "alice")
	got := readPlaceholders(repl)
	want := map[string]string{"allowed": "true", "reason": "ok", "blocked_by": "", "retry_after": "0",
		"policy": "user", "tier": "user", "limit": "3", "remaining": "2", "reset": "20"}
	if code != 200 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allowed: code %d\n got %v\nwant %v", code, got, want)
	}
	serve("fresh", "alice")
	serve("fresh", "alice")
	repl, code = serve("fresh", "alice")
	serve("fresh", "vip") // reuses the memory with another path
	got = readPlaceholders(repl)
	want = map[string]string{"allowed": "false", "reason": "limited", "blocked_by": "pool/user", "retry_after": "20",
		"policy": "user", "tier": "user", "limit": "3", "remaining": "0", "reset": "60"}
	if code != 429 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("denied: code %d\n got %v\nwant %v", code, got, want)
	}
}

// TestPlaceholdersOfHandlersAloneOrNot: a handler alone in its
// configuration publishes its placeholders without touching the request's
// variables; two handlers of one configuration on one request mark them,
// and the placeholders show the second one's decision; a handler whose
// configuration is unloaded is not alone.
func TestPlaceholdersOfHandlersAloneOrNot(t *testing.T) {
	handler := func(tree string, count int) string {
		return fmt.Sprintf(`{"trees": [{"name": %q, "tiers": [{"name": "user", "key": "{http.request.header.X-User}",
			"limits": [{"count": %d, "per": "min"}]}]}], "store": {"memory": {"name": %q}}}`, tree, count, t.Name()+tree)
	}
	serve := func(handlers ...*Handler) (map[string]any, *caddy.Replacer) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "u")
		repl := caddy.NewReplacer()
		vars := map[string]any{}
		ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
		r = r.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, vars))
		var next caddyhttp.Handler = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
		for i := len(handlers) - 1; i >= 0; i-- {
			h, n := handlers[i], next
			next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, n) })
		}
		if err := next.ServeHTTP(httptest.NewRecorder(), r); err != nil {
			t.Fatal(err)
		}
		return vars, repl
	}

	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	alone := provisionIn(t, ctx, handler("alone", 1))
	vars, repl := serve(alone)
	if _, marked := vars[placeholdersVar]; marked || !alone.alone() {
		t.Fatalf("a handler alone in its configuration: alone() %v, variables %v; want true and untouched", alone.alone(), vars)
	}
	if got := readPlaceholders(repl); got["tier"] != "user" || got["allowed"] != "true" || got["limit"] != "1" {
		t.Fatalf("alone: placeholders %v", got)
	}

	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel2()
	first, second := provisionIn(t, ctx2, handler("first", 1000)), provisionIn(t, ctx2, handler("second", 1))
	serve(first, second) // spends second's one request a minute
	vars, repl = serve(first, second)
	if first.alone() || second.alone() {
		t.Fatal("two handlers of one configuration: each thinks it is alone")
	}
	if _, marked := vars[placeholdersVar]; !marked {
		t.Fatalf("two handlers: the variables lack the mark: %v", vars)
	}
	if got := readPlaceholders(repl); got["blocked_by"] != "second/user" || got["allowed"] != "false" {
		t.Fatalf("two handlers: placeholders %v; want the second handler's refusal", got)
	}

	// A configuration being unloaded: its other handlers may already have
	// left package running, so none is alone (nor remembers being so).
	ctx3, cancel3 := caddy.NewContext(caddy.Context{Context: context.Background()})
	leaving := provisionIn(t, ctx3, handler("leaving", 1))
	cancel3()
	if leaving.alone() || leaving.config.company.Load() != 0 {
		t.Fatalf("a handler of an unloaded configuration: alone %v, company %d", leaving.alone(), leaving.config.company.Load())
	}
}

// TestHeaderCacheMatchesFormatting: the header values cached per path are
// those formatted afresh, for more paths than the cache has slots (so
// paths collide and replace each other), with overrides, skipped tiers,
// several limits per tier and denials.
func TestHeaderCacheMatchesFormatting(t *testing.T) {
	values := map[string]any{}
	for i := 0; i < 100; i++ {
		values[fmt.Sprintf("u%d", i)] = map[string]any{"limits": []any{map[string]any{"count": i + 1, "per": "h"}}}
	}
	cfg, _ := json.Marshal(map[string]any{
		"trees": []any{map[string]any{"name": "hc", "tiers": []any{
			map[string]any{"name": "org", "key": "{http.request.header.X-Org}", "limits": []any{map[string]any{"count": 1000000, "per": "h"}}},
			map[string]any{"name": "user", "key": "{http.request.header.X-User}", "values": values,
				"limits": []any{map[string]any{"count": 5, "per": "min"}, map[string]any{"count": 50, "per": "h"}}},
			map[string]any{"name": "agent", "key": "{http.request.header.X-Agent}", "missing": "skip",
				"limits": []any{map[string]any{"count": 7, "per": "s"}}},
		}}},
		"headers": map[string]any{"openai": true},
		"store":   map[string]any{"memory": map[string]any{"name": t.Name()}},
	})
	h := provisionJSON(t, string(cfg))
	denied := 0
	for round := 0; round < 3; round++ {
		for i := 0; i < 130; i++ {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-Org", "o")
			r.Header.Set("X-User", fmt.Sprintf("u%d", i))
			if i%2 == 0 {
				r.Header.Set("X-Agent", fmt.Sprintf("a%d", i%3))
			}
			var d decision
			if status, err := h.decide(r, caddy.NewReplacer(), &d); status != 0 || err != nil {
				t.Fatal(status, err)
			}
			if !d.Allowed {
				denied++
			}
			got := http.Header{}
			d.WriteHeaders(got)
			d.Scaled = true // as if the adaptive factor had scaled a limit: formatted afresh
			want := http.Header{}
			d.WriteHeaders(want)
			d.Release()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("round %d, user u%d:\n got %v\nwant %v", round, i, got, want)
			}
			if i < 100 && !strings.Contains(got.Get("RateLimit-Policy"), fmt.Sprintf(`"user";q=%d;w=3600`, i+1)) {
				t.Fatalf("user u%d: RateLimit-Policy %q lacks its override", i, got.Get("RateLimit-Policy"))
			}
		}
	}
	if denied == 0 {
		t.Fatal("no denial exercised")
	}
}

// TestDirectHandlers: which handlers decide with nothing but their one
// tree's path (decide's direct shortcut): any matcher, cost, idempotency
// key, wait, decision endpoint or model to read takes the general steps.
func TestDirectHandlers(t *testing.T) {
	user := `{"name": "user", "key": "{http.request.header.X-User}", "limits": [{"count": 2, "per": "min"}]}`
	tree := `{"name": "api", "tiers": [` + user + `]}`
	for _, tc := range []struct {
		name, cfg string
		direct    bool
	}{
		{"one tree", `"trees": [` + tree + `]`, true},
		{"two tiers", `"trees": [{"name": "api", "tiers": [{"name": "org", "key": "{http.request.header.X-Org}", "limits": [{"count": 9, "per": "min"}]}, ` + user + `]}]`, true},
		{"an mholt zone", `"rate_limits": {"users": {"key": "{http.request.header.X-User}", "window": 60000000000, "max_events": 2}}`, true},
		{"charged by outcome", `"trees": [` + tree + `], "charge_on": {"status": [200]}`, true},
		{"two trees", `"trees": [` + tree + `, {"name": "other", "tiers": [` + user + `]}]`, false},
		{"a matcher", `"trees": [{"name": "api", "match": [{"path": ["/a*"]}], "tiers": [` + user + `]}]`, false},
		{"waiting", `"trees": [` + tree + `], "max_wait": 1000000000`, false},
		{"a cost", `"trees": [` + tree + `], "costs": [{"dimension": "tokens", "value": "{http.request.header.X-Tokens}"}]`, false},
		{"idempotency keys", `"trees": [` + tree + `], "idempotency": {"ttl": 600000000000}`, false},
		{"a decision endpoint", `"trees": [` + tree + `], "forwarded": {}`, false},
		{"a model key", `"trees": [{"name": "api", "tiers": [{"name": "model", "key": "{http.rate_limit.model}", "limits": [{"count": 2, "per": "min"}]}]}]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionJSON(t, fmt.Sprintf(`{%s, "store": {"memory": {"name": %q}}}`, tc.cfg, t.Name()))
			if h.direct != tc.direct {
				t.Fatalf("direct: %v, want %v", h.direct, tc.direct)
			}
		})
	}
}

// TestOneTierHandlers: a handler of one tree of one tier with one limit
// (the engine decides its paths on its single-bucket path, see
// engine.decideSingle; TestSingleRefuses says which) decides by the
// request's value of its key, whether a header or another placeholder:
// each value's limit of 2 admits two requests and refuses the third.
func TestOneTierHandlers(t *testing.T) {
	tree := func(tiers string) string {
		return fmt.Sprintf(`{"name": "api", "tiers": [%s]}`, tiers)
	}
	tier := func(name, key string) string {
		return fmt.Sprintf(`{"name": %q, "key": %q, "limits": [{"count": 2, "per": "min"}]}`, name, key)
	}
	byUser, byPath := tier("user", "{http.request.header.X-User}"), tier("path", "{http.request.uri.path}")
	for _, tc := range []struct{ name, cfg string }{
		{"a tier keyed by a header", `"trees": [` + tree(byUser) + `]`},
		{"a tier keyed by another placeholder", `"trees": [` + tree(byPath) + `]`}, // X-User then varies
		{"an mholt zone", `"rate_limits": {"users": {"key": "{http.request.header.X-User}", "window": 60000000000, "max_events": 2}}`},
		{"charged by outcome", `"trees": [` + tree(byUser) + `], "charge_on": {"status": [200]}`},
		{"a cost of another dimension", `"trees": [` + tree(byUser) + `], "costs": [{"dimension": "tokens", "value": "{http.request.header.X-Tokens}"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionJSON(t, fmt.Sprintf(`{%s, "store": {"memory": {"name": %q}}}`, tc.cfg, t.Name()))
			for _, value := range []string{"/a", "/b"} { // the path, and the header X-User
				for i, want := range []int{200, 200, 429} {
					r := httptest.NewRequest("GET", value, nil)
					r.Header.Set("X-User", value)
					if strings.Contains(tc.cfg, "uri.path") {
						r.Header.Set("X-User", fmt.Sprint(i)) // a key read from the header would never refuse
					}
					r.Header.Set("X-Org", "o")
					repl := caddyhttp.NewTestReplacer(r)
					r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
					w := httptest.NewRecorder()
					next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
						w.WriteHeader(200)
						return nil
					})
					err := h.ServeHTTP(w, r, next)
					status := w.Code
					var he caddyhttp.HandlerError
					if errors.As(err, &he) {
						status = he.StatusCode
					} else if err != nil {
						t.Fatal(err)
					}
					if status != want {
						t.Fatalf("%s, request %d: status %d, want %d", value, i+1, status, want)
					}
				}
			}
		})
	}
}
