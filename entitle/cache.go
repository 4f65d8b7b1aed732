package entitle

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Cache. Zero fields take their defaults.
type Options struct {
	// TTL is how long an answer is fresh (default 5m). A Get that sees
	// an answer past 80% of it refreshes it in the background.
	TTL time.Duration
	// NegativeTTL is how long a "not found" is kept (default 1m;
	// negative: not kept).
	NegativeTTL time.Duration
	// Stale is how long past its TTL the last good answer is served once
	// a refresh has failed (default 1h; negative: never). A failed value
	// is looked up again at most every TTL/10 (10s at most).
	Stale time.Duration
	// Timeout is the longest a Get waits for a lookup (default 1s). The
	// lookup itself is given twice as long: a request waits the first
	// Timeout, and an answer that comes in the second still fills the
	// cache for the next request.
	Timeout time.Duration
	// MaxEntries is how many values are cached at most (default
	// 100,000). Past it, a value among a few sampled that was used least
	// recently is dropped.
	MaxEntries int
	// MaxLookups is how many lookups may be in flight at once (default
	// 64): past it, a value not cached yet is answered at once with
	// ok=false (the default plan) and looked up by a later request, so
	// that a flood of new values (random API keys) cannot queue
	// thousands of calls at the source.
	MaxLookups int
	// OnFailure is told of every failed lookup (the source's error, or out
	// of time), for a log line; nil ignores them.
	OnFailure func(error)
	// Name is set as the Source of every answer the cache keeps.
	Name string
	// Clock tells the time that TTL, NegativeTTL and Stale are measured
	// in (default: the monotonic clock). Timeout is always real time.
	Clock func() time.Time
}

// The defaults of Options.
const (
	DefaultTTL         = 5 * time.Minute
	DefaultNegativeTTL = time.Minute
	DefaultStale       = time.Hour
	DefaultTimeout     = time.Second
	DefaultMaxEntries  = 100_000
	DefaultMaxLookups  = 64
)

const (
	// maxRetryAfter bounds how long a value whose lookup failed waits
	// before it is looked up again.
	maxRetryAfter = 10 * time.Second
	// touchEvery is how stale an entry's last-use time may get: hits
	// within it do not write, so a busy value's hits stay reads.
	touchEvery = int64(100 * time.Millisecond)
	// maxShards and minPerShard size the sharded map: enough shards that
	// concurrent misses rarely share a lock, few enough that each shard's
	// share of MaxEntries is large and the bound stays close.
	maxShards   = 64
	minPerShard = 256
	// evictSample is how many entries a full shard compares to choose
	// the least recently used one to drop.
	evictSample = 8
	// maxRecent bounds the answers Cache.recent holds (two to a pair).
	maxRecent = 1 << 14
)

// Stats are a Cache's counters since it was made. Every Get that has a
// value counts once in exactly one of Hits, Misses and Stale.
type Stats struct {
	Lookups  uint64 // lookups started
	Failures uint64 // lookups that failed (the source's error, or out of time)
	Hits     uint64 // Gets answered by a fresh answer in memory
	Misses   uint64 // Gets with no fresh answer in memory that did not serve a stale one
	Stale    uint64 // Gets answered by an answer past its TTL, the source having failed
	Timeouts uint64 // Gets that stopped waiting for a lookup (after Timeout, or ctx's end)
	Shed     uint64 // lookups not started: MaxLookups were in flight
	Entries  int    // values in memory now
}

