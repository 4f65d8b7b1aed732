package store

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// memoryShards is the number of independently locked parts of the memory
// store. A decision locks only the shards its buckets live in, in ascending
// order, so decisions on unrelated keys run in parallel and never deadlock.
const memoryShards = 64

// evictionSample is how many entries are looked at to choose a victim when
// the store is at its cap (sampled eviction, as Redis does for maxmemory).
const evictionSample = 16

// MemoryOptions configure a Memory store.
type MemoryOptions struct {
	// MaxKeys caps the number of buckets tracked. At the cap, inserting a
	// new bucket first drops the expired state of its shard (one 64th of
	// the store; at most once a second per shard, so a store full of live
	// state does not rescan itself on every insert), then, if the store is
	// still full, evicts an idempotency record if a small random sample of
	// that shard has one (its loss charges a retry again), else the entry
	// closest to expiry: the bucket closest to being full again, whose
	// loss over-admits least — never a concurrency counter with slots
	// taken. Evictions are counted (Evictions). The store
	// may exceed MaxKeys by at most one bucket per shard (a shard with no
	// entry has none to evict). Zero means 1,000,000.
	MaxKeys int
	// SweepInterval is how often expired state is removed in the
	// background. Zero means one minute; negative disables the sweeper
	// (tests sweep by hand).
	SweepInterval time.Duration
	// Reserve is the memory (bytes) set aside for buckets when the store
	// is created, paged in only as buckets arrive; more is added as
	// needed. Zero means 16 MiB, or 128 bytes a bucket of MaxKeys if less;
	// negative means the least (64 KiB); more than 4 GiB means 4 GiB (a
	// block's offset in a chunk is 32 bits). What is reserved counts as
	// heap for the Go runtime (see reservedBytes).
	Reserve int
	// MaxReplayBytes bounds the responses kept for idempotent replay
	// (see Memory.KeepResponse), in a table of their own: keys, bytes and
	// ReplayEntryOverhead each. Zero means DefaultMaxReplayBytes (64 MiB).
	MaxReplayBytes int64
	// Clock overrides the wall clock, for tests.
	Clock Clock
}

// Memory is the embedded store: state lives in this process. It is exact
// under any concurrency within the process; instances do not share it.
type Memory struct {
	clock    Clock
	maxKeys  atomic.Int64 // MaxKeys
	count    atomic.Int64 // entries in all shards
	seed     maphash.Seed
	arena    *arena // the buckets of every shard
	shards   [memoryShards]memoryShard
	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
	interval chan time.Duration // a new sweep interval for the sweeper

	evictions atomic.Int64

	replay replayTable // the responses kept (see KeepResponse)
}

// NewMemory returns a Memory store and starts its sweeper.
func NewMemory(opts MemoryOptions) *Memory {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = 1_000_000
	}
	if opts.Clock == nil {
		opts.Clock = WallClock
	}
	m := &Memory{
		clock:    opts.Clock,
		seed:     maphash.MakeSeed(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		interval: make(chan time.Duration, 1),
	}
	m.maxKeys.Store(int64(opts.MaxKeys))
	m.replay.init(opts.MaxReplayBytes)
	reserve := opts.Reserve
	if reserve == 0 {
		reserve = min(reservedBytes, opts.MaxKeys*128)
	}
	m.arena = newArena(reserve)
	for i := range m.shards {
		m.shards[i] = newShard(m.arena)
	}
	interval := opts.SweepInterval
	if interval == 0 {
		interval = time.Minute
	}
	if interval > 0 {
		go m.sweepEvery(interval)
	} else {
		close(m.done)
	}
	return m
}

// Decide implements Store.
func (m *Memory) Decide(ctx context.Context, buckets []Bucket) (Decision, error) {
	return m.DecideInto(ctx, buckets, nil)
}

// maxPath is the longest path decided without heap scratch space: 8,
// as the engine's (4 tiers of 2 limits), so that the frame stays small —
// a deeper frame makes a connection's goroutine grow its stack (a copy)
// again after each collection has shrunk it.
const maxPath = 8

// DecideInto is Decide with the results written into buf when it is long
// enough (a new slice otherwise): the Decision's Results then share buf's
// array. It lets a caller that reuses its memory across requests decide
// without allocating.
func (m *Memory) DecideInto(_ context.Context, buckets []Bucket, buf []rate.Result) (Decision, error) {
	n := len(buckets)
	if n > maxPath {
		return m.decideLong(buckets, sizedResults(buf, n)), nil
	}
	var hashes [maxPath]uint64
	var found [maxPath]*bucket
	var next [maxPath]rate.State
	var lockBuf [maxPath]uint8
	results := sizedResults(buf, n)
	for i, b := range buckets {
		hashes[i] = maphash.String(m.seed, b.Key)
	}
	locked := m.lock(hashes[:n], lockBuf[:0])
	at := m.decideLocked(buckets, hashes[:n], found[:n], next[:n], results)
	m.unlock(locked)
	d := Combine(results)
	d.At = at
	return d, nil
}

