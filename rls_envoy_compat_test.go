package cascade

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rls"
)

// envoyRatelimitVersion is the envoyproxy/ratelimit the compatibility test
// builds from the Go module proxy: its main branch of 2026-01-22 (it tags
// no releases as Go modules).
const envoyRatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

var envoyRatelimitBuild struct {
	once           sync.Once
	service, check string
	err            error
}

// buildEnvoyRatelimit builds envoyproxy/ratelimit's service and its config
// checker at envoyRatelimitVersion, in a throwaway module, once: the
// binaries are kept in the user's cache directory (about 20 s to build,
// then nothing). It skips the test when the build cannot be done here (no
// module proxy), unless CASCADE_ENVOY_COMPAT=require.
func buildEnvoyRatelimit(t *testing.T) (service, check string) {
	t.Helper()
	required := os.Getenv("CASCADE_ENVOY_COMPAT") == "require"
	switch {
	case required && os.Getenv(redistest.SkipEnv) == "1":
		t.Fatalf("CASCADE_ENVOY_COMPAT=require, but %s=1: the compatibility test needs a real redis-server", redistest.SkipEnv)
	case required:
	case testing.Short():
		t.Skip("builds envoyproxy/ratelimit: not in -short (unless CASCADE_ENVOY_COMPAT=require)")
	}
	b := &envoyRatelimitBuild
	b.once.Do(func() { b.service, b.check, b.err = buildEnvoyRatelimitOnce() })
	if b.err != nil {
		if required {
			t.Fatal(b.err)
		}
		t.Skipf("envoyproxy/ratelimit could not be built here (set CASCADE_ENVOY_COMPAT=require to fail instead): %v", b.err)
	}
	return b.service, b.check
}

