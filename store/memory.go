package store

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	shards   [memoryShards]memoryShard
	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
	interval chan time.Duration // a new sweep interval for the sweeper

	evictions atomic.Int64
}

// memoryShard maps the 64-bit hash of a key to its entry: the hash is
// computed once per key and decision (it also picks the shard), so the map
// never hashes the long key string again. Entries whose keys share a hash
// are chained, and every lookup compares the key itself: exact, whatever
// the hash says.
type memoryShard struct {
	mu      sync.Mutex
	entries map[uint64]*memoryEntry
	n       int   // entries, chains included
	swept   int64 // when the shard's expired state was last dropped (µs)
	// One shard per cache line: cores locking neighbouring shards must
	// not contend for one line (false sharing).
	_ [64 - 32]byte
}

type memoryEntry struct {
	key     string
	state   rate.State
	expires int64 // µs; state is as good as fresh after this
	next    *memoryEntry
	// record: an idempotency record (rate.Idempotent), evicted before any
	// limit's state: losing one charges a retry again, losing a limit's
	// state admits more than the limit.
	record bool
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
	for i := range m.shards {
		m.shards[i].entries = make(map[uint64]*memoryEntry)
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
	var entries [maxPath]*memoryEntry
	var next [maxPath]rate.State
	var lockBuf [maxPath]uint8
	results := sizedResults(buf, n)
	for i, b := range buckets {
		hashes[i] = maphash.String(m.seed, b.Key)
	}
	locked := m.lock(hashes[:n], lockBuf[:0])
	at := m.decideLocked(buckets, hashes[:n], entries[:n], next[:n], results)
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
	at := m.decideLocked(buckets, hashes, make([]*memoryEntry, n), make([]rate.State, n), results)
	d := Combine(results)
	d.At = at
	return d
}

// decideLocked applies every bucket's cost and, when all admit it, stores
// the new states. Each key is looked up once: the entry found (nil for a
// fresh bucket) is remembered for the write. The caller holds the shard
// locks of every key. It returns the time of the decision.
func (m *Memory) decideLocked(buckets []Bucket, hashes []uint64, entries []*memoryEntry, next []rate.State, results []rate.Result) (now int64) {
	now = m.clock()
	allowed := true
	for i := range buckets {
		b := &buckets[i]
		e := m.entryOf(hashes[i], b.Key)
		entries[i] = e
		var s rate.State
		if e != nil && e.expires > now {
			s = e.state
		}
		next[i], results[i] = b.Limit.Apply(s, now, b.Cost)
		allowed = allowed && results[i].Allowed
	}
	if !allowed {
		for i := range buckets {
			if e := entries[i]; e != nil && results[i].Keep { // kept all the same
				e.state = next[i]
			}
		}
		return now
	}
	// Entries found are updated first: making room for a new one may
	// evict or drop entries of its shard, and so must not come between
	// finding an entry and writing it.
	fresh := false
	for i := range buckets {
		if e := entries[i]; e != nil {
			e.state, e.expires = next[i], now+buckets[i].Limit.TTL(next[i], now)
		} else {
			fresh = true
		}
	}
	if !fresh {
		return now
	}
	for i := range buckets {
		if entries[i] == nil {
			// A key named twice on one path finds the entry stored
			// for its first mention, as a lookup would.
			m.store(hashes[i], buckets[i], next[i], now)
		}
	}
	return now
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
// buckets at once. SweepInterval takes effect at the next tick; a store
// created without a sweeper stays without one. Clock is ignored.
func (m *Memory) Reconfigure(opts MemoryOptions) {
	if opts.MaxKeys > 0 {
		m.maxKeys.Store(int64(opts.MaxKeys))
	}
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

// Evictions is the number of buckets evicted at the MaxKeys cap so far.
func (m *Memory) Evictions() int64 { return m.evictions.Load() }

// Sweep removes every expired bucket now.
func (m *Memory) Sweep() {
	now := m.clock()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		m.sweepShard(s, now)
		s.mu.Unlock()
	}
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

// entryOf returns the entry of key, expired or not, nil if there is none.
// The caller holds the key's shard lock.
func (m *Memory) entryOf(hash uint64, key string) *memoryEntry {
	for e := m.shards[shardOf(hash)].entries[hash]; e != nil; e = e.next {
		if e.key == key {
			return e
		}
	}
	return nil
}

// stateOf returns the live state of key; expired state reads as fresh.
// The caller holds the key's shard lock.
func (m *Memory) stateOf(hash uint64, key string, now int64) rate.State {
	if e := m.entryOf(hash, key); e != nil && e.expires > now {
		return e.state
	}
	return rate.State{}
}

// store writes a bucket's new state. The caller holds the key's shard lock.
func (m *Memory) store(hash uint64, b Bucket, s rate.State, now int64) {
	sh := &m.shards[shardOf(hash)]
	expires := now + b.Limit.TTL(s, now)
	head := sh.entries[hash]
	for e := head; e != nil; e = e.next {
		if e.key == b.Key {
			e.state, e.expires = s, expires
			return
		}
	}
	if expires <= now {
		return // a full bucket needs no state
	}
	if m.count.Load() >= m.maxKeys.Load() {
		m.makeRoom(sh, now)
		head = sh.entries[hash]
	}
	e := newEntry(b.Key)
	e.state, e.expires, e.next = s, expires, head
	e.record = b.Limit.Algorithm == rate.Idempotent
	sh.entries[hash] = e
	sh.n++
	m.count.Add(1)
}

// Entries carry a copy of their key in the same allocation, right after
// them: a lookup, which must compare the key, then finds its bytes in the
// cache lines it just loaded instead of wherever the request that created
// the entry built them (a string that also held its whole path's keys).
type (
	entry64 struct {
		e   memoryEntry
		key [64]byte
	}
	entry128 struct {
		e   memoryEntry
		key [128]byte
	}
	entry256 struct {
		e   memoryEntry
		key [256]byte
	}
)

// newEntry returns an entry for key, which it copies. The copy is written
// once, here, before the string that shares its bytes exists.
func newEntry(key string) *memoryEntry {
	var e *memoryEntry
	var buf []byte
	switch n := len(key); {
	case n == 0:
		return &memoryEntry{}
	case n <= 64:
		x := new(entry64)
		e, buf = &x.e, x.key[:n]
	case n <= 128:
		x := new(entry128)
		e, buf = &x.e, x.key[:n]
	case n <= 256:
		x := new(entry256)
		e, buf = &x.e, x.key[:n]
	default:
		return &memoryEntry{key: strings.Clone(key)}
	}
	copy(buf, key)
	e.key = unsafe.String(&buf[0], len(buf))
	return e
}

// removeExpired drops the expired entries chained at hash and returns how
// many it dropped. The caller holds the shard lock.
func (m *Memory) removeExpired(sh *memoryShard, hash uint64, now int64) int {
	removed := 0
	var kept *memoryEntry
	for e := sh.entries[hash]; e != nil; {
		next := e.next
		if e.expires <= now {
			removed++
		} else {
			e.next, kept = kept, e
		}
		e = next
	}
	if kept == nil {
		delete(sh.entries, hash)
	} else {
		sh.entries[hash] = kept
	}
	sh.n -= removed
	m.count.Add(int64(-removed))
	return removed
}

// sweepShard drops every expired entry of a shard. The caller holds its lock.
func (m *Memory) sweepShard(sh *memoryShard, now int64) int {
	removed := 0
	for h := range sh.entries {
		removed += m.removeExpired(sh, h, now)
	}
	sh.swept = now
	return removed
}

// makeRoom frees a place in a full store, from the shard about to take a
// new entry: its expired entries first (unless swept within the last
// second), else the sampled entry nearest to expiry.
func (m *Memory) makeRoom(sh *memoryShard, now int64) {
	if now-sh.swept >= sweepShardEvery && m.sweepShard(sh, now) > 0 {
		return
	}
	var victim uint64
	soonest, seen := int64(0), 0
	for h, e := range sh.entries { // map iteration order is randomised
		if m.removeExpired(sh, h, now) > 0 {
			return
		}
		if e.expires-now > rate.ForeverTTL/2 {
			continue // slots in flight: dropping them would over-admit
		}
		if e.record && e.state.A <= float64(now) { // a record whose request has ended goes first
			victim, seen = h, 1
			break
		}
		if seen == 0 || e.expires < soonest {
			victim, soonest = h, e.expires
		}
		if seen++; seen == evictionSample {
			break
		}
	}
	if seen == 0 {
		return // nothing but slots in flight
	}
	if e := sh.entries[victim]; e != nil {
		if e.next == nil {
			delete(sh.entries, victim)
		} else {
			sh.entries[victim] = e.next
		}
		sh.n--
		m.count.Add(-1)
		m.evictions.Add(1)
	}
}

// sweepShardEvery is how often (µs) a full store may rescan a shard for
// expired state before evicting live state from it.
const sweepShardEvery = 1_000_000
