package cascade

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"
)

// loadTraefikPlugin loads the plugin in traefik/ as Traefik does: its
// source under a GOPATH, interpreted by Yaegi (the version Traefik pins)
// with the standard library's symbols, New and CreateConfig looked up by
// the package's name. It returns the middleware built around next with
// the given settings. As in Traefik, next is compiled: a ResponseWriter
// of the plugin's own reaches it through Yaegi's wrapper of
// http.ResponseWriter, which is neither an http.Flusher nor an
// http.Hijacker (TestTraefikHarnessHidesFlushAndHijack).
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

// serveTraefik serves the plugin, loaded with settings, as Traefik serves
// a router: an HTTP server, the plugin, then Traefik's service, Go's
// reverse proxy to upstream (flushing every 100 ms, Traefik's default).
// It returns the server's URL.
func serveTraefik(t *testing.T, upstream string, settings map[string]any) string {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: 100 * time.Millisecond,
	}
	front := httptest.NewServer(loadTraefikPlugin(t, proxy, settings))
	t.Cleanup(front.Close)
	return front.URL
}

// reportSpy passes reports on to target and tells each one's status on
// the channel returned, so that a test waits for a report the plugin
// sends in the background.
func reportSpy(t *testing.T, target string) (string, <-chan int) {
	statuses := make(chan int, 16)
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequest(r.Method, target, r.Body)
		req.Header, req.ContentLength = r.Header.Clone(), r.ContentLength
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Errorf("passing a report on: %v", err)
			w.WriteHeader(http.StatusBadGateway)
			statuses <- http.StatusBadGateway
			return
		}
		defer res.Body.Close()
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
		statuses <- res.StatusCode
	}))
	t.Cleanup(spy.Close)
	return spy.URL, statuses
}

// reported waits for the next report's status.
func reported(t *testing.T, statuses <-chan int) int {
	t.Helper()
	select {
	case s := <-statuses:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5 s")
		return 0
	}
}

// fakeEndpoint is a decision endpoint answering with answer, and the
// requests it was asked (their method, headers and body length).
func fakeEndpoint(t *testing.T, answer http.HandlerFunc) (string, func() []*http.Request) {
	var mu sync.Mutex
	var asked []*http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		asked = append(asked, &http.Request{Method: r.Method, Header: r.Header.Clone(), ContentLength: int64(len(b))})
		mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/", func() []*http.Request {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked)
	}
}

// admit is a decision endpoint's admission.
func admit(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("RateLimit", `"user";r=9;t=1`)
	w.WriteHeader(http.StatusOK)
}