// decideLong decides a path too long for the stack buffers of DecideInto.
func (m *Memory) decideLong(buckets []Bucket, results []rate.Result) Decision {
	n := len(buckets)
	hashes := m.hashesOf(buckets, make([]uint64, 0, n))
	locked := m.lock(hashes, make([]uint8, 0, n))
	defer m.unlock(locked)
	at := m.decideLocked(buckets, hashes, make([]*bucket, n), make([]rate.State, n), results)
	d := Combine(results)
	d.At = at
	return d
}

// decideLocked applies every bucket's cost and, when all admit it, stores
// the new states. Each key is looked up once: the bucket found (nil for a
// fresh bucket) is remembered for the write. The caller holds the shard
// locks of every key. It returns the time of the decision.
func (m *Memory) decideLocked(buckets []Bucket, hashes []uint64, found []*bucket, next []rate.State, results []rate.Result) (now int64) {
	now = m.clock()
	allowed := true
	for i := range buckets {
		b := &buckets[i]
		sh := &m.shards[shardOf(hashes[i])]
		f := sh.find(hashes[i], b.Key)
		found[i] = f
		var s rate.State
		if f != nil && f.expires > now {
			s = sh.state(f, sh.view(i))
		}
		next[i], results[i] = b.Limit.ApplyTo(s, now, b.Cost, sh.nextLog(i))
		allowed = allowed && results[i].Allowed
	}
	if !allowed {
		for i, f := range found {
			if f != nil && results[i].Keep && !writtenLater(found, results, i, true) { // kept all the same
				m.shards[shardOf(hashes[i])].write(f, next[i], f.expires)
			}
		}
		return now
	}
	// Buckets found are written first: making room for a new one may evict
	// or drop buckets of its shard, and so must not come between finding a
	// bucket and writing it.
	fresh := false
	for i, f := range found {
		if f == nil {
			fresh = true
		} else if !writtenLater(found, results, i, false) {
			m.shards[shardOf(hashes[i])].write(f, next[i], now+buckets[i].Limit.TTL(next[i], now))
		}
	}
	if !fresh {
		return now
	}
	for i, f := range found {
		if f == nil {
			// A key named twice on one path finds the bucket stored for its
			// first mention, as a lookup would.
			m.store(hashes[i], buckets[i], next[i], now)
		}
	}
	return now
}

// writtenLater reports whether the bucket found for position i of a path
// is written again for a later position (a key named twice; only refusals
// to keep when keep is set). Only the last write of a bucket is made: each
// read the bucket as it was, and a charge's entry appended in place by one
// may have been overwritten by the next (see rate.LogView), so an earlier
// write would copy the wrong entry, or — had its log grown into a new
// block — leave the later state's bytes in a released one.
func writtenLater(found []*bucket, results []rate.Result, i int, keep bool) bool {
	for j := i + 1; j < len(found); j++ {
		if found[j] == found[i] && (!keep || results[j].Keep) {
			return true
		}
	}
	return false
}

// sizedResults returns buf cut to n, or a new slice when buf is too short.
func sizedResults(buf []rate.Result, n int) []rate.Result {
	if n <= cap(buf) {
		return buf[:n]
	}
	return make([]rate.Result, n)
}

// Adjust implements Store.
func (m *Memory) Adjust(_ context.Context, buckets []Bucket) error {
	var hashBuf [16]uint64
	var lockBuf [16]uint8
	hashes := m.hashesOf(buckets, hashBuf[:0])
	locked := m.lock(hashes, lockBuf[:0])
	defer m.unlock(locked)
	now := m.clock()
	for i, b := range buckets {
		s := b.Limit.Adjust(m.stateOf(hashes[i], b.Key, now), now, b.Cost, b.Limit.ChargeWindow(b.Charged))
		m.store(hashes[i], b, s, now)
	}
	return nil
}

// hashesOf returns the hash of each bucket's key.
func (m *Memory) hashesOf(buckets []Bucket, buf []uint64) []uint64 {
	for _, b := range buckets {
		buf = append(buf, maphash.String(m.seed, b.Key))
	}
	return buf
}

func shardOf(hash uint64) uint8 { return uint8(hash % memoryShards) }

// Reconfigure applies new options to a store in use (a reloaded
// configuration), keeping its state; a zero or negative option keeps the
// current setting. A lower MaxKeys applies to the buckets inserted from now
// on: the store then shrinks as state expires, never by dropping live
// buckets at once. A lower MaxReplayBytes is reached at the next
// KeepResponse. SweepInterval takes effect at the next tick; a store
// created without a sweeper stays without one. Clock is ignored.
func (m *Memory) Reconfigure(opts MemoryOptions) {
	if opts.MaxKeys > 0 {
		m.maxKeys.Store(int64(opts.MaxKeys))
	}
	m.replay.setMax(opts.MaxReplayBytes)
	if opts.SweepInterval <= 0 {
		return
	}
	for { // keep only the newest interval
		select {
		case m.interval <- opts.SweepInterval:
			return
		case <-m.interval:
		}
	}
}

