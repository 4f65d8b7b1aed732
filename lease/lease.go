// Package lease decides most requests of a shared store in memory, without
// ever admitting more than the store's limits allow.
//
// A Store wraps a store.Leaser (the Redis store). The first time it sees a
// path (the buckets of one request) it decides it in the shared store as
// usual. When it sees the path again, it asks the store to decide the
// request and, in the same atomic step, to charge every bucket of the path
// a slice of further capacity, sized from the path's observed rate (Want:
// the requests expected in TTL), never more than MaxShare of what remains
// on any bucket, and none at all when a bucket has less than MinRemaining
// of its capacity left. The requests that follow are decided against that
// slice, in memory: a request whose cost fits what the lease has left on
// every bucket is admitted there and then; one that does not fit goes to the
// store, which gives back what the old lease left and grants a new one in
// the same call.
//
// A busy path far from its limits is not left to run out: the sweep renews
// its lease shortly before it ends (Sweep), the renewals of many paths in
// one round trip (store.Leaser.LeaseAll), each with no request of its own;
// the lease goes on being spent (until the renewal ends if need be: given
// back beneath its renewal, what it has left would be withheld), and the
// renewal takes over once it is spent. When both end, the renewal is given
// back first, then the lease, each the topmost when it goes.
//
// Leased capacity is charged in the store before it is spent, and spent
// only while its charge is still counted there (rate's "Leases" explains
// the draining of GCRA charges and the windows of calendar quotas), so the
// sum of what every instance admits never exceeds the limits: zero
// over-admission, by construction. What leases cost is under-admission:
// capacity one instance holds and does not use is not available to the
// others until its lease ends (after TTL, or when Close releases it) and
// gives back what is left. MaxShare bounds it, and MinRemaining turns it off
// near exhaustion, where every request is decided in the store again.
//
// Paths with a sliding-window limit are never leased (see rate): they are
// decided in the store, request by request, and so is a path for TTL after
// a grant that leased nothing (near exhaustion, or a bucket that refills
// too fast for the TTL). On a Redis Cluster, a path across slots is leased
// slot by slot (store.Redis.Lease). A denial always comes from the store, so its
// Retry-After is the store's. When a path's limits change (an override,
// the adaptive factor), its lease is given back and a new one is taken on
// the new limits; Reset and ResetMatching revoke the leases of the buckets
// they reset (this instance's: another instance's lease on a reset bucket
// runs to the end of its TTL).
package lease

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// Options configure a Store. Zero values take the defaults.
type Options struct {
	// MaxShare is the largest fraction of what remains on a bucket that
	// one lease may take (default 0.1).
	MaxShare float64
	// MinRemaining is the fraction of a bucket's capacity below which no
	// lease is granted on it: near exhaustion every request is decided in
	// the store (default 0.05).
	MinRemaining float64
	// TTL is how long a lease may be spent (a lease its renewal follows:
	// until the renewal's TTL ends), and the horizon of its sizing: a
	// lease is sized for the requests the path is expected to see in TTL
	// (default 1s).
	TTL time.Duration
	// MaxPaths bounds the paths tracked; beyond it new paths are decided in
	// the store until idle ones are forgotten (default 100,000).
	MaxPaths int
	// Clock is the local clock (µs), which times leases from when they
	// were asked for; tests inject one. Default: a monotonic clock (a wall
	// clock stepped back would make a lease outlive its units).
	Clock store.Clock
	// Sweep is how often ended leases are given back and busy paths'
	// leases renewed ahead of their end (default TTL/16, at least 10ms):
	// a lease is renewed 1 to 1¼ sweeps before it ends. A negative value
	// disables the background sweep (tests call Sweep themselves, as if
	// every TTL/16).
	Sweep time.Duration
	// Logger receives what cannot be returned (a failed release). Nil
	// discards it.
	Logger *zap.Logger
}

// Defaults.
const (
	DefaultMaxShare     = 0.1
	DefaultMinRemaining = 0.05
	DefaultTTL          = time.Second
	DefaultMaxPaths     = 100_000
	maxWant             = 1 << 20
)

// Validate reports options that cannot work.
func (o Options) Validate() error {
	switch {
	case o.MaxShare < 0 || o.MaxShare > 1:
		return fmt.Errorf("lease max_share must be in (0, 1], got %v", o.MaxShare)
	case o.MinRemaining < 0 || o.MinRemaining >= 1:
		return fmt.Errorf("lease min_remaining must be in [0, 1), got %v", o.MinRemaining)
	case o.TTL < 0:
		return fmt.Errorf("lease ttl must not be negative, got %v", o.TTL)
	case o.TTL > time.Minute:
		return fmt.Errorf("lease ttl %v is longer than a minute: capacity leased and unused is unavailable to other instances for that long", o.TTL)
	case o.MaxPaths < 0:
		return fmt.Errorf("lease max_paths must not be negative, got %d", o.MaxPaths)
	}
	return nil
}

const shards = 64