// Cache answers Gets from memory and keeps the answers fresh from a
// Source. It is safe for concurrent use.
//
// Each value has at most one lookup in flight, started by a Get; no
// lookup's goroutine outlives it. Without a Clock the cache runs a ticker
// of its own (its coarse clock) until Close. The answers are kept in a map sharded by a
// hash of the value, with the answers found lately also in a lock-free
// array, so a Get of a fresh value is mostly a hash and an atomic load.
type Cache struct {
	src Source

	ttl, negativeTTL, stale, retryAfter int64 // in nanoseconds
	timeout, lookupTimeout              time.Duration
	clock                               func() time.Time // nil: time.Since(epoch), which reads only the monotonic clock
	epoch                               time.Time        // what now counts from

	name      string      // Options.Name
	onFailure func(error) // Options.OnFailure

	// coarse is now, to tickEvery, without a Clock: a hit reads it (an
	// atomic load) rather than the clock; a ticker of the cache's keeps it.
	coarse atomic.Int64

	seed     maphash.Seed
	shards   []shard
	mask     uint64
	perShard int

	// recent is an array of pairs, indexed by the value's hash, of
	// answers found lately (two ways, so that two values whose hashes
	// meet do not push each other out on every Get): a Get whose value's
	// answer is there, and not yet due for a refresh, reads it with one or
	// two atomic loads of one cache line, no lock, and no memory but the
	// answer's own. An answer is put there only under its shard's read
	// lock, from an entry in the map, and taken out under the write lock
	// as its entry leaves the map, so recent never holds the answer of a
	// value the map has dropped. Two values that share a pair share a
	// shard too (there are at least as many pairs as shards, both chosen
	// by the hash's low bits), so a pair changes under one shard's lock.
	recent     []recentPair
	recentMask uint64

	lookups, failures, misses, staleServed, timeouts, shed atomic.Uint64
	inFlight                                               atomic.Int64
	maxLookups                                             int64

	ctx    context.Context // the lookups'; cancelled by Close
	cancel context.CancelFunc
	life   sync.Mutex // guards closed and lookups' wg.Add
	closed bool
	wg     sync.WaitGroup // the lookups in flight
}

// recentPair is one pair of Cache.recent: 16 bytes, four to a cache line.
type recentPair [2]atomic.Pointer[answer]

// put keeps a, value's answer, in p: in the first way if that is free,
// due for a refresh or value's, else in the second, so a value that stays
// in the first way is never pushed out by two others that take turns.
func (p *recentPair) put(value string, a *answer, now int64) {
	if b := p[0].Load(); b == nil || now >= b.refresh || b.is(value) {
		p[0].Store(a)
		return
	}
	p[1].Store(a)
}

// drop takes value's answer out of p.
func (p *recentPair) drop(value string) {
	for i := range p {
		if a := p[i].Load(); a != nil && a.is(value) {
			p[i].CompareAndSwap(a, nil)
		}
	}
}

// shard is one part of the map, padded so that shards' locks and counters
// do not share a cache line.
type shard struct {
	mu   sync.RWMutex
	m    map[string]*entry
	hits atomic.Uint64
	_    [64]byte
}

// entry is one value's answer and its lookup state. ans, used and the
// atomics are read without mu; flight, retryAt and failed change under mu.
type entry struct {
	ans     atomic.Pointer[answer] // nil until a lookup succeeds
	used    atomic.Int64           // the last Get, in Cache.now's time, to touchEvery
	flight  atomic.Pointer[flight] // the lookup in progress
	retryAt atomic.Int64           // after a failure, no lookup starts before it
	failed  atomic.Bool            // the last lookup failed
	mu      sync.Mutex
}

// answer is what a lookup said of value, and until when it is good. It
// never changes once stored, but for used and its memo (written once). A
// Get that finds it fresh reads its first cache line only (on 64-bit
// platforms; the second too for a value longer than hotValue bytes, the
// third and the value's own memory for one longer than shortValue): what a
// Get reads, the memo and a short value's bytes come first, and an answer
// is answerSize bytes, a size Go allocates on a 256-byte boundary
// (TestAnswerLayout checks both).
type answer struct {
	refresh int64        // from then a Get refreshes it in the background
	used    atomic.Int64 // the last Get that read it from recent, to touchEvery
	memo    Memo
	found   bool
	n       uint8            // the value's length when it is in short; 0: in long
	short   [shortValue]byte // the value, when short
	long    string           // the value, when longer than shortValue
	expires int64            // from then it is stale
	e       Entitlement
	_       [answerSize - 216]byte // 216: the fields' size on 64-bit platforms
}

// The answer's layout: its size, the longest value kept inline, and the
// longest whose bytes lie in the first cache line.
const (
	answerSize = 256
	shortValue = 86
	hotValue   = 64 - 42
)

// A short value's length is kept in a uint8: this fails to compile when
// shortValue does not fit.
const _ uint8 = shortValue

