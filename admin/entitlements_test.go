package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
)

// runtimeOf returns a Runtime on a memory store of its own, closed when
// the test ends.
func runtimeOf(t *testing.T) *control.Runtime {
	t.Helper()
	rt, err := control.New(control.NewMemoryBackend(), control.Options{Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// runningHandler registers, as a running rate_limit handler does, an
// engine on rt with tree "api" (tiers org, and key, which is sensitive)
// and the entitlements blocks bs, until the test ends.
func runningHandler(t *testing.T, rt *control.Runtime, bs ...running.Entitlements) *engine.Engine {
	t.Helper()
	sensitive := true
	tr := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{http.request.header.X-Org}", Limits: []*hierarchy.Limit{{Count: 1000, Per: "h"}}},
		{Name: "key", Key: "{http.request.header.X-Key}", Sensitive: &sensitive, Limits: []*hierarchy.Limit{{Count: 10, Per: "min"}}},
	}}
	if err := tr.Compile(); err != nil {
		t.Fatal(err)
	}
	e := engine.New(engine.Config{Trees: []*engine.Tree{{Tree: tr}}, Runtime: rt})
	t.Cleanup(e.Close)
	done := make(chan struct{})
	t.Cleanup(running.Register(e, done))
	t.Cleanup(running.RegisterEntitlements(e, bs...))
	return e
}

var (
	customers = running.Entitlements{Name: "customers", Tree: "api", Tier: "org", Plans: []string{"enterprise", "free", "pro"}}
	apiKeys   = running.Entitlements{Name: "keys", Tree: "api", Tier: "key"}
)

// call serves one request with handleEntitlements and returns its status
// and body (an error's message as Caddy's admin endpoint answers it).
func call(t *testing.T, method, target, body string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	w := httptest.NewRecorder()
	if err := handleEntitlements(w, r); err != nil {
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("%s %s: %v, not an API error", method, target, err)
		}
		return apiErr.HTTPStatus, apiErr.Err.Error()
	}
	return w.Code, w.Body.String()
}

