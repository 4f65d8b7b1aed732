package cascade

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
)

// runExample starts an example Caddyfile with its ports 8080 and 9000 moved
// to free ones, and returns the rate-limited site's URL. The URL names the
// host 127.0.0.1, which the examples' sites must match (they listen on
// :8080, any host).
func runExample(t *testing.T, path string) string {
	front, _ := runExamplePorts(t, path)
	return fmt.Sprintf("http://127.0.0.1:%d/", front)
}

// runExamplePorts is runExample, returning the ports that replaced 8080
// and 9000.
func runExamplePorts(t *testing.T, path string) (front, api int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	front, api = freePort(t), freePort(t)
	cf := strings.NewReplacer("http://:8080", fmt.Sprintf("http://:%d", front),
		"http://:9000", fmt.Sprintf("http://:%d", api),
		"localhost:9000", fmt.Sprintf("127.0.0.1:%d", api)).Replace(string(b))
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("%s does not adapt: %v", path, err)
	}
	// keep the test instance off the default admin port
	cfg = []byte(strings.Replace(string(cfg), `{"apps"`, `{"admin":{"disabled":true},"apps"`, 1))
	loadJSON(t, cfg)
	return front, api
}

func exerciseQuickstart(t *testing.T, url string) {
	alice := []string{"X-Org: acme", "X-User: alice"}
	if got := admitN(t, 5, url, alice...); got != 5 {
		t.Fatalf("alice admitted %d of 5", got)
	}
	r := do(t, "GET", url, alice...)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "12" {
		t.Fatalf("6th request: %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	if r := do(t, "GET", url, "X-Org: acme", "X-User: bob"); r.status != 200 || !strings.Contains(r.body, `"hello": "bob"`) {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", url); r.status != http.StatusBadRequest {
		t.Fatalf("no org: %d", r.status)
	}
	if r := do(t, "GET", url, "X-Org: acme", "X-User: carol", "X-Tokens: 1001"); r.status != http.StatusTooManyRequests {
		t.Fatalf("1001 tokens: %d", r.status)
	}
}

func TestQuickstartExample(t *testing.T) {
	exerciseQuickstart(t, runExample(t, "examples/quickstart/Caddyfile"))
}
