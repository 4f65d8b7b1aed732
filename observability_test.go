package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// The dashboard and alert rules shipped in examples/, checked by promtool
// and against a real Prometheus scraping a real Caddy.
const (
	grafanaDashboardFile = "examples/grafana/cascade.json"
	alertRulesFile       = "examples/prometheus/cascade-rules.yml"
	alertRulesTestFile   = "examples/prometheus/cascade-rules.test.yml"
)

// obsTool is the path of a Prometheus binary (prometheus, promtool),
// failing t when it is not installed.
func obsTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not on PATH (%v): scripts/test.sh installs it (Debian package prometheus)", name, err)
	}
	return path
}

// TestAlertRulesPromtool: the rules file is valid Prometheus rules and its
// unit tests pass (promtool); every rule says what happened and what to
// do, and the unit tests cover the store, local fallback and would-block
// alerts.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := obsTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", alertRulesFile}, {"test", "rules", alertRulesTestFile}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	obsYAML(t, alertRulesFile, &rules)
	if len(rules.Groups) != 1 || rules.Groups[0].Name != "cascade" {
		t.Fatalf("%s: want one group named cascade", alertRulesFile)
	}
	var alerts []string
	for _, r := range rules.Groups[0].Rules {
		alerts = append(alerts, r.Alert)
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s: want a severity label and summary and description annotations", r.Alert)
		}
	}
	for _, want := range []string{"CascadeStoreBreakerOpen", "CascadeStoreErrors", "CascadeLocalFallback", "CascadeAdaptiveAtFloor",
		"CascadeRefusalsJump", "CascadeWouldBlock", "CascadeReconcileErrors", "CascadeMemoryStoreFull", "CascadeEntitlementLookupsFailing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("%s has no alert %s (has %v)", alertRulesFile, want, alerts)
		}
	}

	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string
				ExpAlerts []any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		}
	}
	obsYAML(t, alertRulesTestFile, &tests)
	tested := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				tested[a.Alertname] = true
			}
		}
	}
	for _, want := range []string{"CascadeStoreBreakerOpen", "CascadeLocalFallback", "CascadeWouldBlock"} {
		if !tested[want] {
			t.Errorf("%s: no test expects %s to fire", alertRulesTestFile, want)
		}
	}
}

func obsYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// grafanaDashboard is what the tests read of a Grafana dashboard.
type grafanaDashboard struct {
	UID           string         `json:"uid"`
	Title         string         `json:"title"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Type       string `json:"type"`
			Name       string `json:"name"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

// dashboardQuery is one PromQL expression of the dashboard: a panel's
// target, or a template variable's label_values (as the PromQL that
// returns the same label values).
type dashboardQuery struct {
	where, expr string
}

var (
	// obsVar is a Grafana variable in an expression: $name, ${name} or
	// ${name:format}.
	obsVar = regexp.MustCompile(`\$\{?(\w+)(?::\w+)?\}?`)
	// obsMetric is a Cascade metric name (digits too: _p99_).
	obsMetric      = regexp.MustCompile(`cascade_[a-z0-9_]+`)
	obsLabelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
)

// obsInterpolate replaces a dashboard expression's variables as Grafana
// would with every value selected: tree and tier by the regex .*, the
// intervals by fixed durations.
func obsInterpolate(t *testing.T, where, expr string) string {
	t.Helper()
	return obsVar.ReplaceAllStringFunc(expr, func(v string) string {
		switch name := obsVar.FindStringSubmatch(v)[1]; name {
		case "tree", "tier":
			return ".*"
		case "__rate_interval":
			return "1m"
		case "__interval":
			return "15s"
		case "__range":
			return "5m"
		default:
			t.Errorf("%s: unknown variable %s in %s", where, v, expr)
			return v
		}
	})
}

// obsDashboard checks the dashboard's structure (importable: a uid, a
// schemaVersion, unique panel ids, panels on the Prometheus datasource
// variable, tree and tier variables) and returns its queries.
func obsDashboard(t *testing.T) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(grafanaDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", grafanaDashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("%s: uid %q, title %q, schemaVersion %d: want a uid, a title and a schemaVersion of Grafana 10 or later (≥ 36)", grafanaDashboardFile, d.UID, d.Title, d.SchemaVersion)
	}
	var queries []dashboardQuery
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		switch v.Type {
		case "datasource":
			if v.Query != "prometheus" {
				t.Errorf("variable %s: a datasource variable of type %v, want prometheus", v.Name, v.Query)
			}
		case "query":
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("variable %s: its datasource is not ${datasource}", v.Name)
			}
			m := obsLabelValues.FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, v.Definition)
				continue
			}
			queries = append(queries, dashboardQuery{"variable " + v.Name, fmt.Sprintf("group by (%s) (%s)", m[2], m[1])})
		}
	}
	if vars["datasource"] != "datasource" || vars["tree"] != "query" || vars["tier"] != "query" {
		t.Errorf("%s: variables %v, want datasource (a Prometheus datasource), tree and tier (label_values queries)", grafanaDashboardFile, vars)
	}
	ids := map[int]string{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if prev, dup := ids[p.ID]; dup || p.ID <= 0 {
				t.Errorf("%s: id %d not unique and positive (also %s)", where, p.ID, prev)
			}
			ids[p.ID] = where
			if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v outside the 24 columns", where, g)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("%s: want a title, the datasource ${datasource} (prometheus) and targets", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.Expr == "" || refs[tg.RefID] {
					t.Errorf("%s: target %q has no expr or a refId already used", where, tg.RefID)
				}
				refs[tg.RefID] = true
				queries = append(queries, dashboardQuery{where + " " + tg.RefID, tg.Expr})
			}
		}
	}
	walk(d.Panels)
	for i, q := range queries {
		queries[i].expr = obsInterpolate(t, q.where, q.expr)
	}
	return queries
}