// Store decides paths on leases of a store.Leaser's capacity (see the
// package doc). It implements store.Store and store.Resetter; Close
// releases every lease and closes the inner store.
type Store struct {
	inner store.Leaser
	opts  Options
	seed  maphash.Seed
	ttl   int64 // µs
	// ahead is how long before its end a busy path's lease is renewed
	// by the sweep (µs): a sweep interval and a quarter, so that the last
	// sweep before the end renews it, a ticker late by a few ms included.
	ahead int64
	paths [shards]pathShard
	count atomic.Int64 // paths tracked

	// gen is bumped when a reset starts and when it ends (bump), and
	// marks keeps the latest bumps with the buckets each reset selects: a
	// grant in flight across a bump of a reset of one of its path's
	// buckets is not installed (its charge there may have been wiped); one
	// across resets of other buckets is. A grant begun and installed
	// within a reset is revoked when the reset ends.
	gen     atomic.Int64
	marksMu sync.Mutex
	marks   []resetMark // oldest first, at most maxMarks
	// resetting are the selections of this instance's resets under way
	// (from their first revoke to their last): nothing is queued to go
	// back to a bucket one of them selects, whose charges it may have
	// wiped already (see queue).
	resetting []*func(key string) bool

	pendingMu sync.Mutex
	pending   []store.Release // ended leases to give back

	// life is held for reading by every grant in flight; Close takes it
	// to wait for them, then sets closed (no grant starts after that).
	life   sync.RWMutex
	closed bool

	peersMu sync.Mutex
	peers   peers // the other instances, told of resets (peers.go)

	stats    counters
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	closeErr error
}

type pathShard struct {
	mu  sync.Mutex
	m   map[uint64]*path
	rec records // the shard's part of the reservation of lease records (records.go)
}

// path is one bucket path this instance has seen: its sizing and its lease.
type path struct {
	keys   []string
	limits []rate.Limit
	strict bool // never leased: decided in the store, request by request

	seen  int64 // requests since since
	since int64 // local µs
	want  int64 // the last lease's size, in requests
	used  int64 // local µs of the last request

	lease *held // nil: none
	// next is a renewal of the lease granted while the lease was still
	// being spent: it takes over when the lease is spent or ends (nil:
	// none; never without a lease).
	next     *held
	renewing chan struct{} // closed when the grant in flight is done; nil: none
	noRenew  bool          // the store cannot renew its lease ahead (store.ErrNotRenewable)
	// until is, after a grant that leased nothing (near exhaustion, or a
	// bucket refilling too fast for the TTL), when to try again: until
	// then the path is decided in the store, request by request, on the
	// store's cheaper (batched) path.
	until int64
}

// held is a lease: units per bucket, charged in the store.
type held struct {
	sent    int64 // local µs when the grant was sent (before the grant: so elapsed is never underestimated)
	expires int64 // local µs
	times   bool  // the buckets were granted at different times (a Cluster's slots)
	// ample is whether the lease was granted all the requests asked for,
	// and is small next to what remains on every bucket (at most a tenth
	// of MaxShare of it): no bucket is near its limit (see renewable).
	ample bool
	// buckets are the path's, in order: one run of records, so that a
	// request decided on the lease reads one stretch of memory. Nil once
	// the lease has ended (drop), so that a lease read after its end reads
	// nothing (spendOn panics) rather than records another lease now holds.
	buckets []leased
	from    *records // where buckets was carved (its shard's)
	at      int32    // and at which record (-1: an ordinary allocation)
	// limits are the limits the lease was charged on, bucket by bucket.
	limits []rate.Limit
}

// leased is what a lease holds on one bucket. It holds no pointers (see
// records.go).
type leased struct {
	cost   int64 // a request's cost, which the lease was sized in
	at     int64 // the store's time of the grant (a Cluster's masters each have theirs)
	stop   int64 // store time at which a calendar bucket's window ends (0: GCRA)
	units  float64
	used   float64     // spent or drained
	level  float64     // the bucket's level under the units (rate.Limit.LeaseDrained)
	result rate.Result // the grant's: what remained beyond the lease
}

// counters are the Store's statistics.
type counters struct {
	local, grants, leased, strict, releases, released atomic.Int64
	renewals, renewCalls                              atomic.Int64
	peerResets                                        atomic.Int64
}

// Stats are counts since the Store was made.
type Stats struct {
	// Local counts requests decided in memory on a lease.
	Local int64
	// Grants counts calls to the store that asked for a lease (each also
	// decides its request); Leased, those that were granted one.
	Grants, Leased int64
	// Strict counts requests decided in the store without a lease.
	Strict int64
	// Releases counts calls that gave back ended leases; Released, the
	// leases given back (with a grant or on their own).
	Releases, Released int64
	// Renewals counts the leases asked for ahead of a busy path's lease
	// ending (see Sweep), RenewCalls the calls that asked for them
	// (several each). Leased counts those granted too.
	Renewals, RenewCalls int64
	// PeerResets counts the resets other instances told of (see Connect).
	PeerResets int64
}

// StoreCalls is the number of calls to the store: grants, strict decisions,
// releases and renewals.
func (s Stats) StoreCalls() int64 { return s.Grants + s.Strict + s.Releases + s.RenewCalls }

// Stats returns the Store's counts.
func (s *Store) Stats() Stats {
	return Stats{
		Local: s.stats.local.Load(), Grants: s.stats.grants.Load(), Leased: s.stats.leased.Load(),
		Strict: s.stats.strict.Load(), Releases: s.stats.releases.Load(), Released: s.stats.released.Load(),
		Renewals: s.stats.renewals.Load(), RenewCalls: s.stats.renewCalls.Load(),
		PeerResets: s.stats.peerResets.Load(),
	}
}