// newAnswer returns an answer of value (copied into it when short).
func newAnswer(value string, e Entitlement, found bool, refresh, expires int64) *answer {
	a := &answer{e: e, found: found, refresh: refresh, expires: expires}
	if len(value) <= shortValue {
		a.n = uint8(copy(a.short[:], value))
	} else {
		a.long = value
	}
	return a
}

// is tells whether a is value's answer (value is not empty).
func (a *answer) is(value string) bool {
	if a.n == 0 {
		return a.long == value
	}
	return int(a.n) == len(value) && string(a.short[:a.n]) == value
}

// flight is a lookup in progress; ans and err are set before done closes.
type flight struct {
	done chan struct{}
	ans  *answer
	err  error
}

// NewCache returns a cache of src's answers. Close it to stop its lookups
// and close src.
func NewCache(src Source, opts Options) *Cache {
	opts = opts.withDefaults()
	c := &Cache{
		src:           src,
		ttl:           int64(opts.TTL),
		negativeTTL:   max(int64(opts.NegativeTTL), 0),
		stale:         max(int64(opts.Stale), 0),
		retryAfter:    int64(min(opts.TTL/10, maxRetryAfter)),
		timeout:       opts.Timeout,
		lookupTimeout: 2 * opts.Timeout,
		clock:         opts.Clock,
		name:          opts.Name,
		onFailure:     opts.OnFailure,
		maxLookups:    int64(opts.MaxLookups),
		seed:          maphash.MakeSeed(),
	}
	if c.clock != nil {
		c.epoch = c.clock()
	} else {
		c.epoch = time.Now()
	}
	n := 1
	for n < maxShards && opts.MaxEntries/(2*n) >= minPerShard {
		n *= 2
	}
	c.shards = make([]shard, n)
	for i := range c.shards {
		c.shards[i].m = make(map[string]*entry)
	}
	c.mask = uint64(n - 1)
	c.perShard = max(opts.MaxEntries/n, 1)
	r := 1
	for r < maxRecent/2 && 2*r < opts.MaxEntries {
		r *= 2
	}
	c.recent = make([]recentPair, r)
	c.recentMask = uint64(r - 1)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if c.clock == nil {
		c.coarse.Store(int64(time.Since(c.epoch)))
		go c.tick()
	}
	return c
}

// tickEvery is how often the coarse clock moves: the precision of TTLs.
const tickEvery = 5 * time.Millisecond

// tick keeps the coarse clock until the cache is closed.
func (c *Cache) tick() {
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			c.coarse.Store(int64(time.Since(c.epoch)))
		}
	}
}

