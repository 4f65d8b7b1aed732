package store_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// windowCases are the limits BenchmarkSlidingWindow compares: GCRA, exact
// sliding windows of N = 10, 100 and MaxExact, a coarse one (N = 10·MaxExact,
// whose log stays within MaxExact + 1 entries), and the two-counter estimate.
func windowCases() []struct {
	name  string
	limit rate.Limit
} {
	sliding := func(n int64) rate.Limit { return rate.Limit{Algorithm: rate.Sliding, Count: n, Period: time.Minute} }
	return []struct {
		name  string
		limit rate.Limit
	}{
		{"gcra/N=1000", storetest.GCRA(1000, time.Minute)},
		{"sliding/N=10", sliding(10)},
		{"sliding/N=100", sliding(100)},
		{"sliding/N=" + strconv.Itoa(rate.MaxExact), sliding(rate.MaxExact)},
		{"sliding/N=" + strconv.Itoa(10*rate.MaxExact) + "(coarse)", sliding(10 * rate.MaxExact)},
		{"sliding_approx/N=1000", rate.Limit{Algorithm: rate.SlidingApprox, Count: 1000, Period: time.Minute}},
	}
}

// step is the interval between charges of 1 that keeps a window nearly
// full without a denial: 1% below the limit's rate (a coarse window
// under-admits by up to a tick, the estimate by its error).
func step(l rate.Limit) time.Duration {
	return l.Period * 101 / 100 / time.Duration(l.Count)
}

// fill brings a key to the steady state of a window used to its limit:
// charges of 1 at step over the last window (so a fine log holds nearly N
// entries, a coarse one an entry per tick). It returns the step.
func fill(b *testing.B, s store.Store, clock *storetest.Clock, bucket store.Bucket) time.Duration {
	b.Helper()
	step := step(bucket.Limit)
	for i := int64(0); i < bucket.Limit.Count; i++ {
		clock.Advance(step)
		if d, err := s.Decide(context.Background(), []store.Bucket{bucket}); err != nil || !d.Allowed {
			b.Fatalf("filling %s: %+v %v", bucket.Key, d, err)
		}
	}
	return step
}

// BenchmarkSlidingWindow measures exact sliding windows at steady state —
// every decision admits, logs a charge and drops the oldest, the log full —
// beside GCRA and the two-counter estimate, on both stores:
//
//   - memory: ns per decision, and the memory per key (B/key: arena and heap) over 100 full keys;
//   - redis: the round trip (ns/op), Redis's time per lone decision
//     (server-µs/op, from INFO commandstats) and Redis's MEMORY USAGE of
//     the key (B/key).
//
// Both stores run on an injected clock, stepping at the limit's rate.
func BenchmarkSlidingWindow(b *testing.B) {
	ctx := context.Background()
	b.Run("memory", func(b *testing.B) {
		for _, c := range windowCases() {
			b.Run(c.name, func(b *testing.B) {
				clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC))
				m := store.NewMemory(store.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
				defer m.Close()
				// The memory of 100 full keys: what they hold in the
				// store's arena, and any heap they take (the index of
				// hashes, made with the store, has room for them: at
				// scale it takes 21–43 bytes a key).
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				held := m.StateBytes()
				for k := 0; k < 100; k++ {
					clock.Set(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC))
					fill(b, m, clock, store.Bucket{Key: fmt.Sprintf("{mem}|k%d", k), Limit: c.limit, Cost: 1})
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)+int64(m.StateBytes()-held)) / 100

				bucket := []store.Bucket{{Key: "{mem}|k0", Limit: c.limit, Cost: 1}}
				step := step(c.limit)
				for b.Loop() {
					clock.Advance(step)
					if d, err := m.Decide(ctx, bucket); err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
				}
				b.ReportMetric(perKey, "B/key")
			})
		}
	})
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		for _, c := range windowCases() {
			b.Run(c.name, func(b *testing.B) {
				clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC))
				r := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}, Clock: clock.Now, KeyPrefix: "bench:"})
				bucket := store.Bucket{Key: "{redis}|" + c.name, Limit: c.limit, Cost: 1}
				step := fill(b, r, clock, bucket)
				// The bucket's key, and an exact window's log.
				size := 0.0
				for _, k := range []string{"bench:" + bucket.Key, "bench:" + bucket.Key + "~log"} {
					if usage, err := redistest.Do(srv.Addr(), "MEMORY", "USAGE", k); err == nil {
						n, _ := strconv.ParseFloat(usage, 64)
						size += n
					}
				}
				resetStats(b, srv.Addr())
				path := []store.Bucket{bucket}
				for b.Loop() {
					clock.Advance(step)
					if d, err := r.Decide(ctx, path); err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
				}
				b.ReportMetric(commandStats(b, srv.Addr())["evalsha"].usecPerCall, "server-µs/op")
				b.ReportMetric(size, "B/key")
			})
		}
	})
}
