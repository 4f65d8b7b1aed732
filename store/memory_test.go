package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"

	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store {
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

// newMemory is a memory store of at most maxKeys buckets (0: the
// default) on a test clock, without a sweeper, closed when t ends.
func newMemory(t *testing.T, maxKeys int) (*store.Memory, *storetest.Clock) {
	clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC))
	m := store.NewMemory(store.MemoryOptions{Clock: clock.Now, SweepInterval: -1, MaxKeys: maxKeys})
	t.Cleanup(func() { m.Close() })
	return m, clock
}

// decideUser decides user i's one-bucket path under limit l at cost n.
func decideUser(t *testing.T, m *store.Memory, i int, l rate.Limit, n int64) store.Decision {
	t.Helper()
	d, err := m.Decide(context.Background(), []store.Bucket{{Key: fmt.Sprintf("{t|k%d}", i), Limit: l, Cost: n}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var perHour = rate.Limit{Algorithm: rate.GCRA, Count: 1, Period: time.Hour}

func TestMemoryCapEvictsNearestExpiry(t *testing.T) {
	m, _ := newMemory(t, 64)
	for i := 0; i < 1000; i++ {
		decideUser(t, m, i, perHour, 1)
	}
	if n := m.Len(); n > 64+64 { // at most one entry per shard over the cap
		t.Fatalf("%d keys tracked with MaxKeys 64", n)
	}
	if m.Evictions() == 0 {
		t.Fatal("no evictions counted at the cap")
	}
}

// TestMemoryReconfigureRaisesTheCap: a reloaded configuration's max_keys
// applies to the store in use, whose state is kept.
func TestMemoryReconfigureRaisesTheCap(t *testing.T) {
	m, _ := newMemory(t, 64)
	fill := func(from, to int) {
		for i := from; i < to; i++ {
			decideUser(t, m, i, perHour, 1)
		}
	}
	fill(0, 1000)
	if m.Evictions() == 0 {
		t.Fatal("no evictions at the first cap")
	}
	const keep = -1 // the newest bucket: the last an eviction would pick
	if !decideUser(t, m, keep, perHour, 1).Allowed {
		t.Fatal("a new bucket was refused")
	}
	m.Reconfigure(store.MemoryOptions{MaxKeys: 100_000})
	evicted := m.Evictions()
	fill(1000, 6000)
	if m.Evictions() != evicted || m.Len() < 5000 {
		t.Fatalf("after raising the cap to 100000: %d keys, %d more evictions", m.Len(), m.Evictions()-evicted)
	}
	// The state kept across the reconfiguration still counts.
	if decideUser(t, m, keep, perHour, 1).Allowed {
		t.Fatal("a bucket filled before the reconfiguration was admitted again")
	}
	m.Reconfigure(store.MemoryOptions{MaxKeys: 64})
	fill(6000, 6100)
	if m.Evictions() == evicted {
		t.Fatal("lowering the cap again evicts nothing")
	}
}

// TestMemoryCapIsTheStoresNotAShards: below MaxKeys nothing is evicted,
// however the keys spread over the shards; a small cap is held within one
// bucket per shard.
func TestMemoryCapIsTheStoresNotAShards(t *testing.T) {
	m, _ := newMemory(t, 1000)
	for i := 0; i < 1000; i++ {
		if !decideUser(t, m, i, perHour, 1).Allowed {
			t.Fatalf("bucket %d: first request refused", i)
		}
	}
	for i := 0; i < 1000; i++ {
		if decideUser(t, m, i, perHour, 1).Allowed {
			t.Fatalf("bucket %d of 1000 under MaxKeys 1000 was evicted and admitted again (%d evictions)", i, m.Evictions())
		}
	}
	small, _ := newMemory(t, 10)
	for i := 0; i < 1000; i++ {
		decideUser(t, small, i, perHour, 1)
	}
	if n := small.Len(); n > 10+64 {
		t.Fatalf("MaxKeys 10: %d buckets tracked, want at most one per shard over", n)
	}
}

// TestMemoryCapAndSweepWithSlidingLogs: exact sliding windows count
// against the cap like any bucket, are evicted at it, and are swept once
// their newest charge has left the window.
func TestMemoryCapAndSweepWithSlidingLogs(t *testing.T) {
	win := rate.Limit{Algorithm: rate.Sliding, Count: 5, Period: time.Minute}
	m, clock := newMemory(t, 64)
	for i := 0; i < 1000; i++ {
		for j := 0; j < 3; j++ {
			clock.Advance(time.Millisecond) // three entries per log
			decideUser(t, m, i, win, 1)
		}
	}
	if n := m.Len(); n > 64+64 || m.Evictions() == 0 {
		t.Fatalf("%d sliding logs tracked with MaxKeys 64, %d evictions", n, m.Evictions())
	}
	// The newest kept: its three charges still count.
	if d := decideUser(t, m, 999, win, 3); d.Allowed || d.Results[0].Remaining != 2 {
		t.Fatalf("user 999 after 3 of 5: %+v", d)
	}
	clock.Advance(time.Minute - time.Millisecond)
	m.Sweep()
	if m.Len() == 0 {
		t.Fatal("swept a log whose newest charge is still in the window")
	}
	clock.Advance(time.Millisecond)
	m.Sweep()
	if m.Len() != 0 {
		t.Fatalf("%d logs kept after every charge left the window", m.Len())
	}
}

func TestMemorySweepDropsExpiredState(t *testing.T) {
	m, clock := newMemory(t, 0)
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	for i := 0; i < 100; i++ {
		decideUser(t, m, i, lim, 5)
	}
	if m.Len() != 100 {
		t.Fatalf("Len = %d", m.Len())
	}
	clock.Advance(29 * time.Second)
	m.Sweep()
	if m.Len() != 100 {
		t.Fatalf("swept live state: Len = %d", m.Len())
	}
	clock.Advance(time.Second) // 5 units drain in 30 s
	m.Sweep()
	if m.Len() != 0 {
		t.Fatalf("expired state kept: Len = %d", m.Len())
	}
}

// BenchmarkMemoryDecide is one decision on a path of 1, 3, 5 and 7 tiers
// (one limit each), spread over many tenants.
func BenchmarkMemoryDecide(b *testing.B) { benchmarkMemoryDecide(b, false) }

// BenchmarkMemoryDecideInto is the same with the results written into a
// reused buffer, as the handler decides.
func BenchmarkMemoryDecideInto(b *testing.B) { benchmarkMemoryDecide(b, true) }

func benchmarkMemoryDecide(b *testing.B, into bool) {
	for _, tiers := range []int{1, 3, 5, 7} {
		b.Run(fmt.Sprintf("tiers=%d", tiers), func(b *testing.B) {
			m := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
			defer m.Close()
			lim := rate.Limit{Algorithm: rate.GCRA, Count: 1 << 40, Period: time.Hour}
			paths := make([][]store.Bucket, 1024)
			for p := range paths {
				for i := 0; i < tiers; i++ {
					paths[p] = append(paths[p], store.Bucket{Key: fmt.Sprintf("{bench|org=%d}tier%d", p, i), Limit: lim, Cost: 1})
				}
			}
			ctx := context.Background()
			// The state is created from other strings than the requests'
			// keys, as in a server, where every request builds its keys
			// anew: no lookup may find its key by pointer equality.
			for _, path := range paths {
				first := make([]store.Bucket, len(path))
				for i, bk := range path {
					first[i] = bk
					first[i].Key = strings.Clone(bk.Key)
				}
				m.Decide(ctx, first)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var buf [8]rate.Result
				i := 0
				for pb.Next() {
					var d store.Decision
					if into {
						d, _ = m.DecideInto(ctx, paths[i&1023], buf[:])
					} else {
						d, _ = m.Decide(ctx, paths[i&1023])
					}
					if !d.Allowed {
						b.Fatal("denied")
					}
					i++
				}
			})
		})
	}
}

func TestMemoryOps(t *testing.T) {
	storetest.RunOps(t, func(t *testing.T, clock store.Clock) store.Store {
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

func TestMemoryLeaseConformance(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T, clock store.Clock) store.Leaser {
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

// TestMemoryNeverEvictsSlotsInFlight: a store at its cap makes room by
// evicting state, but never a concurrency counter with slots taken
// (dropping it would admit more requests in flight than the limit).
func TestMemoryNeverEvictsSlotsInFlight(t *testing.T) {
	m := store.NewMemory(store.MemoryOptions{MaxKeys: 1, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	slots := []store.Bucket{{Key: "slots", Limit: rate.Limit{Algorithm: rate.Concurrent, Count: 1}, Cost: 1, Holder: 1}}
	if d, _ := m.Decide(ctx, slots); !d.Allowed {
		t.Fatal("the first slot refused")
	}
	for i := range 2000 { // every shard full, the counter's too
		m.Decide(ctx, []store.Bucket{{Key: fmt.Sprintf("k%d", i), Limit: rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Hour}, Cost: 1}})
	}
	if m.Evictions() == 0 {
		t.Fatal("nothing was evicted: the test does not test eviction")
	}
	slots[0].Holder = 2
	if d, _ := m.Decide(ctx, slots); d.Allowed {
		t.Fatal("a second request in flight on 1 slot: the counter was evicted")
	}
}

// TestMemoryEvictsRecordsFirst: a store full of idempotency records makes
// room by evicting records, not a limit's state (losing a record charges a
// retry again; losing a limit's state admits more than the limit).
func TestMemoryEvictsRecordsFirst(t *testing.T) {
	m := store.NewMemory(store.MemoryOptions{MaxKeys: 640, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	record := func(i int) []store.Bucket {
		return []store.Bucket{{Key: fmt.Sprintf("r%d", i), Limit: rate.Limit{Algorithm: rate.Idempotent, Count: 1, Period: 24 * time.Hour, Burst: 3}, Cost: 1}} // in flight 1µs: ended at once
	}
	for i := range 600 {
		m.Decide(ctx, record(i))
	}
	victim := []store.Bucket{{Key: "victim", Limit: rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Hour}, Cost: 10}}
	if d, _ := m.Decide(ctx, victim); !d.Allowed {
		t.Fatal("the victim's first request refused")
	}
	for i := 600; i < 3000; i++ {
		m.Decide(ctx, record(i))
	}
	if m.Evictions() == 0 {
		t.Fatal("nothing was evicted: the test does not test eviction")
	}
	victim[0].Cost = 1
	if d, _ := m.Decide(ctx, victim); d.Allowed {
		t.Fatal("the victim's spent limit admits again: its state was evicted before records")
	}
}
