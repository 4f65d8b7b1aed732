package store_test

import (
	"context"
	"errors"
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
	for _, tc := range redistest.Deployments() {
		t.Run(tc.Name, func(t *testing.T) {
			ctx := context.Background()
			clock := storetest.NewClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
			p := prefix(t)
			const ttl = 3 * time.Second
			open := func() *store.Redis {
				r, err := store.NewRedis(ctx, store.RedisOptions{Addrs: tc.Addrs(t), KeyPrefix: p, Clock: clock.Now, SlotTTL: ttl, Timeout: testTimeout})
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

// TestRedisSlotGivenBackWhileBreakerOpen: a slot given back while the
// circuit breaker is open (the give-back never reaches Redis) is no longer
// renewed, so it comes back within the slot TTL.
func TestRedisSlotGivenBackWhileBreakerOpen(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	const ttl = 3 * time.Second
	// The timeout is what tripping the breaker waits out, and all that a
	// call to the healthy Redis gets: seconds, for a slow machine.
	const timeout = 2 * time.Second
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix(t), Timeout: timeout,
		Clock: clock.Now, SlotTTL: ttl, Breaker: store.BreakerOptions{Failures: 1, Cooldown: 50 * time.Millisecond}})
	ctx := context.Background()
	slots := rate.Limit{Algorithm: rate.Concurrent, Count: 1}
	d, err := s.Decide(ctx, []store.Bucket{{Key: "{s}k", Limit: slots, Cost: 1, Holder: 1}})
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	srv.Pause()
	// Trip the breaker. A call this instance's own queue held past half
	// its timeout (a slow machine) is an overload of its own, which the
	// breaker does not count: try again.
	for tries := 1; !s.BreakerOpen(); tries++ {
		if tries > 10 {
			t.Fatal("10 calls to a hung Redis did not open a breaker of 1 failure")
		}
		_, err := s.Decide(ctx, []store.Bucket{{Key: "{s}x", Limit: rate.Limit{Count: 1, Period: time.Second}, Cost: 1}})
		t.Logf("call %d to the hung Redis: %v", tries, err)
	}
	// The response ends: give the slot back (engine.Done).
	errAdj := s.Adjust(ctx, []store.Bucket{{Key: "{s}k", Limit: slots, Cost: -1, Holder: 1}})
	t.Logf("give-back with the breaker open: %v; held now %d", errAdj, s.HeldSlots())
	srv.Resume()
	waitFor(t, timeout+unavailableBound, "the breaker to close once Redis is back", func() error {
		if s.BreakerOpen() {
			return errors.New("still open")
		}
		return nil
	})
	for range 5 { // long after slot_ttl, the instance keeps renewing
		clock.Advance(2 * time.Second)
		s.RenewSlots(ctx)
	}
	d, err = s.Decide(ctx, []store.Bucket{{Key: "{s}k", Limit: slots, Cost: 1, Holder: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		t.Fatalf("10s (> slot_ttl %v) after the request ended, its slot is still taken: held %d", ttl, s.HeldSlots())
	}
}

// TestSlotsResetThenGiveBack: after a reset of a concurrency limit, the
// slots taken before it give nothing back to the fresh counter (both
// stores agree: a slot is given back to the counter that counted it).
func TestSlotsResetThenGiveBack(t *testing.T) {
	type resettable interface {
		store.Store
		store.Resetter
	}
	for _, tc := range []struct {
		name string
		open func(t *testing.T, clock store.Clock) resettable
	}{
		{"memory", func(_ *testing.T, clock store.Clock) resettable {
			return store.NewMemory(store.MemoryOptions{SweepInterval: -1, Clock: clock})
		}},
		{"redis", func(t *testing.T, clock store.Clock) resettable {
			return newRedis(t, store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, KeyPrefix: prefix(t), Clock: clock})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := storetest.NewClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
			s := tc.open(t, clock.Now)
			ctx := context.Background()
			l := rate.Limit{Algorithm: rate.Concurrent, Count: 3}
			taken := map[int64]int64{} // holder → when its slot was taken, as engine.Done gives it
			take := func(h int64) bool {
				t.Helper()
				clock.Advance(time.Microsecond)
				d, err := s.Decide(ctx, []store.Bucket{{Key: "{r}slots", Limit: l, Cost: 1, Holder: h}})
				if err != nil {
					t.Fatal(err)
				}
				taken[h] = d.At
				return d.Allowed
			}
			give := func(h int64) {
				t.Helper()
				clock.Advance(time.Microsecond)
				if err := s.Adjust(ctx, []store.Bucket{{Key: "{r}slots", Limit: l, Cost: -1, Holder: h, Charged: taken[h]}}); err != nil {
					t.Fatal(err)
				}
			}
			take(1)
			take(2)
			clock.Advance(time.Microsecond)
			if _, err := s.Reset(ctx, []string{"{r}slots"}); err != nil { // admin reset, 1 and 2 in flight
				t.Fatal(err)
			}
			for h := int64(3); h <= 5; h++ {
				if !take(h) {
					t.Fatalf("slot %d of 3 after a reset refused", h-2)
				}
			}
			give(1)
			give(2) // the old ones end: 3, 4, 5 in flight
			if take(6) {
				t.Fatalf("a 4th request in flight admitted on 3 slots (3, 4, 5 still in flight)")
			}
			give(3)
			if !take(7) {
				t.Fatal("a slot given back after the reset did not come back")
			}
		})
	}
}

// TestRedisClusterCrossSlotSlots: a concurrency limit on a path across
// Cluster slots, refused by the other slot (the slot taken is given back)
// or by its own (nothing taken): no slot is lost, none is held.
func TestRedisClusterCrossSlotSlots(t *testing.T) {
	ctx := context.Background()
	s := newRedis(t, store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs(), KeyPrefix: prefix(t)})
	slots := rate.Limit{Algorithm: rate.Concurrent, Count: 5}
	ceil := rate.Limit{Count: 1, Period: time.Hour}
	path := func(h int64) []store.Bucket {
		return []store.Bucket{{Key: "{global}ceil", Limit: ceil, Cost: 1}, {Key: "{tenant-a}slots", Limit: slots, Cost: 1, Holder: h}}
	}
	if d, err := s.Decide(ctx, path(1)); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	for h := int64(2); h < 10; h++ {
		d, err := s.Decide(ctx, path(h))
		if err != nil || d.Allowed {
			t.Fatal(d, err)
		}
	}
	// leaf alone: 4 free
	d, err := store.Peek(ctx, s, []store.Bucket{{Key: "{tenant-a}slots", Limit: slots, Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Results[0].Remaining != 4 {
		t.Fatalf("after 8 cross-slot refusals: %d free, want 4 (held %d)", d.Results[0].Remaining, s.HeldSlots())
	}
	// reverse: global slots, leaf gcra refusing
	path2 := func(h int64) []store.Bucket {
		return []store.Bucket{{Key: "{global}slots", Limit: slots, Cost: 1, Holder: h}, {Key: "{tenant-b}r", Limit: ceil, Cost: 1}}
	}
	for h := int64(20); h < 28; h++ {
		s.Decide(ctx, path2(h))
	}
	d, _ = store.Peek(ctx, s, []store.Bucket{{Key: "{global}slots", Limit: slots, Cost: 1}})
	if d.Results[0].Remaining != 4 {
		t.Fatalf("global slots: %d free, want 4", d.Results[0].Remaining)
	}
	if s.HeldSlots() != 2 {
		t.Fatalf("held %d want 2", s.HeldSlots())
	}
}
