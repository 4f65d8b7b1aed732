package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// checkShards verifies every shard's index, chains and counts, and the arena: each
// chained bucket is in its shard under its own hash, no block is both live
// and free, no two live blocks overlap, and the store's count is the sum of
// its shards'.
func checkShards(t *testing.T, m *Memory) {
	t.Helper()
	total := 0
	type span struct{ chunk, lo, hi int }
	var live []span // the arena is the shards' together
	chunks := *m.arena.chunks.Load()
	for si := range m.shards {
		sh := &m.shards[si]
		add := func(ref blockRef, c uint8, what string) {
			chunk := int(ref >> 32)
			if chunk >= len(chunks) || chunks[chunk] == nil {
				t.Fatalf("shard %d: %s %x in a released chunk", si, what, ref)
			}
			lo := int(uint32(ref))
			hi := lo + len(sh.arena.block(ref, c))
			for _, s := range live {
				if s.chunk == chunk && lo < s.hi && s.lo < hi {
					t.Fatalf("shard %d: %s %x overlaps a live block", si, what, ref)
				}
			}
			live = append(live, span{chunk, lo, hi})
		}
		n := 0
		for h, ref := range sh.index.all() {
			if shardOf(h) != uint8(si) {
				t.Fatalf("shard %d holds hash %x of shard %d", si, h, shardOf(h))
			}
			seen := 0
			for ; ref != noBlock; ref = sh.at(ref).next {
				b := sh.at(ref)
				if b.hash != h {
					t.Fatalf("shard %d: bucket %q has hash %x, chained at %x", si, b.key(), b.hash, h)
				}
				if b.class != classOf(headerSize+int(b.keyLen)) {
					t.Fatalf("shard %d: bucket %q of class %d", si, b.key(), b.class)
				}
				add(ref, b.class, "bucket")
				if b.log == noBlock && b.logLen != 0 {
					t.Fatalf("shard %d: bucket %q: log %x of %d bytes", si, b.key(), b.log, b.logLen)
				}
				if b.log != noBlock {
					add(b.log, b.logClass, "log")
					// Entries at a whole entry from the block's start, with
					// room for one more after them (see writeLog).
					if n := int(b.logOff + b.logLen); b.logLen > 0 && n+logEntry > len(sh.arena.block(b.log, b.logClass)) || b.logLen%10 != 0 || b.logOff%10 != 0 {
						t.Fatalf("shard %d: bucket %q: log of %d bytes at %d in class %d", si, b.key(), b.logLen, b.logOff, b.logClass)
					}
				}
				n++
				if seen++; seen > 1_000_000 {
					t.Fatalf("shard %d: a cycle in the chain of %x", si, h)
				}
			}
		}
		if n != sh.n {
			t.Fatalf("shard %d: %d buckets chained, n = %d", si, n, sh.n)
		}
		total += n
	}
	for c := range m.arena.free {
		steps := 0
		for ref := m.arena.free[c]; ref != noBlock; ref = blockRef(leUint64(m.arena.block(ref, uint8(c)))) {
			lo := int(uint32(ref))
			hi := lo + blockSize(uint8(c))
			for _, s := range live {
				if s.chunk == int(ref>>32) && lo < s.hi && s.lo < hi {
					t.Fatalf("free block %x (class %d) is live", ref, c)
				}
			}
			if steps++; steps > 10_000_000 {
				t.Fatalf("a cycle in free list %d", c)
			}
		}
	}
	if got := m.count.Load(); got != int64(total) {
		t.Fatalf("count %d, %d buckets held", got, total)
	}
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// TestMemoryStress decides random paths over a few keys (long,
// empty, colliding hashes: every chain operation), with sliding logs, GCRA,
// calendars, slots and records, adjusts, resets and sweeps, in a store
// small enough to evict, checking the shards' invariants after each step
// and the states the store holds against Apply's on a plain map.
func TestMemoryStress(t *testing.T) {
	for _, maxKeys := range []int{0, 5, 12} {
		for seed := range uint64(stressSeeds) {
			t.Run(fmt.Sprint(maxKeys, "/", seed), func(t *testing.T) {
				now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
				m := NewMemory(MemoryOptions{SweepInterval: -1, MaxKeys: maxKeys, Clock: func() int64 { return now }})
				defer m.Close()
				keys := []string{"", "a", "b", "c", "d", strings.Repeat("L", chunkSize+7), strings.Repeat("M", chunkSize-headerSize), "e", "f", "g", "h", "i"}
				limits := []rate.Limit{
					{Algorithm: rate.Sliding, Count: 1000, Period: time.Second},
					{Algorithm: rate.Sliding, Count: 5, Period: time.Millisecond},
					{Algorithm: rate.GCRA, Count: 30, Period: 10 * time.Millisecond},
					{Algorithm: rate.Calendar, Count: 500, Unit: rate.Hour, Location: time.UTC},
					{Algorithm: rate.Idempotent, Count: 100, Period: 5 * time.Millisecond, Burst: 2},
				}
				limitOf := map[string]rate.Limit{}
				hashOf := map[string]uint64{}
				for i, k := range keys {
					limitOf[k] = limits[i%len(limits)]
					hashOf[k] = uint64(i%3)*memoryShards + 7 // three chains, one shard
				}
				ref := map[string]applied{}
				rng := rand.New(rand.NewPCG(7+seed, uint64(maxKeys)))
				for step := range 15_000 {
					now += int64(rng.IntN(60))
					switch r := rng.IntN(100); {
					case r == 0:
						k := keys[rng.IntN(len(keys))]
						sh := &m.shards[shardOf(hashOf[k])]
						m.remove(sh, hashOf[k], func(s string) bool { return s == k }, now)
						delete(ref, k)
					case r == 1:
						m.Sweep()
					case r < 6:
						k := keys[rng.IntN(len(keys))]
						h := hashOf[k]
						lim := limitOf[k]
						d := int64(rng.IntN(5)) - 2
						var s rate.State
						if e, ok := ref[k]; ok && e.expires > now {
							s = e.s
						}
						ns := lim.Adjust(s, now, d, 0)
						m.store(h, Bucket{Key: k, Limit: lim}, lim.Adjust(m.stateOf(h, k, now), now, d, 0), now)
						if _, ok := ref[k]; ok || now+lim.TTL(ns, now) > now {
							keep(ref, k, ns, now+lim.TTL(ns, now))
						}
					default:
						path := make([]Bucket, 1+rng.IntN(4))
						if rng.IntN(10) == 0 {
							path = make([]Bucket, 1+rng.IntN(12))
						}
						hashes := make([]uint64, len(path))
						for i := range path {
							k := keys[rng.IntN(len(keys))]
							path[i] = Bucket{Key: k, Limit: limitOf[k], Cost: int64(rng.IntN(4))}
							hashes[i] = hashOf[k]
						}
						results := make([]rate.Result, len(path))
						m.decideLocked(path, hashes, make([]*bucket, len(path)), make([]rate.State, len(path)), results)
						rs, _ := applyPath(ref, path, now)
						for i := range rs {
							if got, want := results[i], rs[i]; got.Allowed != want.Allowed || got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter {
								t.Fatalf("step %d, bucket %d (%.10q): the store said %+v, Apply %+v", step, i, path[i].Key, got, want)
							}
						}
					}
					checkShards(t, m)
					for k, e := range ref {
						h := hashOf[k]
						if m.shards[shardOf(h)].find(h, k) == nil {
							delete(ref, k) // evicted, or dropped expired
							continue
						}
						got := m.stateOf(h, k, now)
						want := rate.State{}
						if e.expires > now {
							want = e.s
						}
						if got.A != want.A || got.B != want.B || got.T != want.T || got.Log.Len() != want.Log.Len() ||
							(got.Log != nil && (got.Log.H != want.Log.H || !bytes.Equal(got.Log.Entries(), want.Log.Entries()))) {
							t.Fatalf("step %d, %.10q: the store holds %+v (%d entries), Apply %+v (%d)", step, k, got, got.Log.Len(), want, want.Log.Len())
						}
					}
				}
			})
		}
	}
}

// stressSeeds is how many random runs TestMemoryStress makes of
// each cap (40 take a minute and a half).
var stressSeeds = 1

// TestMemoryConcurrentUse: decisions, adjusts, leases, resets and sweeps
// from many goroutines over shared keys (sliding logs, long paths, long
// keys) keep every shard consistent.
func TestMemoryConcurrentUse(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: time.Millisecond, MaxKeys: 40})
	defer m.Close()
	limits := []rate.Limit{
		{Algorithm: rate.Sliding, Count: 1000, Period: 50 * time.Millisecond},
		{Algorithm: rate.Sliding, Count: 3, Period: time.Millisecond},
		{Algorithm: rate.GCRA, Count: 30, Period: 10 * time.Millisecond},
		{Algorithm: rate.Idempotent, Count: 100, Period: 5 * time.Millisecond, Burst: 2},
		{Algorithm: rate.Concurrent, Count: 3},
	}
	keyOf := func(i int) string {
		if i%17 == 0 {
			return fmt.Sprintf("%d%s", i, strings.Repeat("L", chunkSize))
		}
		return fmt.Sprint("k", i)
	}
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			ctx := context.Background()
			for range 1500 {
				n := 1 + rng.IntN(12)
				path := make([]Bucket, n)
				for i := range path {
					k := rng.IntN(60)
					path[i] = Bucket{Key: keyOf(k), Limit: limits[k%len(limits)], Cost: int64(rng.IntN(3)), Holder: 1}
				}
				switch rng.IntN(20) {
				case 0:
					m.Reset(ctx, []string{path[0].Key})
				case 1:
					m.ResetMatching(ctx, KeyMatch{Match: func(k string) bool { return strings.HasSuffix(k, "7") }})
				case 2, 3:
					for i := range path {
						path[i].Cost = int64(rng.IntN(5)) - 2
						path[i].Charged = time.Now().UnixMicro()
					}
					m.Adjust(ctx, path)
				default:
					m.Decide(ctx, path)
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
	for i := range m.shards {
		m.shards[i].mu.Lock()
	}
	checkShards(t, m)
	for i := range m.shards {
		m.shards[i].mu.Unlock()
	}
}

// TestMemoryHugeLogs: a log grown past a chunk by debts moves from a
// 64 KiB block to a chunk of its own and keeps its bytes, refusals reading
// it in place.
func TestMemoryHugeLogs(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.Sliding, Count: 1000, Period: time.Hour}
	tick := lim.Tick()
	now -= now % tick
	const entries = chunkSize/10 - 3 // a 64 KiB block, three entries short
	raw := make([]byte, 8, 8+entries*10)
	binary.LittleEndian.PutUint64(raw, math.Float64bits(float64(now)))
	for range entries {
		raw = binary.LittleEndian.AppendUint16(raw, uint16(tick))
		raw = binary.LittleEndian.AppendUint32(raw, uint32(tick>>16))
		raw = binary.LittleEndian.AppendUint32(raw, 1)
	}
	g, err := rate.ParseLog(raw)
	if err != nil {
		t.Fatal(err)
	}
	now += entries * tick
	ref := rate.State{A: entries + 1, B: 1, T: now, Log: g}
	h := maphash.String(m.seed, "huge")
	m.store(h, Bucket{Key: "huge", Limit: lim}, ref, now)
	ctx := context.Background()
	for i := range 8 {
		now += tick
		b := Bucket{Key: "huge", Limit: lim, Cost: 1}
		if i%2 == 0 {
			d, _ := m.Decide(ctx, []Bucket{b})
			if _, r := lim.Apply(ref, now, 1); d.Allowed || d.Results[0].RetryAfter != r.RetryAfter {
				t.Fatalf("step %d: the store said %+v, Apply %+v", i, d.Results[0], r)
			}
		} else {
			m.Adjust(ctx, []Bucket{b})
			ref = lim.Adjust(ref, now, 1, 0)
		}
		c := rate.LogView(ref.Log.H, bytes.Clone(ref.Log.Entries()))
		ref.Log = &c
		got := m.stateOf(h, "huge", now)
		if got.A != ref.A || got.T != ref.T || got.Log.H != ref.Log.H || !bytes.Equal(got.Log.Entries(), ref.Log.Entries()) {
			t.Fatalf("step %d: the store holds %v/%d entries, Apply %v/%d", i, got.A, got.Log.Len(), ref.A, ref.Log.Len())
		}
		checkShards(t, m)
	}
	if b := m.shards[shardOf(h)].find(h, "huge"); b.logClass != ownChunk {
		t.Fatalf("a log of %d bytes in class %d", b.logLen, b.logClass)
	}
}

// TestMemoryResetMatchingKeysStay: the keys ResetMatching shows its Match
// are strings: one Match keeps (to log or publish what it reset) must not
// change when the store later reuses the memory of a reset bucket.
func TestMemoryResetMatchingKeysStay(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	ctx := context.Background()
	for i := range 200 {
		m.Decide(ctx, []Bucket{{Key: fmt.Sprintf("{t|old}%03d", i), Limit: lim, Cost: 1}})
	}
	var seen []string
	n, _ := m.ResetMatching(ctx, KeyMatch{Match: func(k string) bool {
		seen = append(seen, k)
		return strings.HasPrefix(k, "{t|old}")
	}})
	if n != 200 {
		t.Fatalf("reset %d", n)
	}
	for i := range 200 {
		m.Decide(ctx, []Bucket{{Key: fmt.Sprintf("{t|new}%03d", i), Limit: lim, Cost: 1}})
	}
	for _, k := range seen {
		if !strings.HasPrefix(k, "{t|old}") {
			t.Fatalf("a key Match was shown became %q", k)
		}
	}
}
