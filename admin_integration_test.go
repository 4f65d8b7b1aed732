package cascade

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/admin"
)

// adminSite runs a rate-limited site with Caddy's admin endpoint on a free
// port and returns the site's URL and the admin endpoint's.
func adminSite(t *testing.T, rateLimit string) (site, api string) {
	t.Helper()
	return adminSiteThen(t, rateLimit, `respond "ok" 200`)
}

// proxiedSite is adminSiteThen in front of upstream (host:port, or an
// http:// URL): rate_limit then reverse_proxy. It returns the site's URL
// without its trailing slash, and the admin endpoint's.
func proxiedSite(t *testing.T, upstream, rateLimit string) (site, api string) {
	t.Helper()
	site, api = adminSiteThen(t, rateLimit, "reverse_proxy "+strings.TrimPrefix(upstream, "http://"))
	return strings.TrimSuffix(site, "/"), api
}

// adminSiteThen is adminSite with then (a directive) after rate_limit.
func adminSiteThen(t *testing.T, rateLimit, then string) (site, api string) {
	t.Helper()
	port, adminPort := freePort(t), freePort(t)
	cf := fmt.Sprintf(`{
%s}
http://127.0.0.1:%d {
	rate_limit {
%s
	}
	%s
}
`, globals(adminPort), port, rateLimit, then)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d/", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)
}

// call sends an admin API request and decodes a 2xx answer into out.
func call(t *testing.T, method, url string, body any, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, url, rd)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 == 2 && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, url, raw, err)
		}
	}
	return res.StatusCode, string(raw)
}

const opsTree = `
		tree acme {
			tier org {header.X-Org} {
				limit 100/min
			}
			tier user {header.X-User} {
				limit 5/min
				value vip {
					limit 7/min
				}
			}
		}
`

// remainingOf inspects one path and returns each bucket's remaining count,
// by tier.
func remainingOf(t *testing.T, api, query string) (map[string]int64, admin.Buckets) {
	t.Helper()
	var b admin.Buckets
	if code, body := call(t, "GET", api+"/rate_limit/buckets?"+query, nil, &b); code != 200 {
		t.Fatalf("inspect %s: %d %s", query, code, body)
	}
	out := map[string]int64{}
	for _, bk := range b.Buckets {
		out[bk.Tier] = bk.Remaining
	}
	return out, b
}