// obsSites are the ports of the Caddy TestDashboardQueriesAgainstPrometheus
// runs.
type obsSites struct {
	admin, rls                          int
	enforce, shadow, queue, lease, edge int
}

// obsCaddyfile is a Caddy that exports every metric the dashboard reads:
// an enforcing tree on Redis that refuses (with plans from entitlements,
// a route to a second store, a concurrency limit and an adaptive tier),
// a tree in shadow that denies, requests held their turn (max_wait) on a
// memory store, a Redis store with leases that Envoy's rate limit service
// also decides on, and a decision endpoint. Each Redis store has a server
// of its own: the store metrics name a store by its address alone, and
// two stores on one address would repeat their series, failing the whole
// scrape.
func obsCaddyfile(s obsSites, storeAddr, tenantsAddr, leaseAddr string) string {
	return fmt.Sprintf(`{
%[1]s	cascade {
		adaptive {
			memory 95 99
			min_requests 1
			signal inflight {
				in_flight 1000
				warn 50
				critical 90
			}
		}
		rls {
			listen 127.0.0.1:%[2]d
			domain leased
		}
	}
}

http://127.0.0.1:%[3]d {
	rate_limit {
		entitlements customers {
			source redis billing:org:{value}
			key org
		}
		tree api {
			plan {http.rate_limit.entitlement.customers.plan} default free
			tier org {header.X-Org} {
				plan free {
					limit 5/min
				}
				plan pro {
					limit 50/min
				}
			}
			tier user {header.X-User} {
				limit 100000/h
				limit 50 concurrent
				adaptive
			}
		}
		store redis {
			address %[8]s
			key_prefix obs:
			breaker 2 1s
			timeout 200ms
			insecure_bus
		}
		store redis tenants {
			address %[9]s
			insecure_bus
		}
		route org bigco tenants
		on_store_error local
	}
	respond "ok" 200
}

http://127.0.0.1:%[4]d {
	rate_limit {
		tree preview {
			tier k fixed {
				limit 1/h
			}
		}
		mode shadow
		store memory {
			name obsshadow
		}
	}
	respond "ok" 200
}

http://127.0.0.1:%[5]d {
	rate_limit {
		tree queue {
			tier k fixed {
				limit 20/s burst 1
			}
		}
		max_wait 2s
		store memory {
			name obsqueue
		}
	}
	respond "ok" 200
}

http://127.0.0.1:%[6]d {
	rate_limit {
		tree leased {
			tier k {header.X-User} {
				limit 1000000/h
			}
		}
		store redis {
			address %[10]s
			lease
			insecure_bus
		}
	}
	respond "ok" 200
}

http://127.0.0.1:%[7]d {
	rate_limit {
		forwarded
		tree edge {
			tier k fixed {
				limit 100/min
			}
		}
		store memory {
			name obsedge
		}
	}
}
`, globals(s.admin), s.rls, s.enforce, s.shadow, s.queue, s.lease, s.edge, storeAddr, tenantsAddr, leaseAddr)
}

