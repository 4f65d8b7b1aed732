// Package redistest starts real redis-server processes for tests: a
// standalone server, a local Redis Cluster, or one server shared by a whole
// test binary. Cascade's Redis store is tested against the real thing, never
// a mock, because what matters (Lua numbers, TIME, EVALSHA and NOSCRIPT,
// hash slots, TTLs) is Redis's behaviour, not ours.
//
// redis-server (and redis-cli, for clusters) must be on PATH; CI installs
// them. A test that needs Redis fails with a clear message when it is
// missing, unless CASCADE_SKIP_REDIS=1 is set, in which case it is skipped.
//
// Every process is bound to 127.0.0.1 on a free port, keeps its files in a
// temporary directory, persists nothing (--save "" --appendonly no) and is
// killed when its test ends (Start, StartCluster) or when Cleanup runs
// (Shared, SharedCluster). On Linux the processes are also killed if the
// test binary dies, so an interrupted run leaves none behind.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

	"github.com/caddy-cascade/cascade/internal/freeport"
)

// SkipEnv is the environment variable that, set to 1, turns every test
// that needs Redis into a skip.
const SkipEnv = "CASCADE_SKIP_REDIS"

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to reach cluster_state:ok.
const startTimeout = 20 * time.Second

// Server is one redis-server process.
type Server struct {
	port  int
	dir   string
	extra []string // extra command-line arguments (cluster mode)
	// sentinelConf is the configuration file of a Sentinel (which must
	// have one it can rewrite); empty for a plain server.
	sentinelConf string
	ownsDir      bool // Close removes dir (shared servers; t.TempDir cleans itself)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Socket is the path of the server's Unix socket.
func (s *Server) Socket() string { return filepath.Join(s.dir, "redis.sock") }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// Require fails tb (or skips it when CASCADE_SKIP_REDIS=1) unless
// redis-server is on PATH. Start, StartCluster, Shared and SharedCluster
// call it; tests that only need to know may call it first.
func Require(tb testing.TB) {
	tb.Helper()
	if os.Getenv(SkipEnv) == "1" {
		tb.Skipf("%s=1: skipping a test that needs a real redis-server", SkipEnv)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("redis-server is not on PATH (%v): install it (Debian: apt-get install redis-server) "+
			"or set %s=1 to skip the tests that need it", err, SkipEnv)
	}
}

// Start starts a standalone redis-server for tb and kills it when tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	Require(tb)
	s, err := start(tb.TempDir(), false, nil)
	return owned(tb, s, err)
}