func TestAdminInspectResetOverrideMode(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		site, api := adminSite(t, opsTree+storeBlock)
		alice := []string{"X-Org: acme", "X-User: alice"}
		if got := admitN(t, 3, site, alice...); got != 3 {
			t.Fatalf("admitted %d of 3", got)
		}

		// Inspect shows the exact remaining values, and charges nothing.
		for i := 0; i < 3; i++ {
			rem, b := remainingOf(t, api, "tree=acme&org=acme&user=alice")
			if rem["org"] != 97 || rem["user"] != 2 || !b.Allowed || b.RetryAfter != 0 {
				t.Fatalf("inspect %d: %v %+v", i, rem, b)
			}
		}
		_, b := remainingOf(t, api, "tree=acme&org=acme&user=alice&cost=3")
		if b.Allowed || b.RetryAfter <= 0 || b.RetryAfter > 12 || b.Buckets[1].RetryAfter != b.RetryAfter || b.Buckets[0].RetryAfter != 0 {
			t.Fatalf("a cost of 3: %+v", b)
		}
		if rem, _ := remainingOf(t, api, "tree=acme&org=acme"); len(rem) != 1 || rem["org"] != 97 {
			t.Fatalf("the org alone: %v", rem)
		}
		if got := admitN(t, 3, site, alice...); got != 2 {
			t.Fatalf("after inspecting, admitted %d of 3, want the 2 left", got)
		}

		// Reset alice's bucket: full again; the org's keeps its count.
		var reset admin.Reset
		if code, body := call(t, "POST", api+"/rate_limit/reset?tree=acme&org=acme&user=alice", nil, &reset); code != 200 || reset.Buckets != 1 {
			t.Fatalf("reset: %d %s", code, body)
		}
		if rem, _ := remainingOf(t, api, "tree=acme&org=acme&user=alice"); rem["user"] != 5 || rem["org"] != 95 {
			t.Fatalf("after the reset: %v", rem)
		}
		// Reset the org's subtree: the org and every user under it.
		admitN(t, 1, site, alice...)
		admitN(t, 1, site, "X-Org: acme", "X-User: bob")
		if code, body := call(t, "POST", api+"/rate_limit/reset?tree=acme&org=acme&below=1", nil, &reset); code != 200 || reset.Buckets != 3 {
			t.Fatalf("reset below: %d %s", code, body)
		}
		if rem, _ := remainingOf(t, api, "tree=acme&org=acme&user=bob"); rem["user"] != 5 || rem["org"] != 100 {
			t.Fatalf("after the subtree's reset: %v", rem)
		}

		// An override lowers alice's limit on the next request, and its
		// deletion restores it.
		var change admin.Change[json.RawMessage]
		if code, body := call(t, "PUT", api+"/rate_limit/overrides/acme/user/alice",
			`{"limits":[{"count":2,"per":"min"}],"note":"ticket 42"}`, &change); code != 200 || change.New == nil {
			t.Fatalf("put override: %d %s", code, body)
		}
		if got := admitN(t, 3, site, alice...); got != 2 {
			t.Fatalf("with an override of 2/min, admitted %d of 3", got)
		}
		if code, body := call(t, "DELETE", api+"/rate_limit/overrides/acme/user/alice", nil, &change); code != 200 || change.Old == nil {
			t.Fatalf("delete override: %d %s", code, body)
		}
		if got := admitN(t, 5, site, alice...); got != 3 {
			t.Fatalf("back to 5/min (2 used), admitted %d of 5, want 3", got)
		}
		// An override wins over the configuration's value block; a value
		// with ':' and unicode is escaped as on the request path.
		odd := "a:b/é"
		if code, body := call(t, "PUT", api+"/rate_limit/overrides/acme/user/"+url.PathEscape(odd), `{"limits":[{"count":1,"per":"min"}]}`, nil); code != 200 {
			t.Fatalf("put override: %d %s", code, body)
		}
		if got := admitN(t, 3, site, "X-Org: acme", "X-User: "+odd); got != 1 {
			t.Fatalf("%q with an override of 1/min: admitted %d", odd, got)
		}
		call(t, "PUT", api+"/rate_limit/overrides/acme/user/vip", `{"limits":[{"count":9,"per":"min"}]}`, nil)
		if got := admitN(t, 10, site, "X-Org: acme", "X-User: vip"); got != 9 {
			t.Fatalf("vip (7/min in the config, 9/min overridden): admitted %d", got)
		}
		var trees []admin.Tree
		call(t, "GET", api+"/rate_limit/trees", nil, &trees)
		if len(trees) != 1 || len(trees[0].Tiers) != 2 || len(trees[0].Tiers[1].Values) != 2 {
			t.Fatalf("trees: %+v", trees)
		}
		for _, v := range trees[0].Tiers[1].Values {
			if v.Value == "vip" && (v.Source != "override" || v.Configured == nil || v.Limits[0].Count != 9) {
				t.Fatalf("vip as listed: %+v", v)
			}
		}

		// Modes: shadow lets the over-limit request through silently, warn
		// with the headers, and deleting the mode enforces again.
		carol := []string{"X-Org: acme", "X-User: carol"}
		admitN(t, 5, site, carol...)
		if r := do(t, "GET", site, carol...); r.status != 429 {
			t.Fatalf("enforced: %d", r.status)
		}
		call(t, "PUT", api+"/rate_limit/mode/acme", `{"mode":"shadow","note":"rollout"}`, nil)
		if r := do(t, "GET", site, carol...); r.status != 200 || r.header.Get("RateLimit") != "" {
			t.Fatalf("shadow: %d %v", r.status, r.header)
		}
		call(t, "PUT", api+"/rate_limit/mode/acme", `{"mode":"warn"}`, nil)
		if r := do(t, "GET", site, carol...); r.status != 200 || r.header.Get("RateLimit") == "" {
			t.Fatalf("warn: %d %v", r.status, r.header)
		}
		call(t, "GET", api+"/rate_limit/trees", nil, &trees)
		if trees[0].Mode != "warn" || trees[0].ConfiguredMode != "enforce" {
			t.Fatalf("modes listed: %s / %s", trees[0].Mode, trees[0].ConfiguredMode)
		}
		call(t, "DELETE", api+"/rate_limit/mode/acme", nil, nil)
		if r := do(t, "GET", site, carol...); r.status != 429 {
			t.Fatalf("enforced again: %d", r.status)
		}

		// The most-denied keys.
		var top admin.Top
		call(t, "GET", api+"/rate_limit/top?n=5", nil, &top)
		if top.Total == 0 || len(top.Keys) == 0 || top.Keys[0].Tree != "acme" {
			t.Fatalf("top: %+v", top)
		}
	})
}