// New returns a Store deciding on leases of inner's capacity. The Store owns
// inner: Close closes it.
func New(inner store.Leaser, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxShare == 0 {
		opts.MaxShare = DefaultMaxShare
	}
	if opts.MinRemaining == 0 {
		opts.MinRemaining = DefaultMinRemaining
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxPaths == 0 {
		opts.MaxPaths = DefaultMaxPaths
	}
	if opts.Clock == nil {
		opts.Clock = monotonic()
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Store{inner: inner, opts: opts, seed: maphash.MakeSeed(), ttl: opts.TTL.Microseconds(),
		stop: make(chan struct{}), done: make(chan struct{})}
	// One reservation, shared out among the shards.
	mem := make([]leased, reservedRecords(opts.MaxPaths))
	per := len(mem) / shards
	for i := range s.paths {
		s.paths[i].m = map[uint64]*path{}
		s.paths[i].rec.mem = mem[i*per : (i+1)*per : (i+1)*per]
	}
	sweep := opts.Sweep
	if sweep == 0 {
		sweep = max(opts.TTL/16, 10*time.Millisecond)
	}
	every := sweep
	if every < 0 { // the caller sweeps
		every = opts.TTL / 16
	}
	s.ahead = (every + every/4).Microseconds()
	if sweep > 0 {
		go s.sweepEvery(sweep)
	} else {
		close(s.done)
	}
	return s, nil
}

// monotonic returns a clock of µs that never steps back: the wall clock
// when it is made, plus the monotonic time since.
func monotonic() store.Clock {
	start := time.Now()
	base := start.UnixMicro()
	return func() int64 { return base + time.Since(start).Microseconds() }
}

// Inner is the store the leases are taken on.
func (s *Store) Inner() store.Leaser { return s.inner }

// Decide implements store.Store.
func (s *Store) Decide(ctx context.Context, buckets []store.Bucket) (store.Decision, error) {
	return s.DecideInto(ctx, buckets, nil)
}

// DecideInto is Decide writing a lease's results into buf when it is long
// enough (the engine reuses it from request to request).
func (s *Store) DecideInto(ctx context.Context, buckets []store.Bucket, buf []rate.Result) (store.Decision, error) {
	if len(buckets) == 0 {
		return s.inner.Decide(ctx, buckets)
	}
	h := s.hash(buckets)
	sh := &s.paths[h%shards]
	for attempt := 0; ; attempt++ {
		sh.mu.Lock()
		// The clock is read under the lock: a lease installed by another
		// request was sent before now, so its elapsed time is never negative.
		now := s.opts.Clock()
		p := sh.m[h]
		if p == nil || !p.same(buckets) {
			p = s.track(sh, h, buckets, now)
			if p == nil { // too many paths
				sh.mu.Unlock()
				return s.strict(ctx, buckets)
			}
		} else if !p.sameLimits(buckets) {
			s.retire(p)
			p.limits = limitsOf(buckets, nil) // a new slice: leases share the old (held.limits)
			p.want = 0
		}
		if attempt == 0 {
			p.seen++
		}
		p.used = now
		if p.strict {
			sh.mu.Unlock()
			return s.strict(ctx, buckets)
		}
		if d, ok := s.spend(p, buckets, now, buf); ok {
			sh.mu.Unlock()
			s.stats.local.Add(1)
			return d, nil
		}
		if p.renewing != nil {
			// Another request is taking the path's next lease: wait for
			// it once, then try it.
			wait := p.renewing
			sh.mu.Unlock()
			if attempt > 0 {
				return s.strict(ctx, buckets)
			}
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return store.Decision{}, fmt.Errorf("lease: waiting for the path's lease: %w: %w", store.ErrUnavailable, ctx.Err())
			}
		}
		want := s.size(p, now)
		if (want <= 1 || now < p.until) && p.lease == nil {
			sh.mu.Unlock()
			return s.strict(ctx, buckets)
		}
		if !s.life.TryRLock() { // closing
			sh.mu.Unlock()
			return s.strict(ctx, buckets)
		}
		if s.closed {
			s.life.RUnlock()
			sh.mu.Unlock()
			return s.strict(ctx, buckets)
		}
		release := s.end(p)
		done := make(chan struct{})
		p.renewing = done
		gen := s.gen.Load()
		sh.mu.Unlock()
		defer s.life.RUnlock()
		return s.grant(ctx, sh, p, buckets, want, release, gen, done)
	}
}

// grant asks the store to decide buckets and lease want requests' worth,
// giving back release in the same call, and installs the lease.
func (s *Store) grant(ctx context.Context, sh *pathShard, p *path, buckets []store.Bucket, want int64, release []store.Release, gen int64, done chan struct{}) (store.Decision, error) {
	sent := s.opts.Clock()
	s.stats.grants.Add(1)
	l, err := s.inner.Lease(ctx, s.grantOf(buckets, want, release, false))
	d, err := s.install(sh, p, buckets, want, l, err, release, gen, sent, done, false)
	if errors.Is(err, store.ErrNotLeasable) {
		// Refused before any call: the path is decided in the store from
		// now on.
		return s.strict(ctx, buckets)
	}
	return d, err
}

func (s *Store) grantOf(buckets []store.Bucket, want int64, release []store.Release, renew bool) store.Grant {
	return store.Grant{
		Buckets: buckets, Want: want, MaxShare: s.opts.MaxShare, MinRemaining: s.opts.MinRemaining,
		Hold: s.opts.TTL, Release: release, Renew: renew,
	}
}

// install takes the store's answer to a grant on p sent at sent (a
// request's, or a renewal's), installing the lease unless a reset or a
// change of limits came while it was in flight; a renewal's follows the
// path's lease if it is still being spent. It returns the grant's
// decision (a renewal's is no request's).
func (s *Store) install(sh *pathShard, p *path, buckets []store.Bucket, want int64, l store.Leased, err error,
	release []store.Release, gen, sent int64, done chan struct{}, renewal bool) (store.Decision, error) {
	sh.mu.Lock()
	p.renewing = nil
	close(done)
	if notLeasable, notRenewable := errors.Is(err, store.ErrNotLeasable), errors.Is(err, store.ErrNotRenewable); notLeasable || notRenewable {
		// Refused before any call: the path is decided in the store from
		// now on (not leasable), or its next request takes its next lease
		// (a renewal across Cluster slots); the old lease is given back on
		// its own.
		p.strict = p.strict || notLeasable
		p.noRenew = true
		if len(release) > 0 {
			s.stats.released.Add(1)
			s.queue(release)
		}
		sh.mu.Unlock()
		return store.Decision{}, err
	}
	defer sh.mu.Unlock()
	if err != nil {
		// The releases may or may not have been applied (a reply lost
		// after the script ran): they are not sent again, since giving
		// back twice would over-admit. What they held stays charged until
		// it drains or its window ends.
		return store.Decision{}, err
	}
	if len(release) > 0 {
		s.stats.released.Add(1) // one lease, however many buckets
	}
	p.want = want
	if l.Extra == 0 {
		p.until = sent + s.ttl
		return l.Decision, nil
	}
	s.stats.leased.Add(1)
	same := p.sameLimits(buckets)
	limits := p.limits // never written in place: the lease shares it
	if !same {
		limits = limitsOf(buckets, nil) // given back at once, below
	}
	h := &held{sent: sent, expires: sent + s.ttl, from: &sh.rec, limits: limits,
		ample: l.Extra >= want || (l.Extra == want-1 && !renewal)}
	h.buckets, h.at = sh.rec.get(len(buckets))
	for i, b := range buckets {
		// The decision's results are handed to the caller: the lease keeps
		// its own copy.
		lb := leased{cost: b.Cost, at: l.ChargedAt(i), units: float64(l.Extra * b.Cost), level: l.Levels[i], result: l.Results[i]}
		if l.Units != nil {
			lb.units = float64(l.Units[i])
		}
		if b.Limit.Algorithm == rate.Calendar {
			_, lb.stop = b.Limit.Window(lb.at)
		}
		if i > 0 && lb.at != h.buckets[0].at {
			h.times = true
		}
		if b.Cost > 0 && lb.units > s.opts.MaxShare/10*float64(lb.result.Remaining) {
			h.ample = false
		}
		h.buckets[i] = lb
	}
	switch reset := s.resetSince(gen, p.keys); {
	case reset != nil:
		// A reset of some of the path's buckets ran while the grant was
		// in flight: its charge there may have been wiped, and the
		// capacity it leased with it, or not. It is not spent, nor given
		// back there (giving back what a reset wiped would over-admit;
		// what it holds stays charged until it drains); what it holds on
		// the path's other buckets goes back.
		s.queue(slices.DeleteFunc(h.release(p.keys), func(r store.Release) bool { return reset(r.Key) }))
		h.drop()
	case !same || p.strict || (p.lease != nil && !renewal):
		// The path's limits changed while the grant was in flight (an
		// override, the adaptive factor): the lease is on the old ones,
		// and goes back at once.
		s.giveBack(h, p.keys)
	case p.lease != nil:
		p.next = h // a renewal, while the lease it follows is spent
	default:
		p.lease = h
	}
	return l.Decision, nil
}

// DecideUnleased decides buckets in the store, without a lease: for a
// request whose charge may be refunded (a reconciled cost), since a refund
// cannot reach beneath a lease taken after its charge (see rate's Leases).
func (s *Store) DecideUnleased(ctx context.Context, buckets []store.Bucket) (store.Decision, error) {
	return s.strict(ctx, buckets)
}

// strict decides buckets in the store, without a lease.
func (s *Store) strict(ctx context.Context, buckets []store.Bucket) (store.Decision, error) {
	s.stats.strict.Add(1)
	return s.inner.Decide(ctx, buckets)
}

// spend decides buckets on p's lease, if it has one that covers every
// bucket's cost now. The caller holds the path's shard lock.
func (s *Store) spend(p *path, buckets []store.Bucket, now int64, buf []rate.Result) (store.Decision, bool) {
	for {
		d, ok := s.spendOn(p.lease, buckets, now, buf, p.next)
		if ok || p.next == nil || now >= p.next.expires {
			// Decided, or no lease left to decide on: ended ones go back
			// together, the renewal first (end), with the path's
			// next grant or by the sweep.
			return d, ok
		}
		// The lease cannot pay for the request (spent, or what is left is
		// less than its cost): its renewal takes over, and what it left
		// goes back (beneath the renewal: withheld until it drains).
		s.giveBack(p.lease, p.keys)
		p.lease, p.next = p.next, nil
	}
}

// spendOn decides buckets on lease l, if it covers every bucket's cost now.
// While a renewal follows it, the lease is spent until the renewal ends
// (what it has left is drained or spent): given back beneath the renewal,
// it would be withheld.
func (s *Store) spendOn(l *held, buckets []store.Bucket, now int64, buf []rate.Result, next *held) (store.Decision, bool) {
	if l == nil {
		return store.Decision{}, false
	}
	if end := l.expires; now >= end && (next == nil || now >= next.expires) {
		return store.Decision{}, false
	}
	elapsed := now - l.sent // since the grant, never underestimated
	for i, b := range buckets {
		// A bucket the request does not charge needs nothing of the
		// lease (it may hold none there).
		if b.Cost > 0 && float64(b.Cost) > l.buckets[i].avail(b.Limit, elapsed) {
			return store.Decision{}, false
		}
	}
	results := buf
	if cap(results) < len(buckets) {
		results = make([]rate.Result, len(buckets))
	}
	results = results[:len(buckets)]
	for i, b := range buckets {
		lb := &l.buckets[i]
		avail := lb.avail(b.Limit, elapsed)
		if b.Cost > 0 {
			lb.used = lb.units - avail + float64(b.Cost)
			avail -= float64(b.Cost)
		}
		left := max(0, int64(avail))
		g := lb.result
		results[i] = rate.Result{
			Allowed:   true,
			Remaining: g.Remaining + left,
			Before:    g.Remaining + left + b.Cost,
			Reset:     max(0, g.Reset-elapsed),
		}
	}
	d := store.Decision{Allowed: true, Results: results, At: l.buckets[len(l.buckets)-1].at + elapsed}
	if l.times {
		d.Times = make([]int64, len(l.buckets))
		for i, lb := range l.buckets {
			d.Times[i] = lb.at + elapsed
		}
	}
	return d, true
}

// avail is what the lease has left on the bucket elapsed µs after its
// grant: the units neither spent nor drained, none once a calendar window
// has ended.
func (lb *leased) avail(limit rate.Limit, elapsed int64) float64 {
	at := lb.at + elapsed // the store's time
	if lb.stop != 0 && at >= lb.stop {
		return 0
	}
	return lb.units - math.Max(lb.used, limit.LeaseDrained(lb.at, lb.level, at))
}

// end ends p's lease and its renewal, and returns what they give back
// (nil: nothing): the renewal's first, so that each is the topmost when
// the store applies it (see retire). The caller holds the path's shard
// lock.
func (s *Store) end(p *path) []store.Release {
	var out []store.Release
	for _, l := range []*held{p.next, p.lease} {
		if l != nil {
			out = append(out, l.release(p.keys)...)
			l.drop()
		}
	}
	p.lease, p.next = nil, nil
	return out
}

// drop gives the lease's records back to its shard's reservation. The
// caller holds that shard's lock, and the lease is no longer read.
func (l *held) drop() {
	if l.buckets != nil {
		l.from.put(l.at, len(l.buckets))
		l.buckets = nil
	}
}

// requestsLeft is how many requests of the costs it was granted for the
// lease can still decide at local time now (on its tightest bucket).
func (l *held) requestsLeft(now int64) int64 {
	left := int64(math.MaxInt64)
	for i, lb := range l.buckets {
		if lb.cost > 0 {
			left = min(left, int64(lb.avail(l.limits[i], now-l.sent)/float64(lb.cost)))
		}
	}
	return max(left, 0)
}

// release returns what the lease on keys gives back when it ends, on the
// limits it was charged on (nil: nothing).
func (l *held) release(keys []string) []store.Release {
	var out []store.Release
	for i, lb := range l.buckets {
		if left := lb.units - lb.used; left >= 1 {
			out = append(out, store.Release{
				Bucket: store.Bucket{Key: keys[i], Limit: l.limits[i], Charged: lb.at},
				Offset: lb.level + lb.used, Units: left,
			})
		}
	}
	return out
}

// retire ends p's lease and its renewal, queueing what they give back.
// The caller holds the path's shard lock.
func (s *Store) retire(p *path) {
	for _, l := range []*held{p.next, p.lease} {
		if l != nil {
			s.giveBack(l, p.keys)
		}
	}
	p.lease, p.next = nil, nil
}

// endExpired ends p's lease if its TTL is over (its renewal taking over),
// and the renewal too if its TTL is over. The caller holds the path's
// shard lock.
func (s *Store) endExpired(p *path, now int64) {
	switch {
	case p.next != nil && now >= p.next.expires:
		s.retire(p)
	case p.next == nil && p.lease != nil && now >= p.lease.expires:
		s.giveBack(p.lease, p.keys)
		p.lease = nil
	}
}

// giveBack ends lease l on keys, queueing what it gives back, if anything.
// The caller holds the lease's shard lock.
func (s *Store) giveBack(l *held, keys []string) {
	if r := l.release(keys); len(r) > 0 {
		s.stats.released.Add(1)
		s.queue(r)
	}
	l.drop()
}

func (s *Store) queue(r []store.Release) {
	r = s.notResetting(r)
	if len(r) == 0 {
		return
	}
	s.pendingMu.Lock()
	s.pending = append(s.pending, r...)
	s.pendingMu.Unlock()
}

// size is how many requests the path's next lease should cover (see
// expected), and starts counting the path's rate afresh. The caller holds
// the path's shard lock.
func (s *Store) size(p *path, now int64) int64 {
	want := s.expected(p, now)
	p.seen, p.since = 0, now
	return want
}

// expected is how many requests the path's next lease should cover: its
// rate since the last lease times TTL, growing at most fourfold from one
// lease to the next. The caller holds the path's shard lock.
func (s *Store) expected(p *path, now int64) int64 {
	want := int64(math.Ceil(p.seenIn(s.ttl, now)))
	want = min(want, max(4*p.want, 4), maxWant)
	return max(want, 1)
}

// seenIn is how many requests the path sees in window µs at its rate since
// its last lease. The caller holds the path's shard lock.
func (p *path) seenIn(window, now int64) float64 {
	elapsed := max(now-p.since, 1000) // at least 1ms: two requests at once are not an infinite rate
	return float64(p.seen) * float64(window) / float64(elapsed)
}

// track starts tracking a path (replacing whatever hashed the same), or
// returns nil when MaxPaths are tracked. The caller holds the shard lock.
func (s *Store) track(sh *pathShard, h uint64, buckets []store.Bucket, now int64) *path {
	if old := sh.m[h]; old != nil {
		if old.renewing != nil {
			return nil // a collision whose grant is in flight: leave it be
		}
		s.retire(old)
	} else if s.count.Load() >= int64(s.opts.MaxPaths) {
		return nil
	} else {
		s.count.Add(1)
	}
	// seen starts below zero: the first request is not counted, it starts
	// the clock (a rate needs two requests).
	p := &path{keys: make([]string, len(buckets)), since: now, seen: -1}
	// The keys are kept in one string, which every request of the path
	// compares its own with: one stretch of memory, not one per key.
	var all strings.Builder
	for _, b := range buckets {
		all.WriteString(b.Key)
	}
	joined, off := all.String(), 0
	for i, b := range buckets {
		p.keys[i] = joined[off : off+len(b.Key)]
		off += len(b.Key)
		if !b.Limit.Leasable() {
			p.strict = true
		}
		for _, o := range buckets[:i] {
			if o.Key == b.Key {
				p.strict = true
			}
		}
	}
	p.limits = limitsOf(buckets, nil)
	sh.m[h] = p
	return p
}

func limitsOf(buckets []store.Bucket, dst []rate.Limit) []rate.Limit {
	for _, b := range buckets {
		dst = append(dst, b.Limit)
	}
	return dst
}

func (p *path) same(buckets []store.Bucket) bool {
	if len(p.keys) != len(buckets) {
		return false
	}
	for i, b := range buckets {
		if p.keys[i] != b.Key {
			return false
		}
	}
	return true
}

func (p *path) sameLimits(buckets []store.Bucket) bool {
	for i, b := range buckets {
		if p.limits[i] != b.Limit {
			return false
		}
	}
	return true
}

// hash identifies a path by its keys.
func (s *Store) hash(buckets []store.Bucket) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	for _, b := range buckets {
		h.WriteString(b.Key)
		h.WriteByte(0)
	}
	return h.Sum64()
}

