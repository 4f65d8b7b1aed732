package app

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/rls"
)

// TestParseRLSRules: the config block of rls, as its JSON says it, and
// read back from that JSON; the files read when the app validates.
func TestParseRLSRules(t *testing.T) {
	d := caddyfile.NewTestDispenser(`rls {
		listen 127.0.0.1:8081
		config /etc/ratelimit/config /etc/more.yaml {
			store redis {
				address 127.0.0.1:6379
			}
			atomic off
			descriptor_limits
			shadow
			headers X-Limit X-Left X-Reset
			watch 5s
			max_hits_addend 100
		}
	}`)
	d.Next()
	c, err := parseRLS(d)
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `"config":{"paths":["/etc/ratelimit/config","/etc/more.yaml"],"store":{"redis":{"addresses":["127.0.0.1:6379"]}},"atomic":false,"descriptor_limits":true,"max_hits_addend":100,"shadow":true,"headers":{"limit":"X-Limit","remaining":"X-Left","reset":"X-Reset"},"watch":5000000000}`
	if !strings.Contains(string(js), want) {
		t.Fatalf("JSON %s\nwant it to hold %s", js, want)
	}
	var back RLSConfig
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Config.Atomic == nil || *back.Config.Atomic || time.Duration(back.Config.Watch) != 5*time.Second {
		t.Fatalf("read back %+v", back.Config)
	}

	// validate reads the files; a missing one stops the configuration.
	if err := back.validate(); err == nil || !strings.Contains(err.Error(), "cascade rls: config: rls config: stat /etc/ratelimit/config") {
		t.Fatalf("missing files: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: api\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = &RLSConfig{Listen: "127.0.0.1:8081", Config: &RLSRules{Paths: []string{dir}}, Domains: []RLSDomain{{Domain: "api"}}}
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "domain api is a tree's and the domain of a file of config too") {
		t.Fatalf("a domain both a tree's and the files': %v", err)
	}
	c.Domains = nil
	if err := c.validate(); err != nil || c.rules == nil || c.rules.Domains()[0] != "api" {
		t.Fatalf("validate: %v, rules %v", err, c.rules)
	}
}

// TestWatchRules: the watcher serves rules that changed and load; keeps
// the rules before, with an error logged once, when the files do not load
// or give a domain line's tree's domain to the files; and stops when told.
func TestWatchRules(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	write := func(y string) { // whole, as the watcher reads it
		t.Helper()
		tmp := filepath.Join(dir, ".next")
		if err := os.WriteFile(tmp, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: files\n")
	rules, err := rls.LoadRules(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &RLSConfig{Listen: "127.0.0.1:8081", Config: &RLSRules{Paths: []string{dir}}, Domains: []RLSDomain{{Domain: "api"}}}
	e := &rls.Envoy{Rules: rules}
	core, logs := observer.New(zap.InfoLevel)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { watchRules(e, []string{dir}, time.Millisecond, c.checkRules, stop, zap.New(core)); close(done) }()
	defer func() {
		close(stop)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the watcher did not stop")
		}
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s after 10 s; logs %v", what, logs.All())
			}
		}
	}
	domains := func() string { return strings.Join(e.CurrentRules().Domains(), ",") }
	logged := func(msg string) func() bool {
		return func() bool { return logs.FilterMessageSnippet(msg).Len() > 0 }
	}

	write("domain: api\n") // a domain line's tree's: refused
	waitFor("error", logged("do not load"))
	if !strings.Contains(logs.FilterMessageSnippet("do not load").All()[0].ContextMap()["error"].(string), "domain api is a tree's") {
		t.Fatalf("logged %v", logs.All())
	}
	if got := domains(); got != "files" {
		t.Fatalf("after a file taking a tree's domain: %s served, want files", got)
	}
	write("domain: [broken\n")
	waitFor("second error", func() bool { return logs.FilterMessageSnippet("do not load").Len() == 2 })
	write("domain: other\n")
	waitFor("new rules", func() bool { return domains() == "other" })
	if n := logs.FilterMessageSnippet("do not load").Len(); n != 2 {
		t.Fatalf("%d errors logged, want 2 (each once)", n)
	}
}

// TestRLSWatchFloor: a watch interval below minWatch would read the files
// in a busy loop; it is refused with the fix.
func TestRLSWatchFloor(t *testing.T) {
	for _, tt := range []struct {
		watch time.Duration
		ok    bool
	}{{0, true}, {time.Nanosecond, false}, {9 * time.Millisecond, false}, {minWatch, true}, {5 * time.Second, true}} {
		c := RLSConfig{Listen: "127.0.0.1:8081", Config: &RLSRules{Paths: []string{"x.yaml"}, Watch: caddy.Duration(tt.watch)}}
		err := c.check()
		if (err == nil) != tt.ok || err != nil && !strings.Contains(err.Error(), "at most every 10ms") {
			t.Errorf("watch %v: %v, want ok %v", tt.watch, err, tt.ok)
		}
	}
}