// owned fails tb with err, or has s stopped when tb ends and returns it.
func owned[T interface{ Close() }](tb testing.TB, s T, err error) T {
	tb.Helper()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// start launches a server in dir on a fresh free port, retrying on the rare
// race where another process takes the port between our probe and Redis's
// bind. setup, when non-nil, configures the server before its launch; it is
// given a second free port (a cluster's bus port).
func start(dir string, ownsDir bool, setup func(s *Server, sparePort int) error) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		s := &Server{port: ports[0], dir: dir, ownsDir: ownsDir}
		if setup != nil {
			if err := setup(s, ports[1]); err != nil {
				return nil, err
			}
		}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

// launch runs redis-server on s.port and waits until it answers PING.
func (s *Server) launch() error {
	var args []string
	if s.sentinelConf != "" {
		args = []string{s.sentinelConf, "--sentinel"}
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	if s.sentinelConf == "" {
		args = append(args, "--save", "", "--appendonly", "no",
			"--unixsocket", s.Socket(), "--unixsocketperm", "700")
	}
	args = append(args, s.extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited during start-up: %s", s.port, s.logTail())
		default:
		}
		if reply, err := Do(s.Addr(), "PING"); err == nil && reply == "PONG" {
			return nil
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", s.port, startTimeout, s.logTail())
		}
		time.Sleep(10 * time.Millisecond) // polling for start-up, not timing behaviour
	}
}

// logTail is the end of the server's log, for error messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Kill kills the server (SIGKILL) and waits for it to exit, as a crash
// would: clients see refused connections until Restart.
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Restart starts the server again on the same port, empty (nothing is
// persisted): state and loaded scripts are gone, as after a real restart.
// It kills the server first if it is running.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.kill()
	if err := s.launch(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// Pause stops the server process (SIGSTOP) without closing its sockets:
// connections succeed and commands hang, the way an overloaded or
// partitioned Redis looks to a client. Resume undoes it; Close and Kill
// work on a paused server.
func (s *Server) Pause() { s.signal(sigStop) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(sigCont) }

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(sig)
	}
}

// Close kills the server and removes its files if it owns them.
func (s *Server) Close() {
	s.kill()
	if s.ownsDir {
		os.RemoveAll(s.dir)
	}
}

// Do sends one command to addr over a fresh connection and returns its
// reply as a string: the text of a simple or bulk string, the digits of an
// integer, the elements of an array joined by newlines. An error reply is
// returned as an error. It is a deliberately tiny RESP client, for start-up
// checks and for tests that must not depend on the client under test.
func Do(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(req.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err // a nil bulk string is ""
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// freePorts finds n distinct free loopback ports outside the range the
// kernel gives outgoing connections (see package freeport): a Restart on
// the same port must find it still free.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		port, err := freeport.Pick()
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ports, port) {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// StartSentinel starts a Redis Sentinel for tb that monitors master under
// the name masterName (quorum 1), and kills it when tb ends. A client given
// the Sentinel's Addr and masterName reaches master through it.
func StartSentinel(tb testing.TB, masterName string, master *Server) *Server {
	tb.Helper()
	Require(tb)
	dir := tb.TempDir()
	s, err := start(dir, false, func(s *Server, _ int) error {
		s.sentinelConf = filepath.Join(dir, "sentinel.conf")
		conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 5000\n",
			masterName, master.Port(), masterName)
		return os.WriteFile(s.sentinelConf, []byte(conf), 0o644)
	})
	s = owned(tb, s, err)
	if reply, err := Do(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName); err != nil || !strings.HasSuffix(reply, strconv.Itoa(master.Port())) {
		tb.Fatalf("redistest: sentinel does not know master %s: %q %v", masterName, reply, err)
	}
	return s
}

// StartReplica starts a server for tb that replicates master, and
// returns once it is in sync.
func StartReplica(tb testing.TB, master *Server) *Server {
	tb.Helper()
	Require(tb)
	s, err := start(tb.TempDir(), false, func(s *Server, _ int) error {
		s.extra = []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}
		return nil
	})
	s = owned(tb, s, err)
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := Do(s.Addr(), "INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: replica of %s not in sync within %v: %v %s", master.Addr(), startTimeout, err, info)
		}
		time.Sleep(10 * time.Millisecond) // polling for start-up
	}
}

// StartSentinels starts n Sentinels for tb that monitor master under
// masterName with a quorum of a majority, and declare it down after
// downAfter without an answer; the majority then promotes a replica
// (started with StartReplica before). It returns once every Sentinel
// knows the others and the master's replicas, so that a failover can
// happen; a client given their addresses and masterName reaches the
// current master through them.
func StartSentinels(tb testing.TB, masterName string, master *Server, n int, downAfter time.Duration) []*Server {
	tb.Helper()
	Require(tb)
	replicas, err := Do(master.Addr(), "INFO", "replication")
	if err != nil {
		tb.Fatalf("redistest: master %s: %v", master.Addr(), err)
	}
	_, after, _ := strings.Cut(replicas, "connected_slaves:")
	var sentinels []*Server
	for range n {
		dir := tb.TempDir()
		s, err := start(dir, false, func(s *Server, _ int) error {
			s.sentinelConf = filepath.Join(dir, "sentinel.conf")
			conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
				"sentinel down-after-milliseconds %[1]s %[4]d\n"+
				"sentinel failover-timeout %[1]s %[5]d\n"+
				"sentinel parallel-syncs %[1]s 1\n",
				masterName, master.Port(), n/2+1, downAfter.Milliseconds(), max(2*downAfter, 2*time.Second).Milliseconds())
			return os.WriteFile(s.sentinelConf, []byte(conf), 0o644)
		})
		sentinels = append(sentinels, owned(tb, s, err))
	}
	replicaCount, _, _ := strings.Cut(after, "\r")
	deadline := time.Now().Add(startTimeout)
	for _, s := range sentinels {
		for {
			peers, err1 := Do(s.Addr(), "SENTINEL", "SENTINELS", masterName)
			master, err2 := Do(s.Addr(), "SENTINEL", "MASTER", masterName)
			known := func(field string) string {
				lines := strings.Split(master, "\n")
				for i := 0; i+1 < len(lines); i += 2 {
					if lines[i] == field {
						return lines[i+1]
					}
				}
				return ""
			}
			if err1 == nil && err2 == nil && known("num-other-sentinels") == strconv.Itoa(n-1) && known("num-slaves") == strings.TrimSpace(replicaCount) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: sentinel %s does not know its %d peers and %s replicas within %v: %v %v %q", s.Addr(), n-1, replicaCount, startTimeout, err1, err2, peers)
			}
			time.Sleep(20 * time.Millisecond) // polling for start-up: peers hello every 2 s
		}
	}
	return sentinels
}

