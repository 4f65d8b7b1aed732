package cascade

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// forwardedRequest is a request to a decision endpoint from a trusted
// proxy at 192.0.2.1 that Caddy resolved the client of as clientIP, with
// headers given as name, value pairs (a name given twice: two lines).
func forwardedRequest(clientIP string, headers ...string) *http.Request {
	r := &http.Request{Method: "GET", URL: &url.URL{Path: "/"}, Host: "endpoint", Header: http.Header{}, RemoteAddr: "192.0.2.1:1234"}
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{
		caddyhttp.TrustedProxyVarKey: true, caddyhttp.ClientIPVarKey: clientIP}))
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// TestUnforward: the request a decision endpoint decides is the one the
// forwarded headers describe, from the client Caddy resolved; headers
// that describe none, or two, are refused with what to send instead.
func TestUnforward(t *testing.T) {
	for _, tc := range []struct {
		name      string
		uriHeader string
		headers   []string
		method    string // want
		path      string
		query     string
		host      string
		remote    string
		err       string // or the error's words
	}{
		{name: "traefik", headers: []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/v1/chat?x=1", "X-Forwarded-Host", "api.example.com"},
			method: "POST", path: "/v1/chat", query: "x=1", host: "api.example.com", remote: "203.0.113.7:0"},
		{name: "nginx", headers: []string{"X-Original-URI", "/a%2Fb/c", "X-Forwarded-Method", "DELETE"},
			method: "DELETE", path: "/a/b/c", host: "endpoint", remote: "203.0.113.7:0"},
		{name: "both, agreeing", headers: []string{"X-Original-URI", "/x", "X-Forwarded-Uri", "/x"},
			method: "GET", path: "/x", host: "endpoint", remote: "203.0.113.7:0"},
		{name: "no method: the endpoint's", headers: []string{"X-Forwarded-Uri", "/x"},
			method: "GET", path: "/x", host: "endpoint", remote: "203.0.113.7:0"},
		{name: "uri_header: the other is not read", uriHeader: "X-Original-URI", headers: []string{"X-Forwarded-Uri", "/cheap", "X-Original-URI", "/dear"},
			method: "GET", path: "/dear", host: "endpoint", remote: "203.0.113.7:0"},
		{name: "a path starting with //, as a client may send", headers: []string{"X-Forwarded-Uri", "//evil.example/x"},
			method: "GET", path: "//evil.example/x", host: "endpoint", remote: "203.0.113.7:0"},
		{name: "two URIs", headers: []string{"X-Forwarded-Uri", "/cheap", "X-Original-URI", "/dear"}, err: "two original URIs"},
		{name: "two lines of one URI header", headers: []string{"X-Forwarded-Uri", "/cheap", "X-Forwarded-Uri", "/dear"}, err: "two original URIs"},
		{name: "two methods", headers: []string{"X-Forwarded-Uri", "/x", "X-Forwarded-Method", "GET", "X-Forwarded-Method", "POST"}, err: "two values of X-Forwarded-Method"},
		{name: "two hosts", headers: []string{"X-Forwarded-Uri", "/x", "X-Forwarded-Host", "a", "X-Forwarded-Host", "b"}, err: "two values of X-Forwarded-Host"},
		{name: "nothing forwarded", err: "X-Forwarded-Uri (Traefik, Envoy) or X-Original-URI (nginx)"},
		{name: "not the uri_header", uriHeader: "X-Original-URI", headers: []string{"X-Forwarded-Uri", "/x"}, err: "X-Original-URI (uri_header)"},
		{name: "an absolute URI", headers: []string{"X-Forwarded-Uri", "http://evil.example/x"}, err: "is not a request path"},
		{name: "not a path", headers: []string{"X-Forwarded-Uri", "x y"}, err: "is not a request path"},
		{name: "a method with spaces", headers: []string{"X-Forwarded-Uri", "/x", "X-Forwarded-Method", "GET /admin"}, err: "is not a method"},
		{name: "a long method", headers: []string{"X-Forwarded-Uri", "/x", "X-Forwarded-Method", strings.Repeat("A", 33)}, err: "is not a method"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := forwardedRequest("203.0.113.7", tc.headers...)
			err := (&ForwardedConfig{URIHeader: tc.uriHeader}).unforward(r)
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

// TestForwardedConfig: the forwarded block's options, and the errors of
// bad ones.
func TestForwardedConfig(t *testing.T) {
	c := &ForwardedConfig{}
	if err := c.provision(); err != nil || c.MaxHeld != 100000 || c.MaxHeldPerTenant != 10000 {
		t.Fatalf("defaults: %v, max_held %d, max_held_per_tenant %d", err, c.MaxHeld, c.MaxHeldPerTenant)
	}
	for _, tc := range []struct{ cfg ForwardedConfig }{
		{ForwardedConfig{MaxHeld: 10, MaxHeldPerTenant: 11}},
		{ForwardedConfig{MaxHeldPerTenant: -1}},
		{ForwardedConfig{URIHeader: "X Bad"}},
	} {
		if err := tc.cfg.provision(); err == nil {
			t.Errorf("%+v: no error", tc.cfg)
		}
	}
	for _, tc := range []struct{ block, err string }{
		{"forwarded {\n uri_header\n }", "uri_header needs a header name"},
		{"forwarded {\n uri_header X-A X-B\n }", "takes one header name"},
		{"forwarded {\n uri_header X:A\n }", "is not a header name"},
		{"forwarded {\n max_held_per_tenant 0\n }", "give a positive count"},
		{"forwarded {\n max_held 10\n max_held_per_tenant 11\n }", "more than max_held 10"},
		{"forwarded {\n uri_heder X-Original-URI\n }", "max_held_per_tenant or uri_header"},
	} {
		_, err := adapt(t, "http://:1 {\n rate_limit {\n "+tc.block+"\n tree a {\n tier u {header.X-User} {\n limit 1/min\n }\n }\n }\n}\n")
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %v, want an error saying %q", tc.block, err, tc.err)
		}
	}
	cfg, err := adapt(t, "http://:1 {\n rate_limit {\n forwarded {\n uri_header X-Original-URI\n max_held 50\n max_held_per_tenant 5\n }\n tree a {\n tier u {header.X-User} {\n limit 1/min\n }\n }\n }\n}\n")
	if err != nil || !strings.Contains(string(cfg), `"forwarded":{"max_held":50,"max_held_per_tenant":5,"uri_header":"X-Original-URI"}`) {
		t.Fatalf("%v\n%s", err, cfg)
	}
}

// FuzzUnforward: whatever a trusted proxy forwards, unforward answers
// without panicking; what it decides is a request path from a single
// original URI, with a method and host without controls.
func FuzzUnforward(f *testing.F) {
	f.Add("/v1/chat?x=1", "", "POST", "api.example.com", "", false)
	f.Add("/cheap", "/dear", "GET", "", "", false)
	f.Add("", "/a%2Fb", "DELETE", "h", "x", true)
	f.Add("//evil/x", "//evil/x", "GET /admin", "", "", false)
	f.Add("http://evil/x", "", "", "", "y", false)
	f.Fuzz(func(t *testing.T, fwdURI, origURI, method, host, second string, uriHeader bool) {
		headers := []string{"X-Forwarded-Uri", fwdURI, "X-Original-URI", origURI, "X-Forwarded-Method", method, "X-Forwarded-Host", host}
		if second != "" {
			headers = append(headers, "X-Forwarded-Uri", second)
		}
		r := forwardedRequest("203.0.113.7", headers...)
		c := &ForwardedConfig{}
		if uriHeader {
			c.URIHeader = "X-Original-URI"
		}
		err := c.unforward(r)
		if err != nil {
			return
		}
		named := map[string]bool{}
		for _, v := range []string{fwdURI, origURI, second} {
			if v != "" && (!uriHeader || v == origURI) {
				named[v] = true
			}
		}
		if len(named) != 1 || !named[r.RequestURI] {
			t.Fatalf("decided %q from %v", r.RequestURI, named)
		}
		if u, perr := url.ParseRequestURI(r.RequestURI); perr != nil || u.Host != "" || r.URL.Path != u.Path {
			t.Fatalf("decided %q as path %q", r.RequestURI, r.URL.Path)
		}
		if strings.ContainsFunc(r.Method, func(c rune) bool { return c <= ' ' || c >= 0x7f }) || r.RemoteAddr != "203.0.113.7:0" {
			t.Fatalf("method %q from %q", r.Method, r.RemoteAddr)
		}
	})
}
