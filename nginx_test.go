package cascade

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// requireNginx skips unless nginx is on PATH and CASCADE_SKIP_NGINX is set;
// otherwise it fails with how to install it (scripts/test.sh does).
func requireNginx(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if os.Getenv("CASCADE_SKIP_NGINX") != "" {
			t.Skip("nginx is not installed")
		}
		if bin = "/usr/sbin/nginx"; fileExists(bin) {
			return bin
		}
		t.Fatalf("nginx is not on PATH: install it (Debian: apt-get install nginx; scripts/test.sh does) or set CASCADE_SKIP_NGINX=1")
	}
	return bin
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestNginxAuthRequest runs a real nginx with examples/nginx/nginx.conf in
// front of the example's API, every request decided by Cascade through
// auth_request (examples/nginx/Caddyfile): limits, the 429 and Retry-After
// reaching the client, the rate-limit headers on admitted responses, keys
// from the forwarded headers, and a client's own forwarded headers, which
// nginx replaces: the request decided is the one nginx serves.
func TestNginxAuthRequest(t *testing.T) {
	bin := requireNginx(t)
	front, api := runExamplePorts(t, "examples/nginx/Caddyfile")
	conf, err := os.ReadFile("examples/nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	listen := freePort(t)
	cf := strings.NewReplacer(
		"127.0.0.1:8000", fmt.Sprintf("127.0.0.1:%d", listen),
		"127.0.0.1:8080", fmt.Sprintf("127.0.0.1:%d", front),
		"127.0.0.1:9000", fmt.Sprintf("127.0.0.1:%d", api),
	).Replace(string(conf))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(cf), 0o644)
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"))
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	// nginx's workers inherit the output pipe: stop the whole process
	// group, and never wait on the pipe for long.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	url := fmt.Sprintf("http://127.0.0.1:%d/hello", listen)
	deadline := time.Now().Add(processStartTimeout)
	for {
		if res, err := httpClient(t).Get(fmt.Sprintf("http://127.0.0.1:%d/", listen)); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not start:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// (the probe above was bob-less: the shared bucket of requests without
	// a user, not alice's)
	for i := 0; i < 3; i++ {
		r := do(t, "GET", url, "X-User: alice")
		if r.status != 200 || r.body != "hello alice" {
			t.Fatalf("request %d: %d %q\n%s", i, r.status, r.body, out)
		}
		if want := fmt.Sprintf(`"api/user";r=%d;t=`, 2-i); !strings.HasPrefix(r.header.Get("RateLimit"), want) {
			t.Fatalf("request %d: RateLimit %q, want %s…", i, r.header.Get("RateLimit"), want)
		}
	}
	r := do(t, "GET", url, "X-User: alice")
	if r.status != 429 || r.header.Get("Retry-After") == "" || r.header.Get("Retry-After") == "0" ||
		!strings.HasPrefix(r.header.Get("RateLimit"), `"api/user";r=0;t=`) || strings.Contains(r.body, "hello") {
		t.Fatalf("over the limit: %d %v %q", r.status, r.header, r.body)
	}
	if r := do(t, "POST", url, "X-User: bob"); r.status != 200 || r.body != "hello bob" {
		t.Fatalf("bob: %d %q", r.status, r.body)
	}

	// A client sends the headers that describe the request decided,
	// naming the cheap /hello while nginx serves it the dear /search (one
	// a minute): nginx sets or removes each of them, and Cascade decides
	// /search.
	search := fmt.Sprintf("http://127.0.0.1:%d/search", listen)
	spoof := []string{"X-User: mallory", "X-Forwarded-Uri: /hello", "X-Original-URI: /hello", "X-Forwarded-Method: GET",
		"X-Forwarded-Host: elsewhere", "Forwarded: for=198.51.100.1", "X-Forwarded-For: 198.51.100.1"}
	if r := do(t, "GET", search, spoof...); r.status != 200 || r.body != "hello mallory" {
		t.Fatalf("mallory's first search: %d %q\n%s", r.status, r.body, out)
	}
	if r := do(t, "GET", search, spoof...); r.status != 429 {
		t.Fatalf("mallory's second search, naming /hello: %d %q, want 429 (decided as /search, one a minute)\n%s", r.status, r.body, out)
	}
}