// TestEntitlementsAPI: set, read, list and delete runtime entitlements
// through the routes, in every store whose handler has the block (one
// name in two stores), and what is refused, with which status.
func TestEntitlementsAPI(t *testing.T) {
	rtA, rtB := runtimeOf(t), runtimeOf(t)
	runningHandler(t, rtA, customers, apiKeys)
	runningHandler(t, rtB, customers)
	runningHandler(t, rtA) // no blocks: nothing changes for it
	fp := showEntitled(active(), "keys", "sk-secret")
	if !strings.HasPrefix(fp, engine.FingerprintPrefix) {
		t.Fatalf("the value of a sensitive tier shows as %q, want a fingerprint", fp)
	}
	future := time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)

	steps := []struct {
		method, target, body string
		status               int
		says                 string // in the body, or the error's message
		check                func() error
	}{
		{"GET", "/rate_limit/entitlements", "", 200, "[]", nil},
		{"PUT", "/rate_limit/entitlements/customers/acme", `{"plan":"pro","note":"deal #12"}`, 200, `"old": null`, func() error {
			for _, rt := range []*control.Runtime{rtA, rtB} {
				if e := rt.Snapshot().Entitlement("customers", "acme"); e == nil || e.Plan != "pro" || e.Note != "deal #12" {
					return errors.New("not in every store that has the block")
				}
			}
			return nil
		}},
		{"PUT", "/rate_limit/entitlements/customers/acme", `{"plan":"enterprise","limits":[{"count":90000,"per":"h"}],"expires":"` + future + `"}`, 200,
			`"plan": "pro"`, func() error {
				if e := rtB.Snapshot().Entitlement("customers", "acme"); e == nil || e.Plan != "enterprise" || e.Limits[0].Count != 90000 || e.Expires.IsZero() {
					return errors.New("not replaced")
				}
				return nil
			}},
		{"PUT", "/rate_limit/entitlements/customers/a%2Fb%20%C3%A7", `{"plan":"free"}`, 200, `"value": "a/b ç"`, func() error {
			if rtA.Snapshot().Entitlement("customers", "a/b ç") == nil {
				return errors.New("an escaped value is not unescaped")
			}
			return nil
		}},
		{"PUT", "/rate_limit/entitlements/customers", `{"value":"beta","limits":[{"count":5,"per":"min"}]}`, 200, `"value": "beta"`, nil},
		{"PUT", "/rate_limit/entitlements/keys", `{"value":"sk-secret","plan":"pro"}`, 200, `"value": "` + fp + `"`, func() error {
			if e := rtA.Snapshot().Entitlement("keys", "sk-secret"); e == nil || e.Plan != "pro" {
				return errors.New("not set")
			}
			if rtB.Snapshot().Entitlement("keys", "sk-secret") != nil {
				return errors.New("set in a store whose handler has no such block")
			}
			return nil
		}},
		{"GET", "/rate_limit/entitlements/customers/acme", "", 200, `"plan": "enterprise"`, nil},
		{"GET", "/rate_limit/entitlements/keys/sk-secret", "", 200, fp, nil},
		{"GET", "/rate_limit/entitlements/customers/nobody", "", 404, `no runtime entitlement of customers/"nobody": its source answers for it`, nil},

		{"PUT", "/rate_limit/entitlements/nope/x", `{"plan":"pro"}`, 404, `no entitlements block "nope" in the running configuration: its entitlements blocks are customers, keys`, nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"plan":"prp"}`, 400, `plan "prp": the trees of entitlements customers know no such plan: use enterprise, free, pro`, nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"note":"nothing"}`, 400, "an entitlement needs a plan", nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"limits":[{"count":1,"per":"fortnight"}]}`, 400, "limit 1 (1/fortnight)", nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"plan":"pro","expires":"2020-01-01T00:00:00Z"}`, 400, "is in the past", nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"plan":"pro","expires":"tomorrow"}`, 400, `expires "tomorrow": write an RFC 3339 time`, nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"plan":"pro","unlimited":true}`, 400, "the body is not the JSON expected", nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"value":"y","plan":"pro"}`, 400, "the body names another value than the path", nil},
		{"PUT", "/rate_limit/entitlements/customers", `{"plan":"pro"}`, 400, "name the value", nil},
		{"PUT", "/rate_limit/entitlements/customers/x", `{"plan":"pro","note":"` + strings.Repeat("n", 2000) + `"}`, 400, "the note is 2000 bytes long", nil},
		{"PUT", "/rate_limit/entitlements/customers/x/y", `{"plan":"pro"}`, 400, "use /rate_limit/entitlements/<name>", nil},
		{"POST", "/rate_limit/entitlements", "", 405, "POST is not allowed here: use GET", nil},
		{"GET", "/rate_limit/entitlements/customers", "", 405, "GET is not allowed here", nil},
		{"DELETE", "/rate_limit/entitlements/customers", `{}`, 400, `name the value: {"value": "…"}`, nil},

		{"GET", "/rate_limit/entitlements", "", 200, fp, func() error {
			// customers/a/b ç, acme, beta and keys/sk-secret in A; the
			// customers in B.
			_, body := call(t, "GET", "/rate_limit/entitlements", "")
			var list []*control.Entitlement
			if err := json.Unmarshal([]byte(body), &list); err != nil {
				return err
			}
			if len(list) != 7 {
				return errors.New("not every store's entitlements are listed")
			}
			if strings.Contains(body, "sk-secret") {
				return errors.New("the list shows a sensitive value")
			}
			return nil
		}},
		{"DELETE", "/rate_limit/entitlements/customers/acme", "", 200, `"plan": "enterprise"`, func() error {
			if rtA.Snapshot().Entitlement("customers", "acme") != nil || rtB.Snapshot().Entitlement("customers", "acme") != nil {
				return errors.New("not deleted from every store")
			}
			return nil
		}},
		{"DELETE", "/rate_limit/entitlements/customers/acme", "", 200, `"old": null`, nil},
		{"DELETE", "/rate_limit/entitlements/keys", `{"value":"sk-secret"}`, 200, `"value": "` + fp + `"`, func() error {
			if rtA.Snapshot().Entitlement("keys", "sk-secret") != nil {
				return errors.New("not deleted")
			}
			return nil
		}},
	}
	for _, st := range steps {
		status, body := call(t, st.method, st.target, st.body)
		name := st.method + " " + st.target + " " + st.body
		if status != st.status || !strings.Contains(body, st.says) {
			t.Errorf("%.120s: %d %s\nwant %d saying %s", name, status, body, st.status, st.says)
			continue
		}
		if strings.Contains(body, "sk-secret") {
			t.Errorf("%.120s: the answer shows a sensitive value: %s", name, body)
		}
		if st.check != nil {
			if err := st.check(); err != nil {
				t.Errorf("%.120s: %v", name, err)
			}
		}
	}
}

// TestEntitlementsWithoutBlocks: with no entitlements block running, a
// change is refused with a 404 that says so; the list is empty, and an
// entitlement left in a store from another configuration is listed as a
// fingerprint (no block says whether its values are secrets).
func TestEntitlementsWithoutBlocks(t *testing.T) {
	rt := runtimeOf(t)
	runningHandler(t, rt)
	status, body := call(t, "PUT", "/rate_limit/entitlements/customers/acme", `{"plan":"pro"}`)
	if status != 404 || !strings.Contains(body, "its entitlements blocks are (none: no rate_limit handler has an entitlements block)") {
		t.Fatalf("%d %s", status, body)
	}
	if _, err := rt.SetEntitlement(t.Context(), &control.Entitlement{Name: "old", Value: "acme", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	status, body = call(t, "GET", "/rate_limit/entitlements", "")
	if status != 200 || !strings.Contains(body, `"value": "`+engine.FingerprintPrefix) || strings.Contains(body, `"acme"`) {
		t.Fatalf("%d %s", status, body)
	}
}

