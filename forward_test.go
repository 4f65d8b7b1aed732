package cascade

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestUnforward: the request a decision endpoint decides is the one the
// forwarded headers describe; headers that describe none are refused
// with what to send instead.
func TestUnforward(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		method  string // want, or the error's words
		path    string
		query   string
		host    string
		remote  string
		err     string
	}{
		{name: "traefik", headers: map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/chat?x=1",
			"X-Forwarded-Host": "api.example.com", "X-Forwarded-For": "203.0.113.7, 10.0.0.2"},
			method: "POST", path: "/v1/chat", query: "x=1", host: "api.example.com", remote: "10.0.0.2:0"},
		{name: "nginx", headers: map[string]string{"X-Original-URI": "/a%2Fb/c", "X-Forwarded-Method": "DELETE"},
			method: "DELETE", path: "/a/b/c", host: "endpoint", remote: "192.0.2.1:1234"},
		{name: "no method: the endpoint's", headers: map[string]string{"X-Forwarded-Uri": "/x"},
			method: "GET", path: "/x", host: "endpoint", remote: "192.0.2.1:1234"},
		{name: "a client address that is not one", headers: map[string]string{"X-Forwarded-Uri": "/x", "X-Forwarded-For": "nonsense"},
			method: "GET", path: "/x", host: "endpoint", remote: "192.0.2.1:1234"},
		{name: "nothing forwarded", headers: map[string]string{}, err: "X-Forwarded-Uri (Traefik, Envoy) or X-Original-URI (nginx)"},
		{name: "an absolute URI", headers: map[string]string{"X-Forwarded-Uri": "http://evil.example/x"}, err: "is not a request path"},
		{name: "a path starting with //, as a client may send", headers: map[string]string{"X-Forwarded-Uri": "//evil.example/x"},
			method: "GET", path: "//evil.example/x", host: "endpoint", remote: "192.0.2.1:1234"},
		{name: "not a path", headers: map[string]string{"X-Forwarded-Uri": "x y"}, err: "is not a request path"},
		{name: "a method with spaces", headers: map[string]string{"X-Forwarded-Uri": "/x", "X-Forwarded-Method": "GET /admin"}, err: "is not a method"},
		{name: "a long method", headers: map[string]string{"X-Forwarded-Uri": "/x", "X-Forwarded-Method": strings.Repeat("A", 33)}, err: "is not a method"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://endpoint/", nil)
			r.RemoteAddr = "192.0.2.1:1234"
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			err := unforward(r)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Method != tc.method || r.URL.Path != tc.path || r.URL.RawQuery != tc.query || r.Host != tc.host || r.RemoteAddr != tc.remote {
				t.Fatalf("%s %s ?%s host %s from %s, want %s %s ?%s host %s from %s", r.Method, r.URL.Path, r.URL.RawQuery, r.Host, r.RemoteAddr,
					tc.method, tc.path, tc.query, tc.host, tc.remote)
			}
		})
	}
}