// Sweep ends the leases whose TTL is over and gives back what they left,
// forgets paths idle for ten TTLs, sends what is queued to the store, and
// renews the leases of busy paths about to end (see renew).
func (s *Store) Sweep(ctx context.Context) {
	now := s.opts.Clock()
	var ending []pathOf
	for i := range s.paths {
		sh := &s.paths[i]
		sh.mu.Lock()
		for h, p := range sh.m {
			s.endExpired(p, now)
			if p.lease == nil && p.renewing == nil && now-p.used > 10*s.ttl {
				delete(sh.m, h)
				s.count.Add(-1)
			}
			if s.renewable(p, now) {
				ending = append(ending, pathOf{sh, p})
			}
		}
		sh.mu.Unlock()
	}
	s.flush(ctx)
	s.renew(ctx, ending)
}

// renewable says whether p's lease is to be renewed now: the path is busy
// (a request within the last sweep or so), has ample headroom (its lease
// was granted in full, and is small next to what remains), and its lease
// ends before the next sweep — its TTL, or its units spent at the path's
// rate since its last lease. Near a limit a renewal would hold capacity
// others may need, and what a lease leaves when its renewal follows may be
// given back beneath another instance's later lease (withheld until it
// drains): such paths take their next lease when a request needs it. The
// caller holds p's shard lock.
func (s *Store) renewable(p *path, now int64) bool {
	l := p.lease
	if l == nil || !l.ample || p.next != nil || p.renewing != nil || p.strict || p.noRenew || now-p.used > s.ahead {
		return false
	}
	if l.expires-now <= s.ahead {
		return true
	}
	return float64(l.requestsLeft(now)) <= p.seenIn(s.ahead, now)
}