// adminServer serves the API's routes as Caddy's admin endpoint does (an
// error as {"error": …} with its status), for the CLI.
func adminServer(t *testing.T) string {
	mux := http.NewServeMux()
	for _, route := range (API{}).Routes() {
		mux.HandleFunc(route.Pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := route.Handler.ServeHTTP(w, r); err != nil {
				var apiErr caddy.APIError
				errors.As(err, &apiErr)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(apiErr.HTTPStatus)
				json.NewEncoder(w).Encode(map[string]string{"error": apiErr.Err.Error()})
			}
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestEntitlementsCLI: the CLI's commands against the API's handlers:
// what it sends is what they take, and it prints what they answer.
func TestEntitlementsCLI(t *testing.T) {
	fixClock(t, time.Now())
	rt := runtimeOf(t)
	runningHandler(t, rt, customers, apiKeys)
	addr := adminServer(t)
	fp := showEntitled(active(), "keys", "sk-secret")

	steps := []struct {
		args []string
		want string // the output's first line, or the error
	}{
		{[]string{"entitlements"}, "no runtime entitlements"},
		{[]string{"entitlements", "set", "customers", "a/b:c é", "--plan", "pro", "--limit", "100/h", "--for", "24h", "--note", "upgrade"},
			"customers/\"a/b:c é\": the source's → plan pro, 100/h until "},
		{[]string{"entitlements", "set", "keys", "sk-secret", "--plan", "free"}, "keys/" + fp + ": the source's → plan free"},
		{[]string{"entitlements", "set", "keys", "sk-secret", "--plan", "pro"}, "keys/" + fp + ": plan free → plan pro"},
		{[]string{"entitlements", "list"}, "NAME       VALUE            PLAN  LIMITS  EXPIRES"},
		{[]string{"entitlements", "set", "customers", "x", "--plan", "gold"}, "error: plan \"gold\": the trees of entitlements customers know no such plan: use enterprise, free, pro"},
		{[]string{"entitlements", "set", "nope", "x", "--plan", "pro"}, `error: no entitlements block "nope" in the running configuration: its entitlements blocks are customers, keys`},
		{[]string{"entitlements", "delete", "keys", "sk-secret"}, "keys/" + fp + ": plan pro → the source's"},
		{[]string{"entitlements", "delete", "keys", "sk-secret"}, "keys: the value given had no runtime entitlement: nothing changed"},
	}
	for _, st := range steps {
		out, err := runCLI(append(st.args, "--address", addr)...)
		if err != nil {
			out = "error: " + err.Error()
		}
		if !strings.HasPrefix(out, st.want) {
			t.Errorf("%q:\n%s\nwant it to begin with\n%s", st.args, out, st.want)
		}
		if strings.Contains(out, "sk-secret") {
			t.Errorf("%q: the output shows a sensitive value: %s", st.args, out)
		}
	}
	e := rt.Snapshot().Entitlement("customers", "a/b:c é")
	if e == nil || e.Plan != "pro" || e.Limits[0].Count != 100 || e.Note != "upgrade" || e.Expires.Sub(time.Now()) > 24*time.Hour {
		t.Fatalf("the entitlement set through the CLI: %+v", e)
	}
}
