package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// rlsYAMLGlobal is the cascade global option serving envoyproxy/ratelimit's
// YAML at path on port, with the config block's options.
func rlsYAMLGlobal(port int, path, options string) string {
	return fmt.Sprintf("cascade {\n\trls {\n\t\tlisten 127.0.0.1:%d\n\t\tconfig %s {\n\t\t\t%s\n\t\t}\n\t}\n}", port, path, options)
}

// TestRLSConfigYAML: a Caddy with no rate_limit handler serves
// envoyproxy/ratelimit's YAML as it is, on a real Redis; a reload reads
// the files again; a file with an unknown field does not load (its file
// and line named) and the running rules go on serving; each rule's hits
// are counted by outcome.
func TestRLSConfigYAML(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write := func(perMinute int, extra string) {
		t.Helper()
		y := fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n%s", perMinute, extra)
		if err := os.WriteFile(file, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(2, "")
	// Every call must count in one window (an hour): not across the hour.
	awayFromBoundary(time.Hour, 30*time.Second)
	srv := redistest.Shared(t)
	store := fmt.Sprintf("store redis {\n\t\t\t\taddress %s\n\t\t\t\tkey_prefix rlsyaml%d:\n\t\t\t}", srv.Addr(), freePort(t))
	grpcPort := freePort(t)
	site := fmt.Sprintf("http://127.0.0.1:%d {\n\trespond 200\n}\n", freePort(t))
	startCaddy(t, site, rlsYAMLGlobal(grpcPort, dir, store))
	client := rlsClient(t, grpcPort)
	ask := func(ip string) string {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", ip)}})
		if err != nil {
			t.Fatal(err)
		}
		st := res.Statuses[0]
		return fmt.Sprintf("%s %d/%d", res.OverallCode, st.LimitRemaining, st.CurrentLimit.GetRequestsPerUnit())
	}
	for i, want := range []string{"OK 1/2", "OK 0/2", "OVER_LIMIT 0/2"} {
		if got := ask("10.0.0.1"); got != want {
			t.Fatalf("call %d: %s, want %s", i+1, got, want)
		}
	}

	write(5, "")
	if err := reload(t, site, rlsYAMLGlobal(grpcPort, dir, store)); err != nil {
		t.Fatal(err)
	}
	// the same counter, a new limit
	if got := ask("10.0.0.1"); got != "OK 2/5" {
		t.Fatalf("after the reload: %s, want OK 2/5", got)
	}

	write(9, "    shadow: true\n")
	err := reload(t, site, rlsYAMLGlobal(grpcPort, dir, store))
	if err == nil || !strings.Contains(err.Error(), file+`:7: unknown field "shadow" in a descriptor`) {
		t.Fatalf("an unknown field: %v, want its file and line", err)
	}
	if got := ask("10.0.0.1"); got != "OK 1/5" {
		t.Fatalf("after the failed reload: %s, want the rules before it: OK 1/5", got)
	}

	counts := map[string]float64{}
	for _, m := range runningMetrics(t, "cascade_rls_rule_hits_total") {
		var labels []string
		for _, l := range m.GetLabel() {
			if l.GetValue() != "" {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
		}
		counts[strings.Join(labels, ",")] = m.GetCounter().GetValue()
	}
	if counts["domain=edge,outcome=within_limit,rule=edge.remote_address"] != 2 {
		t.Fatalf("cascade_rls_rule_hits_total: %v, want 2 within_limit since the reload", counts)
	}
}

// awayFromBoundary waits, when less than margin is left of the fixed
// window of period (aligned to the Unix epoch) holding now, for the next
// one: what follows then has margin before the window ends.
func awayFromBoundary(period, margin time.Duration) {
	if left := period - time.Duration(time.Now().UnixNano())%period; left < margin {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// TestRLSConfigExample runs examples/envoy/Caddyfile.ratelimit on its
// YAML (examples/envoy/ratelimit) and a real Redis, and asks it what
// Envoy would.
func TestRLSConfigExample(t *testing.T) {
	b, err := os.ReadFile("examples/envoy/Caddyfile.ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	grpcPort := freePort(t)
	cf := strings.NewReplacer("127.0.0.1:8081", fmt.Sprintf("127.0.0.1:%d", grpcPort),
		"{$REDIS_ADDR:127.0.0.1:6379}", fmt.Sprintf("%s\n\t\t\t\t\tkey_prefix rlsexample%d:", redistest.Shared(t).Addr(), grpcPort), // counters of its own
		"auto_https off", globals(0)).Replace(string(b))
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatal(err)
	}
	loadJSON(t, cfg)
	client := rlsClient(t, grpcPort)
	for _, tc := range []struct {
		descs []*ratelimitv3.RateLimitDescriptor
		want  string
	}{
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", "192.0.2.7")}, "OK 99 of 100/MINUTE"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("api_key", "k1")}, "OK 999 of 1000/HOUR"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("api_key", "partner-zeta")}, "OK 4999 of 5000/HOUR"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("api_key", "partner-acme")}, "OK 19999 of 20000/HOUR acme"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("method", "POST", "path", "/orders")}, "OK 9 of 10/SECOND"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("method", "GET", "path", "/orders")}, "OK no limit"},
		{[]*ratelimitv3.RateLimitDescriptor{rlsDesc("path", "/healthz")}, "OK unlimited"},
	} {
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: tc.descs})
		if err != nil {
			t.Fatal(err)
		}
		st := res.Statuses[0]
		got := st.Code.String()
		switch cl := st.CurrentLimit; {
		case cl == nil && st.LimitRemaining == 1<<32-1:
			got += " unlimited"
		case cl == nil:
			got += " no limit"
		default:
			got += fmt.Sprintf(" %d of %d/%s", st.LimitRemaining, cl.RequestsPerUnit, cl.Unit)
			if cl.Name != "" {
				got += " " + cl.Name
			}
		}
		if got != tc.want {
			t.Errorf("%v: %s, want %s", tc.descs, got, tc.want)
		}
	}
}

// TestEnvoySideBySideExample checks examples/envoy/envoy-side-by-side.yaml
// against Envoy's own configuration schema (go-control-plane's Bootstrap
// and its validation rules): no Envoy is installed here to load it.
func TestEnvoySideBySideExample(t *testing.T) {
	y, err := os.ReadFile("examples/envoy/envoy-side-by-side.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(y, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("breaks Envoy's rules: %v", err)
	}
	for _, want := range []string{`"port_value":8081`, `"port_value":8091`, `"domain":"edge"`, `"numerator":0`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("no %s in it", want)
		}
	}
}

// TestRLSConfigWatch: with watch, a changed file serves its rules without
// a reload; a change that does not load leaves the rules before it
// serving, and the next good one serves.
func TestRLSConfigWatch(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write := func(perMinute int, extra string) {
		t.Helper()
		y := fmt.Sprintf("domain: w\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: %d\n%s", perMinute, extra)
		// written aside and renamed, as a deployment would: never half a file
		tmp := filepath.Join(t.TempDir(), "next.yaml")
		if err := os.WriteFile(tmp, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(2, "")
	grpcPort := freePort(t)
	startCaddy(t, fmt.Sprintf("http://127.0.0.1:%d {\n\trespond 200\n}\n", freePort(t)), rlsYAMLGlobal(grpcPort, dir, "watch 20ms"))
	client := rlsClient(t, grpcPort)
	limit := func() uint32 {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "w",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("k", "v")}, HitsAddend: 0})
		if err != nil {
			t.Fatal(err)
		}
		return res.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	waitFor := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(propagation)
		for got := limit(); got != want; got = limit() {
			if time.Now().After(deadline) {
				t.Fatalf("limit %d after %v, want %d", got, propagation, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(2)
	write(50, "")
	waitFor(50)
	write(60, "    burst: 3\n")
	// 50 watch ticks: the bad file is read and refused, 50 still serves
	for range 50 {
		if got := limit(); got != 50 {
			t.Fatalf("a file that does not load: limit %d, want 50 still", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	write(70, "")
	waitFor(70)
}

// TestRLSConfigWatchStops: each configuration's watcher stops when the
// configuration is replaced (a reload) or a reload fails, and the last one
// when Caddy stops: reloads leak no goroutine.
func TestRLSConfigWatchStops(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: w\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	watchers := func() int {
		buf := make([]byte, 1<<22)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "app.watchRules(")
	}
	settle := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); watchers() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d watchers running, want %d", watchers(), want)
			}
		}
	}
	before := watchers()
	grpcPort := freePort(t)
	site := fmt.Sprintf("http://127.0.0.1:%d {\n\trespond 200\n}\n", freePort(t))
	startCaddy(t, site, rlsYAMLGlobal(grpcPort, dir, "watch 10ms"))
	settle(before + 1)
	for range 3 {
		if err := reload(t, site, rlsYAMLGlobal(grpcPort, dir, "watch 10ms")); err != nil {
			t.Fatal(err)
		}
	}
	// a reload that fails after its watcher started: its address is taken
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if err := reload(t, site, rlsYAMLGlobal(taken.Addr().(*net.TCPAddr).Port, dir, "watch 10ms")); err == nil {
		t.Fatal("a reload on a taken address loaded")
	}
	settle(before + 1)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	settle(before)
}