// pathOf is a path and its shard.
type pathOf struct {
	sh *pathShard
	p  *path
}

// renewBatch bounds the renewals sent together: a Redis script runs alone,
// and a path whose lease runs out while its renewal is on the wire waits
// for it.
const renewBatch = 32

// renew takes the next lease of each busy path whose lease is about to
// end, renewBatch paths at a time in one LeaseAll call (one round trip):
// each renewal leases the requests the path is expected to see in TTL
// beyond what its lease still has, with no request of its own
// (store.Grant's Renew). A path's requests would otherwise find its lease
// spent or ended and take the next one themselves, one call each, waiting
// for it; now they rarely do. The lease is not given back: it is charged
// beneath its renewal, where a give-back would be withheld (see rate's
// Leases), so it goes on being spent, until the renewal ends if need be
// (spendOn), and the renewal takes over once it is spent.
func (s *Store) renew(ctx context.Context, ending []pathOf) {
	for len(ending) > 0 {
		batch := ending[:min(len(ending), renewBatch)]
		ending = ending[len(batch):]
		if !s.life.TryRLock() { // closing
			return
		}
		if s.closed {
			s.life.RUnlock()
			return
		}
		s.renewBatch(ctx, batch)
		s.life.RUnlock()
	}
}

// renewBatch renews the leases of batch that still need it. The caller
// holds life for reading.
func (s *Store) renewBatch(ctx context.Context, batch []pathOf) {
	type renewal struct {
		sh      *pathShard
		p       *path
		buckets []store.Bucket
		want    int64
		gen     int64
		done    chan struct{}
	}
	var rs []renewal
	var grants []store.Grant
	for _, b := range batch {
		sh, p := b.sh, b.p
		sh.mu.Lock()
		now := s.opts.Clock()
		if !s.renewable(p, now) { // spent, ended or renewed by a request since
			sh.mu.Unlock()
			continue
		}
		// The lease goes on being spent while its renewal is in flight,
		// and until it is spent or ends: the renewal covers the requests
		// expected in TTL beyond what the lease has left.
		want := s.expected(p, now) - p.lease.requestsLeft(now)
		if want <= 1 {
			sh.mu.Unlock()
			continue
		}
		s.size(p, now) // counting afresh
		r := renewal{sh: sh, p: p, want: want, buckets: make([]store.Bucket, len(p.keys)),
			gen: s.gen.Load(), done: make(chan struct{})}
		for i, lb := range p.lease.buckets {
			r.buckets[i] = store.Bucket{Key: p.keys[i], Limit: p.limits[i], Cost: lb.cost}
		}
		p.renewing = r.done
		sh.mu.Unlock()
		rs = append(rs, r)
		grants = append(grants, s.grantOf(r.buckets, r.want, nil, true))
	}
	if len(rs) == 0 {
		return
	}
	sent := s.opts.Clock()
	s.stats.renewCalls.Add(1)
	s.stats.renewals.Add(int64(len(rs)))
	leased, errs := s.inner.LeaseAll(ctx, grants)
	failed := 0
	for i, r := range rs {
		if _, err := s.install(r.sh, r.p, r.buckets, r.want, leased[i], errs[i], nil, r.gen, sent, r.done, true); err != nil {
			failed++
		}
	}
	if failed > 0 {
		s.opts.Logger.Debug("renewing leases ahead failed; the paths' next requests take their next leases",
			zap.Int("failed", failed), zap.Int("renewals", len(rs)), zap.Error(errors.Join(errs...)))
	}
}

