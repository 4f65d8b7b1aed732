package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
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

// BenchmarkRedisDecideParallel is BenchmarkRedisDecide at 5 tiers with
// concurrent callers, each on its own tenant's keys: the throughput of one
// store instance, as a busy Caddy would drive it.
func BenchmarkRedisDecideParallel(b *testing.B) {
	srv := redistest.Start(b)
	s := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}})
	resetStats(b, srv.Addr())
	b.RunParallel(func(pb *testing.PB) {
		path := tiers(5)
		for pb.Next() {
			if _, err := s.Decide(context.Background(), path); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(commandStats(b, srv.Addr())["evalsha"].usecPerCall, "server-µs/op")
}
