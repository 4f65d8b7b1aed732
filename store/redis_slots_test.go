package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestRedisSlotsExpireUnlessRenewed: a concurrency slot lives while the
// instance that took it renews it, and comes back by itself within the slot
// TTL once that instance is gone; a renewal never brings back a slot given
// back. Two instances share one Redis (standalone and Cluster), on an
// injected clock.
func TestRedisSlotsExpireUnlessRenewed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{redistest.Shared(t).Addr()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := storetest.NewClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
			p := prefix(t)
			const ttl = 3 * time.Second
			open := func() *store.Redis {
				r, err := store.NewRedis(ctx, store.RedisOptions{Addrs: tc.addrs(t), KeyPrefix: p, Clock: clock.Now, SlotTTL: ttl, Timeout: testTimeout})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			a, b := open(), open()
			defer b.Close()
			slots := rate.Limit{Algorithm: rate.Concurrent, Count: 2}
			take := func(s *store.Redis, holder int64) bool {
				t.Helper()
				d, err := s.Decide(ctx, []store.Bucket{{Key: "{slots}|k", Limit: slots, Cost: 1, Holder: holder}})
				if err != nil {
					t.Fatal(err)
				}
				return d.Allowed
			}
			if !take(a, 1) || !take(a, 2) {
				t.Fatal("instance A was refused a free slot")
			}
			if a.HeldSlots() != 2 {
				t.Fatalf("A holds %d slots, want 2", a.HeldSlots())
			}
			if take(b, 3) {
				t.Fatal("B took a third slot of 2")
			}
			clock.Advance(2 * time.Second)
			if n, err := a.RenewSlots(ctx); err != nil || n != 2 {
				t.Fatalf("A renewed %d slots (%v), want 2", n, err)
			}
			clock.Advance(2 * time.Second) // past the first TTL, within the renewed one
			if take(b, 4) {
				t.Fatal("B took a renewed slot")
			}
			// A gives one back: renewing does not bring it back.
			if err := a.Adjust(ctx, []store.Bucket{{Key: "{slots}|k", Limit: slots, Cost: -1, Holder: 1}}); err != nil {
				t.Fatal(err)
			}
			if n, err := a.RenewSlots(ctx); err != nil || n != 1 {
				t.Fatalf("A renewed %d slots (%v), want the 1 it still holds", n, err)
			}
			if !take(b, 5) {
				t.Fatal("B was refused the slot A gave back")
			}
			// A dies with a slot in flight: it is B's again after the TTL,
			// not before.
			a.Close()
			clock.Advance(time.Second)
			if n, err := b.RenewSlots(ctx); err != nil || n != 1 { // B lives on
				t.Fatalf("B renewed %d slots (%v), want 1", n, err)
			}
			clock.Advance(ttl - time.Second - time.Microsecond)
			if take(b, 6) {
				t.Fatal("B took A's slot before its TTL ran out")
			}
			clock.Advance(time.Microsecond)
			if !take(b, 7) {
				t.Fatal("A's slot did not come back after its TTL")
			}
			if take(b, 8) {
				t.Fatal("B took a third slot of 2")
			}
		})
	}
}