// TestTraefikHarnessHidesFlushAndHijack: what the upstream behind the
// plugin gets is what Traefik's proxy gets in Traefik, Yaegi's wrapper of
// the plugin's writer, which can neither flush nor hijack (else the
// stream and upgrade tests below would prove nothing).
func TestTraefikHarnessHidesFlushAndHijack(t *testing.T) {
	endpoint, _ := fakeEndpoint(t, admit)
	var flusher, hijacker atomic.Bool
	plugin := loadTraefikPlugin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := w.(http.Flusher)
		flusher.Store(ok)
		_, ok = w.(http.Hijacker)
		hijacker.Store(ok)
	}), map[string]any{"Endpoint": endpoint})
	front := httptest.NewServer(plugin)
	defer front.Close()
	res, err := httpClient(t).Get(front.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || flusher.Load() || hijacker.Load() {
		t.Fatalf("%d: the upstream's writer is a Flusher: %v, a Hijacker: %v; Traefik's proxy gets neither", res.StatusCode, flusher.Load(), hijacker.Load())
	}
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
		!strings.Contains(rec.Body.String(), `"status":429`) || !strings.HasPrefix(rec.Header().Get("RateLimit"), `"user";r=0;`) {
		t.Fatalf("over the limit: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	// What the SDKs read of a refusal passes too: the exact wait, whether
	// to retry, and the request's id.
	for _, h := range []string{"Retry-After-Ms", "X-Should-Retry", "X-Request-Id", "Request-Id"} {
		if rec.Header().Get(h) == "" {
			t.Errorf("the refusal lacks %s: %v", h, rec.Header())
		}
	}
	// Cascade's problem and headers for the client, nothing of the
	// endpoint's own.
	for _, h := range []string{"Server", "Cascade-Decision", "Date", "Alt-Svc"} {
		if v := rec.Header().Get(h); v != "" {
			t.Errorf("the refusal passes on the endpoint's %s: %q", h, v)
		}
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
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" || rec.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(rec.Body.String(), "#decision-unavailable") {
		t.Fatalf("fail closed: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	if u, _ := url.Parse(dead); strings.Contains(rec.Body.String(), u.Hostname()) || strings.Contains(rec.Body.String(), u.Port()) {
		t.Fatalf("the 503 names the endpoint: %q", rec.Body.String())
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
// upstream's response (JSON, an event stream's last usage, and gzip JSON
// reported with its Content-Encoding), which the plugin reports under the
// decision's id, after the response. The org's tokens remaining show it:
// the limit is 5000 tokens/h, and the estimate of each request is its
// max_tokens (1000) plus its prompt (~2).
func TestTraefikPluginReconciles(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"max_tokens":1000`) {
			t.Errorf("the upstream got %q, not the whole body", body)
		}
		switch {
		case strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":40,\"total_tokens\":50}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		case strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprint(zw, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":60,"total_tokens":70}}`)
			zw.Close()
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
		}
	})
	reports, statuses := reportSpy(t, endpoint+"report")
	plugin := loadTraefikPlugin(t, upstream, map[string]any{
		"Endpoint": endpoint, "ReportEndpoint": reports, "SendBody": true,
	})
	chat := func(stream, gzipped bool) int {
		if gzipped {
			return chatLeft(t, plugin, "tokens-org", stream, "Accept-Encoding: gzip")
		}
		return chatLeft(t, plugin, "tokens-org", stream)
	}
	// Each decision shows what remains after its estimate; the report of
	// the previous response, waited for, has given back estimate − usage.
	first := chat(false, false)
	estimate := 5000 - first
	if estimate < 1000 || estimate > 1010 {
		t.Fatalf("first estimate %d, want max_tokens and the prompt", estimate)
	}
	used := 0
	for _, step := range []struct {
		name            string
		stream, gzipped bool
		usage           int // reported by the step before
	}{
		{"gzip", false, true, 30},
		{"stream", true, false, 70},
		{"json", false, false, 50},
	} {
		if s := reported(t, statuses); s != http.StatusNoContent {
			t.Fatalf("before %s: the report was answered %d", step.name, s)
		}
		used += step.usage
		if got, want := chat(step.stream, step.gzipped), 5000-used-estimate; got != want {
			t.Fatalf("%s, after reporting %d tokens: %d remaining, want %d", step.name, step.usage, got, want)
		}
	}
	if s := reported(t, statuses); s != http.StatusNoContent {
		t.Fatalf("the last report was answered %d", s)
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

// chatRequest is a chat completion through the plugin served at front,
// as the example's org and user.
func chatRequest(t *testing.T, front, path, body string) *http.Request {
	req, err := http.NewRequest("POST", front+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Org", "stream-org")
	req.Header.Set("X-User", "alice")
	return req
}

// TestTraefikPluginStreams: an event stream reaches the client as the
// upstream sends it, through Traefik's proxy, which cannot flush the
// plugin's writer: each event within 50 ms of its sending, while the
// events are 300 ms apart (unflushed, all would come at the end, 0.9 s).
func TestTraefikPluginStreams(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	const events = 4
	sent := make(chan time.Time, events)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			if i > 0 {
				time.Sleep(300 * time.Millisecond)
			}
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			sent <- time.Now()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\ndata: [DONE]\n\n")
	}))
	defer upstream.Close()
	reports, statuses := reportSpy(t, endpoint+"report")
	front := serveTraefik(t, upstream.URL, map[string]any{"Endpoint": endpoint, "ReportEndpoint": reports, "SendBody": true})
	res, err := httpClient(t).Do(chatRequest(t, front, "/v1/chat/completions",
		`{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("RateLimit") == "" {
		t.Fatalf("%d %v", res.StatusCode, res.Header)
	}
	var arrived []time.Time
	lines := bufio.NewReader(res.Body)
	for len(arrived) < events {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", len(arrived), err)
		}
		if strings.HasPrefix(line, `data: {"n":`) {
			arrived = append(arrived, time.Now())
		}
	}
	_, _ = io.Copy(io.Discard, res.Body)
	for i, at := range arrived {
		if late := at.Sub(<-sent); late > 50*time.Millisecond {
			t.Errorf("event %d reached the client %v after the upstream sent it", i, late)
		}
	}
	// The stream's tail is still reported, after it ends.
	if s := reported(t, statuses); s != http.StatusNoContent {
		t.Fatalf("the stream's report: %d", s)
	}
}

// TestTraefikPluginWebSocket: a WebSocket upgrade through the plugin and
// Traefik's proxy switches protocols (the proxy hijacks the connection)
// and echoes, with the rate-limit headers on the 101. The upstream is a
// hand-written upgrade and line echo: what a proxy sees of WebSocket.
func TestTraefikPluginWebSocket(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "not an upgrade", http.StatusBadRequest)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("upstream hijack: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		line, err := rw.ReadString('\n')
		if err == nil {
			fmt.Fprint(rw, "echo: "+line)
			rw.Flush()
		}
	}))
	defer upstream.Close()
	front := serveTraefik(t, upstream.URL, map[string]any{"Endpoint": endpoint})
	conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Org: acme\r\nX-User: ws\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("RateLimit") == "" {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		t.Fatalf("upgrade: %d %v %q", res.StatusCode, res.Header, body)
	}
	fmt.Fprint(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Fatalf("echo: %q %v", line, err)
	}
}

// TestTraefikPluginReportsInBackground: a report endpoint that takes 1 s
// delays no response (the report goes after it, in the background), and
// still gets the report: the upstream's body under the decision's id,
// with its Content-Type.
func TestTraefikPluginReportsInBackground(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	}))
	defer upstream.Close()
	got := make(chan *http.Request, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		time.Sleep(time.Second)
		w.WriteHeader(http.StatusNoContent)
		got <- &http.Request{Header: r.Header.Clone(), Body: io.NopCloser(bytes.NewReader(body))}
	}))
	defer slow.Close()
	// A timeout long enough that a report sent before the response would
	// hold it the whole second.
	front := serveTraefik(t, upstream.URL, map[string]any{"Endpoint": endpoint, "ReportEndpoint": slow.URL, "SendBody": true, "Timeout": "3s"})
	start := time.Now()
	res, err := httpClient(t).Do(chatRequest(t, front, "/v1/chat/completions",
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	firstByte := time.Since(start)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || firstByte > 500*time.Millisecond {
		t.Fatalf("%d, first byte after %v: the report held the response", res.StatusCode, firstByte)
	}
	select {
	case r := <-got:
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Cascade-Decision") == "" || r.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"total_tokens":3`) {
			t.Fatalf("the report: %v %q", r.Header, body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report")
	}
}

// TestTraefikPluginBodyTooLarge: with sendBody, a body over maxBodyBytes
// (its length known or not) is refused with 413 and nothing decided or
// passed on, rather than priced on its start; a body of maxBodyBytes
// passes whole.
func TestTraefikPluginBodyTooLarge(t *testing.T) {
	endpoint, asked := fakeEndpoint(t, admit)
	var mu sync.Mutex
	var upstreamGot []int // the length of each body the upstream got
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		upstreamGot = append(upstreamGot, len(b))
		mu.Unlock()
	}))
	defer upstream.Close()
	front := serveTraefik(t, upstream.URL, map[string]any{"Endpoint": endpoint, "SendBody": true, "MaxBodyBytes": int64(1 << 20)})
	post := func(n int, chunked bool) *http.Response {
		var body io.Reader = bytes.NewReader(bytes.Repeat([]byte("x"), n))
		if chunked {
			body = io.MultiReader(body) // a length the client cannot know
		}
		res, err := httpClient(t).Post(front+"/v1/upload", "application/octet-stream", body)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode == 413 && (res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(b), "#body-too-large")) {
			t.Errorf("413: %v %q", res.Header, b)
		}
		return res
	}
	for _, chunked := range []bool{false, true} {
		if res := post(2<<20, chunked); res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("2 MiB (chunked %v): %d", chunked, res.StatusCode)
		}
	}
	passed := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(upstreamGot)
	}
	if len(asked()) != 0 || len(passed()) != 0 {
		t.Fatalf("a body too large was decided %d times, passed on %d", len(asked()), len(passed()))
	}
	if res := post(1<<20, true); res.StatusCode != 200 || !slices.Equal(passed(), []int{1 << 20}) {
		t.Fatalf("1 MiB: %d, the upstream got %v", res.StatusCode, passed())
	}
	if a := asked(); len(a) != 1 || a[0].ContentLength != 1<<20 {
		t.Fatalf("the decision of 1 MiB was sent %v", a)
	}
}

