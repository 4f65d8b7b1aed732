package cascade

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"
)

// loadTraefikPlugin loads the plugin in traefik/ as Traefik does: its
// source under a GOPATH, interpreted by Yaegi (the version Traefik pins),
// New and CreateConfig looked up by the package's name. It returns the
// middleware built around next with the given settings.
func loadTraefikPlugin(t *testing.T, next http.Handler, settings map[string]any) http.Handler {
	t.Helper()
	gopath := t.TempDir()
	dst := filepath.Join(gopath, "src", "github.com", "caddy-cascade", "cascade", "traefik")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cascade.go", "go.mod", ".traefik.yml"} {
		b, err := os.ReadFile(filepath.Join("traefik", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, f), b, 0o644)
	}
	i := interp.New(interp.Options{GoPath: gopath, Env: os.Environ()})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}
	if _, err := i.Eval(`import "github.com/caddy-cascade/cascade/traefik"`); err != nil {
		t.Fatalf("yaegi cannot load the plugin: %v", err)
	}
	createConfig, err := i.Eval("traefik.CreateConfig")
	if err != nil {
		t.Fatal(err)
	}
	newFn, err := i.Eval("traefik.New")
	if err != nil {
		t.Fatal(err)
	}
	cfg := createConfig.Call(nil)[0]
	// As Traefik's mapstructure decoding does: settings onto the struct.
	for k, v := range settings {
		f := cfg.Elem().FieldByNameFunc(func(n string) bool { return strings.EqualFold(n, k) })
		if !f.IsValid() {
			t.Fatalf("no setting %s", k)
		}
		f.Set(reflect.ValueOf(v))
	}
	out := newFn.Call([]reflect.Value{reflect.ValueOf(context.Background()), reflect.ValueOf(next), cfg, reflect.ValueOf("cascade")})
	if !out[1].IsNil() {
		t.Fatalf("New: %v", out[1].Interface())
	}
	return out[0].Interface().(http.Handler)
}

// TestTraefikPlugin runs the Traefik plugin, interpreted by Yaegi, in front
// of an upstream, against a real Caddy with Cascade deciding from the
// forwarded request: limits, the rate-limit headers on admitted responses,
// the refusal as Cascade wrote it, keys from the original headers, and the
// failure policy with Cascade gone.
func TestTraefikPlugin(t *testing.T) {
	// The example's decision endpoint, as it is written.
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.Path)
	})
	plugin := loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": endpoint})
	serve := func(path, user string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-Org", "acme")
		if user != "" {
			req.Header.Set("X-User", user)
		}
		rec := httptest.NewRecorder()
		plugin.ServeHTTP(rec, req)
		return rec
	}
	for i := 0; i < 60; i++ {
		rec := serve("/v1/chat", "alice")
		if rec.Code != 200 || rec.Body.String() != "upstream saw GET /v1/chat" {
			t.Fatalf("request %d: %d %q", i, rec.Code, rec.Body.String())
		}
		if got, want := rec.Header().Get("RateLimit"), fmt.Sprintf(`"user";r=%d;t=`, 59-i); !strings.HasPrefix(got, want) {
			t.Fatalf("request %d: RateLimit %q, want %s…", i, got, want)
		}
		if rec.Header().Get("RateLimit-Policy") == "" {
			t.Fatal("no RateLimit-Policy on an admitted response")
		}
	}
	rec := serve("/v1/chat", "alice")
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" || rec.Header().Get("Content-Type") != "application/problem+json" ||
		strings.Contains(rec.Body.String(), "upstream saw") {
		t.Fatalf("over the limit: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	if rec := serve("/v1/chat", "bob"); rec.Code != 200 {
		t.Fatalf("bob: %d", rec.Code)
	}
	if rec := serve("/v1/chat", ""); rec.Code != 400 {
		t.Fatalf("no X-User: %d", rec.Code)
	}

	// A request the plugin does not forward as such is refused, charging
	// nothing.
	if r := do(t, "GET", endpoint, "X-Org: acme", "X-User: carol"); r.status != 400 ||
		!strings.Contains(r.body, "X-Forwarded-Uri") || r.header.Get("RateLimit") != "" {
		t.Fatalf("not forwarded: %d %q", r.status, r.body)
	}

	// Cascade gone: fail closed by default, open when configured.
	dead := fmt.Sprintf("http://127.0.0.1:%d/decide", freePort(t))
	closed := loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": dead})
	rec = httptest.NewRecorder()
	closed.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/chat", nil))
	if rec.Code != 503 {
		t.Fatalf("fail closed: %d", rec.Code)
	}
	open := loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": dead, "FailOpen": true})
	rec = httptest.NewRecorder()
	open.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/chat", nil))
	if rec.Code != 200 {
		t.Fatalf("fail open: %d", rec.Code)
	}
}

