package cascade

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// The token a client sends, and the parts of it that must never be shown.
const (
	bearer = "Bearer sk-secret-123"
	secret = "sk-secret"
)

var fingerprintRE = regexp.MustCompile(`fp:[0-9a-f]{12}`)

// TestSensitiveValuesNeverShown: a tier
// keyed on Authorization (the LLM example of docs/costs.md), a client refused
// with its API key, then everything an operator can read — Caddy's log,
// the admin API (top, buckets, reset, trees, overrides), the CLI, the
// problem body — shows a fingerprint of the key, never the key; the
// fingerprint is the one another instance sharing the Redis computes; and
// a tier marked `sensitive off` shows its values as they are.
func TestSensitiveValuesNeverShown(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := fmt.Sprintf("t%d:", testSeq.Add(1))
	storeBlock := fmt.Sprintf("store redis {\n address %s\n key_prefix %s\n timeout 2s\n }", srv.Addr(), prefix)
	logFile := filepath.Join(t.TempDir(), "log.json")
	port, plainPort, adminPort := freePort(t), freePort(t), freePort(t)
	cf := fmt.Sprintf(`{
%s	log {
		output file %s
		format json
		level INFO
	}
}
http://127.0.0.1:%d {
	rate_limit {
		tree llm {
			tier key {header.Authorization} {
				limit 1/min
				penalty 10m after 2
			}
		}
		log_key
		%s
	}
	respond "ok"
}
http://127.0.0.1:%d {
	rate_limit {
		tree plain {
			tier key {header.Authorization} {
				sensitive off
				limit 1/min
			}
		}
		%s
	}
	respond "ok"
}
`, globals(adminPort), logFile, port, storeBlock, plainPort, storeBlock)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	site := fmt.Sprintf("http://127.0.0.1:%d/", port)
	plain := fmt.Sprintf("http://127.0.0.1:%d/", plainPort)
	api := fmt.Sprintf("http://127.0.0.1:%d", adminPort)

	// Another instance sharing the Redis: its fingerprint of the key.
	other, err := store.NewRedis(context.Background(), store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	want := engine.NewFingerprints(nil, other.FingerprintSecret, nil).Value(bearer)
	if !fingerprintRE.MatchString(want) {
		t.Fatalf("the other instance's fingerprint is %q", want)
	}

	// The attack's victim: a client refused with its key, boxed by the
	// penalty (whose log line names the value too).
	var problems []string
	for range 4 {
		r := do(t, "GET", site, "Authorization: "+bearer)
		if r.status == 429 {
			problems = append(problems, r.body)
		}
	}
	if len(problems) != 3 {
		t.Fatalf("%d of 4 requests refused, want 3", len(problems))
	}
	for _, p := range problems {
		if strings.Contains(p, secret) {
			t.Fatalf("the problem body shows the key: %s", p)
		}
	}
	if r := do(t, "GET", plain, "Authorization: Bearer plain-1"); r.status != 200 {
		t.Fatalf("plain: %d", r.status)
	}
	if r := do(t, "GET", plain, "Authorization: Bearer plain-1"); r.status != 429 {
		t.Fatalf("plain, second request: %d", r.status)
	}

	// The admin API: the operator names the key as it is (in the body,
	// out of the URI Caddy logs); the answers show its fingerprint.
	var shown []string // every answer, checked below
	var top admin.Top
	code, body := call(t, "GET", api+"/rate_limit/top", nil, &top)
	shown = append(shown, body)
	if code != 200 || !strings.Contains(body, want) || !strings.Contains(body, "Bearer plain-1") {
		t.Fatalf("top: %d %s: want %s and the plain value", code, body, want)
	}
	form := url.Values{"tree": {"llm"}, "key": {bearer}}.Encode()
	code, body = postForm(t, api+"/rate_limit/buckets", form)
	shown = append(shown, body)
	if code != 200 || !strings.Contains(body, want) {
		t.Fatalf("buckets: %d %s: want %s", code, body, want)
	}
	code, body = call(t, "GET", api+"/rate_limit/buckets?tree=plain&key="+url.QueryEscape("Bearer plain-1"), nil, nil)
	if code != 200 || !strings.Contains(body, "Bearer plain-1") {
		t.Fatalf("buckets of sensitive off: %d %s: want the value as it is", code, body)
	}
	code, body = call(t, "GET", api+"/rate_limit/trees", nil, nil)
	shown = append(shown, body)
	if code != 200 || !strings.Contains(body, `"sensitive": true`) {
		t.Fatalf("trees: %d %s", code, body)
	}

	// The CLI.
	run := func(args ...string) string { t.Helper(); return cli(t, api, args...) }
	for _, args := range [][]string{{"inspect", "llm", "key=" + bearer}, {"top"}, {"inspect", "llm", "key=" + bearer, "--json"}} {
		out := run(args...)
		shown = append(shown, out)
		if !strings.Contains(out, want) {
			t.Fatalf("%v:\n%s\nwant %s", args[:1], out, want)
		}
	}
	code, body = postForm(t, api+"/rate_limit/reset", form)
	shown = append(shown, body)
	if code != 200 || !strings.Contains(body, want) {
		t.Fatalf("reset: %d %s: want %s", code, body, want)
	}

	// Overrides: set by the value as it is (in the body, out of the URI
	// that Caddy's admin endpoint logs), answered and listed by its
	// fingerprint.
	setBody, _ := json.Marshal(map[string]any{"value": bearer, "limits": []map[string]any{{"count": 5, "per": "min"}}, "note": "support"})
	code, body = call(t, "PUT", api+"/rate_limit/overrides/llm/key", string(setBody), nil)
	shown = append(shown, body)
	if code != 200 || !strings.Contains(body, want) {
		t.Fatalf("override set: %d %s: want %s", code, body, want)
	}
	for _, u := range []string{api + "/rate_limit/overrides", api + "/rate_limit/trees"} {
		code, body = call(t, "GET", u, nil, nil)
		shown = append(shown, body)
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("GET %s: %d %s: want %s", u, code, body, want)
		}
	}
	out := run("override", "list")
	shown = append(shown, out)
	if !strings.Contains(out, want) {
		t.Fatalf("override list:\n%s", out)
	}
	out = run("override", "delete", "llm", "key", bearer)
	shown = append(shown, out)
	if !strings.Contains(out, want) {
		t.Fatalf("override delete:\n%s", out)
	}

	_ = caddy.Stop()
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	logged := string(raw)
	for _, msg := range []string{`"msg":"rate limited"`, `"msg":"rate limit penalty: a value is refused outright for a while"`, `"msg":"rate limit buckets reset"`} {
		line := lineOf(logged, msg, `llm`)
		if line == "" || !strings.Contains(line, want) {
			t.Errorf("log line %s: %q, want one with %s", msg, line, want)
		}
	}
	if !strings.Contains(lineOf(logged, `"msg":"rate limited"`, `plain/key`), "key=Bearer plain-1") {
		t.Errorf("the sensitive off tier's denial is not logged with its value:\n%s", logged)
	}
	if line := lineOf(logged, `"msg":"rate limit override set"`, `llm`); !strings.Contains(line, want) {
		t.Errorf("the override's log line %q, want one with %s", line, want)
	}
	// Every line, Caddy's admin endpoint's (which logs each request's
	// URI) and the runtime state's among them.
	shown = append(shown, strings.Split(logged, "\n")...)
	for _, s := range shown {
		if strings.Contains(s, secret) || strings.Contains(s, "sk-secret") || strings.Contains(s, "sk%2Dsecret") {
			t.Fatalf("the key shows:\n%s", s)
		}
	}
}

// postForm posts a URL-encoded form and returns the status and body.
func postForm(t *testing.T, url, form string) (int, string) {
	t.Helper()
	res, err := httpClient(t).Post(url, "application/x-www-form-urlencoded", strings.NewReader(form))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer res.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	return res.StatusCode, b.String()
}

// lineOf returns the first line of log holding every one of s, or "".
func lineOf(log string, s ...string) string {
	for _, l := range strings.Split(log, "\n") {
		all := true
		for _, x := range s {
			all = all && strings.Contains(l, x)
		}
		if all {
			return l
		}
	}
	return ""
}
