package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/shirou/gopsutil/v4/cpu"
)

// cgroupFS builds a fake root filesystem: files maps paths relative to the
// cgroup mount to contents, self is the process's cgroup path ("" for no
// /proc/self/cgroup at all).
func cgroupFS(self string, files map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	if self != "" {
		fsys["proc/self/cgroup"] = &fstest.MapFile{Data: []byte("0::" + self + "\n")}
	}
	for p, data := range files {
		fsys[strings.TrimSuffix("sys/fs/cgroup/"+p, "/")] = &fstest.MapFile{Data: []byte(data)}
	}
	return fsys
}

func cpuStat(usec uint64) string {
	return fmt.Sprintf("usage_usec %d\nuser_usec %d\nsystem_usec 0\nnr_periods 0\n", usec, usec)
}

func TestSystemCPUDetection(t *testing.T) {
	const app = "/kubepods/pod1/app"
	for _, tc := range []struct {
		name     string
		self     string
		files    map[string]string
		ncpu     int
		wantHost bool
		wantCPUs float64 // expected capacity when cgroup
	}{
		{
			name:     "quota on own group",
			self:     app,
			files:    map[string]string{"kubepods/pod1/app/cpu.stat": cpuStat(0), "kubepods/pod1/app/cpu.max": "150000 100000\n"},
			ncpu:     8,
			wantCPUs: 1.5,
		},
		{
			name: "quota on an ancestor binds the child",
			self: app,
			files: map[string]string{
				"kubepods/pod1/app/cpu.stat": cpuStat(0),
				"kubepods/pod1/app/cpu.max":  "max 100000\n",
				"kubepods/pod1/cpu.max":      "200000 100000\n",
				"kubepods/cpu.max":           "800000 100000\n",
			},
			ncpu:     8,
			wantCPUs: 2,
		},
		{
			name:     "quota larger than the CPUs we may run on",
			self:     app,
			files:    map[string]string{"kubepods/pod1/app/cpu.stat": cpuStat(0), "kubepods/pod1/app/cpu.max": "400000 100000"},
			ncpu:     2,
			wantCPUs: 2,
		},
		{
			name:     "max everywhere: host",
			self:     app,
			files:    map[string]string{"kubepods/pod1/app/cpu.stat": cpuStat(0), "kubepods/pod1/app/cpu.max": "max 100000\n", "kubepods/cpu.max": "max 100000"},
			ncpu:     4,
			wantHost: true,
		},
		{
			name:     "no cpu.max files: host",
			self:     app,
			files:    map[string]string{"kubepods/pod1/app/cpu.stat": cpuStat(0)},
			ncpu:     4,
			wantHost: true,
		},
		{
			name:     "no cpu.stat: host",
			self:     app,
			files:    map[string]string{"kubepods/pod1/app/cpu.max": "100000 100000"},
			ncpu:     4,
			wantHost: true,
		},
		{
			name:     "nothing at all (cgroup v1, not Linux): host",
			ncpu:     4,
			wantHost: true,
		},
		{
			// Docker without a cgroup namespace: /proc/self/cgroup names a
			// host path that does not exist in the container's mount.
			name:     "path not in the mount: mount root",
			self:     "/docker/abc",
			files:    map[string]string{"cpu.stat": cpuStat(0), "cpu.max": "50000 100000"},
			ncpu:     4,
			wantCPUs: 0.5,
		},
		{
			name:     "no /proc/self/cgroup: mount root",
			files:    map[string]string{"cpu.stat": cpuStat(0), "cpu.max": "100000"}, // period omitted
			ncpu:     4,
			wantCPUs: 1,
		},
		{
			name:     "malformed cpu.max: host",
			self:     "/",
			files:    map[string]string{"cpu.stat": cpuStat(0), "cpu.max": "lots 100000"},
			ncpu:     4,
			wantHost: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := cgroupFS(tc.self, tc.files)
			src, desc := systemCPU(fsys, tc.ncpu)
			if _, isHost := src.(*hostCPU); isHost != tc.wantHost {
				t.Fatalf("source %T (%s), want host %v", src, desc, tc.wantHost)
			}
			if tc.wantHost {
				return
			}
			// Measure: one full wanted-capacity second of usage over one
			// second of wall time is 100%.
			cg := src.(*cgroupCPU)
			dir := cg.dir
			now := epoch
			if _, err := src.Read(now); !errors.Is(err, ErrNoSample) {
				t.Fatalf("first read: %v, want ErrNoSample", err)
			}
			used := uint64(tc.wantCPUs * 0.5 * 1e6) // half the capacity for 1s
			fsys[dir+"/cpu.stat"] = &fstest.MapFile{Data: []byte(cpuStat(used))}
			got, err := src.Read(now.Add(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-50) > 0.01 {
				t.Errorf("utilisation %.3f%%, want 50%% of %v CPUs (%s)", got, tc.wantCPUs, desc)
			}
		})
	}
}