// TestTraefikPluginReconciles: behind the plugin, chat completions are
// charged their estimated tokens, then reconciled with the usage of the
// upstream's response (JSON, and an event stream's last usage), which
// the plugin reports under the decision's id. The org's tokens remaining
// show it: the limit is 5000 tokens/h, and the estimate of each request
// is its max_tokens (1000) plus its prompt (~2).
func TestTraefikPluginReconciles(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"max_tokens":1000`) {
			t.Errorf("the upstream got %q, not the whole body", body)
		}
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":40,\"total_tokens\":50}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
	})
	plugin := loadTraefikPlugin(t, upstream, map[string]any{
		"Endpoint": endpoint, "ReportEndpoint": endpoint + "report", "SendBody": true,
	})
	chat := func(stream bool) *httptest.ResponseRecorder {
		body := `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
		if stream {
			body = `{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
		}
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Org", "tokens-org")
		req.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		plugin.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("chat: %d %q", rec.Code, rec.Body.String())
		}
		return rec
	}
	remaining := func(rec *httptest.ResponseRecorder) int {
		var r int
		if _, err := fmt.Sscanf(rec.Header().Get("RateLimit"), `"llm/org";r=%d;`, &r); err != nil {
			t.Fatalf("RateLimit %q: %v", rec.Header().Get("RateLimit"), err)
		}
		return r
	}
	// Each decision shows what remains after its estimate; the report of
	// the previous response has given back estimate − usage by then.
	first := remaining(chat(false))
	estimate := 5000 - first
	if estimate < 1000 || estimate > 1010 {
		t.Fatalf("first estimate %d, want max_tokens and the prompt", estimate)
	}
	second := remaining(chat(true)) // the first reconciled to its 30 tokens
	if want := 5000 - 30 - estimate; second != want {
		t.Fatalf("after the JSON report: %d remaining, want %d", second, want)
	}
	third := remaining(chat(false)) // the stream reconciled to its 50 tokens
	if want := 5000 - 30 - 50 - estimate; third != want {
		t.Fatalf("after the stream's report: %d remaining, want %d", third, want)
	}
}

// TestDecisionEndpointReports: the report endpoint refuses what it cannot
// reconcile (an unknown decision, one already reported, a body too long,
// no id, another method) and reconciles a decision once.
func TestDecisionEndpointReports(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	decide := func(maxTokens int) resp {
		body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"x"}]}`, maxTokens)
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(body))
		for k, v := range map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/chat/completions",
			"X-Org": "report-org", "X-User": "u", "Content-Type": "application/json"} {
			req.Header.Set(k, v)
		}
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return resp{status: res.StatusCode, header: res.Header, body: string(b)}
	}
	report := func(id, method, body string) resp {
		req, _ := http.NewRequest(method, endpoint+"report", strings.NewReader(body))
		if id != "" {
			req.Header.Set("Cascade-Decision", id)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return resp{status: res.StatusCode, header: res.Header, body: string(b)}
	}
	d := decide(100)
	id := d.header.Get("Cascade-Decision")
	if d.status != 200 || id == "" {
		t.Fatalf("decision: %d %v", d.status, d.header)
	}
	usage := `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	for _, tc := range []struct {
		name, id, method, body string
		status                 int
		says                   string
	}{
		{"no id", "", "POST", usage, 400, "Cascade-Decision"},
		{"GET", id, "GET", "", 405, "POST"},
		{"unknown id", "nope", "POST", usage, 404, "no decision"},
		{"too long", id, "POST", strings.Repeat("x", 1<<20+1), 413, "max_report_bytes"},
		{"reconciled", id, "POST", usage, 204, ""},
		{"again", id, "POST", usage, 404, "already reported"},
	} {
		r := report(tc.id, tc.method, tc.body)
		if r.status != tc.status || !strings.Contains(r.body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, r.status, r.body, tc.status, tc.says)
		}
	}
	// A forwarded request for the report path is decided like any other,
	// not taken for a report (nginx asks at the original URI).
	req, _ := http.NewRequest("GET", endpoint+"report", nil)
	req.Header.Set("X-Original-URI", "/report")
	req.Header.Set("X-Org", "report-org")
	req.Header.Set("X-User", "u")
	if res, err := httpClient(t).Do(req); err != nil || res.StatusCode != 200 || res.Header.Get("RateLimit") == "" {
		t.Fatalf("a forwarded request for /report: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	// The decision after: charged its estimate (4000 + ~1) on top of the
	// first's 3 tokens, not on its estimate. (So large an estimate makes
	// the tokens limit the closest, the one RateLimit shows.)
	d = decide(4000)
	var r int
	fmt.Sscanf(d.header.Get("RateLimit"), `"llm/org";r=%d;`, &r)
	if r < 5000-3-4010 || r > 5000-3-4000 {
		t.Fatalf("after the report: %d tokens remaining (%q)", r, d.header.Get("RateLimit"))
	}
}

// TestTraefikPluginForwardedHeaders: a client's own forwarded headers,
// naming another request (X-Original-URI: /cheap, X-Forwarded-Uri,
// -Method, -Host), never reach Cascade through the plugin: the request
// decided is the one the upstream serves, here the LLM route's.
func TestTraefikPluginForwardedHeaders(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	var seen http.Header
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		fmt.Fprint(w, "ok")
	})
	plugin := loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": endpoint, "SendBody": true})
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`))
	for k, v := range map[string]string{"X-Org": "spoof-org", "X-User": "mallory", "Content-Type": "application/json",
		"X-Original-URI": "/cheap", "X-Forwarded-Uri": "/cheap", "X-Forwarded-Method": "GET", "X-Forwarded-Host": "elsewhere",
		"Forwarded": "for=198.51.100.1"} {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	plugin.ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Header().Get("RateLimit-Policy"), `"llm/org"`) {
		t.Fatalf("decided as another request: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	if seen == nil {
		t.Fatal("the upstream was not called")
	}
}
