package store

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// A Leaser is a store that can lease capacity: decide a request and, in
// the same atomic step, charge every bucket of its path a slice of further
// capacity that the caller then spends on later requests of the same path
// without asking (package lease does the spending). See rate's "Leases"
// for why leased capacity is never admitted twice.
type Leaser interface {
	Store
	// Lease gives back the releases' unspent, undrained units, then
	// decides g.Buckets as Decide does and, if it admits them, charges
	// each bucket Extra times its cost more, for the largest Extra below
	// g.Want that rate.Limit.LeaseExtra allows on every bucket (0: no
	// lease). All in one atomic step (on a Redis Cluster, one per slot of
	// the path, see Redis.Lease).
	Lease(ctx context.Context, g Grant) (Leased, error)
	// LeaseAll is Lease for several grants sent together (renewals, which
	// no request waits for): each is applied in turn as if on its own (the
	// Redis store applies those of a slot in one script: together atomic),
	// and has its own answer or error, in order. A renewal of a path across
	// Redis Cluster slots is refused with ErrNotRenewable.
	LeaseAll(ctx context.Context, gs []Grant) ([]Leased, []error)
	// Release gives back what leases left unspent (and undrained), in one
	// step per Cluster slot.
	Release(ctx context.Context, r []Release) error
}

// ErrNotLeasable is Lease's answer for a path it cannot lease: decide it
// with Decide.
var ErrNotLeasable = errors.New("path cannot be leased")

// ErrNotRenewable is LeaseAll's answer for a renewal it cannot make (a path
// across Redis Cluster slots): its lease ends, and the path's next request
// takes the next one with Lease.
var ErrNotRenewable = errors.New("lease cannot be renewed ahead")

// Grant asks Lease for a decision and a lease on the same path.
type Grant struct {
	// Buckets are the request's path and costs, as Decide takes them.
	// Every limit must be Leasable and every key distinct.
	Buckets []Bucket
	// Want is how many requests of this cost the lease should cover, the
	// deciding one included: Extra is at most Want − 1.
	Want int64
	// Renew asks for a lease with no request of its own, to follow one
	// about to end: the decision charges nothing (it only says whether the
	// buckets could admit a request), and Extra is at most Want.
	Renew bool
	// MaxShare bounds Extra on each bucket to this fraction of what
	// remains after the request (padding included); below MinRemaining (a
	// fraction of its capacity) remaining, a bucket grants no lease at all.
	MaxShare, MinRemaining float64
	// Hold is how long the leased units must last: a GCRA bucket is
	// padded (rate.Limit.LeasePad) so that none drains sooner.
	Hold time.Duration
	// Release are leases given back first, in the same atomic step (the
	// previous lease of the path, when the new one replaces it).
	Release []Release
}

// Release gives back the unspent part of a lease on one bucket.
type Release struct {
	// Key and Limit name the bucket, Charged is when the lease was
	// charged (its Leased.At): Cost is not used.
	Bucket
	// Offset is the bucket's level under the unspent units (the lease's
	// Levels entry plus the units spent or drained since), Units the
	// unspent units (see rate.Limit.LeaseRefund).
	Offset, Units float64
}

// Leased is Lease's answer.
type Leased struct {
	Decision
	// Extra is how many more requests of the same cost the lease covers
	// on every bucket (0: none; always 0 on a denial).
	Extra int64
	// Levels are, for each bucket, its GCRA level under the leased units
	// (after the request's own charge and the padding): the leased units
	// sit on top of it, and drain after it (rate.Limit.LeaseDrained).
	Levels []float64
	// Pads are, for each bucket, the padding charged under the leased
	// units (rate.Limit.LeasePad; 0 without a lease).
	Pads []int64
	// Units, when not nil, are the units leased on each bucket; nil means
	// Extra times the bucket's cost. (A path across Cluster slots is
	// leased slot by slot: a slot may lease more than the path can use.)
	Units []int64
}