// TestTraefikPluginClientAddress: the client Cascade is told of is the
// peer, unless the peer is one of trustedIPs: then the right-most address
// of X-Forwarded-For that is not, whatever a client wrote left of it.
func TestTraefikPluginClientAddress(t *testing.T) {
	endpoint, asked := fakeEndpoint(t, admit)
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	plain := loadTraefikPlugin(t, next, map[string]any{"Endpoint": endpoint})
	behindLB := loadTraefikPlugin(t, next, map[string]any{"Endpoint": endpoint, "TrustedIPs": []string{"10.0.0.0/8", "192.0.2.1"}})
	for _, tc := range []struct {
		name   string
		plugin http.Handler
		peer   string
		xff    []string
		client string
	}{
		{"no trusted IPs", plain, "10.0.0.1:5000", []string{"198.51.100.9"}, "10.0.0.1"},
		{"a trusted peer", behindLB, "10.0.0.1:5000", []string{"198.51.100.9"}, "198.51.100.9"},
		{"a client's own before", behindLB, "10.0.0.1:5000", []string{"6.6.6.6, 198.51.100.9"}, "198.51.100.9"},
		{"two trusted proxies", behindLB, "192.0.2.1:5000", []string{"6.6.6.6", "198.51.100.9, 10.1.1.1"}, "198.51.100.9"},
		{"all trusted", behindLB, "10.0.0.1:5000", []string{"10.0.0.7"}, "10.0.0.7"},
		{"not an address", behindLB, "10.0.0.1:5000", []string{"unknown, 10.0.0.7"}, "10.0.0.7"},
		{"an untrusted peer", behindLB, "203.0.113.5:5000", []string{"198.51.100.9"}, "203.0.113.5"},
		{"no header", behindLB, "10.0.0.1:5000", nil, "10.0.0.1"},
	} {
		req := httptest.NewRequest("GET", "/v1/chat", nil)
		req.RemoteAddr = tc.peer
		for _, v := range tc.xff {
			req.Header.Add("X-Forwarded-For", v)
		}
		req.Header.Set("X-Real-Ip", "6.6.6.6")
		tc.plugin.ServeHTTP(httptest.NewRecorder(), req)
		a := asked()
		h := a[len(a)-1].Header
		if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != tc.client || h.Get("X-Real-Ip") != tc.client {
			t.Errorf("%s: X-Forwarded-For %q, X-Real-Ip %q, want %s", tc.name, got, h.Get("X-Real-Ip"), tc.client)
		}
	}
}