// TestAdminOverrideExpires: an override that expires is gone by itself.
func TestAdminOverrideExpires(t *testing.T) {
	site, api := adminSite(t, opsTree+memoryStore().block(t))
	// Far enough ahead that the six requests below are sent before it on
	// a busy machine.
	expires := time.Now().Add(5 * time.Second).UTC().Format(time.RFC3339Nano)
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/acme/user/dave",
		fmt.Sprintf(`{"unlimited":true,"expires":%q}`, expires), nil); code != 200 {
		t.Fatalf("put: %d %s", code, body)
	}
	dave := []string{"X-Org: acme", "X-User: dave"}
	if got := admitN(t, 6, site, dave...); got != 6 {
		t.Fatalf("unlimited: admitted %d of 6", got)
	}
	eventually(t, 5*time.Second+propagation, func() bool {
		var o admin.Overrides
		call(t, "GET", api+"/rate_limit/overrides", nil, &o)
		return len(o.Overrides) == 0
	}, "the expired override to go")
	if got := admitN(t, 6, site, dave...); got != 5 {
		t.Fatalf("after expiry: admitted %d of 6, want 5", got)
	}
}

// TestAdminBadInput: every route refuses bad input with a 4xx that says
// what to fix, and changes nothing.
func TestAdminBadInput(t *testing.T) {
	_, api := adminSite(t, opsTree+memoryStore().block(t))
	big := `{"note":"` + strings.Repeat("x", 1<<20) + `"}`
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		method, path, body string
		status             int
		says               string
	}{
		{"GET", "/rate_limit/buckets?tree=nope&org=a", "", 404, "its trees are acme"},
		{"GET", "/rate_limit/buckets?org=a", "", 400, "no tree"},
		{"GET", "/rate_limit/buckets?tree=acme&usr=a", "", 400, "its tiers are org, user"},
		{"GET", "/rate_limit/buckets?tree=acme&user=a", "", 400, "needs the value of tier org"},
		{"GET", "/rate_limit/buckets?tree=acme&org=a&cost=-1", "", 400, "whole number"},
		{"GET", "/rate_limit/buckets?tree=acme&org=a&cost.tokens=5", "", 400, "counts no tokens"},
		{"POST", "/rate_limit/reset?tree=acme&org=a&below=maybe", "", 400, "below=1"},
		{"GET", "/rate_limit/reset?tree=acme&org=a", "", 405, "POST"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"limits":[{"count":5,"per":"min"}`, 400, "JSON"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"limits":[{"count":-5,"per":"min"}]}`, 400, "count"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"limits":[{"count":5,"per":"fortnight"}]}`, 400, "fortnight"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"limits":[{"count":5,"per":"min","dimension":"tokens"}]}`, 400, "no cost for tokens"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{}`, 400, "no limits"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"limits":[null]}`, 400, "limit 1 is null"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"unlimited":true,"limits":[{"count":5,"per":"min"}]}`, 400, "exclusive"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"unlimited":true,"expires":"` + past + `"}`, 400, "in the past"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"unlimited":true,"expires":"tomorrow"}`, 400, "RFC 3339"},
		{"PUT", "/rate_limit/overrides/acme/user/x", `{"unlimited":true,"colour":"red"}`, 400, "colour"},
		{"PUT", "/rate_limit/overrides/acme/user/x", big, 413, "KiB"},
		{"PUT", "/rate_limit/overrides/acme/team/x", `{"unlimited":true}`, 400, "no tier \"team\""},
		{"PUT", "/rate_limit/overrides/nope/user/x", `{"unlimited":true}`, 404, "its trees are acme"},
		{"PUT", "/rate_limit/overrides/acme/user", `{"unlimited":true}`, 400, "<tree>/<tier>/<value>"},
		{"PUT", "/rate_limit/mode/acme", `{"mode":"loud"}`, 400, "enforce, warn or shadow"},
		{"PUT", "/rate_limit/mode/nope", `{"mode":"warn"}`, 404, "its trees are acme"},
		{"GET", "/rate_limit/top?n=0", "", 400, "from 1"},
	}
	for _, tt := range tests {
		code, body := call(t, tt.method, api+tt.path, tt.body, nil)
		var e struct{ Error string }
		if json.Unmarshal([]byte(body), &e) == nil && e.Error != "" {
			body = e.Error
		}
		if code != tt.status || !strings.Contains(body, tt.says) {
			t.Errorf("%s %s: %d %s; want %d saying %q", tt.method, tt.path, code, truncate(body, 300), tt.status, tt.says)
		}
	}
	var o admin.Overrides
	call(t, "GET", api+"/rate_limit/overrides", nil, &o)
	if len(o.Overrides) != 0 || len(o.Modes) != 0 {
		t.Fatalf("bad input changed the state: %+v", o)
	}
}

// cli runs `caddy rate-limit args…` against the admin API at api and
// returns what it printed, failing t if it fails.
func cli(t *testing.T, api string, args ...string) string {
	t.Helper()
	cmd := admin.NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--address", strings.TrimPrefix(api, "http://")))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// TestCLI runs `caddy rate-limit` against a running Caddy's admin API.
func TestCLI(t *testing.T) {
	site, api := adminSite(t, opsTree+memoryStore().block(t))
	admitN(t, 2, site, "X-Org: acme", "X-User: alice")
	run := func(args ...string) string { t.Helper(); return cli(t, api, args...) }
	if out := run("inspect", "acme", "org=acme", "user=alice"); !strings.Contains(out, "3/5") || !strings.Contains(out, "98/100") || !strings.Contains(out, "would be admitted now") {
		t.Fatalf("inspect:\n%s", out)
	}
	if out := run("override", "set", "acme", "user", "alice", "--limit", "2/min", "--for", "1h", "--note", "cli"); !strings.Contains(out, "none → 2/min") {
		t.Fatalf("override set:\n%s", out)
	}
	if got := admitN(t, 2, site, "X-Org: acme", "X-User: alice"); got != 0 {
		t.Fatalf("after the CLI's override of 2/min (2 used), admitted %d", got)
	}
	if out := run("override", "list"); !strings.Contains(out, "alice") || !strings.Contains(out, "cli") {
		t.Fatalf("override list:\n%s", out)
	}
	if out := run("mode", "acme", "warn"); !strings.Contains(out, "configured → warn") {
		t.Fatalf("mode:\n%s", out)
	}
	if out := run("trees"); !strings.Contains(out, "mode warn") || !strings.Contains(out, "override until") {
		t.Fatalf("trees:\n%s", out)
	}
	if out := run("reset", "acme", "org=acme", "--below"); !strings.Contains(out, "reset 2 bucket(s)") {
		t.Fatalf("reset:\n%s", out)
	}
	if out := run("top", "-n", "3"); !strings.Contains(out, "DENIALS") {
		t.Fatalf("top:\n%s", out)
	}
	cmd := admin.NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"inspect", "nope", "org=a", "--address", strings.TrimPrefix(api, "http://")})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "its trees are acme") {
		t.Fatalf("an unknown tree: %v", err)
	}
}

// TestMatcherErrorRefuses: a tree whose matcher fails on a request does
// not silently stop applying: the request is refused.
func TestMatcherErrorRefuses(t *testing.T) {
	url := site(t, `
		tree t {
			match {
				expression `+"`"+`int({http.request.header.X-N}) > 5`+"`"+`
			}
			tier all fixed {
				limit 1/min
			}
		}
		`+memoryStore().block(t))
	if r := do(t, "GET", url, "X-N: 9"); r.status != 200 {
		t.Fatalf("a matching request: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", url, "X-N: 9"); r.status != 429 {
		t.Fatalf("the second matching request: %d", r.status)
	}
	if r := do(t, "GET", url, "X-N: 1"); r.status != 200 {
		t.Fatalf("a request the matcher does not match: %d", r.status)
	}
	r := do(t, "GET", url, "X-N: abc")
	if r.status/100 == 2 {
		t.Fatalf("a request the matcher fails on passed: %d %s", r.status, r.body)
	}
	if p := r.problem(t); !strings.Contains(p["detail"].(string), "matcher of tree t") {
		t.Fatalf("problem: %v", p)
	}
}

// TestStateMetrics: the memory store's keys, the overrides in force and
// each tree's mode are exported.
func TestStateMetrics(t *testing.T) {
	storeBlock := memoryStore().block(t)
	name := strings.Fields(storeBlock)[4] // store memory { name tN }
	site, api := adminSite(t, opsTree+storeBlock)
	admitN(t, 3, site, "X-Org: acme", "X-User: alice")
	call(t, "PUT", api+"/rate_limit/overrides/acme/user/bob", `{"unlimited":true}`, nil)
	call(t, "PUT", api+"/rate_limit/mode/acme", `{"mode":"warn"}`, nil)
	_, body := call(t, "GET", api+"/metrics", nil, nil)
	for _, want := range []string{
		`cascade_store_keys{store="memory/` + name + `"} 2`,
		`cascade_store_evictions_total{store="memory/` + name + `"} 0`,
		`cascade_overrides{store="memory/` + name + `"} 1`,
		`cascade_tree_mode{mode="warn",tree="acme"} 1`,
		`cascade_tree_mode{mode="enforce",tree="acme"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
}

