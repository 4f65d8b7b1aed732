package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-cascade/cascade/rate"
)

// TestMemorySharedArenaStress: goroutines deciding on keys in every shard
// while others reset, sweep, adjust and evict (a small MaxKeys, a minimal
// reserve: chunks are added, own chunks come and go) share one arena: a
// block released by one shard and carved again for another must never be
// read or written by the first. Under -race the detector sees such an
// access; without it, every bucket's key must still hash to its hash, and
// each goroutine's own sliding log must stay a log it could have written.
func TestMemorySharedArenaStress(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: time.Millisecond, MaxKeys: 96, Reserve: -1})
	defer m.Close()
	hot := rate.Limit{Algorithm: rate.Sliding, Count: 1000, Period: 300 * time.Millisecond}
	limits := []rate.Limit{
		{Algorithm: rate.Sliding, Count: 500, Period: 20 * time.Millisecond},
		{Algorithm: rate.Sliding, Count: 3, Period: time.Millisecond},
		{Algorithm: rate.GCRA, Count: 30, Period: 10 * time.Millisecond},
		{Algorithm: rate.Idempotent, Count: 100, Period: 5 * time.Millisecond, Burst: 2},
		{Algorithm: rate.Calendar, Count: 50, Unit: rate.Hour, Location: time.UTC},
	}
	keyOf := func(g, i int) string {
		if i%23 == 0 {
			return fmt.Sprintf("g%d-%d%s", g, i, strings.Repeat("L", chunkSize+i)) // a chunk of its own
		}
		return fmt.Sprintf("g%d-%d", g, i)
	}
	const deciders, rounds = 8, 800
	var wg sync.WaitGroup
	errs := make(chan string, deciders+2)
	stop := make(chan struct{})
	for g := range deciders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			ctx := context.Background()
			hotKey := fmt.Sprintf("hot%d", g)
			hh := maphash.String(m.seed, hotKey)
			for range rounds {
				path := make([]Bucket, 1+rng.IntN(8))
				for i := range path {
					k := rng.IntN(70)
					owner := g
					if rng.IntN(4) == 0 {
						owner = rng.IntN(deciders) // another's: shard locks contended
					}
					path[i] = Bucket{Key: keyOf(owner, k), Limit: limits[k%len(limits)], Cost: int64(rng.IntN(3))}
				}
				path[rng.IntN(len(path))] = Bucket{Key: hotKey, Limit: hot, Cost: 1 + int64(rng.IntN(3))}
				m.Decide(ctx, path)
				// The hot log is this goroutine's alone: whatever it holds
				// was written by a decision of 1 to 3 units within the limit.
				sh := &m.shards[shardOf(hh)]
				sh.mu.Lock()
				if b := sh.find(hh, hotKey); b != nil && b.logLen > 0 {
					entries := sh.entries(b)
					sum := uint64(0)
					for e := 0; e < len(entries); e += 10 {
						c := uint64(binary.LittleEndian.Uint32(entries[e+6:]))
						if c == 0 {
							report(errs, fmt.Sprintf("%s: entry %d of cost 0", hotKey, e/10))
						}
						sum += c
					}
					if sum > uint64(hot.Count) {
						report(errs, fmt.Sprintf("%s: %d entries of %d units, over %d", hotKey, b.logLen/10, sum, hot.Count))
					}
				}
				sh.mu.Unlock()
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	operating := make(chan struct{})
	go func() { // the operator, and the cap's evictions
		defer close(operating)
		rng := rand.New(rand.NewPCG(99, 3))
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			default:
			}
			switch rng.IntN(4) {
			case 0:
				m.Reset(ctx, []string{keyOf(rng.IntN(deciders), rng.IntN(70)), fmt.Sprintf("hot%d", rng.IntN(deciders))})
			case 1:
				m.ResetMatching(ctx, KeyMatch{Match: func(k string) bool { return strings.HasSuffix(k, fmt.Sprint(rng.IntN(10))) }})
			case 2:
				m.Sweep()
			default:
				path := make([]Bucket, 1+rng.IntN(6))
				for i := range path {
					k := rng.IntN(70)
					path[i] = Bucket{Key: keyOf(rng.IntN(deciders), k), Limit: limits[k%len(limits)], Cost: int64(rng.IntN(5)) - 2, Charged: time.Now().UnixMicro()}
				}
				m.Adjust(ctx, path)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	check := func() {
		for i := range m.shards {
			m.shards[i].mu.Lock() // every shard: no allocation can be under way
		}
		defer func() {
			for i := range m.shards {
				m.shards[i].mu.Unlock()
			}
		}()
		checkShards(t, m)
		for si := range m.shards {
			sh := &m.shards[si]
			for h, ref := range sh.index.all() {
				for ; ref != noBlock; ref = sh.at(ref).next {
					if b := sh.at(ref); maphash.String(m.seed, b.key()) != h {
						t.Fatalf("shard %d: a bucket at %x whose key (%.20q) is not its hash's", si, ref, b.key())
					}
				}
			}
		}
	}
	deciding := 0
	for done := false; !done; {
		select {
		case <-finished:
			done = true
		case e := <-errs:
			close(stop)
			<-finished
			<-operating
			t.Fatal(e)
		case <-time.After(2 * time.Millisecond):
		}
		if deciding++; deciding%8 == 0 || done {
			if done {
				close(stop)
				<-operating
			}
			check()
		}
	}
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
	t.Logf("%d evictions, %d chunks", m.Evictions(), len(*m.arena.chunks.Load()))
	if m.Evictions() == 0 || len(*m.arena.chunks.Load()) < 3 {
		t.Fatal("nothing was evicted, or the arena never grew")
	}
}

// TestArenaLockApartFromReads: the fields every decision reads (first,
// chunks) never share a cache line with the lock and free lists that every
// allocation writes, wherever the arena's object falls (the heap aligns it
// to its size class, not to a line).
func TestArenaLockApartFromReads(t *testing.T) {
	for range 64 {
		a := newArena(-1)
		p := uintptr(unsafe.Pointer(a))
		last := p + unsafe.Offsetof(a.chunks) + unsafe.Sizeof(a.chunks) - 1
		if last/64 == (p+unsafe.Offsetof(a.mu))/64 {
			t.Fatalf("an arena at %#x (%d into a line): chunks and mu share a cache line", p, p%64)
		}
	}
}

func report(errs chan<- string, e string) {
	select {
	case errs <- e:
	default:
	}
}