// Close stops the sweeper. The state is dropped with the store.
func (m *Memory) Close() error {
	m.closed.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

// Len is the number of buckets currently tracked.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

// StateBytes is the memory its buckets hold in the store's arena: their
// state, keys and sliding logs, in whole blocks (not the free blocks, nor
// the reservation not yet used, nor the index of hashes).
func (m *Memory) StateBytes() int { return m.arena.heldBytes() }

// Evictions is the number of buckets evicted at the MaxKeys cap so far.
func (m *Memory) Evictions() int64 { return m.evictions.Load() }

// Sweep removes every expired bucket and kept response now.
func (m *Memory) Sweep() {
	now := m.clock()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		m.sweepShard(s, now)
		s.mu.Unlock()
	}
	m.replay.sweepReplay(now)
}

func (m *Memory) sweepEvery(interval time.Duration) {
	defer close(m.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		case d := <-m.interval:
			t.Reset(d)
		}
	}
}

// lock takes the shard locks of the given key hashes in ascending shard
// order, each once.
func (m *Memory) lock(hashes []uint64, buf []uint8) []uint8 {
	for _, h := range hashes {
		buf = append(buf, shardOf(h))
	}
	for i := 1; i < len(buf); i++ { // insertion sort: paths are short, and it does not allocate
		for j := i; j > 0 && buf[j] < buf[j-1]; j-- {
			buf[j], buf[j-1] = buf[j-1], buf[j]
		}
	}
	out := buf[:0]
	for i, s := range buf {
		if i == 0 || s != buf[i-1] {
			out = append(out, s)
		}
	}
	for _, s := range out {
		m.shards[s].mu.Lock()
	}
	return out
}

func (m *Memory) unlock(shards []uint8) {
	for _, s := range shards {
		m.shards[s].mu.Unlock()
	}
}

// stateOf returns the live state of key; expired state reads as fresh. Its
// log is the store's memory: the caller holds the key's shard lock while
// it uses the state.
func (m *Memory) stateOf(hash uint64, key string, now int64) rate.State {
	sh := &m.shards[shardOf(hash)]
	if b := sh.find(hash, key); b != nil && b.expires > now {
		return sh.state(b, new(rate.Log))
	}
	return rate.State{}
}

// store writes a bucket's new state. The caller holds the key's shard lock.
func (m *Memory) store(hash uint64, b Bucket, s rate.State, now int64) {
	sh := &m.shards[shardOf(hash)]
	expires := now + b.Limit.TTL(s, now)
	if f := sh.find(hash, b.Key); f != nil {
		sh.write(f, s, expires)
		return
	}
	if expires <= now {
		return // a full bucket needs no state
	}
	if m.count.Load() >= m.maxKeys.Load() {
		m.makeRoom(sh, now)
	}
	sh.insert(hash, b.Key, s, expires, b.Limit.Algorithm == rate.Idempotent)
	m.count.Add(1)
}

// removeExpired drops the expired buckets chained at hash and returns how
// many it dropped. The caller holds the shard lock.
func (m *Memory) removeExpired(sh *memoryShard, hash uint64, now int64) int {
	removed := 0
	prev := noBlock
	at, _ := sh.index.get(hash) // noBlock if none
	for at != noBlock {
		next := sh.at(at).next
		if sh.at(at).expires <= now {
			sh.unlink(at, prev)
			removed++
		} else {
			prev = at
		}
		at = next
	}
	m.count.Add(int64(-removed))
	return removed
}

// sweepShard drops every expired bucket of a shard. The caller holds its lock.
func (m *Memory) sweepShard(sh *memoryShard, now int64) int {
	removed := 0
	for h := range sh.index.all() {
		removed += m.removeExpired(sh, h, now)
	}
	sh.swept = now
	return removed
}

// makeRoom frees a place in a full store, from the shard about to take a
// new bucket: its expired buckets first (unless swept within the last second),
// else the sampled bucket nearest to expiry.
func (m *Memory) makeRoom(sh *memoryShard, now int64) {
	if now-sh.swept >= sweepShardEvery && m.sweepShard(sh, now) > 0 {
		return
	}
	victim := noBlock
	soonest, seen := int64(0), 0
	for h, at := range sh.index.from(rand.Int()) { // from a random slot: a random sample
		if m.removeExpired(sh, h, now) > 0 {
			return
		}
		s := sh.at(at)
		if s.expires-now > rate.ForeverTTL/2 {
			continue // concurrency slots in flight: dropping them would over-admit
		}
		if s.record && s.a <= float64(now) { // a record whose request has ended goes first
			victim, seen = at, 1
			break
		}
		if seen == 0 || s.expires < soonest {
			victim, soonest = at, s.expires
		}
		if seen++; seen == evictionSample {
			break
		}
	}
	if seen == 0 {
		return // nothing but concurrency slots in flight
	}
	sh.unlink(victim, noBlock) // the first of its chain
	m.count.Add(-1)
	m.evictions.Add(1)
}

// sweepShardEvery is how often (µs) a full store may rescan a shard for
// expired state before evicting live state from it.
const sweepShardEvery = 1_000_000
