package cascade

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// loadYAML is the configuration both servers are loaded with: Envoy's
// usual pair of descriptors (the client's address, its API key), limits
// no run reaches, so that every call is charged.
const loadYAML = `domain: load
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// TestRLSEnvoyLoad loads envoyproxy/ratelimit and Cascade (each its own
// process, on one Redis, both with loadYAML) with the same calls: two
// descriptors each, 1,000 addresses and 100 keys, from 16 and then 64
// concurrent callers on 4 connections, in alternating rounds (as
// scripts/load.sh runs mholt: the order turns every round, and each ratio
// is taken within a round, its median reported). It reports calls/s, p99,
// each server's CPU per call and Redis's. A measurement, not a check: run
// it with CASCADE_ENVOY_LOAD=1 (ROUNDS, default 6; DURATION, default 3s).
func TestRLSEnvoyLoad(t *testing.T) {
	if os.Getenv("CASCADE_ENVOY_LOAD") == "" {
		t.Skip("a load measurement: CASCADE_ENVOY_LOAD=1 runs it")
	}
	rounds, _ := strconv.Atoi(os.Getenv("ROUNDS"))
	if rounds <= 0 {
		rounds = 6
	}
	duration, err := time.ParseDuration(os.Getenv("DURATION"))
	if err != nil {
		duration = 3 * time.Second
	}
	service, _ := buildEnvoyRatelimit(t)
	srv := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "load.yaml"), []byte(loadYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	theirs := startEnvoyRatelimit(t, service, root, srv.Addr())
	ours := startCascadeProcess(t, dir, srv.Addr())

	type server struct {
		name string
		pid  int
		port int
	}
	servers := []server{{"envoyproxy/ratelimit", theirs.pid, theirs.port}, {"cascade", ours.pid, ours.port}}
	for _, callers := range []int{16, 64} {
		results := make([][]loadResult, len(servers))
		for r := range rounds {
			order := []int{0, 1}
			if r%2 == 1 {
				order = []int{1, 0}
			}
			for _, i := range order {
				s := servers[i]
				runLoad(t, s.port, callers, time.Second, srv.Addr(), s.pid) // warm-up
				results[i] = append(results[i], runLoad(t, s.port, callers, duration, srv.Addr(), s.pid))
			}
		}
		var ratios []float64
		for r := range rounds {
			ratios = append(ratios, results[1][r].rate/results[0][r].rate)
		}
		for i, s := range servers {
			m := medianResult(results[i])
			t.Logf("%d callers, %-21s %8.0f calls/s  p99 %6.2f ms  server %5.1f µs CPU/call  redis %5.1f µs CPU/call",
				callers, s.name, m.rate, m.p99.Seconds()*1000, m.cpu, m.redisCPU)
		}
		t.Logf("%d callers: cascade / envoyproxy/ratelimit calls/s, per round: %s; median %.2f×",
			callers, fmtRatios(ratios), median(ratios))
	}
}

// loadResult is one run's measurement.
type loadResult struct {
	rate          float64 // calls/s
	p99           time.Duration
	cpu, redisCPU float64 // µs a call
}

// runLoad calls the server on port with callers goroutines for d, and
// measures it, its process pid's CPU and Redis's.
func runLoad(t *testing.T, port, callers int, d time.Duration, redisAddr string, pid int) loadResult {
	t.Helper()
	conns := make([]rlsv3.RateLimitServiceClient, 4)
	for i := range conns {
		cc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	cpu0, redis0 := processCPU(t, pid), redisCPU(t, redisAddr)
	var calls, failed atomic.Int64
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := conns[g%len(conns)]
			for n := 0; time.Now().Before(stop); n++ {
				req := &rlsv3.RateLimitRequest{Domain: "load", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("10.0.%d.%d", g, n%250)}}},
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "key-" + strconv.Itoa((g*31+n)%100)}}},
				}}
				t0 := time.Now()
				res, err := client.ShouldRateLimit(context.Background(), req)
				lat[g] = append(lat[g], time.Since(t0))
				if err != nil || res.OverallCode != rlsv3.RateLimitResponse_OK {
					failed.Add(1)
				}
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, redis1 := processCPU(t, pid), redisCPU(t, redisAddr)
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d calls failed or were refused", f, calls.Load())
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	n := float64(calls.Load())
	return loadResult{
		rate:     n / elapsed.Seconds(),
		p99:      all[int(float64(len(all))*0.99)],
		cpu:      (cpu1 - cpu0).Seconds() * 1e6 / n,
		redisCPU: (redis1 - redis0).Seconds() * 1e6 / n,
	}
}

// processCPU is the CPU time pid has used, from /proc (user and system,
// in clock ticks of 10 ms).
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// redisCPU is the CPU time Redis has used, as INFO cpu says.
func redisCPU(t *testing.T, addr string) time.Duration {
	t.Helper()
	info, err := redistest.Do(addr, "INFO", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// cascadeProcess is Cascade serving the rules of a directory from a Caddy
// process of its own.
type cascadeProcess struct{ pid, port int }

// startCascadeProcess builds ./cmd/caddy and runs it serving the YAML of
// dir on the Redis at redisAddr, and waits until it answers a call.
func startCascadeProcess(t *testing.T, dir, redisAddr string) cascadeProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/caddy").CombinedOutput(); err != nil {
		t.Fatalf("building ./cmd/caddy: %v\n%s", err, out)
	}
	port := freePort(t)
	cf := filepath.Join(t.TempDir(), "Caddyfile")
	caddyfile := fmt.Sprintf("{\n%s\tcascade {\n\t\trls {\n\t\t\tlisten 127.0.0.1:%d\n\t\t\tconfig %s {\n\t\t\t\tstore redis {\n\t\t\t\t\taddress %s\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n",
		globals(0), port, dir, redisAddr)
	if err := os.WriteFile(cf, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "run", "--config", cf, "--adapter", "caddyfile")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	f, err := os.Create(logFile)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cancel(); <-exited })
	client := rlsClient(t, port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "load",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", "127.0.0.1")}})
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logFile)
			t.Fatalf("caddy exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("caddy not answering after 30 s (%v):\n%s", err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cascadeProcess{pid: cmd.Process.Pid, port: port}
}

func medianResult(rs []loadResult) loadResult {
	pick := func(f func(loadResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	return loadResult{
		rate:     pick(func(r loadResult) float64 { return r.rate }),
		p99:      time.Duration(pick(func(r loadResult) float64 { return float64(r.p99) })),
		cpu:      pick(func(r loadResult) float64 { return r.cpu }),
		redisCPU: pick(func(r loadResult) float64 { return r.redisCPU }),
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}
