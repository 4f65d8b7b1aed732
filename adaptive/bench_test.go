package adaptive

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func benchController(b *testing.B, opts Options) *Controller {
	b.Helper()
	if opts.CPU == nil {
		opts.CPU = SourceFunc(func(time.Time) (float64, error) { return 50, nil })
	}
	c, err := New(Config{}, opts)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkRecord is the request path's cost of feeding the latency and
// error signals. Run with -cpu 1,2 to see contention on the shared counters.
func BenchmarkRecord(b *testing.B) {
	c := benchController(b, Options{})
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			c.Record(time.Duration(i&1023)*time.Millisecond, 200)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				// Mostly similar latencies, as in production: the worst case
				// for contention, since they share buckets.
				status := 200
				if i&63 == 0 {
					status = 502
				}
				c.Record(time.Duration(40+i&7)*time.Millisecond, status)
			}
		})
	})
}

// BenchmarkFactor is the request path's cost of reading the factor.
func BenchmarkFactor(b *testing.B) {
	c := benchController(b, Options{})
	c.Sample(epoch)
	b.Run("Factor", func(b *testing.B) {
		b.ReportAllocs()
		var sum float64
		for range b.N {
			sum += c.Factor()
		}
		_ = sum
	})
	b.Run("FactorFor", func(b *testing.B) {
		b.ReportAllocs()
		var sum float64
		for i := range b.N {
			sum += c.FactorFor(Priority(i % 3))
		}
		_ = sum
	})
	b.Run("FactorFor/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var sum float64
			for pb.Next() {
				sum += c.FactorFor(PriorityBatch)
			}
			_ = sum
		})
	})
}

// BenchmarkSample is the sampler's cost per interval: summing the window
// (31 slots of 194 buckets), the controller step and the publisher call.
// "system" adds reading the real CPU source of this machine.
func BenchmarkSample(b *testing.B) {
	run := func(b *testing.B, c *Controller) {
		for i := range 10_000 {
			c.Record(time.Duration(i)*time.Microsecond*37, 200)
		}
		now := epoch
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			now = now.Add(time.Second)
			c.Sample(now)
		}
	}
	b.Run("fake-cpu", func(b *testing.B) { run(b, benchController(b, Options{})) })
	b.Run("fake-cpu+publisher", func(b *testing.B) {
		run(b, benchController(b, Options{Publisher: &fakePublisher{shared: 0.9}}))
	})
	b.Run("system", func(b *testing.B) {
		if runtime.GOOS != "linux" {
			b.Skip("linux only")
		}
		src, _ := systemCPU(os.DirFS("/"), runtime.NumCPU())
		run(b, benchController(b, Options{CPU: src}))
	})
	b.Run("cgroup-files", func(b *testing.B) {
		// A container's group three levels deep, read from real files.
		root := b.TempDir()
		dir := filepath.Join(root, "sys/fs/cgroup/kubepods/pod/app")
		write := func(name, data string) {
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		write(filepath.Join(root, "proc/self/cgroup"), "0::/kubepods/pod/app\n")
		write(filepath.Join(dir, "cpu.stat"), cpuStat(123456789))
		write(filepath.Join(dir, "cpu.max"), "200000 100000\n")
		write(filepath.Join(dir, "../cpu.max"), "max 100000\n")
		src, desc := systemCPU(os.DirFS(root), 8)
		if _, ok := src.(*cgroupCPU); !ok {
			b.Fatalf("source %s, want the cgroup", desc)
		}
		run(b, benchController(b, Options{CPU: src}))
	})
}