// TestTraefikPluginAsksAsSent: the decision is asked with the request's
// own method, with a body only when there is one: a GET whose body Traefik
// wrapped (its access log does) is asked as a GET without a body.
func TestTraefikPluginAsksAsSent(t *testing.T) {
	endpoint, asked := fakeEndpoint(t, admit)
	plugin := loadTraefikPlugin(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		map[string]any{"Endpoint": endpoint, "SendBody": true})
	get := httptest.NewRequest("GET", "/v1/models", nil)
	get.Body = io.NopCloser(get.Body) // as Traefik's access log wraps it
	plugin.ServeHTTP(httptest.NewRecorder(), get)
	plugin.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("PUT", "/v1/doc", strings.NewReader("twelve bytes")))
	a := asked()
	if len(a) != 2 || a[0].Method != "GET" || a[0].ContentLength != 0 || a[0].Header.Get("X-Forwarded-Method") != "GET" ||
		a[1].Method != "PUT" || a[1].ContentLength != 12 || a[1].Header.Get("X-Forwarded-Method") != "PUT" {
		for _, r := range a {
			t.Logf("asked %s, %d bytes, X-Forwarded-Method %s", r.Method, r.ContentLength, r.Header.Get("X-Forwarded-Method"))
		}
		t.Fatal("the decision was not asked as the request was sent")
	}
}

