package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// indexHashes returns n hashes of one shard (equal low bits) whose top
// bits, the index's home slots, often collide and straddle the end of the
// table: every hash is drawn from 300 top values of 1,024, half of them
// the last ones, so that probe runs are long and wrap around to its start.
func indexHashes(r *rand.Rand, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		top := (1024 - 150 + r.Uint64N(300)) % 1024 << 54
		hs[i] = top | r.Uint64()&(1<<54-1)&^(memoryShards-1) | 7
	}
	return hs
}

// TestIndexAgainstMap: random sets, replacements and deletions give the
// same answers as a Go map, through growth, long colliding runs and
// wrapping, and the index never fills more than three quarters of its
// slots.
func TestIndexAgainstMap(t *testing.T) {
	for _, n := range []int{1, 10, 200, 2000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			hs := indexHashes(r, n)
			x, want := newIndex(), map[uint64]blockRef{}
			for op := 0; op < 20*n+100; op++ {
				h := hs[r.IntN(len(hs))]
				switch r.IntN(3) {
				case 0, 1:
					ref := blockRef(r.Uint64N(1 << 40))
					x.set(h, ref)
					want[h] = ref
				case 2:
					x.del(h)
					delete(want, h)
				}
				if op%(2*n+1) == 0 {
					checkIndex(t, &x, want)
				}
			}
			checkIndex(t, &x, want)
			for h := range want {
				x.del(h)
			}
			if x.n != 0 {
				t.Fatalf("emptied: %d left", x.n)
			}
			for _, h := range hs {
				if _, ok := x.get(h); ok {
					t.Fatalf("emptied: %x still found", h)
				}
			}
		})
	}
}

func checkIndex(t *testing.T, x *index, want map[uint64]blockRef) {
	t.Helper()
	if x.n != len(want) || 4*x.n > 3*len(x.slots) {
		t.Fatalf("%d stored in %d slots; want %d, at most three quarters full", x.n, len(x.slots), len(want))
	}
	for h, ref := range want {
		if got, ok := x.get(h); !ok || got != ref {
			t.Fatalf("get(%x) = %x, %v; want %x", h, got, ok, ref)
		}
	}
	seen := map[uint64]bool{}
	for h, ref := range x.all() {
		if seen[h] || want[h] != ref {
			t.Fatalf("all yields %x → %x (seen before: %v); want each once, → %x", h, ref, seen[h], want[h])
		}
		seen[h] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("all yields %d hashes, want %d", len(seen), len(want))
	}
}

// TestIndexDeletingWhileIterating: a yield that deletes the hash it is
// given (as the memory store's sweep and reset do) or replaces its ref
// still sees every hash stored when the iteration began, from any start:
// the slots the deletions move back are not skipped.
func TestIndexDeletingWhileIterating(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 2))
		x := newIndex()
		hs := indexHashes(r, 1+r.IntN(300))
		for _, h := range hs {
			x.set(h, 1)
		}
		before := map[uint64]bool{}
		for h := range x.all() {
			before[h] = true
		}
		seen, kept := map[uint64]bool{}, map[uint64]bool{}
		for h := range x.from(r.Int()) {
			seen[h] = true
			switch r.IntN(3) {
			case 0:
				x.del(h)
				delete(kept, h)
			case 1:
				x.set(h, 2) // a chain's new first bucket
				kept[h] = true
			default:
				kept[h] = true
			}
		}
		for h := range before {
			if !seen[h] {
				t.Fatalf("seed %d: %x was never yielded", seed, h)
			}
		}
		if x.n != len(kept) {
			t.Fatalf("seed %d: %d left, want %d", seed, x.n, len(kept))
		}
		for h := range kept {
			if _, ok := x.get(h); !ok {
				t.Fatalf("seed %d: kept %x is lost", seed, h)
			}
		}
	}
}

// TestIndexReplacingKeepsTheTable: replacing a ref never grows the table,
// even when it is as full as it gets, so an iteration that replaces refs
// (a chain's first bucket unlinked) yields each hash exactly once.
func TestIndexReplacingKeepsTheTable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	x := newIndex()
	for 4*(x.n+1) <= 3*len(x.slots) {
		x.set(indexHashes(r, 1)[0], 1)
	}
	slots := len(x.slots)
	seen := map[uint64]int{}
	for h := range x.all() {
		seen[h]++
		x.set(h, 2)
	}
	if len(x.slots) != slots || len(seen) != x.n {
		t.Fatalf("%d slots became %d; %d hashes yielded of %d", slots, len(x.slots), len(seen), x.n)
	}
	for h, n := range seen {
		if ref, _ := x.get(h); n != 1 || ref != 2 {
			t.Fatalf("%x yielded %d times, ref %x", h, n, ref)
		}
	}
}

// BenchmarkIndex looks up random hashes of a million-entry index, as Go
// map and as index: a table far larger than the CPU's caches, as the
// memory store's shards are between two requests on a key under load
// (each lookup then pays the cache misses of the lines it reads).
func BenchmarkIndex(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = r.Uint64()
	}
	b.Run("map", func(b *testing.B) {
		m := make(map[uint64]blockRef)
		for i, h := range hs {
			m[h] = blockRef(i)
		}
		b.ResetTimer()
		var sum blockRef
		for i := 0; i < b.N; i++ {
			sum += m[hs[(i*7919)&(n-1)]]
		}
		sink = uint64(sum)
	})
	b.Run("index", func(b *testing.B) {
		x := newIndex()
		for i, h := range hs {
			x.set(h, blockRef(i))
		}
		b.ResetTimer()
		var sum blockRef
		for i := 0; i < b.N; i++ {
			ref, _ := x.get(hs[(i*7919)&(n-1)])
			sum += ref
		}
		sink = uint64(sum)
	})
}

var sink uint64