func buildEnvoyRatelimitOnce() (service, check string, err error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "cascade-test", "envoy-ratelimit-"+envoyRatelimitVersion)
	service, check = filepath.Join(dir, "service_cmd"), filepath.Join(dir, "config_check_cmd")
	if _, err1 := os.Stat(service); err1 == nil {
		if _, err2 := os.Stat(check); err2 == nil {
			return service, check, nil
		}
	}
	work, err := os.MkdirTemp("", "envoy-ratelimit-build")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(work)
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("no go command: %w", err)
	}
	run := func(args ...string) error {
		cmd := exec.Command(gobin, args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	out := filepath.Join(work, "bin")
	for _, step := range [][]string{
		{"mod", "init", "compat.invalid/envoyratelimit"},
		{"get", "github.com/envoyproxy/ratelimit@" + envoyRatelimitVersion},
		{"build", "-o", out + string(filepath.Separator), "github.com/envoyproxy/ratelimit/src/service_cmd", "github.com/envoyproxy/ratelimit/src/config_check_cmd"},
	} {
		if err := run(step...); err != nil {
			return "", "", err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	// Renamed into place: a concurrent test binary sees whole files only.
	for _, name := range []string{"service_cmd", "config_check_cmd"} {
		if err := os.Rename(filepath.Join(out, name), filepath.Join(dir, name)); err != nil {
			return "", "", err
		}
	}
	return service, check, nil
}

// envoyRatelimit is a running envoyproxy/ratelimit.
type envoyRatelimit struct {
	client rlsv3.RateLimitServiceClient
	log    string // the file of its output
	pid    int
	port   int // its gRPC port
}

// logTail is the end of its output, without gostats' debug lines.
func (e *envoyRatelimit) logTail() string {
	b, _ := os.ReadFile(e.log)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "gostats") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

// startEnvoyRatelimit runs bin on the YAML files of configDir (its
// runtime layout: root/ratelimit/config) and the Redis at redisAddr, and
// waits until its health check says it has loaded them.
func startEnvoyRatelimit(t *testing.T, bin, root, redisAddr string) *envoyRatelimit {
	t.Helper()
	grpcPort, httpPort, debugPort := freePort(t), freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin)
	e := &envoyRatelimit{log: filepath.Join(t.TempDir(), "envoy-ratelimit.log")}
	logFile, err := os.Create(e.log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd.Stdout, cmd.Stderr = logFile, logFile
	dieWithTest(cmd)
	cmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort),
		"GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", debugPort),
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true",
	)
	if err = cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cancel(); <-exited })
	deadline := time.Now().Add(30 * time.Second)
	for {
		var res *http.Response
		res, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("envoyproxy/ratelimit exited:\n%s", e.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit not healthy after 30 s (last: %v):\n%s", err, e.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.client, e.pid, e.port = rlsClient(t, grpcPort), cmd.Process.Pid, grpcPort
	return e
}

// compatYAML are the domains both servers are given: envoyproxy/ratelimit's
// own example (rl) and the cases the semantics need.
var compatYAML = map[string]string{
	"wild.yaml": `domain: wild
descriptors:
  - key: user
    value: vip-*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    value: vip-gold
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: org
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1, name: acme_user}
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 3}
      - key: plan
        value: free
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
`,
	// YAML as envoyproxy/ratelimit's library (yaml.v2) reads it: anchors,
	// aliases, merge keys, YAML 1.1 booleans, hexadecimal numbers; in a
	// subdirectory, which it reads too.
	"teams/anchors.yaml": `domain: anchors
descriptors:
  - &base
    key: a
    shadow_mode: no
    rate_limit: &rl {unit: minute, requests_per_unit: 0x2}
  - <<: *base
    key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: c
    shadow_mode: yes
    rate_limit: *rl
`,
}

// compatCall is one call of a case: descriptors written "k=v,k=v", the
// call's hits_addend, and a descriptor's own ("k=v,k=v+N").
type compatCall struct {
	domain string
	descs  []string
	hits   uint32
}

func (c compatCall) request() *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: c.domain, HitsAddend: c.hits}
	for _, s := range c.descs {
		d := &ratelimitv3.RateLimitDescriptor{}
		s, own, hasOwn := strings.Cut(s, "+")
		s, lim, hasLim := strings.Cut(s, "@")
		for _, e := range strings.Split(s, ",") {
			k, v, _ := strings.Cut(e, "=")
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if hasOwn {
			var n uint64
			fmt.Sscan(own, &n)
			d.HitsAddend = wrapperspb.UInt64(n)
		}
		if hasLim { // "@N/hour": Envoy's limit override
			var n uint32
			var unit string
			fmt.Sscanf(strings.Replace(lim, "/", " ", 1), "%d %s", &n, &unit)
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n,
				Unit: typev3.RateLimitUnit(typev3.RateLimitUnit_value[strings.ToUpper(unit)])}
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// renderCompat is an answer in the terms both servers share: the overall
// code, then each status's code, limit_remaining, current_limit and
// duration_until_reset (whole seconds).
func renderCompat(res *rlsv3.RateLimitResponse) (text string, resets []int64) {
	parts := []string{res.GetOverallCode().String()}
	for _, st := range res.GetStatuses() {
		s := st.GetCode().String()
		switch {
		case st.GetCurrentLimit() == nil && st.GetLimitRemaining() == math.MaxUint32:
			s += " unlimited"
		case st.GetCurrentLimit() == nil:
			s += fmt.Sprintf(" no limit %d", st.GetLimitRemaining())
		default:
			cl := st.GetCurrentLimit()
			s += fmt.Sprintf(" %d left of %d/%s", st.GetLimitRemaining(), cl.GetRequestsPerUnit(), cl.GetUnit())
			if cl.GetName() != "" {
				s += " " + cl.GetName()
			}
		}
		parts = append(parts, s)
		resets = append(resets, st.GetDurationUntilReset().GetSeconds())
	}
	for _, h := range res.GetResponseHeadersToAdd() {
		if h.GetKey() == "RateLimit-Reset" { // each server's clock: compared as resets
			n, _ := strconv.ParseInt(h.GetValue(), 10, 64)
			resets = append(resets, n)
			parts = append(parts, h.GetKey())
			continue
		}
		parts = append(parts, h.GetKey()+": "+h.GetValue())
	}
	return strings.Join(parts, "; "), resets
}

// compatCases are the call sequences both servers must answer alike
// (Cascade with atomic off): each starts on an empty Redis.
var compatCases = []struct {
	name  string
	calls []compatCall
}{
	{"example: a value's rule", repeat(5, compatCall{"rl", []string{"category=account"}, 0})},
	{"example: nested under a value, and its parent alone", append(repeat(2, compatCall{"rl", []string{"source_cluster=proxy,destination_cluster=mock"}, 0}),
		compatCall{"rl", []string{"source_cluster=proxy,destination_cluster=bkthomps"}, 0},
		compatCall{"rl", []string{"source_cluster=proxy"}, 0},
		compatCall{"rl", []string{"source_cluster=other,destination_cluster=mock"}, 0})},
	{"example: key only, each value its own counter", append(repeat(3, compatCall{"rl", []string{"foo=x"}, 0}),
		compatCall{"rl", []string{"foo=y"}, 0})},
	{"example: the most specific nested rule, deeper than any rule", []compatCall{
		{"rl", []string{"foo=x,bar=y"}, 0}, {"rl", []string{"foo=x,bar=bkthomps"}, 0}, {"rl", []string{"foo=x,bar=bkthomps"}, 0},
		{"rl", []string{"foo=x,baz=not-so-shady"}, 0}, {"rl", []string{"foo=x,bar=y,baz=z"}, 0}}},
	{"example: requests_per_unit 0", repeat(2, compatCall{"rl", []string{"foo=x,bar=banned"}, 0})},
	{"example: shadow_mode", repeat(5, compatCall{"rl", []string{"foo=x,baz=shady"}, 0})},
	{"example: unlimited", []compatCall{{"rl", []string{"foo=x,bay=y"}, 0}, {"rl", []string{"qux=any"}, 7}}},
	{"example: no rule", []compatCall{{"rl", []string{"nope=v"}, 0}, {"rl", []string{"category=other"}, 0}}},
	{"example: replaces", []compatCall{
		{"rl", []string{"category=account", "foo=x,bar=bkthomps"}, 0}, {"rl", []string{"foo=x,bar=bkthomps"}, 0},
		{"rl", []string{"category=account", "source_cluster=proxy,destination_cluster=fake"}, 0},
		{"rl", []string{"source_cluster=proxy,destination_cluster=override", "foo=x,bar=banned"}, 0}}},
	{"example: detailed_metric", repeat(3, compatCall{"rl", []string{"unspec=v"}, 0})},
	{"hits_addend: the call's, a descriptor's own, 0 only checks", []compatCall{
		{"rl", []string{"category=account"}, 3}, {"rl", []string{"category=account+0"}, 0},
		{"rl", []string{"category=account+1"}, 9}, {"rl", []string{"category=account+0"}, 0}}},
	{"several descriptors, one over (atomic off)", []compatCall{
		{"rl", []string{"category=account", "foo=x"}, 0}, {"rl", []string{"category=account", "foo=x"}, 0},
		{"rl", []string{"category=account", "foo=x"}, 0}, {"rl", []string{"category=account"}, 0}}},
	{"wildcards: a value beats a wildcard, a wildcard the key; each value its own counter", []compatCall{
		{"wild", []string{"user=vip-gold"}, 0}, {"wild", []string{"user=vip-x"}, 0}, {"wild", []string{"user=vip-y"}, 0},
		{"wild", []string{"user=bob"}, 0}, {"wild", []string{"user=bob"}, 0}, {"wild", []string{"user=bob"}, 0}}},
	{"share_threshold: one counter for the wildcard", []compatCall{
		{"wild", []string{"path=/api/a"}, 0}, {"wild", []string{"path=/api/b"}, 0}, {"wild", []string{"path=/api/c"}, 0},
		{"wild", []string{"path=/api/d"}, 0}, {"wild", []string{"path=/other"}, 0}}},
	{"nested rules belong to their parent's value", []compatCall{
		{"wild", []string{"org=acme,user=x"}, 0}, {"wild", []string{"org=acme,user=x"}, 0},
		{"wild", []string{"org=other,user=x"}, 0}, {"wild", []string{"org=acme,plan=free"}, 0}}},
	{"quota_mode: over is OK", repeat(3, compatCall{"wild", []string{"org=beta,plan=free"}, 0})},
	{"a descriptor's own limit", append(repeat(3, compatCall{"rl", []string{"nope=v@2/hour"}, 0}),
		compatCall{"rl", []string{"category=account@1/minute"}, 0}, compatCall{"rl", []string{"category=account"}, 0})},
	{"an unknown domain", []compatCall{{"nowhere", []string{"a=b", "c=d"}, 0}}},
	{"anchors, aliases, merge keys, yes and no", append(append(repeat(3, compatCall{"anchors", []string{"a=1"}, 0}),
		repeat(2, compatCall{"anchors", []string{"b=1"}, 0})...), repeat(3, compatCall{"anchors", []string{"c=1"}, 0})...)},
}

func repeat(n int, c compatCall) []compatCall {
	out := make([]compatCall, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// TestRLSEnvoyCompat runs envoyproxy/ratelimit itself, built from the Go
// module proxy, and Cascade with the same YAML files on the same real
// Redis, sends both the same calls, and requires the same answers: codes,
// limit_remaining, current_limit, and duration_until_reset within a
// second (each reads its own clock). Cascade runs with atomic off, as
// envoyproxy/ratelimit decides; the intended differences (atomic on, a
// refused charge, the same counter twice in a call, a misplaced field)
// are then checked to be what docs/envoy.md says.
func TestRLSEnvoyCompat(t *testing.T) {
	service, check := buildEnvoyRatelimit(t)
	srv := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("rls/testdata/envoy-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"example.yaml": string(example)}
	for name, y := range compatYAML {
		files[name] = y
	}
	for name, y := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	theirs := startEnvoyRatelimit(t, service, root, srv.Addr())
	grpcPort := freePort(t)
	site := fmt.Sprintf("http://127.0.0.1:%d {\n\trespond 200\n}\n", freePort(t))
	options := func(atomic string) string {
		return fmt.Sprintf("store redis {\n\t\t\t\taddress %s\n\t\t\t}\n\t\t\tatomic %s\n\t\t\tdescriptor_limits\n\t\t\theaders", srv.Addr(), atomic)
	}
	startCaddy(t, site, rlsYAMLGlobal(grpcPort, dir, options("off")))
	ours := rlsClient(t, grpcPort)

	ask := func(client rlsv3.RateLimitServiceClient, c compatCall) (string, []int64) {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), c.request())
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		return renderCompat(res)
	}
	// fresh empties Redis and waits, if need be, for a minute that has
	// time for a case: a case's calls must fall in one window of each
	// rule, on both servers.
	fresh := func() {
		t.Helper()
		if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 3*time.Second {
			time.Sleep(left + 50*time.Millisecond)
		}
		if _, err := redistest.Do(srv.Addr(), "FLUSHDB"); err != nil {
			t.Fatal(err)
		}
	}
	same := func(t *testing.T, c compatCall) {
		t.Helper()
		want, wantResets := ask(theirs.client, c)
		got, gotResets := ask(ours, c)
		if got != want {
			t.Errorf("%s %v:\n  envoyproxy/ratelimit: %s\n  cascade:              %s", c.domain, c.descs, want, got)
		}
		for i := range wantResets {
			if d := gotResets[i] - wantResets[i]; d < -1 || d > 1 {
				t.Errorf("%s %v: duration_until_reset of status %d: %d s, envoyproxy/ratelimit %d s", c.domain, c.descs, i, gotResets[i], wantResets[i])
			}
		}
	}
	for _, tc := range compatCases {
		t.Run(tc.name, func(t *testing.T) {
			fresh()
			for _, c := range tc.calls {
				same(t, c)
			}
		})
	}
	t.Run("a second's window", func(t *testing.T) {
		// baz's rule is 1 a second: both servers' calls must fall in one
		// second; tried again, on a fresh Redis, if they did not (answers
		// that straddle a second are never compared).
		for attempt := 0; attempt < 10; attempt++ {
			fresh()
			time.Sleep(time.Second - time.Duration(time.Now().UnixNano())%time.Second + 5*time.Millisecond)
			start := time.Now().Unix()
			var answers [2][2]string
			for i := range 2 {
				answers[i][0], _ = ask(theirs.client, compatCall{"rl", []string{"foo=x,baz=q"}, 0})
				answers[i][1], _ = ask(ours, compatCall{"rl", []string{"foo=x,baz=q"}, 0})
			}
			if time.Now().Unix() != start {
				continue
			}
			for i, a := range answers {
				if a[0] != a[1] {
					t.Errorf("call %d: envoyproxy/ratelimit %s, cascade %s", i+1, a[0], a[1])
				}
			}
			if !strings.HasPrefix(answers[1][1], "OVER_LIMIT") {
				t.Errorf("the second call in a second: %s, want OVER_LIMIT", answers[1][1])
			}
			return
		}
		t.Fatal("10 times, 4 calls took more than the rest of a second: the machine is too loaded to compare")
	})

	// The intended differences, each as docs/envoy.md states it.
	t.Run("differences", func(t *testing.T) {
		diff := func(t *testing.T, calls []compatCall, wantTheirs, wantOurs string) {
			t.Helper()
			fresh()
			var a, b string
			for _, c := range calls {
				a, _ = ask(theirs.client, c)
				b, _ = ask(ours, c)
			}
			// the statuses: the headers follow them
			a, _, _ = strings.Cut(a, "; RateLimit-")
			b, _, _ = strings.Cut(b, "; RateLimit-")
			if a != wantTheirs || b != wantOurs {
				t.Errorf("last call:\n  envoyproxy/ratelimit: %s (want %s)\n  cascade:              %s (want %s)", a, wantTheirs, b, wantOurs)
			}
		}
		t.Run("a refused charge counts nowhere", func(t *testing.T) {
			diff(t, []compatCall{{"rl", []string{"unspec=v"}, 3}, {"rl", []string{"unspec=v"}, 2}},
				"OVER_LIMIT; OVER_LIMIT 0 left of 2/MINUTE",
				"OK; OK 0 left of 2/MINUTE")
		})
		t.Run("the same counter twice in a call", func(t *testing.T) {
			diff(t, []compatCall{{"rl", []string{"category=account", "category=account"}, 0}},
				"OK; OK 3 left of 4/MINUTE; OK 2 left of 4/MINUTE",
				"OK; OK 2 left of 4/MINUTE; OK 2 left of 4/MINUTE")
		})
		if err := reload(t, site, rlsYAMLGlobal(grpcPort, dir, options("on"))); err != nil {
			t.Fatal(err)
		}
		t.Run("atomic on: a call one descriptor refuses charges none", func(t *testing.T) {
			calls := repeat(3, compatCall{"rl", []string{"category=account", "foo=x"}, 0})
			calls = append(calls, compatCall{"rl", []string{"category=account"}, 0})
			diff(t, calls, "OK; OK 0 left of 4/MINUTE", "OK; OK 1 left of 4/MINUTE")
		})
		t.Run("atomic on: requests_per_unit 0 refuses the call, charges none", func(t *testing.T) {
			calls := []compatCall{{"rl", []string{"category=account", "foo=x,bar=banned"}, 0}, {"rl", []string{"category=account"}, 0}}
			diff(t, calls, "OK; OK 2 left of 4/MINUTE", "OK; OK 3 left of 4/MINUTE")
		})
	})

	t.Run("calls both refuse", func(t *testing.T) {
		// envoyproxy/ratelimit answers them with a gRPC error (UNKNOWN),
		// Cascade with INVALID_ARGUMENT: to Envoy both are a failed call,
		// which its failure_mode_deny decides.
		for _, req := range []*rlsv3.RateLimitRequest{
			{Domain: "", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("a", "b")}},
			{Domain: "rl"},
		} {
			_, errTheirs := theirs.client.ShouldRateLimit(context.Background(), req)
			_, errOurs := ours.ShouldRateLimit(context.Background(), req)
			if errTheirs == nil || status.Code(errOurs) != codes.InvalidArgument {
				t.Errorf("%v: envoyproxy/ratelimit %v, cascade %v: want both refused", req, errTheirs, errOurs)
			}
		}
	})
	t.Run("unknown and misplaced fields", func(t *testing.T) {
		bad := t.TempDir()
		for _, tc := range []struct {
			yaml       string
			theirsFail bool
			ours       string
		}{
			{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    burst: 5\n", true, `f.yaml:5: unknown field "burst" in a descriptor`},
			{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", true, `f.yaml:4: d.a: invalid unit "fortnight"`},
			// envoyproxy/ratelimit checks names anywhere, not places: a unit at the top is ignored
			{"domain: d\nunit: second\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n", false, `f.yaml:2: unknown field "unit" in a file's top level`},
		} {
			f := filepath.Join(bad, "f.yaml")
			if err := os.WriteFile(f, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(check, "-config_dir", bad).CombinedOutput()
			if (err != nil) != tc.theirsFail {
				t.Errorf("%q: envoyproxy/ratelimit's config check: %v\n%s", tc.yaml, err, out)
			}
			_, err = rls.LoadRules(f)
			if err == nil || !strings.Contains(err.Error(), f[:len(f)-len("f.yaml")]+tc.ours) {
				t.Errorf("%q: cascade: %v, want %q", tc.yaml, err, tc.ours)
			}
		}
	})
	if t.Failed() {
		t.Logf("envoyproxy/ratelimit's log:\n%s", theirs.logTail())
	}
}