// withDefaults is o with its zero fields set to their defaults.
func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.NegativeTTL == 0 {
		o.NegativeTTL = DefaultNegativeTTL
	}
	if o.Stale == 0 {
		o.Stale = DefaultStale
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxLookups <= 0 {
		o.MaxLookups = DefaultMaxLookups
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	return o
}

// Get returns value's entitlement, shared and read-only (the cache's own,
// which the caller must not change), and the answer's Memo, for the caller
// to keep what it derives from the answer in. ok is false, and e and m nil,
// when there is none to give: the source knows no such value, or has not
// answered in time (the caller then uses its default plan). An empty value
// has none, and is not looked up.
//
// A fresh answer comes from memory; past 80% of its TTL, the first Get to
// see it also starts a refresh in the background. With no fresh answer,
// Get looks the value up, joining the lookup in flight if there is one,
// and waits at most Timeout (or until ctx ends); a lookup that takes longer
// fills the cache when it completes. When the source fails, the last good
// answer is served up to Stale past its TTL; until the value's retry is
// due, its Gets answer at once (that answer, or ok=false) and wait for no
// lookup.
func (c *Cache) Get(ctx context.Context, value string) (e *Entitlement, m *Memo, ok bool) {
	if value == "" {
		return nil, nil, false
	}
	// A fresh answer among the recent ones: the hit, written out here
	// rather than in calls (Go inlines none of them), as it is every
	// request's.
	now := c.coarse.Load()
	if c.clock != nil {
		now = c.now()
	}
	hash := maphash.String(c.seed, value)
	sh := &c.shards[hash&c.mask]
	pair := &c.recent[hash&c.recentMask]
	a := pair[0].Load()
	if a == nil || !a.is(value) {
		if a = pair[1].Load(); a != nil && !a.is(value) {
			a = nil
		}
	}
	if a == nil || now >= a.refresh {
		a = c.answer(ctx, sh, pair, value, now)
	} else {
		if now-a.used.Load() >= touchEvery {
			a.used.Store(now)
		}
		sh.hits.Add(1)
	}
	if a == nil || !a.found {
		return nil, nil, false
	}
	return &a.e, &a.memo, true
}

// answer is Get's answer for a value whose answer is not among the recent
// ones, or due for a refresh: nil when there is none to give.
func (c *Cache) answer(ctx context.Context, sh *shard, pair *recentPair, value string, now int64) *answer {
	sh.mu.RLock()
	en := sh.m[value]
	if en != nil {
		if a := en.ans.Load(); a != nil {
			pair.put(value, a, now)
		}
	}
	sh.mu.RUnlock()
	if en != nil {
		en.touch(now)
		if a := en.ans.Load(); a != nil && now < a.expires {
			sh.hits.Add(1)
			if now >= a.refresh && en.flight.Load() == nil && now >= en.retryAt.Load() {
				c.start(en, value, now)
			}
			return a
		}
	}
	return c.miss(ctx, sh, en, value, now)
}

// miss is answer for a value with no fresh answer in memory (en nil: no entry).
func (c *Cache) miss(ctx context.Context, sh *shard, en *entry, value string, now int64) *answer {
	if en == nil {
		en = c.insert(sh, value, now)
	}
	a := en.ans.Load()
	if a != nil && now < a.expires { // filled since Get looked
		sh.hits.Add(1)
		return a
	}
	stale := a != nil && now < a.expires+c.stale
	if stale && en.failed.Load() {
		// The source failed to refresh it: serve it at once, and retry
		// in the background when the failure is old enough.
		c.start(en, value, now)
		return c.served(a)
	}
	f := c.start(en, value, now)
	if f == nil {
		// Nothing to wait for: an answer came meanwhile, the source
		// failed lately, or the cache is closed.
		if a := en.ans.Load(); a != nil && now < a.expires {
			sh.hits.Add(1)
			return a
		}
		if stale {
			return c.served(a)
		}
		c.misses.Add(1)
		return nil
	}
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	select {
	case <-f.done:
		if f.err == nil {
			c.misses.Add(1)
			return f.ans
		}
	case <-timer.C:
		c.timeouts.Add(1)
	case <-ctx.Done():
		c.timeouts.Add(1)
	}
	if stale {
		return c.served(a)
	}
	c.misses.Add(1)
	return nil
}

// served counts a stale answer served and returns it.
func (c *Cache) served(a *answer) *answer {
	c.staleServed.Add(1)
	return a
}

// start returns value's lookup in flight, starting one if it is due: the
// answer in memory (if any) is past its refresh time, and the last failure
// (if any) is past its retry time. It returns nil when none is in flight
// nor due, or the cache is closed.
func (c *Cache) start(en *entry, value string, now int64) *flight {
	en.mu.Lock()
	defer en.mu.Unlock()
	if f := en.flight.Load(); f != nil {
		return f
	}
	if a := en.ans.Load(); a != nil && now < a.refresh {
		return nil // a lookup completed since the caller looked
	}
	if now < en.retryAt.Load() {
		return nil
	}
	if c.inFlight.Add(1) > c.maxLookups {
		c.inFlight.Add(-1)
		c.shed.Add(1)
		return nil
	}
	c.life.Lock()
	if c.closed {
		c.life.Unlock()
		c.inFlight.Add(-1)
		return nil
	}
	c.wg.Add(1)
	c.life.Unlock()
	f := &flight{done: make(chan struct{})}
	en.flight.Store(f)
	c.lookups.Add(1)
	go c.lookup(en, f, value)
	return f
}

// lookup runs f, value's lookup, stores its answer in en, and ends f.
func (c *Cache) lookup(en *entry, f *flight, value string) {
	defer c.wg.Done()
	defer c.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(c.ctx, c.lookupTimeout)
	e, found, err := c.call(ctx, value)
	cancel()
	now := c.now()
	en.mu.Lock()
	if err != nil {
		c.failures.Add(1)
		if c.onFailure != nil {
			c.onFailure(err)
		}
		en.failed.Store(true)
		en.retryAt.Store(now + c.retryAfter)
	} else {
		ttl := c.ttl
		if !found {
			e, ttl = Entitlement{}, c.negativeTTL
		}
		e.Source = c.name
		f.ans = newAnswer(value, e, found, now+ttl-ttl/5, now+ttl)
		en.ans.Store(f.ans)
		en.failed.Store(false)
		en.retryAt.Store(0)
	}
	f.err = err
	en.flight.Store(nil)
	en.mu.Unlock()
	close(f.done)
}

// call is src.Lookup, with a panic turned into an error: a lookup runs in
// a goroutine of its own, where a panic would end the process.
func (c *Cache) call(ctx context.Context, value string) (e Entitlement, found bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("entitle: lookup of %q panicked: %v", value, r)
		}
	}()
	return c.src.Lookup(ctx, value)
}

