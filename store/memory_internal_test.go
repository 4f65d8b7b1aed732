package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-cascade/cascade/rate"
)

// TestMemoryHashCollisions: keys whose hashes collide keep separate state,
// and expire separately.
func TestMemoryHashCollisions(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	short := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Second}
	const h = 42 // one hash for three keys
	m.store(h, Bucket{Key: "a", Limit: lim}, rate.State{A: 3, T: now}, now)
	m.store(h, Bucket{Key: "b", Limit: lim}, rate.State{A: 7, T: now}, now)
	m.store(h, Bucket{Key: "c", Limit: short}, rate.State{A: 1, T: now}, now)
	if a, b := m.stateOf(h, "a", now), m.stateOf(h, "b", now); a.A != 3 || b.A != 7 {
		t.Fatalf("colliding keys share state: a=%v b=%v", a, b)
	}
	if s := m.stateOf(h, "d", now); s != (rate.State{}) {
		t.Fatalf("an absent key with a colliding hash read %v", s)
	}
	m.store(h, Bucket{Key: "a", Limit: lim}, rate.State{A: 4, T: now}, now)
	if m.Len() != 3 || m.stateOf(h, "a", now).A != 4 || m.stateOf(h, "b", now).A != 7 {
		t.Fatalf("update in a chain: len %d", m.Len())
	}
	now += 200_000 // c (0.1 s of state) has expired
	m.Sweep()
	if m.Len() != 2 || m.stateOf(h, "b", now).A != 7 {
		t.Fatalf("sweep of a chain: len %d", m.Len())
	}
}

// sameShardKeys returns n keys whose hashes fall in one shard of m.
func sameShardKeys(m *Memory, n int) []string {
	var keys []string
	want := -1
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("{t|k%d}", i)
		s := int(shardOf(maphash.String(m.seed, k)))
		if want < 0 {
			want = s
		}
		if s == want {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestMemoryDecideKeepsFoundEntries: a decision that charges a key found
// expired and, in the same full shard, a new key must not lose the first
// charge when room is made for the second (dropping expired entries would
// drop the one just found).
func TestMemoryDecideKeepsFoundEntries(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, MaxKeys: 2, Clock: func() int64 { return now }})
	defer m.Close()
	keys := sameShardKeys(m, 3)
	a, b, c := keys[0], keys[1], keys[2]
	short := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Second}
	long := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Hour}
	ctx := context.Background()
	if d, _ := m.Decide(ctx, []Bucket{{Key: a, Limit: short, Cost: 1}}); !d.Allowed {
		t.Fatal("a denied")
	}
	now += 1_000_000 // a has expired, unswept
	if d, _ := m.Decide(ctx, []Bucket{{Key: c, Limit: short, Cost: 1}}); !d.Allowed {
		t.Fatal("c denied")
	}
	// The store is full (a, c). Charge a (found, expired) and b (new) with
	// a long limit: room for b must come from c, never from a.
	d, _ := m.Decide(ctx, []Bucket{{Key: b, Limit: long, Cost: 1}, {Key: a, Limit: long, Cost: 5}})
	if !d.Allowed {
		t.Fatal("b, a denied")
	}
	if s := m.stateOf(maphash.String(m.seed, a), a, now); s.A != 5 {
		t.Fatalf("a's charge was lost: %+v", s)
	}
	if s := m.stateOf(maphash.String(m.seed, b), b, now); s.A != 1 {
		t.Fatalf("b's charge was lost: %+v", s)
	}
}

// TestMemoryDecideInto: results land in the caller's buffer when it is long
// enough, and in a new slice otherwise; paths longer than the stack buffers
// decide alike.
func TestMemoryDecideInto(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: -1})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	for _, n := range []int{1, 4, maxPath, maxPath + 3} {
		path := make([]Bucket, n)
		for i := range path {
			path[i] = Bucket{Key: fmt.Sprintf("{t|n%d}k%d", n, i), Limit: lim, Cost: int64(i + 1)}
		}
		buf := make([]rate.Result, 8)
		d, err := m.DecideInto(context.Background(), path, buf)
		if err != nil || !d.Allowed || len(d.Results) != n {
			t.Fatalf("n=%d: %+v %v", n, d, err)
		}
		if shared := &d.Results[0] == &buf[0]; shared != (n <= len(buf)) {
			t.Fatalf("n=%d: results share the buffer: %v", n, shared)
		}
		for i, r := range d.Results {
			if r.Remaining != 100-int64(i+1) {
				t.Fatalf("n=%d: bucket %d remaining %d", n, i, r.Remaining)
			}
		}
	}
}

func TestMemoryShardIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(memoryShard{}); n != 64 {
		t.Fatalf("a shard takes %d bytes, not one 64-byte cache line", n)
	}
}

// TestMemoryEntryOwnsItsKey: an entry keeps its own copy of the key, of
// any length, so the caller's buffer (a request's keys) is neither
// retained nor able to change it.
func TestMemoryEntryOwnsItsKey(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 128, 129, 256, 257, 1000} {
		buf := []byte(strings.Repeat("k", n))
		key := string(buf)
		e := newEntry(key)
		if e.key != key {
			t.Fatalf("len %d: key %q", n, e.key)
		}
		if n > 0 && unsafe.StringData(e.key) == unsafe.StringData(key) {
			t.Fatalf("len %d: the entry shares the caller's key", n)
		}
	}
}

// TestMemoryFullStoreDropsExpiredFirst: at the cap, the inserting shard's
// expired state goes before any live bucket is evicted, wherever the
// expired entry sits in the shard.
func TestMemoryFullStoreDropsExpiredFirst(t *testing.T) {
	for trial := 0; trial < 20; trial++ {
		now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
		m := NewMemory(MemoryOptions{SweepInterval: -1, MaxKeys: 32, Clock: func() int64 { return now }})
		keys := sameShardKeys(m, 33)
		short := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Second}
		long := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Hour}
		ctx := context.Background()
		m.Decide(ctx, []Bucket{{Key: keys[0], Limit: short, Cost: 1}})
		for _, k := range keys[1:32] {
			m.Decide(ctx, []Bucket{{Key: k, Limit: long, Cost: 1}})
		}
		now += 2_000_000 // keys[0] has expired, unswept; the store is full
		m.Decide(ctx, []Bucket{{Key: keys[32], Limit: long, Cost: 1}})
		if m.Evictions() > 0 || m.Len() != 32 {
			t.Fatalf("trial %d: %d live buckets evicted while an expired one stayed; %d tracked", trial, m.Evictions(), m.Len())
		}
		m.Close()
	}
}