// obsDrive sends the sites traffic until the test ends: each round, two
// orgs over their limit (one routed to the tenants store), a request the
// shadow tree denies, two requests to the queue (the second held its
// turn), one on leases, a decision endpoint's request from an untrusted
// peer, and a call to the rate limit service.
func obsDrive(t *testing.T, s obsSites) {
	t.Helper()
	rls := rlsClient(t, s.rls)
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(port int, headers ...string) {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Set(k, strings.TrimSpace(v))
		}
		if res, err := client.Do(req); err == nil { // not t.Fatal: a goroutine
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			get(s.enforce, "X-Org: acme", "X-User: alice")
			get(s.enforce, "X-Org: bigco", "X-User: bob")
			get(s.shadow)
			get(s.queue)
			get(s.queue)
			get(s.lease, "X-User: carol")
			get(s.edge)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "leased",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("k", "dave")}})
			cancel()
		}
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		client.CloseIdleConnections()
	})
}

// obsProm is a Prometheus process's HTTP API.
type obsProm struct {
	base, log string
}

// obsStartPrometheus runs prometheus until the test ends, scraping the
// admin endpoint's /metrics every second and evaluating rules every second.
func obsStartPrometheus(t *testing.T, bin string, adminPort int, rules string) *obsProm {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: ['127.0.0.1:%d']
`, rules, adminPort), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &obsProm{base: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), log: filepath.Join(dir, "prometheus.log")}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+strings.TrimPrefix(p.base, "http://"), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logFile.Close()
	})
	p.await(t, 30*time.Second, "prometheus ready", func() (bool, string) {
		res, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, res.Status
	})
	return p
}

// await polls ok every 200 ms until it holds, failing t with what it last
// said (and Prometheus's log) after timeout.
func (p *obsProm) await(t *testing.T, timeout time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var done bool
		if done, last = ok(); done {
			return
		}
	}
	log, _ := os.ReadFile(p.log)
	t.Fatalf("%s: not within %s; last: %s\nprometheus log:\n%s", what, timeout, last, log)
}

// query evaluates expr now: the number of series it returns (1 for a
// scalar), or Prometheus's error.
func (p *obsProm) query(expr string) (int, error) {
	res, err := http.Get(p.base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var r struct {
		Status, ErrorType, Error string
		Data                     struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&r); err != nil {
		return 0, fmt.Errorf("%s: %v", res.Status, err)
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	if r.Data.ResultType == "scalar" || r.Data.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(r.Data.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}

// promAlert is an alert of Prometheus's /api/v1/alerts.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *obsProm) alerts() ([]promAlert, error) {
	res, err := http.Get(p.base + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	err = json.NewDecoder(res.Body).Decode(&r)
	return r.Data.Alerts, err
}

// awaitAlert waits until an alert named name whose labels include want is
// in one of states.
func (p *obsProm) awaitAlert(t *testing.T, name string, want map[string]string, states ...string) {
	t.Helper()
	p.await(t, 20*time.Second, fmt.Sprintf("alert %s %v %v", name, want, states), func() (bool, string) {
		alerts, err := p.alerts()
		if err != nil {
			return false, err.Error()
		}
		for _, a := range alerts {
			if a.Labels["alertname"] != name || !slices.Contains(states, a.State) {
				continue
			}
			matches := true
			for k, v := range want {
				matches = matches && a.Labels[k] == v
			}
			if matches {
				return true, ""
			}
		}
		return false, fmt.Sprintf("alerts %v", alerts)
	})
}

// TestDashboardQueriesAgainstPrometheus: a real Prometheus scrapes a real
// Caddy's admin /metrics, whose configuration exercises what the dashboard
// shows, and loads the alert rules (their `for` shortened to a second).
// Every query of the dashboard is valid PromQL; those on decisions,
// refusals, limits and would-block return data, as do the tree and tier
// variables; every metric the dashboard and the rules name is exported.
// The shadow tree's would-block alert fires, and once the Redis store is
// stopped its breaker's and the local fallback's alerts are raised.
func TestDashboardQueriesAgainstPrometheus(t *testing.T) {
	queries := obsDashboard(t)
	prometheus := obsTool(t, "prometheus")
	rules, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// The rules as shipped, each `for` a second: the promtool tests check
	// the real durations.
	forRE := regexp.MustCompile(`(?m)^(\s+for:\s*)\S+$`)
	if !forRE.Match(rules) {
		t.Fatalf("%s: no `for:` to shorten", alertRulesFile)
	}
	liveRules := filepath.Join(t.TempDir(), "cascade-rules.yml")
	if err := os.WriteFile(liveRules, forRE.ReplaceAll(rules, []byte("${1}1s")), 0o644); err != nil {
		t.Fatal(err)
	}

	storeRedis := redistest.Start(t) // stopped below
	tenantsRedis, leaseRedis := redistest.Start(t), redistest.Start(t)
	s := obsSites{admin: freePort(t), rls: freePort(t), enforce: freePort(t), shadow: freePort(t),
		queue: freePort(t), lease: freePort(t), edge: freePort(t)}
	cf := obsCaddyfile(s, storeRedis.Addr(), tenantsRedis.Addr(), leaseRedis.Addr())
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	loadJSON(t, cfg)
	obsDrive(t, s)
	prom := obsStartPrometheus(t, prometheus, s.admin, liveRules)

	// Three scrapes at least: a rate has two samples to work on.
	prom.await(t, 20*time.Second, "three scrapes of Caddy", func() (bool, string) {
		n, err := prom.query(`count_over_time(up{job="caddy"}[1m]) >= 3 and up{job="caddy"} == 1`)
		return n == 1, fmt.Sprint(n, err)
	})

	// What Caddy exports: the text Prometheus scrapes.
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", s.admin))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("admin /metrics: %s\n%s", res.Status, body)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(strings.TrimPrefix(line, "# TYPE ")); len(f) > 0 && strings.HasPrefix(f[0], "cascade_") {
			name, _, _ := strings.Cut(f[0], "{")
			exported[name] = true // a histogram's base name, its _bucket, _sum and _count
		}
	}
	named := func(where, expr string) {
		for _, m := range obsMetric.FindAllString(expr, -1) {
			if !exported[m] {
				t.Errorf("%s: %s is not among the metrics Caddy exports (%s)", where, m, expr)
			}
		}
	}
	for _, q := range queries {
		named(q.where, q.expr)
	}
	named(alertRulesFile, string(rules))

	// Every query valid, and with data: the configuration exercises every
	// metric the dashboard reads.
	pending := map[string]dashboardQuery{}
	for _, q := range queries {
		n, err := prom.query(q.expr)
		if err != nil {
			t.Errorf("%s: %s: %v", q.where, q.expr, err)
			continue
		}
		if n == 0 {
			pending[q.where] = q
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
		for where, q := range pending {
			if n, err := prom.query(q.expr); err == nil && n > 0 {
				delete(pending, where)
			}
		}
	}
	for _, q := range pending {
		t.Errorf("%s: no data after 15 s of scrapes: %s", q.where, q.expr)
	}
	for _, tree := range []string{"api", "preview", "queue", "leased", "edge"} {
		if n, err := prom.query(fmt.Sprintf(`group by (tree) (cascade_limit_capacity{tree=%q})`, tree)); n != 1 || err != nil {
			t.Errorf("tree %s: no capacity exported (%d series, %v)", tree, n, err)
		}
	}

	// The rollout signal: the shadow tree would block, the enforcing trees not.
	prom.awaitAlert(t, "CascadeWouldBlock", map[string]string{"tree": "preview", "mode": "shadow"}, "firing")
	alerts, err := prom.alerts()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		switch a.Labels["alertname"] {
		case "CascadeWouldBlock":
			if a.Labels["tree"] != "preview" {
				t.Errorf("would-block alert for a tree that enforces: %v", a.Labels)
			}
		case "CascadeStoreBreakerOpen", "CascadeLocalFallback", "CascadeStoreErrors":
			t.Errorf("%s %s while every Redis is up: %v", a.Labels["alertname"], a.State, a.Labels)
		}
	}

	// The store away: its breaker opens, and decisions fall back to memory.
	storeRedis.Kill()
	prom.awaitAlert(t, "CascadeStoreBreakerOpen", map[string]string{"store": "redis/" + storeRedis.Addr(), "node": storeRedis.Addr()}, "pending", "firing")
	prom.awaitAlert(t, "CascadeLocalFallback", map[string]string{"job": "caddy"}, "pending", "firing")
}
