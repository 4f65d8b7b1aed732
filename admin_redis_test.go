package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/internal/freeport"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// caddyProcess is a Caddy process of the binary built from ./cmd/caddy,
// its configuration rendered for the ports it was given, its output kept
// in a log shown when it fails to come up.
type caddyProcess struct {
	bin, dir        string
	caddyfile       func(port, adminPort int) string
	port, adminPort int
	site, api       string
	cmd             *exec.Cmd
	exited          chan struct{} // closed when cmd has exited
}

func buildCaddy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building ./cmd/caddy: %v", err)
	}
	return bin
}

// newCaddyProcess starts a Caddy process of bin whose Caddyfile is
// caddyfile(port, adminPort), and kills it when t ends. Its site must
// answer 200 on /__health.
func newCaddyProcess(t *testing.T, bin string, caddyfile func(port, adminPort int) string) *caddyProcess {
	t.Helper()
	p := &caddyProcess{bin: bin, dir: t.TempDir(), caddyfile: caddyfile}
	p.start(t)
	return p
}

// processStartTimeout bounds a Caddy process's start-up: seconds on a quiet
// machine, more with both cores busy and a race-enabled test binary
// beside it.
const processStartTimeout = 60 * time.Second

// start runs the process and waits until its site answers, or fails t
// with its log. A first start whose port was taken meanwhile by another
// process picks new ports and tries again; a restart keeps its ports, on
// which the other processes of the test may rely.
func (p *caddyProcess) start(t *testing.T) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		first := p.port == 0
		if first {
			p.port, p.adminPort = freePort(t), freePort(t)
			p.site, p.api = fmt.Sprintf("http://127.0.0.1:%d/", p.port), fmt.Sprintf("http://127.0.0.1:%d", p.adminPort)
		}
		err := p.launch(t)
		if err == nil {
			return
		}
		log := p.log()
		if first && attempt < 5 && freeport.InUse(errors.New(log)) {
			p.port = 0
			continue
		}
		t.Fatalf("Caddy at %s: %v\n--- its log ---\n%s", p.site, err, log)
	}
}

// launch starts the process and waits for its site's /__health to answer
// 200, for it to exit, or for processStartTimeout.
func (p *caddyProcess) launch(t *testing.T) error {
	config := filepath.Join(p.dir, "Caddyfile")
	if err := os.WriteFile(config, []byte(p.caddyfile(p.port, p.adminPort)), 0o644); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(p.dir, "caddy.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the process has its own copy
	cmd := exec.Command(p.bin, "run", "--config", config, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+p.dir, "XDG_DATA_HOME="+p.dir, "XDG_CONFIG_HOME="+p.dir)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	t.Cleanup(p.stop)

	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(processStartTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("exited during start-up (%v)", cmd.ProcessState)
		default:
		}
		if res, err := probe.Get(p.site + "__health"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			p.stop()
			return fmt.Errorf("not serving %s__health after %v", p.site, processStartTimeout)
		}
		time.Sleep(20 * time.Millisecond) // polling for start-up, not timing behaviour
	}
}

// log is the process's output so far.
func (p *caddyProcess) log() string {
	b, err := os.ReadFile(filepath.Join(p.dir, "caddy.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 8000 {
		b = append([]byte("…"), b[len(b)-8000:]...)
	}
	return string(b)
}

// stop kills the process and waits for it to exit; it does nothing to a
// process already stopped.
func (p *caddyProcess) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.exited
}

// startInstances runs n Caddy processes sharing one Redis store, with
// the tree acme (org 1000/min > user 2/min).
func startInstances(t *testing.T, n int, storeBlock string) []*caddyProcess {
	return startRateLimited(t, n, `
			tree acme {
				tier org {header.X-Org} {
					limit 1000/min
				}
				tier user {header.X-User} {
					limit 2/min
				}
			}
			`+storeBlock)
}

// startRateLimited runs n Caddy processes whose site is rate_limited by
// block (the rate_limit block's body), answering "ok", with an admin API
// each and /__health outside the limits.
func startRateLimited(t *testing.T, n int, block string) []*caddyProcess {
	return startProxies(t, n, block, "")
}

// startProxies is startRateLimited with the site's handler a
// reverse_proxy to upstream (host:port; "" answers "ok").
func startProxies(t *testing.T, n int, block, upstream string) []*caddyProcess {
	bin := buildCaddy(t)
	handler := `respond "ok"`
	if upstream != "" {
		handler = "reverse_proxy " + upstream
	}
	var out []*caddyProcess
	for range n {
		out = append(out, newCaddyProcess(t, bin, func(port, adminPort int) string {
			return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
}
http://127.0.0.1:%d {
	handle /__health {
		respond "up"
	}
	handle {
		rate_limit {
			%s
		}
		%s
	}
}
`, adminPort, port, block, handler)
		}))
	}
	return out
}

// TestAdminAcrossInstances: an override and a mode set through one
// instance's admin API apply on another sharing its Redis within a
// second, and are still there after both restart; on a standalone Redis
// and on the 3-master Cluster.
func TestAdminAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	for _, tt := range redistest.Deployments() {
		t.Run(tt.Name, func(t *testing.T) {
			store := fmt.Sprintf("store redis {\n address %s\n key_prefix shared%d:\n }", strings.Join(tt.Addrs(t), " "), testSeq.Add(1))
			ps := startInstances(t, 2, store)
			a, b := ps[0], ps[1]
			carol := []string{"X-Org: acme", "X-User: carol"}

			if code, body := call(t, "PUT", a.api+"/rate_limit/overrides/acme/user/carol", `{"limits":[{"count":4,"per":"min"}],"note":"test"}`, nil); code != 200 {
				t.Fatalf("override through A: %d %s", code, body)
			}
			start := time.Now()
			for {
				_, bk := remainingOf(t, b.api, "tree=acme&org=acme&user=carol")
				if bk.Buckets[1].Source == "override" && bk.Buckets[1].Capacity == 4 {
					break
				}
				if time.Since(start) > propagation {
					t.Fatalf("B did not apply A's override within %v: %+v", propagation, bk.Buckets[1])
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("override applied on B after %v", time.Since(start))
			if got := admitN(t, 5, b.site, carol...); got != 4 {
				t.Fatalf("B admitted %d of 5 under the override of 4/min", got)
			}

			if code, body := call(t, "PUT", a.api+"/rate_limit/mode/acme", `{"mode":"shadow"}`, nil); code != 200 {
				t.Fatalf("mode through A: %d %s", code, body)
			}
			start = time.Now()
			for do(t, "GET", b.site, carol...).status != 200 {
				if time.Since(start) > propagation {
					t.Fatalf("B did not apply A's shadow mode within %v", propagation)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("mode applied on B after %v", time.Since(start))

			// Both restart: the state is in Redis.
			a.stop()
			b.stop()
			a.start(t)
			b.start(t)
			for _, p := range ps {
				var trees []admin.Tree
				call(t, "GET", p.api+"/rate_limit/trees", nil, &trees)
				if len(trees) != 1 || trees[0].Mode != "shadow" || len(trees[0].Tiers[1].Values) != 1 || trees[0].Tiers[1].Values[0].Limits[0].Count != 4 {
					t.Fatalf("after a restart, %s: %+v", p.api, trees)
				}
			}
		})
	}
}