// insert returns value's entry in sh, adding it (and dropping another if
// sh is full) if there is none.
func (c *Cache) insert(sh *shard, value string, now int64) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if en := sh.m[value]; en != nil {
		return en
	}
	if len(sh.m) >= c.perShard {
		c.forget(sh, sh.victim())
	}
	en := &entry{}
	en.used.Store(now)
	sh.m[value] = en
	return en
}

// victim is the least recently used of a few entries of sh (the map's
// iteration starts at random). The caller holds sh.mu.
func (sh *shard) victim() string {
	victim, oldest, n := "", int64(0), 0
	for value, en := range sh.m {
		used := en.used.Load()
		if a := en.ans.Load(); a != nil {
			used = max(used, a.used.Load())
		}
		if n == 0 || used < oldest {
			victim, oldest = value, used
		}
		if n++; n == evictSample {
			break
		}
	}
	return victim
}

// forget drops value's entry from sh and from recent. The caller holds
// sh.mu for writing.
func (c *Cache) forget(sh *shard, value string) {
	if _, ok := sh.m[value]; !ok {
		return
	}
	c.recent[maphash.String(c.seed, value)&c.recentMask].drop(value)
	delete(sh.m, value)
}

// touch records a use of en at now, unless one was recorded lately.
func (en *entry) touch(now int64) {
	if now-en.used.Load() >= touchEvery {
		en.used.Store(now)
	}
}

// Invalidate forgets value's answer, so that the next Get looks it up
// again (after a change made at runtime, say). A lookup in flight still
// answers those waiting for it, but no longer fills the cache.
func (c *Cache) Invalidate(value string) {
	sh := &c.shards[maphash.String(c.seed, value)&c.mask]
	sh.mu.Lock()
	c.forget(sh, value)
	sh.mu.Unlock()
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	s := Stats{
		Lookups:  c.lookups.Load(),
		Failures: c.failures.Load(),
		Misses:   c.misses.Load(),
		Stale:    c.staleServed.Load(),
		Timeouts: c.timeouts.Load(),
		Shed:     c.shed.Load(),
	}
	for i := range c.shards {
		sh := &c.shards[i]
		s.Hits += sh.hits.Load()
		sh.mu.RLock()
		s.Entries += len(sh.m)
		sh.mu.RUnlock()
	}
	return s
}

// Close cancels the lookups in flight, waits for them to end, and closes
// the source. Gets after Close answer from memory only. It is safe to call
// more than once; only the first closes the source.
func (c *Cache) Close() error {
	c.life.Lock()
	if c.closed {
		c.life.Unlock()
		return nil
	}
	c.closed = true
	c.life.Unlock()
	c.cancel()
	c.wg.Wait()
	if err := c.src.Close(); err != nil {
		return fmt.Errorf("entitle: closing the source: %w", err)
	}
	return nil
}

// now is the time by Clock, in nanoseconds since the cache was made.
// Without a Clock it is the coarse clock (to tickEvery), which a hit reads
// for the cost of an atomic load (Get reads it so itself).
func (c *Cache) now() int64 {
	if c.clock == nil {
		return c.coarse.Load()
	}
	return int64(c.clock().Sub(c.epoch))
}
