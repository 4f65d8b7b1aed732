package store

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
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

func TestMemoryShardIsWholeCacheLines(t *testing.T) {
	if n := unsafe.Sizeof(memoryShard{}); n%64 != 0 {
		t.Fatalf("a shard takes %d bytes, not a whole number of 64-byte cache lines", n)
	}
}

// TestMemoryOwnsItsKeys: the store keeps its own copy of each key, of any
// length (in blocks of every class, and in a chunk of its own), so the
// caller's buffer (a request's keys) is neither retained nor able to
// change it.
func TestMemoryOwnsItsKeys(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	lengths := []int{0, 1, 31, 32, 33, 1000, chunkSize, chunkSize + 1, 3 * chunkSize}
	for _, n := range lengths {
		buf := []byte(strings.Repeat("k", n))
		key := unsafe.String(unsafe.SliceData(buf), n)
		h := maphash.String(m.seed, key)
		m.store(h, Bucket{Key: key, Limit: lim}, rate.State{A: float64(n + 1), T: now}, now)
		for i := range buf {
			buf[i] = 'x'
		}
		want := strings.Repeat("k", n)
		if s := m.stateOf(h, want, now); s.A != float64(n+1) {
			t.Fatalf("len %d: the stored key changed with the caller's buffer: %+v", n, s)
		}
	}
	if m.Len() != len(lengths) {
		t.Fatalf("%d buckets, want %d", m.Len(), len(lengths))
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

// applied is a bucket's state as the reference of the memory store's tests
// keeps it: a value, its log a copy.
type applied struct {
	s       rate.State
	expires int64
}

// keep stores s as key's state in ref, a copy of its log.
func keep(ref map[string]applied, key string, s rate.State, expires int64) {
	if s.Log != nil {
		g := rate.LogView(s.Log.H, bytes.Clone(s.Log.Entries()))
		s.Log = &g
	}
	ref[key] = applied{s, expires}
}

// applyPath decides path on ref as the memory store must: each bucket's
// state (fresh once expired) through Apply, all or nothing — a refusal
// keeps only the states its results mark Keep, their expiry unchanged —
// the last mention of a key named twice written last. It returns the
// results, before Combine.
func applyPath(ref map[string]applied, path []Bucket, now int64) ([]rate.Result, bool) {
	next := make([]rate.State, len(path))
	rs := make([]rate.Result, len(path))
	allowed := true
	for i, b := range path {
		var s rate.State
		if e, ok := ref[b.Key]; ok && e.expires > now {
			s = e.s
		}
		next[i], rs[i] = b.Limit.Apply(s, now, b.Cost)
		allowed = allowed && rs[i].Allowed
	}
	for i, b := range path {
		switch {
		case allowed:
			keep(ref, b.Key, next[i], now+b.Limit.TTL(next[i], now))
		case rs[i].Keep:
			keep(ref, b.Key, next[i], ref[b.Key].expires)
		}
	}
	return rs, allowed
}

// TestMemoryMatchesApply: the memory store decides as rate.Apply does on
// states kept by the plainest means (a map of values), all or nothing, over
// random paths of sliding windows (whose logs grow through every block
// class, in place and by moving), GCRA and calendar limits, with keys named
// twice on a path, refusals, expiry and a store small enough to evict — the
// reference evicting what the store reports evicted is not modelled, so
// that part only checks the store stays exact for what it holds.
func TestMemoryMatchesApply(t *testing.T) {
	for _, maxKeys := range []int{0, 6} {
		now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
		m := NewMemory(MemoryOptions{SweepInterval: -1, MaxKeys: maxKeys, Clock: func() int64 { return now }})
		ref := map[string]applied{}
		limits := map[string]rate.Limit{
			"{t|s1}": {Algorithm: rate.Sliding, Count: 400, Period: 50 * time.Millisecond},
			"{t|s2}": {Algorithm: rate.Sliding, Count: 7, Period: 3 * time.Millisecond},
			"{t|s3}": {Algorithm: rate.Sliding, Count: 1000, Period: time.Second},
			"{t|g}":  {Algorithm: rate.GCRA, Count: 30, Period: 10 * time.Millisecond},
			"{t|c}":  {Algorithm: rate.Calendar, Count: 5000, Unit: rate.Hour, Location: time.UTC},
		}
		var keys []string
		for k := range limits {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		rng := rand.New(rand.NewPCG(3, uint64(maxKeys)))
		for step := range 20_000 {
			now += int64(rng.IntN(40))
			path := make([]Bucket, 1+rng.IntN(4))
			for i := range path {
				k := keys[rng.IntN(len(keys))]
				path[i] = Bucket{Key: k, Limit: limits[k], Cost: int64(rng.IntN(4))}
			}
			d, err := m.Decide(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			rs, allowed := applyPath(ref, path, now)
			for i, r := range rs {
				if !allowed {
					r.Remaining = r.Before // nothing was charged
				}
				if got := d.Results[i]; maxKeys == 0 && (got.Allowed != r.Allowed || got.Remaining != r.Remaining || got.RetryAfter != r.RetryAfter || got.Reset != r.Reset) {
					t.Fatalf("step %d, bucket %d (%s): the store said %+v, Apply %+v", step, i, path[i].Key, got, r)
				}
			}
			if maxKeys != 0 {
				for k := range ref { // what the store dropped is fresh in it
					sh := &m.shards[shardOf(maphash.String(m.seed, k))]
					if sh.find(maphash.String(m.seed, k), k) == nil {
						delete(ref, k)
					}
				}
			}
		}
		for _, k := range keys {
			h := maphash.String(m.seed, k)
			got := m.stateOf(h, k, now)
			want := rate.State{}
			if e, ok := ref[k]; ok && e.expires > now {
				want = e.s
			}
			if got.A != want.A || got.B != want.B || got.T != want.T || got.Log.Len() != want.Log.Len() ||
				(got.Log != nil && (got.Log.H != want.Log.H || !bytes.Equal(got.Log.Entries(), want.Log.Entries()))) {
				t.Fatalf("max_keys %d, %s: the store holds %+v (%d entries), Apply %+v (%d)", maxKeys, k, got, got.Log.Len(), want, want.Log.Len())
			}
		}
		m.Close()
	}
}

// TestMemoryReserve: the arena set aside up front is 16 MiB by default,
// less for a store capped at fewer keys, the least when asked.
func TestMemoryReserve(t *testing.T) {
	for _, tc := range []struct {
		opts MemoryOptions
		want int // bytes
	}{
		{MemoryOptions{}, reservedBytes},
		{MemoryOptions{MaxKeys: 1_000_000_000}, reservedBytes},
		{MemoryOptions{MaxKeys: 64 * 1024}, 8 << 20},
		{MemoryOptions{MaxKeys: 10}, chunkSize},
		{MemoryOptions{Reserve: 64 << 20}, 64 << 20},
		{MemoryOptions{Reserve: -1}, chunkSize},
	} {
		tc.opts.SweepInterval = -1
		m := NewMemory(tc.opts)
		if got := len(m.arena.first); got != tc.want {
			t.Fatalf("%+v: the arena starts with %d bytes, want %d", tc.opts, got, tc.want)
		}
		m.Close()
	}
}

// TestMemoryPathIsContiguous: the buckets of a path, created together,
// are carved next to one another in the arena, whichever shards their
// keys fall in (one arena for every shard: see arena).
func TestMemoryPathIsContiguous(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: -1})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	path := make([]Bucket, 7)
	for i := range path {
		path[i] = Bucket{Key: fmt.Sprintf("{t|org=1}tier%d", i), Limit: lim, Cost: 1}
	}
	if d, err := m.Decide(context.Background(), path); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	var lo, hi uintptr
	shards := map[uint8]bool{}
	for i, b := range path {
		h := maphash.String(m.seed, b.Key)
		shards[shardOf(h)] = true
		at := uintptr(unsafe.Pointer(m.shards[shardOf(h)].find(h, b.Key)))
		if i == 0 || at < lo {
			lo = at
		}
		hi = max(hi, at)
	}
	if len(shards) < 2 {
		t.Fatal("the path's keys share a shard: the test shows nothing")
	}
	if span := hi - lo; span > 7*128 {
		t.Fatalf("the path's 7 buckets span %d bytes", span)
	}
}

// TestMemorySlidingChargeInPlace: at the steady state of a full exact
// window (each charge drops the oldest entry and logs one), a decision
// allocates only the Log that Apply returns: the entry is appended in the
// store's block, which keeps room for it, for every log length. (Not N =
// 2: its log of one entry empties at each charge, and Apply makes a new
// one.)
func TestMemorySlidingChargeInPlace(t *testing.T) {
	for _, n := range []int64{3, 5, 10, 13, 100, 1000} {
		now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
		m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
		lim := rate.Limit{Algorithm: rate.Sliding, Count: n, Period: time.Minute}
		step := (time.Minute * 101 / 100 / time.Duration(n)).Microseconds()
		path := []Bucket{{Key: "{t|k}", Limit: lim, Cost: 1}}
		buf := make([]rate.Result, 1)
		decide := func() {
			now += step
			if d, err := m.DecideInto(context.Background(), path, buf); err != nil || !d.Allowed {
				t.Fatalf("N=%d: %+v %v", n, d, err)
			}
		}
		for range 2 * n {
			decide()
		}
		if allocs := testing.AllocsPerRun(200, decide); allocs > 1 {
			t.Errorf("N=%d: %.1f allocations a decision, want at most 1", n, allocs)
		}
		m.Close()
	}
}

// A log slides through its block: when a charge drops the oldest entry and
// appends one, the entries stay where they are (the log starts 10 bytes
// further on), and they are copied back to the block's start only when
// its end leaves no room for the next entry (see writeLog).
func TestMemorySlidingLogMovesInItsBlock(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	// 39 entries in the window at steady state (390 bytes), in a block of
	// 512 (the class of 400 bytes: the log and room for one more entry),
	// which leaves room to move through it.
	const n = 40
	if spare := blockSize(classOf(n*logEntry)) - n*logEntry; spare < 2*logEntry {
		t.Fatalf("the class of a %d-byte log leaves %d spare bytes: choose another n", n*logEntry, spare)
	}
	lim := rate.Limit{Algorithm: rate.Sliding, Count: n, Period: time.Second}
	step := (time.Second * 101 / 100 / n).Microseconds()
	path := []Bucket{{Key: "{t|k}", Limit: lim, Cost: 1}}
	h := maphash.String(m.seed, path[0].Key)
	sh := &m.shards[shardOf(h)]
	var moves, copies int
	var last *bucket
	for i := range 10 * n {
		now += step
		if d, err := m.Decide(context.Background(), path); err != nil || !d.Allowed {
			t.Fatalf("charge %d: %+v %v", i, d, err)
		}
		b := sh.find(h, path[0].Key)
		if i < 2*n { // the log grows to its length first
			last = &bucket{log: b.log, logOff: b.logOff, logLen: b.logLen}
			continue
		}
		if b.log != last.log || b.logLen != last.logLen {
			t.Fatalf("charge %d: log %x of %d bytes, was %x of %d", i, b.log, b.logLen, last.log, last.logLen)
		}
		room := len(sh.arena.block(b.log, b.logClass)) - int(last.logOff+last.logLen)
		switch {
		case b.logOff == last.logOff+logEntry && room >= 2*logEntry:
			moves++ // dropped one at the front, appended one in the spare bytes
		case b.logOff == 0 && room < 2*logEntry:
			copies++ // no room for the next entry after this one: back to the start
		default:
			t.Fatalf("charge %d: the log moved from %d to %d with %d bytes of room after it", i, last.logOff, b.logOff, room)
		}
		last.logOff = b.logOff
	}
	if moves == 0 || copies == 0 || copies > moves {
		t.Fatalf("%d charges moved the log in its block, %d copied it back", moves, copies)
	}
	t.Logf("%d charges moved the log in its block, %d copied it back", moves, copies)
}