// TestDenialLog: the first denial of a key is logged at INFO with the key
// values, the next ones are not; no_values drops the values.
func TestDenialLog(t *testing.T) {
	for _, tt := range []struct{ option, want, not string }{
		{"", `"values":["org=acme","user=alice"]`, ""},
		{"denial_log no_values", `"blocked_by":"acme/user"`, `alice`},
	} {
		logFile := filepath.Join(t.TempDir(), "log.json")
		port := freePort(t)
		cf := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output file %s
		format json
		level INFO
	}
}
http://127.0.0.1:%d {
	rate_limit {
%s
		%s
		%s
	}
	respond "ok"
}
`, logFile, port, opsTree, memoryStore().block(t), tt.option)
		cfg, err := adapt(t, cf)
		if err != nil {
			t.Fatal(err)
		}
		loadJSON(t, cfg)
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		admitN(t, 8, url, "X-Org: acme", "X-User: alice")
		_ = caddy.Stop()
		raw, _ := os.ReadFile(logFile)
		var lines []string
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.Contains(l, `"msg":"rate limited"`) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], tt.want) || (tt.not != "" && strings.Contains(lines[0], tt.not)) {
			t.Fatalf("%q: denial lines %v, want one with %s", tt.option, lines, tt.want)
		}
	}
}

// TestAdminLongValues: a 10 KiB value works in the admin API's path and
// query as it does on the request path (hashed in the key alike).
func TestAdminLongValues(t *testing.T) {
	site, api := adminSite(t, opsTree+memoryStore().block(t))
	long := strings.Repeat("é:/", 3500)[:10<<10]
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/acme/user/"+url.PathEscape(long), `{"limits":[{"count":1,"per":"min"}]}`, nil); code != 200 {
		t.Fatalf("put: %d %s", code, truncate(body, 200))
	}
	if got := admitN(t, 3, site, "X-Org: acme", "X-User: "+long); got != 1 {
		t.Fatalf("admitted %d under an override of 1/min", got)
	}
	rem, b := remainingOf(t, api, "tree=acme&org=acme&user="+url.QueryEscape(long))
	if rem["user"] != 0 || b.Buckets[1].Source != "override" || !strings.Contains(b.Buckets[1].Key, "user=~") {
		t.Fatalf("inspect: %v %+v", rem, b.Buckets[1])
	}
}

// TestOverridesSurviveReload: on the memory store, runtime overrides and
// modes live in the process and survive a config reload.
func TestOverridesSurviveReload(t *testing.T) {
	storeBlock := memoryStore().block(t)
	site, api := adminSite(t, opsTree+storeBlock)
	call(t, "PUT", api+"/rate_limit/overrides/acme/user/erin", `{"limits":[{"count":1,"per":"min"}]}`, nil)
	call(t, "PUT", api+"/rate_limit/mode/acme", `{"mode":"warn"}`, nil)
	port := strings.TrimSuffix(strings.TrimPrefix(site, "http://127.0.0.1:"), "/")
	adminPort := strings.TrimPrefix(api, "http://127.0.0.1:")
	cfg, err := adapt(t, fmt.Sprintf(`{
	admin 127.0.0.1:%s
	auto_https off
	persist_config off
}
http://127.0.0.1:%s {
	rate_limit {
%s
%s
	}
	respond "reloaded" 200
}
`, adminPort, port, opsTree, storeBlock))
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	reloaded()
	erin := []string{"X-Org: acme", "X-User: erin"}
	if r := do(t, "GET", site, erin...); r.body != "reloaded" {
		t.Fatalf("not reloaded: %s", r.body)
	}
	// warn: the second request is over erin's override of 1/min, passes
	// with the headers.
	if r := do(t, "GET", site, erin...); r.status != 200 || r.header.Get("Retry-After") == "" {
		t.Fatalf("after the reload, erin's second request: %d %v", r.status, r.header)
	}
	var trees []admin.Tree
	call(t, "GET", api+"/rate_limit/trees", nil, &trees)
	if trees[0].Mode != "warn" {
		t.Fatalf("mode after the reload: %s", trees[0].Mode)
	}
}

// TestMixedModes: when only a tree in shadow mode denies, the request
// passes and is still charged to the tree that enforces.
func TestMixedModes(t *testing.T) {
	site, api := adminSite(t, `
		tree a {
			tier all fixed {
				limit 5/min
			}
		}
		tree b {
			tier all fixed {
				limit 2/min
			}
		}
		`+memoryStore().block(t))
	if code, body := call(t, "PUT", api+"/rate_limit/mode/b", `{"mode":"shadow"}`, nil); code != 200 {
		t.Fatalf("mode: %d %s", code, body)
	}
	var codes []int
	for i := 0; i < 6; i++ {
		codes = append(codes, do(t, "GET", site).status)
	}
	if fmt.Sprint(codes) != "[200 200 200 200 200 429]" {
		t.Fatalf("statuses %v: want 5 admitted (tree a's limit) and the 6th refused by tree a", codes)
	}
	rem, _ := remainingOf(t, api, "tree=a")
	if rem["all"] != 0 {
		t.Fatalf("tree a has %d left: requests that only tree b denied were not charged to it", rem["all"])
	}
}
