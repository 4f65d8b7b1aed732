package rls

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestParseRulesErrors: every error of a file is reported, each with the
// file, the line and what is expected.
func TestParseRulesErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:4: unknown field "rate_limt" in a descriptor: expected key, value, rate_limit, descriptors`}},
		{"unknown field in rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 1\n",
			[]string{`f.yaml:6: unknown field "request_per_unit" in a rate_limit: expected requests_per_unit, unit`}},
		{"a known field out of place", "domain: d\nunit: second\n",
			[]string{`f.yaml:2: unknown field "unit" in a file's top level: expected domain, descriptors`}},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			[]string{`f.yaml:4: d.a: invalid unit "fortnight"`}},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n",
			[]string{`f.yaml:4: d.a: invalid unit ""`}},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}\n",
			[]string{`f.yaml:4: d.a is unlimited: it takes no unit`}},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n",
			[]string{`f.yaml:5: duplicate descriptor d.a_b`}},
		{"no key", "domain: d\ndescriptors:\n  - value: b\n",
			[]string{`f.yaml:3: a descriptor needs a key`}},
		{"no domain", "descriptors: []\n", []string{`f.yaml:1: no domain`}},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
			[]string{`f.yaml:4: d.a replaces its own name "n"`}},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n",
			[]string{`f.yaml:3: share_threshold is for wildcard values`}},
		{"types", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes please\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{`f.yaml:4: shadow_mode must be true or false`, `f.yaml:5: requests_per_unit must be a whole number from 0 to 4294967295, not "-1"`}},
		{"every error, not the first only", "domain: d\ndescriptors:\n  - key: a\n    bogus: 1\n  - key: b\n    rate_limit: {unit: eon, requests_per_unit: 1}\n",
			[]string{`f.yaml:4: unknown field "bogus"`, `f.yaml:6: d.b: invalid unit "eon"`}},
		{"not YAML", "domain: [d\n", []string{`f.yaml: yaml:`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules("f.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

// TestLoadRules: a directory's .yaml and .yml files are read, others and
// dotfiles not; a domain in two files is an error naming both.
func TestLoadRules(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: Minute, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\n")
	write(".hidden.yaml", "not: [valid\n")
	if err := os.MkdirAll(filepath.Join(dir, "..data", "team"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("..data/team/x.yaml", "not: [valid\n")
	// a subdirectory's files are rules, as envoyproxy/ratelimit reads them
	if err := os.Mkdir(filepath.Join(dir, "team"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("team/c.yaml", "domain: c\n")
	r, err := LoadRules(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Domains(), ","); got != "a,b,c" {
		t.Errorf("domains %s, want a,b,c", got)
	}
	if r.Len() != 1 || len(r.Files()) != 3 {
		t.Errorf("%d rules from %v, want 1 from 3 files", r.Len(), r.Files())
	}
	// envoyproxy/ratelimit would read any other file as rules: an error,
	// not rules silently not served
	write("team/limits.conf", "domain: d\n")
	if _, err := LoadRules(dir); err == nil || !strings.Contains(err.Error(), "neither .yaml nor .yml") || !strings.Contains(err.Error(), filepath.Join(dir, "team", "limits.conf")) {
		t.Fatalf("a .conf file among the rules: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "team", "limits.conf")); err != nil {
		t.Fatal(err)
	}
	write("c.yaml", "domain: a\n")
	_, err = LoadRules(dir)
	if err == nil || !strings.Contains(err.Error(), "c.yaml:1: domain \"a\" is also the domain of "+filepath.Join(dir, "a.yaml")) {
		t.Fatalf("a domain twice: %v", err)
	}
	if _, err := LoadRules(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("a missing file loaded")
	}
	empty := t.TempDir()
	if _, err := LoadRules(empty); err == nil || !strings.Contains(err.Error(), "no .yaml or .yml file") {
		t.Fatalf("an empty directory: %v", err)
	}
	// envoyproxy/ratelimit's own example, as it is
	ex, err := LoadRules("testdata/envoy-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Len() != 15 {
		t.Fatalf("the example: %d rules, want 15", ex.Len())
	}
}

// TestRulesChanged: rules know whether their files changed: a rewrite, a
// file added, a symbolic link swapped as Kubernetes swaps a ConfigMap's.
func TestRulesChanged(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..data1")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "config")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	y := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(data, "a.yaml"), []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(data, "a.yaml"), filepath.Join(conf, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRules(conf)
	if err != nil {
		t.Fatal(err)
	}
	changed := func() bool {
		t.Helper()
		c, err := r.Changed(conf)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if changed() {
		t.Fatal("changed before any change")
	}
	data2 := filepath.Join(dir, "..data2")
	if err := os.Mkdir(data2, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data2, "a.yaml"), []byte(strings.Replace(y, "1}", "2}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "next")
	if err := os.Symlink(filepath.Join(data2, "a.yaml"), link); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link, filepath.Join(conf, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if !changed() {
		t.Fatal("a swapped link: not changed")
	}
	if r, err = LoadRules(conf); err != nil {
		t.Fatal(err)
	}
	if changed() {
		t.Fatal("changed after loading the change")
	}
	if err := os.WriteFile(filepath.Join(conf, "b.yml"), []byte("domain: b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !changed() {
		t.Fatal("a file added: not changed")
	}
}

// TestParseRulesYAMLAsEnvoyReadsIt: what envoyproxy/ratelimit's YAML
// library (yaml.v2) takes, Cascade takes alike: anchors and aliases, merge
// keys (the mapping's own field wins), YAML 1.1 booleans (yes, on) and
// hexadecimal numbers.
func TestParseRulesYAMLAsEnvoyReadsIt(t *testing.T) {
	y := `domain: d
descriptors:
  - &base
    key: a
    shadow_mode: yes
    rate_limit: &rl {unit: minute, requests_per_unit: 0x10, name: base}
  - <<: *base
    key: b
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: c
    rate_limit: *rl
    descriptors: &kids
      - key: k
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: e
    shadow_mode: off
    descriptors: *kids
`
	r, err := ParseRules("f.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	top := r.domains["d"]
	a, b, c, e := top.rules["a"], top.rules["b"], top.rules["c"], top.rules["e"]
	if a == nil || b == nil || c == nil || e == nil {
		t.Fatalf("rules %v", top.rules)
	}
	if !a.limit.shadow || a.limit.requests != 16 || a.limit.unit != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("a: %+v, want shadow, 16 a minute", a.limit)
	}
	if !b.limit.shadow || b.limit.requests != 7 || b.limit.unit != rlsv3.RateLimitResponse_RateLimit_HOUR || b.path != "d.b" {
		t.Errorf("b merges a's shadow_mode, its own key and rate_limit: %+v %s", b.limit, b.path)
	}
	if c.limit.requests != 16 || c.limit.name != "base" || c.rules["k"] == nil || e.rules["k"].path != "d.e.k" {
		t.Errorf("c's alias of a's rate_limit, e's of c's descriptors: %+v %v", c.limit, e.rules)
	}
	if r.Len() != 5 {
		t.Errorf("%d rules with a rate_limit, want 5", r.Len())
	}
	// A merge key names a mapping; a quoted "yes" is a string.
	for _, bad := range []string{
		"domain: d\ndescriptors:\n  - <<: [1, 2]\n    key: a\n",
		"domain: d\ndescriptors:\n  - key: a\n    shadow_mode: \"yes\"\n",
	} {
		if _, err := ParseRules("f.yaml", []byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestParseRulesBillionLaughs: aliases of aliases of descriptors (10⁹
// once expanded) stop at maxRuleNodes, fast, with an error naming the file.
func TestParseRulesBillionLaughs(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	for l := 1; l < 10; l++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n", l, l)
		for i := range 10 {
			fmt.Fprintf(&b, "      - {key: k%d, descriptors: *l%d}\n", i, l-1)
		}
	}
	start := time.Now()
	_, err := ParseRules("f.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "f.yaml:") || !strings.Contains(err.Error(), "once its aliases are expanded") {
		t.Fatalf("a billion laughs: %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a billion laughs took %v", took)
	}
}

// TestLoadRulesNotRegular: a named pipe, or a link to a device, among the
// files is an error, not a reader blocked forever or reading without end;
// a file too large is an error.
func TestLoadRulesNotRegular(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := LoadRules(dir); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "pipe.yaml is not a regular file") {
			t.Fatalf("a named pipe: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a directory with a named pipe blocked")
	}
	dev := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(dev, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRules(dev); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a link to /dev/zero: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("domain: d\n#"+strings.Repeat("x", maxRuleFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRules(big); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") {
		t.Fatalf("a file too large: %v", err)
	}
}

// TestParseRulesLarge: a file of many rules without aliases (more nodes
// than maxRuleNodes) loads: only aliases' expansion is bounded.
func TestParseRulesLarge(t *testing.T) {
	defer func(n int) { maxRuleNodes = n }(maxRuleNodes)
	maxRuleNodes = 1 << 10
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	const n = 2000
	for i := range n {
		fmt.Fprintf(&b, "  - {key: tenant, value: t%d, rate_limit: {unit: hour, requests_per_unit: %d}}\n", i, i)
	}
	r, err := ParseRules("f.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("%.300v", err)
	}
	if r.Len() != n {
		t.Fatalf("%d rules, want %d", r.Len(), n)
	}
}