// TestTraefikPluginNotADecision: an answer that is not Cascade's (a
// redirect, which is not followed; a page of some other server) is no
// decision: the failure policy applies, and the client sees none of it.
func TestTraefikPluginNotADecision(t *testing.T) {
	var followed atomic.Bool
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		followed.Store(true)
		admit(w, r)
	}))
	defer elsewhere.Close()
	redirect, _ := fakeEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL, http.StatusFound)
	})
	notFound, _ := fakeEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "Caddy")
		http.Error(w, "404 page of http://10.9.8.7:8080", http.StatusNotFound)
	})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream") })
	for _, endpoint := range []string{redirect, notFound} {
		rec := httptest.NewRecorder()
		loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": endpoint}).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != 503 || !strings.Contains(rec.Body.String(), "#decision-unavailable") || rec.Header().Get("Server") != "" ||
			strings.Contains(rec.Body.String(), "10.9.8.7") {
			t.Errorf("%s: %d %v %q", endpoint, rec.Code, rec.Header(), rec.Body.String())
		}
		rec = httptest.NewRecorder()
		loadTraefikPlugin(t, upstream, map[string]any{"Endpoint": endpoint, "FailOpen": true}).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != 200 || rec.Body.String() != "upstream" {
			t.Errorf("%s, failOpen: %d %q", endpoint, rec.Code, rec.Body.String())
		}
	}
	if followed.Load() {
		t.Error("the plugin followed the endpoint's redirect")
	}
}

// TestTraefikPluginLongStreamKeepsItsStart: an Anthropic event stream
// longer than maxReportBytes is reported with its start (message_start,
// which holds the input tokens) and its end (message_delta, the output
// tokens), so a long answer does not make its prompt free; and a request
// that asks for an upgrade other than a WebSocket is reported as any
// other, the upstream not asked to switch.
func TestTraefikPluginLongStreamKeepsItsStart(t *testing.T) {
	endpoint := runExample(t, "examples/traefik/Caddyfile")
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Upgrade") != "" {
			t.Errorf("the upstream was asked to upgrade to %q", r.Header.Get("Upgrade"))
		}
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":300,\"output_tokens\":1}}}\n\n")
		for range 200 { // about 20 KiB, five times maxReportBytes
			fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lorem ipsum dolor sit amet\"}}\n\n")
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n")
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	})
	reports, statuses := reportSpy(t, endpoint+"report")
	plugin := loadTraefikPlugin(t, upstream, map[string]any{
		"Endpoint": endpoint, "ReportEndpoint": reports, "SendBody": true, "MaxReportBytes": int64(4096),
	})
	chat := func(stream bool, headers ...string) int {
		return chatLeft(t, plugin, "long-stream-org", stream, headers...)
	}
	estimate := 5000 - chat(true)
	if s := reported(t, statuses); s != http.StatusNoContent {
		t.Fatalf("the stream's report was answered %d", s)
	}
	// The next decision (a JSON chat, asking for an upgrade on the way)
	// sees the stream charged 340 tokens (300 in, 40 out), not 40.
	if got, want := chat(false, "Connection: Upgrade", "Upgrade: foo"), 5000-340-estimate; got != want {
		t.Fatalf("after a 20 KiB stream of 300 + 40 tokens: %d remaining, want %d (the input tokens lost with the stream's start?)", got, want)
	}
	if s := reported(t, statuses); s != http.StatusNoContent {
		t.Fatalf("a request asking for an upgrade other than a WebSocket went unreported (%d)", s)
	}
}

// chatLeft has plugin admit a chat completion (max_tokens 1000, streamed
// or not) of org's user alice, with the given "Name: value" headers, and
// returns what its decision left of the llm tree's org limit.
func chatLeft(t *testing.T, plugin http.Handler, org string, stream bool, headers ...string) int {
	t.Helper()
	body := `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
	if stream {
		body = `{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Org", org)
	req.Header.Set("X-User", "alice")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	plugin.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("chat: %d %q", rec.Code, rec.Body.String())
	}
	var r int
	if _, err := fmt.Sscanf(rec.Header().Get("RateLimit"), `"llm/org";r=%d;`, &r); err != nil {
		t.Fatalf("RateLimit %q: %v", rec.Header().Get("RateLimit"), err)
	}
	return r
}