// flushChunk bounds the releases of one call: a Redis script runs alone,
// so one giving back thousands of buckets would hold up every decision.
const flushChunk = 256

// flush sends the queued releases to the store, flushChunk buckets per
// call (one call per Cluster slot).
func (s *Store) flush(ctx context.Context) {
	s.pendingMu.Lock()
	r := s.pending
	s.pending = nil
	s.pendingMu.Unlock()
	for len(r) > 0 {
		chunk := r[:min(len(r), flushChunk)]
		r = r[len(chunk):]
		s.stats.releases.Add(1)
		if err := s.inner.Release(ctx, chunk); err != nil {
			// Not sent again: it may have been applied. What it held stays
			// charged until it drains (under-admission, never over).
			s.opts.Logger.Warn("giving back unused lease capacity failed; it stays charged until it drains",
				zap.Int("buckets", len(chunk)), zap.Error(err))
		}
	}
}

func (s *Store) sweepEvery(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(context.Background())
		}
	}
}

// revoke ends every lease on a path holding a selected key, and drops
// what is queued for those keys: the buckets are being reset, and a
// give-back would land in the fresh bucket. What such a lease holds on the
// path's other buckets (an organisation's, when a user is reset) is given
// back as when it ends.
func (s *Store) revoke(selected func(key string) bool) {
	s.pendingMu.Lock()
	kept := s.pending[:0]
	for _, r := range s.pending {
		if !selected(r.Key) {
			kept = append(kept, r)
		}
	}
	clear(s.pending[len(kept):])
	s.pending = kept
	s.pendingMu.Unlock()
	var back []store.Release
	for i := range s.paths {
		sh := &s.paths[i]
		sh.mu.Lock()
		for _, p := range sh.m {
			if p.lease == nil || !slices.ContainsFunc(p.keys, selected) {
				continue
			}
			for _, r := range s.end(p) {
				if !selected(r.Key) {
					back = append(back, r)
				}
			}
		}
		sh.mu.Unlock()
	}
	s.queue(back)
}

