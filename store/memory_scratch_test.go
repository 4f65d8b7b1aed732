package store

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// TestMemoryScratchLogs: the per-shard scratch space of a decision — the
// views of the old states' logs and the Logs of the new ones (see
// rate.Limit.ApplyTo) — is never shared by two buckets of one path, nor
// by two decisions at once. Goroutines decide, through Decide (paths up to
// maxPath and longer), random paths over keys of their own that all fall
// in the same two shards, so that every decision uses those shards' logs:
// paths with several exact sliding windows in one shard, keys named twice,
// refusals that keep an idempotency record. Each goroutine checks every
// result, and then every state the store holds for its keys, against
// rate.Limit.Apply on a map of its own.
func TestMemoryScratchLogs(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro())
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return clock.Add(3) }})
	defer m.Close()
	limits := []rate.Limit{
		{Algorithm: rate.Sliding, Count: 40, Period: 2 * time.Millisecond},
		{Algorithm: rate.Sliding, Count: 400, Period: 40 * time.Millisecond},
		{Algorithm: rate.Sliding, Count: 12, Period: 500 * time.Microsecond},
		{Algorithm: rate.Sliding, Count: 3000, Period: 20 * time.Millisecond}, // a coarser tick
		{Algorithm: rate.GCRA, Count: 30, Period: 10 * time.Millisecond},
		{Algorithm: rate.Idempotent, Count: 100, Period: time.Millisecond, Burst: 2},
	}
	const goroutines, keysEach, steps = 6, 8, 3000
	shards := [2]uint8{5, 6}
	// keysOf are the keys of goroutine g, in shards 5 and 6 by turns: each
	// shard holds at least three exact sliding windows of each goroutine.
	keysOf := make([][]string, goroutines)
	limitOf := map[string]rate.Limit{}
	for g := range keysOf {
		for n := 0; len(keysOf[g]) < keysEach; n++ {
			k := fmt.Sprintf("{g%d}k%d", g, n)
			if s := shardOf(maphash.String(m.seed, k)); s == shards[len(keysOf[g])%2] {
				limitOf[k] = limits[len(keysOf[g])%len(limits)]
				keysOf[g] = append(keysOf[g], k)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := keysOf[g]
			hashes := make([]uint64, len(keys))
			for i, k := range keys {
				hashes[i] = maphash.String(m.seed, k)
			}
			ref := map[string]applied{}
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			buf := make([]rate.Result, maxPath)
			for step := range steps {
				n := 1 + rng.IntN(maxPath)
				if rng.IntN(8) == 0 {
					n = maxPath + 1 + rng.IntN(6) // decideLong
				}
				path := make([]Bucket, n)
				for i := range path {
					k := keys[rng.IntN(len(keys))]
					lim := limitOf[k]
					cost := int64(rng.IntN(4))
					if rng.IntN(50) == 0 {
						cost = lim.Count + 1 // impossible
					}
					path[i] = Bucket{Key: k, Limit: lim, Cost: cost}
				}
				d, err := m.DecideInto(context.Background(), path, buf)
				if err != nil {
					errs <- err
					return
				}
				rs, allowed := applyPath(ref, path, d.At)
				for i, want := range rs {
					if !allowed {
						want.Remaining = want.Before // nothing was charged
					}
					if got := d.Results[i]; got != want {
						errs <- fmt.Errorf("goroutine %d, step %d, bucket %d (%s): the store said %+v, Apply %+v", g, step, i, path[i].Key, got, want)
						return
					}
				}
				// Every state of this goroutine's keys, under their locks
				// (other goroutines keep deciding in the same shards).
				locked := m.lock(hashes, nil)
				now := d.At
				for i, k := range keys {
					sh := &m.shards[shardOf(hashes[i])]
					var got rate.State
					if b := sh.find(hashes[i], k); b != nil && b.expires > now {
						got = sh.state(b, new(rate.Log))
					}
					want := rate.State{}
					if e, ok := ref[k]; ok && e.expires > now {
						want = e.s
					}
					if got.A != want.A || got.B != want.B || got.T != want.T || got.Log.Len() != want.Log.Len() ||
						(got.Log != nil && (got.Log.H != want.Log.H || !bytes.Equal(got.Log.Entries(), want.Log.Entries()))) {
						m.unlock(locked)
						errs <- fmt.Errorf("goroutine %d, step %d, %s: the store holds %+v (%d entries), Apply %+v (%d)", g, step, k, got, got.Log.Len(), want, want.Log.Len())
						return
					}
				}
				m.unlock(locked)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range m.shards {
		m.shards[i].mu.Lock()
	}
	checkShards(t, m)
	for i := range m.shards {
		m.shards[i].mu.Unlock()
	}
}
