package adaptive

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/mem"
)

// A Source reads one resource signal (CPU or memory) as a percentage.
// Read is called only by the sampling goroutine, once per interval, with
// the sample's time; a Source that works from counters (CPU) keeps the
// previous reading and returns the utilisation since then.
type Source interface {
	Read(now time.Time) (percent float64, err error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(now time.Time) (float64, error)

// Read calls f.
func (f SourceFunc) Read(now time.Time) (float64, error) { return f(now) }

// ErrNoSample is returned by a counter-based Source on its first Read: a
// utilisation needs two readings. The controller ignores the signal for that
// sample without logging.
var ErrNoSample = errors.New("adaptive: no sample yet")

// cgroupMount is where the cgroup v2 hierarchy is mounted, relative to the
// root filesystem given to the detectors.
const cgroupMount = "sys/fs/cgroup"

// cgroupDir finds the cgroup v2 directory of this process: the "0::<path>"
// line of /proc/self/cgroup, under the mount. In a container without a
// cgroup namespace the path printed there does not exist inside the
// container's mount, whose root is then the container's own group; so
// fall back to the mount's root. ok is false when there is no cgroup v2
// hierarchy with the file want in it (cgroup v1, or not Linux).
func cgroupDir(fsys fs.FS, want string) (dir string, ok bool) {
	var candidates []string
	if b, err := fs.ReadFile(fsys, "proc/self/cgroup"); err == nil {
		for line := range strings.Lines(string(b)) {
			if p, found := strings.CutPrefix(strings.TrimSpace(line), "0::"); found {
				candidates = append(candidates, path.Join(cgroupMount, p))
			}
		}
	}
	candidates = append(candidates, cgroupMount)
	for _, d := range candidates {
		if _, err := fs.Stat(fsys, path.Join(d, want)); err == nil {
			return d, true
		}
	}
	return "", false
}

// ancestors returns dir and its parents up to the cgroup mount, innermost
// first: a limit set on a parent group binds its children too.
func ancestors(dir string) []string {
	out := []string{dir}
	for dir != cgroupMount && strings.HasPrefix(dir, cgroupMount+"/") {
		dir = path.Dir(dir)
		out = append(out, dir)
	}
	return out
}

// parseCPUMax parses cpu.max ("$MAX $PERIOD", MAX possibly "max") into a
// number of CPUs; ok is false when there is no quota.
func parseCPUMax(b []byte) (cpus float64, ok bool, err error) {
	f := strings.Fields(string(b))
	if len(f) == 0 || len(f) > 2 {
		return 0, false, fmt.Errorf("malformed cpu.max %q", b)
	}
	if f[0] == "max" {
		return 0, false, nil
	}
	quota, err := strconv.ParseFloat(f[0], 64)
	if err != nil || quota <= 0 {
		return 0, false, fmt.Errorf("malformed cpu.max quota %q", f[0])
	}
	period := 100000.0 // the kernel's default period, if only the quota is written
	if len(f) == 2 {
		if period, err = strconv.ParseFloat(f[1], 64); err != nil || period <= 0 {
			return 0, false, fmt.Errorf("malformed cpu.max period %q", f[1])
		}
	}
	return quota / period, true, nil
}

// cgroupQuota returns the tightest CPU quota set on dir or its ancestors.
func cgroupQuota(fsys fs.FS, dir string) (cpus float64, ok bool, err error) {
	for _, d := range ancestors(dir) {
		b, rerr := fs.ReadFile(fsys, path.Join(d, "cpu.max"))
		if rerr != nil {
			continue // the root group has no cpu.max
		}
		c, has, perr := parseCPUMax(b)
		if perr != nil {
			return 0, false, fmt.Errorf("%s: %w", path.Join(d, "cpu.max"), perr)
		}
		if has && (!ok || c < cpus) {
			cpus, ok = c, true
		}
	}
	return cpus, ok, nil
}

// statField returns the value of a "key value" line of a cgroup stat file.
func statField(b []byte, key string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), " ")
		if found && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("malformed %s %q", key, v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

// cgroupCPU measures CPU utilisation relative to the cgroup's quota from the
// usage_usec counter of cpu.stat: Δusage / (Δwall × CPUs allowed). The quota
// is re-read at each sample, since it can change at run time (Kubernetes
// in-place resize); it is capped by the CPUs the process may run on, since a
// quota of 4 CPUs on a 2-CPU cpuset can only ever use 2.
type cgroupCPU struct {
	fsys     fs.FS
	dir      string
	ncpu     int
	last     uint64
	lastTime time.Time
}

func (c *cgroupCPU) Read(now time.Time) (float64, error) {
	b, err := fs.ReadFile(c.fsys, path.Join(c.dir, "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("reading cgroup cpu usage: %w", err)
	}
	usage, err := statField(b, "usage_usec")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path.Join(c.dir, "cpu.stat"), err)
	}
	cpus, ok, err := cgroupQuota(c.fsys, c.dir)
	if err != nil {
		return 0, fmt.Errorf("reading cgroup cpu quota: %w", err)
	}
	if !ok || cpus > float64(c.ncpu) {
		cpus = float64(c.ncpu)
	}
	prev, prevTime := c.last, c.lastTime
	c.last, c.lastTime = usage, now
	if prevTime.IsZero() || usage < prev {
		return 0, ErrNoSample // first reading, or the counter was reset
	}
	wall := now.Sub(prevTime)
	if wall <= 0 {
		return 0, ErrNoSample
	}
	used := float64(usage-prev) * float64(time.Microsecond)
	return 100 * used / (float64(wall) * cpus), nil
}

// hostCPU measures host CPU utilisation from the cumulative times of
// /proc/stat (through gopsutil): busy share of the time elapsed since the
// previous Read. Unlike cpu.Percent it neither sleeps nor keeps package
// state.
type hostCPU struct {
	times      func(ctx context.Context) ([]cpu.TimesStat, error)
	busy, all  float64
	haveSample bool
}

func (h *hostCPU) Read(time.Time) (float64, error) {
	ts, err := h.times(context.Background())
	if err != nil {
		return 0, fmt.Errorf("reading host cpu times: %w", err)
	}
	if len(ts) == 0 {
		return 0, errors.New("reading host cpu times: no data")
	}
	t := ts[0]
	// On Linux guest time is already included in user and nice.
	all := t.User + t.Nice + t.System + t.Idle + t.Iowait + t.Irq + t.Softirq + t.Steal
	busy := all - t.Idle - t.Iowait
	prevBusy, prevAll, had := h.busy, h.all, h.haveSample
	h.busy, h.all, h.haveSample = busy, all, true
	if !had || all <= prevAll {
		return 0, ErrNoSample
	}
	return 100 * math.Max(0, busy-prevBusy) / (all - prevAll), nil
}

// cgroupMemory measures the cgroup's working set against its memory limit:
// (memory.current − inactive_file) / memory.max, the measure the kubelet
// evicts on. Page cache that can be dropped without a fault is not pressure.
type cgroupMemory struct {
	fsys fs.FS
	dir  string
}

func (c *cgroupMemory) Read(time.Time) (float64, error) {
	b, err := fs.ReadFile(c.fsys, path.Join(c.dir, "memory.current"))
	if err != nil {
		return 0, fmt.Errorf("reading cgroup memory usage: %w", err)
	}
	current, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: malformed %q", path.Join(c.dir, "memory.current"), b)
	}
	if b, err := fs.ReadFile(c.fsys, path.Join(c.dir, "memory.stat")); err == nil {
		if inactive, err := statField(b, "inactive_file"); err == nil && inactive < current {
			current -= inactive
		}
	}
	limit, ok, err := cgroupMemoryLimit(c.fsys, c.dir)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errors.New("reading cgroup memory limit: memory.max is no longer set")
	}
	return 100 * float64(current) / float64(limit), nil
}

