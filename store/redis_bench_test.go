package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// BenchmarkRedisDecide measures one decision of 1, 3, 5 and 7 tiers (one
// bucket per tier, one hash tag) on a local redis-server with Redis's own
// clock, every decision admitting and so writing every key. Besides ns/op
// (the round trip as a request sees it) it reports server-µs/op, Redis's
// own time per EVALSHA from INFO commandstats: the part that limits a
// shared Redis's throughput.
func BenchmarkRedisDecide(b *testing.B) {
	srv := redistest.Start(b)
	s := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	for _, n := range []int{1, 3, 5, 7} {
		b.Run(fmt.Sprintf("tiers=%d", n), func(b *testing.B) {
			path := tiers(n)
			resetStats(b, srv.Addr())
			for b.Loop() {
				if _, err := s.Decide(ctx, path); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(commandStats(b, srv.Addr())["evalsha"].usecPerCall, "server-µs/op")
		})
	}
}

// BenchmarkRedisDecideParallel drives one store instance as a busy Caddy
// does: 32 concurrent callers, each decision a 4-tier path like the load
// script's (10 organisations, 50 teams, 1,000 users, 3 agents), or 5 tiers
// with a model under the agent, every decision admitted. Decisions that queue up are batched into one script
// call. It reports Redis's time per decision (INFO commandstats over b.N),
// the decisions per script call, and the CPU time of this process per
// decision (getrusage: the client's whole cost, goroutines, go-redis and
// system calls included).
//
// The store has the default circuit breaker (3 failures, 1 s), as
// production does: its cost on every decision is part of the measure. The
// cluster case runs on the shared 3-master Cluster (server-µs/op is then
// the master of the paths' slots' own, INFO commandstats on each master).
func BenchmarkRedisDecideParallel(b *testing.B) {
	srv := redistest.Start(b)
	breaker := store.BreakerOptions{Failures: 3, Cooldown: time.Second}
	s := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}, Breaker: breaker})
	for _, tiers := range []int{4, 5} {
		b.Run(fmt.Sprintf("tiers=%d", tiers), func(b *testing.B) {
			decideParallel(b, s, tiers, []string{srv.Addr()})
		})
	}
	b.Run("cluster/tiers=4", func(b *testing.B) {
		c := redistest.SharedCluster(b)
		s := newRedis(b, store.RedisOptions{Addrs: c.Addrs(), KeyPrefix: prefix(b), Breaker: breaker})
		decideParallel(b, s, 4, c.Addrs())
	})
}

// decideParallel is BenchmarkRedisDecideParallel's body on store s, whose
// servers (every master) are addrs.
func decideParallel(b *testing.B, s *store.Redis, tiers int, addrs []string) {
	var next atomic.Int64
	paths := make([][]store.Bucket, 1000)
	for u := range paths {
		org := fmt.Sprintf("{bench%d|org=org%d}", tiers, u%10)
		team := org + fmt.Sprintf("team=team%d", u%50)
		user := team + fmt.Sprintf("/user=user%d", u)
		agent := user + fmt.Sprintf("/agent=agent%d", u%3)
		model := agent + fmt.Sprintf("/model=model%d", u%2)
		for _, k := range []string{org, team, user, agent, model}[:tiers] {
			paths[u] = append(paths[u], store.Bucket{Key: k, Limit: storetest.GCRA(1_000_000_000, time.Hour), Cost: 1})
		}
	}
	for _, a := range addrs {
		resetStats(b, a)
	}
	before := cpuTime(b)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Decide(context.Background(), paths[next.Add(1)%int64(len(paths))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpu := cpuTime(b) - before
	var calls int64
	var usec float64
	for _, a := range addrs {
		st := commandStats(b, a)["evalsha"]
		calls += st.calls
		usec += float64(st.calls) * st.usecPerCall
	}
	b.ReportMetric(usec/float64(b.N), "server-µs/op")
	b.ReportMetric(float64(b.N)/float64(max(calls, 1)), "decisions/call")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "client-cpu-µs/op")
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRedisLease measures one lease grant as package lease asks for it
// in a steady state: a 4-tier path decided and leased 10 more requests'
// worth, the previous lease's unspent half given back in the same call.
// server-µs/op is Redis's own time per call (INFO commandstats).
func BenchmarkRedisLease(b *testing.B) {
	srv := redistest.Start(b)
	s := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	path := tiers(4)
	for i := range path {
		path[i].Limit = storetest.GCRA(1_000_000_000, time.Hour)
	}
	var last store.Leased
	resetStats(b, srv.Addr())
	for b.Loop() {
		var rel []store.Release
		for i, bk := range path {
			if last.Extra > 0 {
				rel = append(rel, store.Release{Bucket: store.Bucket{Key: bk.Key, Limit: bk.Limit, Charged: last.At},
					Offset: last.Levels[i] + 5, Units: 5})
			}
		}
		l, err := s.Lease(ctx, store.Grant{Buckets: path, Want: 11, MaxShare: 0.1, MinRemaining: 0.05, Hold: time.Second, Release: rel})
		if err != nil {
			b.Fatal(err)
		}
		if l.Extra != 10 {
			b.Fatalf("leased %d, want 10", l.Extra)
		}
		last = l
	}
	b.ReportMetric(commandStats(b, srv.Addr())["evalsha"].usecPerCall, "server-µs/op")
}