// Lease implements Leaser for the memory store. Package lease does not need
// it in production (the memory store decides in memory already); it is
// here so that one conformance suite checks both stores' leases.
func (m *Memory) Lease(_ context.Context, g Grant) (Leased, error) {
	if err := checkGrant(g); err != nil {
		return Leased{}, err
	}
	hashes := m.hashesOf(g.Buckets, nil)
	for _, r := range g.Release {
		hashes = append(hashes, maphash.String(m.seed, r.Key))
	}
	locked := m.lock(hashes, nil)
	defer m.unlock(locked)
	now := m.clock()
	m.releaseLocked(g.Release, hashes[len(g.Buckets):], now)

	n := len(g.Buckets)
	next := make([]rate.State, n)
	results := make([]rate.Result, n)
	allowed := true
	for i, b := range g.Buckets {
		cost := b.Cost
		if g.Renew {
			cost = 0
		}
		next[i], results[i] = b.Limit.Apply(m.stateOf(hashes[i], b.Key, now), now, cost)
		allowed = allowed && results[i].Allowed
	}
	out := Leased{Levels: make([]float64, n), Pads: make([]int64, n)}
	if allowed {
		extra := g.Want - 1
		if g.Renew {
			extra = g.Want
		}
		pads := out.Pads
		for i, b := range g.Buckets {
			if b.Cost > 0 {
				pads[i] = b.Limit.LeasePad(next[i].A, g.Hold.Microseconds())
			}
			extra = b.Limit.LeaseExtra(results[i].Remaining, pads[i], b.Cost, extra, g.MaxShare, g.MinRemaining)
		}
		if extra > 0 {
			leased := make([]rate.State, n)
			after := make([]rate.Result, n)
			for i, b := range g.Buckets {
				out.Levels[i] = next[i].A + float64(pads[i])
				leased[i], after[i] = b.Limit.Apply(next[i], now, pads[i]+extra*b.Cost)
				if b.Cost > 0 {
					leased[i] = b.Limit.LeaseGranted(leased[i])
				}
				if !after[i].Allowed { // cannot happen: LeaseExtra fits what remains
					extra = 0
					break
				}
			}
			if extra > 0 {
				copy(next, leased)
				for i := range results {
					results[i].Remaining, results[i].Reset = after[i].Remaining, after[i].Reset
				}
			} else {
				clear(out.Levels)
				clear(out.Pads)
			}
		}
		if extra <= 0 {
			clear(out.Pads)
		}
		out.Extra = max(extra, 0)
		for i, b := range g.Buckets {
			m.store(hashes[i], b, next[i], now)
		}
	}
	out.Decision = Combine(results)
	out.At = now
	return out, nil
}

// LeaseAll implements Leaser: Lease, grant by grant.
func (m *Memory) LeaseAll(ctx context.Context, gs []Grant) ([]Leased, []error) {
	out, errs := make([]Leased, len(gs)), make([]error, len(gs))
	for i, g := range gs {
		out[i], errs[i] = m.Lease(ctx, g)
	}
	return out, errs
}

// Release implements Leaser.
func (m *Memory) Release(_ context.Context, r []Release) error {
	if err := checkReleases(r); err != nil {
		return err
	}
	hashes := make([]uint64, len(r))
	for i := range r {
		hashes[i] = maphash.String(m.seed, r[i].Key)
	}
	locked := m.lock(hashes, nil)
	defer m.unlock(locked)
	m.releaseLocked(r, hashes, m.clock())
	return nil
}

// releaseLocked gives back what each release's lease left unspent and
// undrained. The caller holds the keys' shard locks.
func (m *Memory) releaseLocked(r []Release, hashes []uint64, now int64) {
	for i, rel := range r {
		s := m.stateOf(hashes[i], rel.Key, now)
		m.store(hashes[i], rel.Bucket, rel.Limit.LeaseGiveBack(s, now, rel.Charged, rel.Offset, rel.Units), now)
	}
}

// checkGrant refuses what no store can lease.
func checkGrant(g Grant) error {
	if len(g.Buckets) == 0 {
		return errors.New("lease: no buckets")
	}
	if g.Want < 1 {
		return fmt.Errorf("lease: want %d requests, at least 1", g.Want)
	}
	if err := checkReleases(g.Release); err != nil {
		return err
	}
	for i, b := range g.Buckets {
		if !b.Limit.Leasable() {
			return fmt.Errorf("lease: %s limit of %q: %w", b.Limit.Algorithm, b.Key, ErrNotLeasable)
		}
		for _, o := range g.Buckets[:i] {
			if o.Key == b.Key {
				return fmt.Errorf("lease: key %q twice on one path: %w", b.Key, ErrNotLeasable)
			}
		}
	}
	return nil
}

var _ Leaser = (*Memory)(nil)

// checkReleases refuses to give back a lease no store could have granted.
func checkReleases(r []Release) error {
	for _, rel := range r {
		if !rel.Limit.Leasable() {
			return fmt.Errorf("lease: giving back a %s limit of %q: %w", rel.Limit.Algorithm, rel.Key, ErrNotLeasable)
		}
		if !(rel.Units >= 0) || math.IsInf(rel.Units, 0) || math.IsNaN(rel.Offset) || math.IsInf(rel.Offset, 0) {
			return fmt.Errorf("lease: giving back %v units over %v on %q: not a lease", rel.Units, rel.Offset, rel.Key)
		}
	}
	return nil
}