// cgroupMemoryLimit returns the tightest memory.max on dir or its ancestors.
func cgroupMemoryLimit(fsys fs.FS, dir string) (limit uint64, ok bool, err error) {
	for _, d := range ancestors(dir) {
		b, rerr := fs.ReadFile(fsys, path.Join(d, "memory.max"))
		if rerr != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, perr := strconv.ParseUint(s, 10, 64)
		if perr != nil || n == 0 {
			return 0, false, fmt.Errorf("%s: malformed %q", path.Join(d, "memory.max"), s)
		}
		if !ok || n < limit {
			limit, ok = n, true
		}
	}
	return limit, ok, nil
}

// hostMemory is the host's used memory, (total − available)/total.
type hostMemory struct {
	virtual func(ctx context.Context) (*mem.VirtualMemoryStat, error)
}

func (h *hostMemory) Read(time.Time) (float64, error) {
	v, err := h.virtual(context.Background())
	if err != nil {
		return 0, fmt.Errorf("reading host memory: %w", err)
	}
	return v.UsedPercent, nil
}

// hostTimes returns the host's total CPU times.
func hostTimes(ctx context.Context) ([]cpu.TimesStat, error) {
	return cpu.TimesWithContext(ctx, false)
}

// systemCPU picks the CPU source: the cgroup v2 group of this process when
// it has a CPU quota (the limit a container actually runs into), else the
// host. An unlimited group ("max" everywhere) is not measured against
// anything of its own: its CPUs are the host's, shared with every other
// process, so host utilisation is what predicts contention. The description
// says which was chosen, for the log.
func systemCPU(fsys fs.FS, ncpu int) (src Source, desc string) {
	if dir, ok := cgroupDir(fsys, "cpu.stat"); ok {
		cpus, limited, err := cgroupQuota(fsys, dir)
		if err == nil && limited {
			return &cgroupCPU{fsys: fsys, dir: dir, ncpu: ncpu},
				fmt.Sprintf("cgroup v2 /%s (quota %.3g CPUs)", dir, min(cpus, float64(ncpu)))
		}
	}
	return &hostCPU{times: hostTimes}, fmt.Sprintf("host (%d CPUs)", ncpu)
}

// systemMemory picks the memory source the same way: the cgroup when it has
// a memory limit, else the host.
func systemMemory(fsys fs.FS) (src Source, desc string) {
	if dir, ok := cgroupDir(fsys, "memory.current"); ok {
		if limit, limited, err := cgroupMemoryLimit(fsys, dir); err == nil && limited {
			return &cgroupMemory{fsys: fsys, dir: dir},
				fmt.Sprintf("cgroup v2 /%s (limit %d bytes)", dir, limit)
		}
	}
	return &hostMemory{virtual: mem.VirtualMemoryWithContext}, "host"
}