// Adjust implements store.Store: corrections go to the store as they are.
func (s *Store) Adjust(ctx context.Context, buckets []store.Bucket) error {
	return s.inner.Adjust(ctx, buckets)
}

// Reset implements store.Resetter: this instance's leases on the keys end
// (the store's buckets are reset, and their charges with them).
func (s *Store) Reset(ctx context.Context, keys []string) (int, error) {
	rs, ok := s.inner.(store.Resetter)
	if !ok {
		return 0, errors.New("lease: the store cannot reset buckets")
	}
	set := make(map[string]bool, len(keys))
	for _, k := range keys {
		set[k] = true
	}
	return s.reset(keys, "", func(k string) bool { return set[k] }, func() (int, error) { return rs.Reset(ctx, keys) })
}

// resetMark is one bump of Store.gen by a reset: the buckets it selects.
type resetMark struct {
	gen      int64
	selected func(key string) bool
}

// maxMarks is how many bumps Store.marks keeps: two per reset. A grant in
// flight across more (resets in a burst) is taken as reset on every
// bucket.
const maxMarks = 64

// bump moves gen for a reset of the selected buckets (see grant).
func (s *Store) bump(selected func(key string) bool) {
	s.marksMu.Lock()
	defer s.marksMu.Unlock()
	if len(s.marks) == maxMarks {
		s.marks = append(s.marks[:0], s.marks[1:]...)
	}
	s.marks = append(s.marks, resetMark{gen: s.gen.Add(1), selected: selected})
}

