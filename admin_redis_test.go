package cascade

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// caddyProcess is a Caddy process of the binary built from ./cmd/caddy.
type caddyProcess struct {
	bin, config string
	site, api   string
	cmd         *exec.Cmd
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

func (p *caddyProcess) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.bin, "run", "--config", p.config, "--adapter", "caddyfile")
	dir := filepath.Dir(p.config)
	p.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := p.cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitUp(t, p.site)
}

func (p *caddyProcess) stop() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
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
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		port, adminPort := freePort(t), freePort(t)
		p := &caddyProcess{bin: bin, config: filepath.Join(dir, "Caddyfile"),
			site: fmt.Sprintf("http://127.0.0.1:%d/", port), api: fmt.Sprintf("http://127.0.0.1:%d", adminPort)}
		os.WriteFile(p.config, []byte(fmt.Sprintf(`{
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
`, adminPort, port, block, handler)), 0o644)
		p.start(t)
		out = append(out, p)
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
				if time.Since(start) > time.Second {
					t.Fatalf("B did not apply A's override within 1 s: %+v", bk.Buckets[1])
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
				if time.Since(start) > time.Second {
					t.Fatal("B did not apply A's shadow mode within 1 s")
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
