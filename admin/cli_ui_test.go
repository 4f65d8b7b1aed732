package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUIProxy: `caddy rate-limit ui` passes the status page's reads on as
// a client's (no Origin, Referer or Sec-Fetch-* for Caddy's admin
// endpoint to refuse), and nothing else: no writes, no other routes, no
// request another site makes.
func TestUIProxy(t *testing.T) {
	var got []*http.Request
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r)
		io.WriteString(w, "from admin "+r.URL.Path)
	}))
	defer admin.Close()
	h, err := uiProxy(strings.TrimPrefix(admin.URL, "http://"), 2020, "tok")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path string
		header             map[string]string
		status             int
	}{
		{"the page", "GET", "/rate_limit/ui", map[string]string{"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "none"}, 200},
		{"without the token", "GET", "/rate_limit/status", map[string]string{"Cookie": ""}, 403},
		{"with a wrong token", "GET", "/rate_limit/ui?token=nope", map[string]string{"Cookie": ""}, 403},
		{"with the token", "GET", "/rate_limit/ui?token=tok", map[string]string{"Cookie": ""}, 302},
		{"its data", "GET", "/rate_limit/trees", map[string]string{"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:2020", "Referer": "http://127.0.0.1:2020/rate_limit/ui"}, 200},
		{"a write", "PUT", "/rate_limit/overrides/a/b/c", nil, 405},
		{"a reset", "POST", "/rate_limit/reset", nil, 405},
		{"another route", "GET", "/config/", nil, 404},
		{"another site", "GET", "/rate_limit/trees", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"the root", "GET", "/", nil, 302},
		{"a rebound name", "GET", "/rate_limit/status", map[string]string{"Host": "evil.example:2020"}, 421},
		{"another port", "GET", "/rate_limit/status", map[string]string{"Host": "127.0.0.1:2019"}, 421},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			r := httptest.NewRequest(tc.method, tc.path, nil)
			r.Host = "127.0.0.1:2020"
			r.Header.Set("Cookie", "cascade_ui=tok")
			for k, v := range tc.header {
				if k == "Host" {
					r.Host = v
					continue
				}
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, w.Code, w.Body, tc.status)
			}
			if tc.status != 200 {
				if len(got) != 0 {
					t.Fatalf("%s %s reached the admin endpoint", tc.method, tc.path)
				}
				return
			}
			if len(got) != 1 || got[0].URL.Path != tc.path {
				t.Fatalf("the admin endpoint got %v", got)
			}
			for _, name := range []string{"Origin", "Referer", "Sec-Fetch-Mode", "Sec-Fetch-Site", "Cookie"} {
				if v := got[0].Header.Get(name); v != "" {
					t.Fatalf("passed on %s: %q", name, v)
				}
			}
		})
	}
	for addr, ok := range map[string]bool{"127.0.0.1:2020": true, "[::1]:2020": true, "localhost:2020": true, "0.0.0.0:2020": false, "192.168.1.2:80": false} {
		if err := loopback(addr); (err == nil) != ok {
			t.Errorf("loopback(%q) = %v", addr, err)
		}
	}
}
