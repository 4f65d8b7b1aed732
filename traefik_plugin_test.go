package cascade

import (
	"context"
	"fmt"
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
	endpoint := runExample(t, "examples/traefik/Caddyfile") + "decide"
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