// Cluster is a local Redis Cluster: masters only, or (StartClusterHA)
// masters each with a replica that takes over when its master dies.
type Cluster struct {
	// Masters are the nodes created as masters, in the order given to
	// redis-cli --cluster create. After a failover, one of them may no
	// longer be a master: MasterForSlot tells who serves a slot now.
	Masters []*Server
	// Replicas are the nodes created as replicas (none unless
	// StartClusterHA).
	Replicas []*Server

	dir     string
	ownsDir bool
}

// Nodes are every node of the cluster, masters then replicas.
func (c *Cluster) Nodes() []*Server { return append(slices.Clone(c.Masters), c.Replicas...) }

// Addrs are the masters' addresses: the seed list for a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr()
	}
	return addrs
}

// Close kills every node (and removes their files if the cluster owns them).
func (c *Cluster) Close() {
	for _, m := range c.Nodes() {
		m.Close()
	}
	if c.ownsDir {
		os.RemoveAll(c.dir)
	}
}

// StartCluster starts a Redis Cluster of masters nodes (at least 3, as
// redis-cli requires) for tb, waits until every node reports
// cluster_state:ok with all 16384 slots assigned, and kills it when tb ends.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	Require(tb)
	c, err := startCluster(tb.TempDir(), false, masters, 0, 5*time.Second)
	return owned(tb, c, err)
}

// StartClusterHA starts a Redis Cluster of masters nodes, each with one
// replica, whose nodes declare a silent peer failed after nodeTimeout
// (cluster-node-timeout): a killed master's replica is promoted about
// that long after, and up to a second more (the election's random delay).
// It returns once every node reports cluster_state:ok and every replica
// is in sync with its master.
func StartClusterHA(tb testing.TB, masters int, nodeTimeout time.Duration) *Cluster {
	tb.Helper()
	Require(tb)
	c, err := startCluster(tb.TempDir(), false, masters, masters, nodeTimeout)
	return owned(tb, c, err)
}

