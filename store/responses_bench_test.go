package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// BenchmarkResponses keeps a response and reads it back (one
// KeepResponse and one Response per op, the same key each time: a
// replacement) of 1 KiB and 1 MiB, in the memory store (default budget:
// nothing is cut) and in a local redis-server (single, over TCP).
func BenchmarkResponses(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) store.Responses
	}{
		{"memory", func(b *testing.B) store.Responses {
			m := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
			b.Cleanup(func() { m.Close() })
			return m
		}},
		{"redis", func(b *testing.B) store.Responses {
			return newRedis(b, store.RedisOptions{Addrs: []string{redistest.Shared(b).Addr()}, KeyPrefix: prefix(b)})
		}},
	}
	ctx := context.Background()
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			rs := st.open(b)
			for _, size := range []int{1 << 10, 1 << 20} {
				b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
					response := storetest.Blob(size)
					b.SetBytes(int64(size))
					b.ReportAllocs()
					for b.Loop() {
						if err := rs.KeepResponse(ctx, "{bench}|response", response, time.Minute); err != nil {
							b.Fatal(err)
						}
						if got, _, err := rs.Response(ctx, "{bench}|response"); err != nil || len(got) != size {
							b.Fatalf("%d bytes, %v", len(got), err)
						}
					}
				})
			}
		})
	}
}