// resetSince returns which of keys a reset selected since gen was read
// (nil: none), as a function of the key.
func (s *Store) resetSince(gen int64, keys []string) func(key string) bool {
	if s.gen.Load() == gen {
		return nil
	}
	s.marksMu.Lock()
	defer s.marksMu.Unlock()
	if len(s.marks) == 0 || s.marks[0].gen > gen+1 {
		return func(string) bool { return true } // not all kept: every one
	}
	var since []func(string) bool
	for _, m := range s.marks {
		if m.gen > gen && slices.ContainsFunc(keys, m.selected) {
			since = append(since, m.selected)
		}
	}
	if since == nil {
		return nil
	}
	return func(key string) bool {
		return slices.ContainsFunc(since, func(selected func(string) bool) bool { return selected(key) })
	}
}

// notResetting is r without the releases of buckets a reset under way
// selects (see Store.resetting). A release queued before such a reset
// began is dropped by its first revoke.
func (s *Store) notResetting(r []store.Release) []store.Release {
	s.marksMu.Lock()
	defer s.marksMu.Unlock()
	if len(s.resetting) == 0 {
		return r
	}
	return slices.DeleteFunc(r, func(x store.Release) bool {
		return slices.ContainsFunc(s.resetting, func(selected *func(string) bool) bool { return (*selected)(x.Key) })
	})
}

// reset revokes this instance's leases on the selected keys around the
// store's reset: before it, so no lease is spent on a reset bucket, and
// after it, in case a grant in flight was installed meanwhile; no grant
// in flight during it on a path with a selected bucket is installed (see
// grant); and while it is under way nothing is queued to go back to the
// selected buckets (see queue).
//
// The other instances are told once the store's reset returned (failed
// too: some buckets may have been reset), so that they revoke theirs.
func (s *Store) reset(keys []string, glob string, selected func(key string) bool, inner func() (int, error)) (int, error) {
	under := &selected
	s.marksMu.Lock()
	s.resetting = append(s.resetting, under)
	s.marksMu.Unlock()
	s.bump(selected)
	defer func() {
		s.bump(selected)
		s.revoke(selected)
		s.marksMu.Lock()
		s.resetting = slices.DeleteFunc(s.resetting, func(r *func(string) bool) bool { return r == under })
		s.marksMu.Unlock()
		s.announceReset(keys, glob)
	}()
	s.revoke(selected)
	return inner()
}

// ResetMatching implements store.Resetter.
func (s *Store) ResetMatching(ctx context.Context, m store.KeyMatch) (int, error) {
	rs, ok := s.inner.(store.Resetter)
	if !ok {
		return 0, errors.New("lease: the store cannot reset buckets")
	}
	return s.reset(nil, m.Glob, m.Match, func() (int, error) { return rs.ResetMatching(ctx, m) })
}

// Close waits for the grants in flight, gives back every lease (waiting at
// most the inner store's timeout) and closes the inner store. Requests
// decided after Close go to the store.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.life.Lock()
		s.closed = true
		s.life.Unlock()
		close(s.stop)
		<-s.done
		for i := range s.paths {
			sh := &s.paths[i]
			sh.mu.Lock()
			for _, p := range sh.m {
				s.retire(p)
			}
			sh.mu.Unlock()
		}
		s.flush(context.Background())
		s.closeErr = s.inner.Close()
	})
	return s.closeErr
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Resetter = (*Store)(nil)
)