func TestCgroupCPURead(t *testing.T) {
	fsys := cgroupFS("/", map[string]string{"cpu.stat": cpuStat(1_000_000), "cpu.max": "200000 100000"})
	src := &cgroupCPU{fsys: fsys, dir: cgroupMount, ncpu: 8}
	set := func(usec uint64) { fsys["sys/fs/cgroup/cpu.stat"] = &fstest.MapFile{Data: []byte(cpuStat(usec))} }
	now := epoch
	if _, err := src.Read(now); !errors.Is(err, ErrNoSample) {
		t.Fatalf("first read: %v, want ErrNoSample", err)
	}
	for _, tc := range []struct {
		name    string
		usec    uint64
		dt      time.Duration
		want    float64
		wantErr error
	}{
		{"idle", 1_000_000, time.Second, 0, nil},
		{"one of two CPUs", 2_000_000, time.Second, 50, nil},
		{"both CPUs over 2s", 6_000_000, 2 * time.Second, 100, nil},
		{"quarter over half a second", 6_250_000, 500 * time.Millisecond, 25, nil},
		{"counter reset", 10, time.Second, 0, ErrNoSample},
		{"after reset", 1_000_010, time.Second, 50, nil},
		{"no time passed", 1_000_010, 0, 0, ErrNoSample},
	} {
		set(tc.usec)
		now = now.Add(tc.dt)
		got, err := src.Read(now)
		if !errors.Is(err, tc.wantErr) || (err == nil && math.Abs(got-tc.want) > 1e-9) {
			t.Errorf("%s: got %v, %v; want %v, %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
	// The quota is re-read: a resize takes effect at the next sample.
	fsys["sys/fs/cgroup/cpu.max"] = &fstest.MapFile{Data: []byte("100000 100000")}
	set(2_000_010)
	now = now.Add(time.Second)
	if got, err := src.Read(now); err != nil || math.Abs(got-100) > 1e-9 {
		t.Errorf("after resize to 1 CPU: %v, %v; want 100", got, err)
	}
	// Files disappearing are errors, not panics or zeros.
	delete(fsys, "sys/fs/cgroup/cpu.stat")
	if _, err := src.Read(now.Add(time.Second)); err == nil {
		t.Error("missing cpu.stat: no error")
	}
	fsys["sys/fs/cgroup/cpu.stat"] = &fstest.MapFile{Data: []byte("user_usec 5\n")}
	if _, err := src.Read(now.Add(time.Second)); err == nil || !strings.Contains(err.Error(), "usage_usec") {
		t.Errorf("cpu.stat without usage_usec: %v", err)
	}
}

func TestParseCPUMax(t *testing.T) {
	for _, tc := range []struct {
		in      string
		cpus    float64
		limited bool
		bad     bool
	}{
		{"max 100000\n", 0, false, false},
		{"max", 0, false, false},
		{"50000 100000", 0.5, true, false},
		{"250000 100000\n", 2.5, true, false},
		{"100000", 1, true, false},
		{"", 0, false, true},
		{"-1 100000", 0, false, true},
		{"100000 0", 0, false, true},
		{"1 2 3", 0, false, true},
	} {
		cpus, limited, err := parseCPUMax([]byte(tc.in))
		if (err != nil) != tc.bad || limited != tc.limited || math.Abs(cpus-tc.cpus) > 1e-12 {
			t.Errorf("parseCPUMax(%q) = %v, %v, %v; want %v, %v, error %v", tc.in, cpus, limited, err, tc.cpus, tc.limited, tc.bad)
		}
	}
}

func TestCgroupMemory(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name     string
		files    map[string]string
		wantHost bool
		want     float64
	}{
		{
			name: "working set of the limit",
			files: map[string]string{
				"app/memory.current": fmt.Sprint(600 * mib),
				"app/memory.stat":    fmt.Sprintf("anon 1\ninactive_file %d\nactive_file 5\n", 88*mib),
				"app/memory.max":     fmt.Sprint(1024 * mib),
			},
			want: 50,
		},
		{
			name: "limit on the parent",
			files: map[string]string{
				"app/memory.current": fmt.Sprint(256 * mib),
				"app/memory.max":     "max\n",
				"memory.max":         fmt.Sprint(512 * mib),
			},
			want: 50,
		},
		{
			name:     "no limit: host",
			files:    map[string]string{"app/memory.current": "1", "app/memory.max": "max\n"},
			wantHost: true,
		},
		{
			name:     "no memory controller: host",
			files:    map[string]string{"app/cpu.stat": cpuStat(0)},
			wantHost: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, desc := systemMemory(cgroupFS("/app", tc.files))
			if _, isHost := src.(*hostMemory); isHost != tc.wantHost {
				t.Fatalf("source %T (%s), want host %v", src, desc, tc.wantHost)
			}
			if tc.wantHost {
				return
			}
			got, err := src.Read(epoch)
			if err != nil || math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestHostCPU(t *testing.T) {
	var times cpu.TimesStat
	var fail error
	h := &hostCPU{times: func(context.Context) ([]cpu.TimesStat, error) { return []cpu.TimesStat{times}, fail }}
	times = cpu.TimesStat{User: 100, System: 50, Idle: 800, Iowait: 50}
	if _, err := h.Read(epoch); !errors.Is(err, ErrNoSample) {
		t.Fatalf("first read: %v, want ErrNoSample", err)
	}
	// +30 user, +10 system, +50 idle, +10 iowait: 40 busy of 100.
	times = cpu.TimesStat{User: 130, System: 60, Idle: 850, Iowait: 60}
	if got, err := h.Read(epoch); err != nil || math.Abs(got-40) > 1e-9 {
		t.Errorf("got %v, %v; want 40", got, err)
	}
	// Guest time is already counted in user: it must not inflate the total.
	times = cpu.TimesStat{User: 230, System: 60, Idle: 850, Iowait: 60, Guest: 100}
	if got, err := h.Read(epoch); err != nil || math.Abs(got-100) > 1e-9 {
		t.Errorf("guest: got %v, %v; want 100", got, err)
	}
	fail = errors.New("no /proc")
	if _, err := h.Read(epoch); err == nil {
		t.Error("error not reported")
	}
}

// TestSystemSourcesOnThisMachine reads the real sources twice: whatever
// this machine is, the values must be percentages.
func TestSystemSourcesOnThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	fsys := os.DirFS("/")
	src, desc := systemCPU(fsys, runtime.NumCPU())
	t.Logf("cpu source: %s", desc)
	_, _ = src.Read(time.Now())
	// Burn a little CPU so that the counters move.
	x := 0.0
	for i := range 2_000_000 {
		x += math.Sqrt(float64(i))
	}
	_ = x
	got, err := src.Read(time.Now())
	if err != nil && !errors.Is(err, ErrNoSample) {
		t.Fatal(err)
	}
	if got < 0 || got > 100.5*float64(runtime.NumCPU()) {
		t.Errorf("cpu %v%%", got)
	}
	msrc, mdesc := systemMemory(fsys)
	t.Logf("memory source: %s", mdesc)
	m, err := msrc.Read(time.Now())
	if err != nil || m <= 0 || m > 100 {
		t.Errorf("memory %v%%, %v", m, err)
	}
}
