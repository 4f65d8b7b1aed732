package redistest_test

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestMain stops the Redis processes shared by this package's tests.
func TestMain(m *testing.M) { redistest.Main(m) }

func ping(addr string) error {
	reply, err := redistest.Do(addr, "PING")
	if err == nil && reply != "PONG" {
		err = &net.AddrError{Err: "unexpected reply " + reply, Addr: addr}
	}
	return err
}

func TestStartKillRestart(t *testing.T) {
	s := redistest.Start(t)
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("a started server must answer PING: %v", err)
	}
	if _, err := redistest.Do(s.Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	// A test server persists nothing.
	for param, want := range map[string]string{"save": "save\n", "appendonly": "appendonly\nno", "bind": "bind\n127.0.0.1"} {
		if got, err := redistest.Do(s.Addr(), "CONFIG", "GET", param); err != nil || got != want {
			t.Errorf("CONFIG GET %s: %q (%v), want %q", param, got, err, want)
		}
	}

	s.Kill()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("a killed server still answers")
	}

	s.Restart(t)
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("a restarted server must answer PING: %v", err)
	}
	if v, _ := redistest.Do(s.Addr(), "GET", "k"); v != "" {
		t.Fatalf("a restarted server kept %q: it must come back empty", v)
	}
}

func TestPauseResume(t *testing.T) {
	s := redistest.Start(t)
	s.Pause()
	done := make(chan error, 1)
	go func() { done <- ping(s.Addr()) }()
	select {
	case err := <-done:
		t.Fatalf("a paused server answered (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	s.Resume()
	if err := <-done; err != nil {
		t.Fatalf("the waiting PING after Resume: %v", err)
	}
}

func TestSharedIsShared(t *testing.T) {
	a, b := redistest.Shared(t), redistest.Shared(t)
	if a != b {
		t.Fatal("Shared started a second server")
	}
	if err := ping(a.Addr()); err != nil {
		t.Fatal(err)
	}
}

func TestStartCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("%d masters, want 3", len(c.Addrs()))
	}
	for _, addr := range c.Addrs() {
		info, err := redistest.Do(addr, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_size:3") {
			t.Fatalf("node %s: %v\n%s", addr, err, info)
		}
	}
}

func TestStartSentinel(t *testing.T) {
	master := redistest.Start(t)
	s := redistest.StartSentinel(t, "m", master)
	reply, err := redistest.Do(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m")
	if err != nil || reply != "127.0.0.1\n"+strings.Split(master.Addr(), ":")[1] {
		t.Fatalf("sentinel reports master %q (%v), want %s", reply, err, master.Addr())
	}
}

// TestMissingRedisFails runs a test binary whose PATH has no redis-server:
// the test must fail with a message saying how to fix it, not skip, unless
// CASCADE_SKIP_REDIS=1, which must skip.
func TestMissingRedisFails(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "1" {
		redistest.Start(t)
		return
	}
	tests := []struct {
		name     string
		skipEnv  string
		wantFail bool
		want     string
	}{
		{"fails", "", true, "redis-server is not on PATH"},
		{"skips when asked", "1", false, "CASCADE_SKIP_REDIS=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMissingRedisFails$", "-test.v")
			cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", "PATH="+t.TempDir(), redistest.SkipEnv+"="+tt.skipEnv)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tt.wantFail || !strings.Contains(string(out), tt.want) {
				t.Fatalf("child failed=%v, want %v, with %q in:\n%s", failed, tt.wantFail, tt.want, out)
			}
		})
	}
}
