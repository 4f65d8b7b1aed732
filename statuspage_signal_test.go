package cascade

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/admin"
)

// TestStatusHidesSignalCredentials: an adaptive prometheus signal whose
// exporter needs basic auth is configured with the credentials in its URL
// (a signal has no headers). When the exporter answers with an error, GET
// /rate_limit/status (which the status page shows) names the URL without
// its password.
func TestStatusHidesSignalCredentials(t *testing.T) {
	const secret = "s3cr3t-exporter-pw"
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unauthorized", http.StatusServiceUnavailable)
	}))
	t.Cleanup(exporter.Close)
	u := strings.Replace(exporter.URL, "http://", "http://scraper:"+secret+"@", 1) + "/metrics"

	port, adminPort := freePort(t), freePort(t)
	cf := fmt.Sprintf(`{
%s	cascade {
		adaptive {
			signal exporter {
				prometheus %s up
				warn 1
				critical 2
				on_error ignore
				interval 200ms
				timeout 100ms
			}
		}
	}
}
http://127.0.0.1:%d {
	rate_limit {
		tree edge {
			tier all fixed {
				limit 1000/s
				adaptive
			}
		}
		%s
	}
	respond "ok" 200
}
`, globals(adminPort), u, port, memoryStore().block(t))
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	api := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	site := fmt.Sprintf("http://127.0.0.1:%d/", port)

	deadline := time.Now().Add(20 * time.Second)
	for {
		do(t, "GET", site)
		var st admin.Status
		code, body := call(t, "GET", api+"/rate_limit/status", nil, &st)
		if code != 200 {
			t.Fatalf("GET /rate_limit/status: %d %s", code, body)
		}
		var sigErr string
		for _, a := range st.Adaptive {
			for _, s := range a.Signals {
				if s.Name == "exporter" && s.Error != "" {
					sigErr = s.Error
				}
			}
		}
		if sigErr != "" {
			if strings.Contains(body, secret) {
				t.Fatalf("/rate_limit/status shows the exporter's password in the signal's error: %q", sigErr)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the signal's read error never showed in /rate_limit/status:\n%s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