func startCluster(dir string, ownsDir bool, masters, replicas int, nodeTimeout time.Duration) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	if replicas != 0 && replicas != masters {
		return nil, fmt.Errorf("a cluster here has no replica or one per master, got %d for %d masters", replicas, masters)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, fmt.Errorf("redis-cli is not on PATH (%v); it is needed to create a cluster", err)
	}
	c := &Cluster{dir: dir, ownsDir: ownsDir}
	for i := 0; i < masters+replicas; i++ {
		nodeDir := filepath.Join(dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		s, err := start(nodeDir, false, func(s *Server, busPort int) error {
			s.extra = []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(nodeDir, "nodes.conf"),
				"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
				"--cluster-port", strconv.Itoa(busPort),
				// A replica may take over however long it last heard
				// its master: the tests kill masters on purpose.
				"--cluster-replica-validity-factor", "0",
				// The healthy masters keep serving their slots while a
				// dead one's are without a master.
				"--cluster-require-full-coverage", "no",
			}
			return nil
		})
		if err != nil {
			c.Close()
			return nil, err
		}
		if i < masters {
			c.Masters = append(c.Masters, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes() {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas/masters), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitOK waits until every node sees a healthy cluster that knows every
// node: only then do all nodes agree on who serves which slot.
func (c *Cluster) waitOK(ctx context.Context) error {
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		fmt.Sprintf("cluster_known_nodes:%d", len(c.Masters)+len(c.Replicas)),
	}
	wait := func(n *Server, cmd []string, want []string) error {
		for {
			info, err := Do(n.Addr(), cmd...)
			if err == nil && containsAll(info, want) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("cluster node %s not ready (want %v): %v %s", n.Addr(), want, err, info)
			case <-time.After(20 * time.Millisecond): // polling for start-up
			}
		}
	}
	for _, n := range c.Nodes() {
		if err := wait(n, []string{"CLUSTER", "INFO"}, want); err != nil {
			return err
		}
	}
	for _, r := range c.Replicas {
		if err := wait(r, []string{"INFO", "replication"}, []string{"role:slave", "master_link_status:up"}); err != nil {
			return err
		}
	}
	return nil
}

// MasterForSlot is the node that serves slot as a master now, as node
// asks sees it (CLUSTER NODES), or nil when none does (its master failed
// and no replica has taken over yet).
func (c *Cluster) MasterForSlot(ask *Server, slot int) (*Server, error) {
	nodes, err := Do(ask.Addr(), "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !slices.Contains(strings.Split(f[2], ","), "master") || strings.Contains(f[2], "fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, _ := strings.Cut(r, "-")
			if hi == "" {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || slot < l || slot > h {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			for _, n := range c.Nodes() {
				if n.Addr() == addr {
					return n, nil
				}
			}
			return nil, fmt.Errorf("slot %d is served by %s, not a node of this cluster", slot, addr)
		}
	}
	return nil, nil
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// The shared server and cluster live as long as the test binary: starting
// processes costs time, and most tests only need keys of their own. This is
// the package's only mutable state, and it exists for tests.
var shared struct {
	mu      sync.Mutex
	server  once[*Server]
	cluster once[*Cluster]
}

// once is a process started on first use, or the error that stopped it.
type once[T interface{ Close() }] struct {
	v       T
	err     error
	started bool
}

// get starts the process on first use (in a temporary directory named
// after what) and fails tb if that failed. The caller holds shared.mu.
func (o *once[T]) get(tb testing.TB, what string, start func(dir string) (T, error)) T {
	tb.Helper()
	if !o.started {
		o.started = true
		var dir string
		if dir, o.err = os.MkdirTemp("", "redistest-"+what+"-"); o.err == nil {
			o.v, o.err = start(dir)
		}
	}
	if o.err != nil {
		tb.Fatalf("redistest: shared %s: %v", what, o.err)
	}
	return o.v
}

// stop stops the process if it runs, and forgets it.
func (o *once[T]) stop() {
	if o.started && o.err == nil {
		o.v.Close()
	}
	*o = once[T]{}
}

// Shared returns a standalone server shared by every test of the binary,
// starting it on first use. Tests that share it must use keys of their own
// (a unique key prefix) and must not flush, kill or pause it. Call Cleanup
// from TestMain to stop it; on Linux it also dies with the test binary.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	Require(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return shared.server.get(tb, "server", func(dir string) (*Server, error) { return start(dir, true, nil) })
}

// SharedCluster is Shared for a 3-master cluster.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	Require(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return shared.cluster.get(tb, "cluster", func(dir string) (*Cluster, error) { return startCluster(dir, true, 3, 0, 5*time.Second) })
}

// Deployment is a shared Redis deployment a test runs on: Addrs starts it
// if needed and returns the addresses to give a store.
type Deployment struct {
	Name  string
	Addrs func(tb testing.TB) []string
}

// Deployments are the shared standalone server and the shared 3-master
// Cluster, for tests that must hold on both.
func Deployments() []Deployment {
	return []Deployment{
		{"standalone", func(tb testing.TB) []string { return []string{Shared(tb).Addr()} }},
		{"cluster", func(tb testing.TB) []string { return SharedCluster(tb).Addrs() }},
	}
}

// Main is a TestMain for packages whose tests use the shared server or
// cluster: it runs the tests, then stops what they started.
func Main(m *testing.M) {
	defer Cleanup()
	m.Run() // testing exits with the tests' status once TestMain returns
}

// Cleanup stops the shared server and cluster, if they were started. Call
// it from TestMain after m.Run (Main does).
func Cleanup() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.server.stop()
	shared.cluster.stop()
}

// OnMaster is those of names whose slot (slot tells a name's) master
// serves now, as another master sees it. It fails tb when a name's slot
// has no master, or when all or none of names are on master: a failover
// test needs tenants of the master it stops and of the others.
func (c *Cluster) OnMaster(tb testing.TB, master *Server, names []string, slot func(string) int) []string {
	tb.Helper()
	ask := c.Masters[0]
	if ask == master {
		ask = c.Masters[1]
	}
	var on []string
	for _, name := range names {
		m, err := c.MasterForSlot(ask, slot(name))
		if err != nil || m == nil {
			tb.Fatalf("redistest: who serves %s: %v %v", name, m, err)
		}
		if m == master {
			on = append(on, name)
		}
	}
	if len(on) == 0 || len(on) == len(names) {
		tb.Fatalf("redistest: %d of %d names on master %s: the test needs both kinds", len(on), len(names), master.Addr())
	}
	return on
}

// Drive calls call from 8 goroutines, each every 20 ms (about 400 calls a
// second in all), each call given the next of 0, 1, 2, …, until stop is
// closed: steady load through a failover. The returned function waits for
// the calls under way to end.
func Drive(stop <-chan struct{}, call func(n int64)) (wait func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond): // pacing the load, not timing behaviour
				}
				call(next.Add(1))
			}
		})
	}
	return wg.Wait
}
