package lease_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// ideal is a GCRA bucket fed what the leases admitted, when they admitted
// it: every admission must fit it, or the leases over-admitted.
type ideal struct {
	t          *testing.T
	limit      rate.Limit
	level      float64
	at         int64 // µs
	admitted   int64
	overLimits int
}

func (b *ideal) drain(now int64) {
	rate := float64(b.limit.Count) / float64(b.limit.Period.Microseconds())
	b.level = math.Max(0, b.level-float64(now-b.at)*rate)
	b.at = now
}

func (b *ideal) admit(now, cost int64, what string) {
	b.t.Helper()
	b.drain(now)
	b.level += float64(cost)
	b.admitted += cost
	if b.level > float64(b.limit.Capacity())+1e-6 && b.overLimits < 5 {
		b.overLimits++
		b.t.Errorf("%s at %v admitted %d over the limit: the bucket would hold %.3f of %d",
			what, time.UnixMicro(now).Sub(start), cost, b.level, b.limit.Capacity())
	}
}

func (b *ideal) refund(now, units int64) {
	b.drain(now)
	b.level = math.Max(0, b.level-float64(units))
}

// TestLeaseStackedGivenBack: a lease taken on top of another keeps its
// units when the one beneath is given back (the give-back is withheld), so
// what is admitted at one instant never exceeds the bucket.
func TestLeaseStackedGivenBack(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		fast := storetest.GCRA(1000, 10*time.Second) // 100/s, a burst of 1000
		bs := []store.Bucket{{Key: "{s}|k", Limit: fast, Cost: 1}}
		want := &ideal{t: t, limit: fast, at: c.Now()}
		// Another instance takes a big lease straight from the store.
		lb, err := in.Lease(ctx, store.Grant{Buckets: bs, Want: 401, MaxShare: 0.5, MinRemaining: 0.05, Hold: time.Second})
		if err != nil || lb.Extra != 400 {
			t.Fatalf("lease: %v extra %d, want 400", err, lb.Extra)
		}
		want.admit(c.Now(), 1, "the other instance's grant")
		a := newLease(t, in, c.Now, lease.Options{TTL: time.Second, MaxShare: 0.5})
		c.Set(start.Add(899 * time.Millisecond))
		for range 2 {
			if d := decide(t, a, bs); d.Allowed {
				want.admit(c.Now(), 1, "A in the store")
			}
			c.Advance(time.Millisecond)
		}
		if a.Stats().Leased != 1 {
			t.Fatalf("A holds no lease: %+v", a.Stats())
		}
		c.Set(start.Add(950 * time.Millisecond))
		rel := store.Release{Bucket: store.Bucket{Key: bs[0].Key, Limit: fast, Charged: lb.At}, Offset: lb.Levels[0], Units: 400}
		if err := in.Release(ctx, []store.Release{rel}); err != nil {
			t.Fatal(err)
		}
		c.Set(start.Add(1500 * time.Millisecond))
		if d := decide(t, in, []store.Bucket{{Key: bs[0].Key, Limit: fast, Cost: 1000}}); d.Allowed {
			want.admit(c.Now(), 1000, "a burst in the store")
		}
		for range 10 {
			if d := decide(t, a, bs); d.Allowed {
				want.admit(c.Now(), 1, "A")
			}
		}
	})
}

// TestLeaseIdealGCRA drives three instances on leases of one fast bucket
// (and a slower one above it) with random arrivals above the limits,
// costs, refunds, sweeps and give-backs under an injected clock: whatever
// they admit, an ideal bucket fed the same admissions and refunds at the
// same instants admits.
func TestLeaseIdealGCRA(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		user := storetest.GCRA(200, 2*time.Second) // 100/s, a burst of 200
		org := storetest.GCRA(600, 10*time.Second) // 60/s, a burst of 600
		rng := rand.New(rand.NewPCG(11, uint64(len(kind))))
		instances := make([]*lease.Store, 4)
		for i := range instances {
			instances[i] = newLease(t, in, c.Now, lease.Options{TTL: time.Second, MaxShare: 0.5, MinRemaining: 0.02})
		}
		users := &ideal{t: t, limit: user, at: c.Now()}
		orgs := &ideal{t: t, limit: org, at: c.Now()}
		type charge struct {
			cost int64
			at   int64
		}
		var admitted []charge
		var refused int
		for step := range 6000 {
			// Calm phases, an average of 2 units each 30ms (67/s, where
			// leases are taken), alternate with floods of 2 units each
			// 4ms (500/s, above both limits).
			gap := 60_000
			if step/300%2 == 1 {
				gap = 8_000
			}
			c.Advance(time.Duration(rng.IntN(gap)) * time.Microsecond)
			s := instances[rng.IntN(len(instances))]
			switch r := rng.IntN(100); {
			case r < 85:
				cost := int64(1 + rng.IntN(3))
				bs := []store.Bucket{
					{Key: "{i}|org", Limit: org, Cost: cost},
					{Key: "{i}|user", Limit: user, Cost: cost},
				}
				// One request in four has a cost to reconcile: it is
				// decided without a lease (as the engine does), and may
				// be refunded.
				refundable := rng.IntN(4) == 0
				var d store.Decision
				var err error
				if refundable {
					d, err = s.DecideUnleased(ctx, bs)
				} else {
					d, err = s.Decide(ctx, bs)
				}
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					users.admit(c.Now(), cost, "a request")
					orgs.admit(c.Now(), cost, "a request (org)")
					if refundable {
						admitted = append(admitted, charge{cost, d.At})
					}
				} else {
					refused++
				}
			case r < 93 && len(admitted) > 0:
				// A reconciled cost: part of an earlier charge refunded.
				k := rng.IntN(len(admitted))
				ch := admitted[k]
				admitted = append(admitted[:k], admitted[k+1:]...)
				back := int64(1 + rng.IntN(int(ch.cost)))
				err := s.Adjust(ctx, []store.Bucket{
					{Key: "{i}|org", Limit: org, Cost: -back, Charged: ch.at},
					{Key: "{i}|user", Limit: user, Cost: -back, Charged: ch.at},
				})
				if err != nil {
					t.Fatal(err)
				}
				users.refund(c.Now(), back)
				orgs.refund(c.Now(), back)
			default:
				s.Sweep(ctx)
			}
			if t.Failed() {
				t.Fatalf("over-admitted by step %d", step)
			}
		}
		var local int64
		for _, s := range instances {
			local += s.Stats().Local
		}
		// Leases must have been used, and the limits reached, or the test
		// proves nothing.
		if local < 500 || refused < 50 {
			t.Fatalf("%d requests decided on leases, %d refused: the test needs more of both", local, refused)
		}
		t.Logf("%d units admitted over %v, %d requests on leases, %d refused", users.admitted, time.UnixMicro(c.Now()).Sub(start), local, refused)
	})
}

// gatedLeaser runs hook in the middle of a grant: after the store has
// decided it, before the lease store sees the answer; and resetHook just
// before the store resets buckets.
type gatedLeaser struct {
	store.Leaser
	hook, resetHook func()
}

func (g *gatedLeaser) Close() error { return nil }

func (g *gatedLeaser) Lease(ctx context.Context, gr store.Grant) (store.Leased, error) {
	l, err := g.Leaser.Lease(ctx, gr)
	if h := g.hook; h != nil {
		g.hook = nil
		h()
	}
	return l, err
}

func (g *gatedLeaser) Reset(ctx context.Context, keys []string) (int, error) {
	if h := g.resetHook; h != nil {
		g.resetHook = nil
		h()
	}
	return g.Leaser.(store.Resetter).Reset(ctx, keys)
}

func (g *gatedLeaser) ResetMatching(ctx context.Context, m store.KeyMatch) (int, error) {
	return g.Leaser.(store.Resetter).ResetMatching(ctx, m)
}

// gatedStore is a lease store (leases of a minute, all that remains at
// most) over an inner store of kind, through a gatedLeaser, on c.
func gatedStore(t *testing.T, kind string) (c *storetest.Clock, in store.Leaser, g *gatedLeaser, s *lease.Store) {
	c = storetest.NewClock(start)
	in = inner(t, kind, c.Now)
	g = &gatedLeaser{Leaser: in}
	return c, in, g, newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
}

// TestLeaseResetRacingGrant: a grant whose charge a reset may wipe is not
// installed, whether the reset lands in the middle of the grant (after the
// store charged it) or the grant in the middle of the reset (after this
// instance's leases were revoked, before the store's reset): the fresh
// bucket admits its capacity and no more.
func TestLeaseResetRacingGrant(t *testing.T) {
	for _, inside := range []string{"reset inside the grant", "grant inside the reset"} {
		t.Run(inside, func(t *testing.T) {
			storetest.EachKind(t, func(t *testing.T, kind string) {
				ctx := context.Background()
				c, in, g, s := gatedStore(t, kind)
				bs := []store.Bucket{{Key: "{r}|k", Limit: storetest.GCRA(100, 24*time.Hour), Cost: 1}}
				decide(t, in, []store.Bucket{{Key: bs[0].Key, Limit: bs[0].Limit, Cost: 50}})
				decide(t, s, bs) // first sight: in the store
				c.Advance(time.Millisecond)
				reset := func() {
					if _, err := s.Reset(ctx, []string{bs[0].Key}); err != nil {
						t.Error(err)
					}
				}
				if inside == "reset inside the grant" {
					g.hook = reset
					decide(t, s, bs)
				} else {
					g.resetHook = func() { decide(t, s, bs) }
					reset()
				}
				if g.hook != nil || g.resetHook != nil || s.Stats().Leased != 1 {
					t.Fatalf("no lease was granted: %+v", s.Stats())
				}
				if admitted := alternate(t, c, bs, s); admitted != 100 {
					t.Fatalf("admitted %d after the reset, want the fresh bucket's 100 (stats %+v)", admitted, s.Stats())
				}
			})
		})
	}
}

// TestLeaseResetOfOtherBucketsDuringGrant: a reset that lands while a
// grant is in flight withholds the lease only from a path with a reset
// bucket. A grant on a path with none is installed (its next request is
// decided on it); one on a path of two buckets, one of them reset, is not,
// and what it held on the other goes back to the store.
func TestLeaseResetOfOtherBucketsDuringGrant(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c, in, g, s := gatedStore(t, kind)
		daily := storetest.GCRA(100, 24*time.Hour)
		reset := func(key string) func() {
			return func() {
				if _, err := s.Reset(ctx, []string{key}); err != nil {
					t.Error(err)
				}
			}
		}

		// Another path's bucket reset: the lease is installed.
		ann := path("ann", 1, daily, daily)
		decide(t, s, ann) // first sight: in the store
		c.Advance(time.Millisecond)
		g.hook = reset("{t|acme}|user|bob")
		decide(t, s, ann) // granted, while bob is reset
		if g.hook != nil || s.Stats().Leased != 1 {
			t.Fatalf("no lease was granted: %+v", s.Stats())
		}
		local := s.Stats().Local
		decide(t, s, ann)
		if s.Stats().Local != local+1 {
			t.Fatalf("a reset of bob kept ann's lease from being installed: %+v", s.Stats())
		}

		// One of the path's buckets reset: not installed, the rest given
		// back (cat's organisation, of its own, holds only what was
		// admitted).
		cat := []store.Bucket{{Key: "{t|cats}|org", Limit: daily, Cost: 1}, {Key: "{t|cats}|user|cat", Limit: daily, Cost: 1}}
		decide(t, s, cat)
		c.Advance(time.Millisecond)
		g.hook = reset(cat[1].Key)
		decide(t, s, cat)
		if g.hook != nil || s.Stats().Leased != 2 {
			t.Fatalf("no second lease was granted: %+v", s.Stats())
		}
		s.Sweep(ctx) // gives back what was queued
		if org := peekRemaining(t, in, cat)[0]; org != 98 {
			t.Fatalf("cat's organisation's bucket holds %d, want 98: 100 less the 2 admitted (the withheld grant's rest given back)", org)
		}
		local = s.Stats().Local
		decide(t, s, cat)
		if s.Stats().Local != local {
			t.Fatalf("a lease was installed on cat's path, whose bucket was reset while it was granted: %+v", s.Stats())
		}

		// More resets during a grant than the store remembers: taken as
		// resets of every bucket (not installed).
		dan := path("dan", 1, daily, daily)
		decide(t, s, dan)
		c.Advance(time.Millisecond)
		g.hook = func() {
			for i := range 40 {
				reset(fmt.Sprintf("{t|acme}|user|other%d", i))()
			}
		}
		decide(t, s, dan)
		local = s.Stats().Local
		decide(t, s, dan)
		if s.Stats().Local != local {
			t.Fatalf("a lease granted across 80 bumps of resets was installed: %+v", s.Stats())
		}
	})
}

// TestLeaseResetDropsQueuedRelease: a lease given back (queued) before a
// reset of its bucket is not given back into the fresh bucket.
func TestLeaseResetDropsQueuedRelease(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
		old := rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}
		bigger := old
		bigger.Count = 200
		bs := func(l rate.Limit) []store.Bucket { return []store.Bucket{{Key: "{q}|k", Limit: l, Cost: 1}} }
		decide(t, s, bs(old))
		c.Advance(time.Millisecond)
		decide(t, s, bs(old)) // leases
		if s.Stats().Leased != 1 {
			t.Fatalf("no lease: %+v", s.Stats())
		}
		decide(t, s, bs(bigger)) // the limit changes: the lease is queued to go back
		if _, err := s.Reset(ctx, []string{"{q}|k"}); err != nil {
			t.Fatal(err)
		}
		charged := bs(bigger)
		charged[0].Cost = 150
		decide(t, in, charged)
		s.Sweep(ctx)
		if r := peekRemaining(t, in, bs(bigger)); r[0] != 50 {
			t.Fatalf("remaining %d of the fresh 200 after charging 150, want 50", r[0])
		}
	})
}

// TestLeaseLimitChangeDuringGrant: a grant on limits that change while it
// is in flight installs no lease on them; it goes back whole.
func TestLeaseLimitChangeDuringGrant(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c, in, g, s := gatedStore(t, kind)
		old := storetest.GCRA(1000, 24*time.Hour)
		tight := storetest.GCRA(10, 24*time.Hour)
		bs := func(l rate.Limit) []store.Bucket { return []store.Bucket{{Key: "{c}|k", Limit: l, Cost: 1}} }
		decide(t, in, []store.Bucket{{Key: "{c}|k", Limit: old, Cost: 500}})
		decide(t, s, bs(old)) // 501
		c.Advance(time.Millisecond)
		g.hook = func() {
			// The limit changes (an override) while the grant is in
			// flight; this request gives up waiting for it at once.
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := s.Decide(cancelled, bs(tight)); err == nil {
				t.Error("a request waiting on a grant in flight with a cancelled context was decided")
			}
		}
		if d := decide(t, s, bs(old)); !d.Allowed { // 502, and a lease of 3
			t.Fatal("the grant was refused")
		}
		for range 5 {
			if decide(t, s, bs(tight)).Allowed {
				t.Fatalf("admitted under the new limit of 10 with 502 charged (stats %+v)", s.Stats())
			}
		}
		s.Sweep(ctx)
		if r := peekRemaining(t, in, bs(old)); r[0] != 1000-502 {
			t.Fatalf("remaining %d, want %d: the lease on the old limit was not given back", r[0], 1000-502)
		}
	})
}

// TestLeaseCloseWaitsForGrant: Close during a grant gives back the lease
// that grant installs.
func TestLeaseCloseWaitsForGrant(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		g := &gatedLeaser{Leaser: in}
		s, err := lease.New(g, lease.Options{TTL: time.Minute, MaxShare: 1, Clock: c.Now, Sweep: -1})
		if err != nil {
			t.Fatal(err)
		}
		daily := storetest.GCRA(100, 24*time.Hour)
		bs := []store.Bucket{{Key: "{w}|k", Limit: daily, Cost: 1}}
		decide(t, s, bs)
		c.Advance(time.Millisecond)
		closed := make(chan error, 1)
		g.hook = func() {
			go func() { closed <- s.Close() }()
			// Let Close overtake the grant (without the wait it would give
			// back before the lease is installed): it waits on this grant.
			for deadline := time.Now().Add(10 * time.Second); !lease.Closing(s); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Error("Close did not begin within 10 s of being called")
					return
				}
			}
		}
		decide(t, s, bs)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if s.Stats().Leased != 1 {
			t.Fatalf("no lease was granted: %+v", s.Stats())
		}
		if r := peekRemaining(t, in, bs); r[0] != 98 {
			t.Fatalf("remaining %d after Close, want 98: the lease granted during Close was kept", r[0])
		}
	})
}

// TestLeaseCostZeroBucket: a bucket the path's requests do not charge (a
// token budget beside a request count) does not keep the path off its
// lease.
func TestLeaseCostZeroBucket(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Second, MaxShare: 0.5})
		l := storetest.GCRA(1000, time.Minute)
		bs := []store.Bucket{{Key: "{z}|tokens", Limit: l, Cost: 0}, {Key: "{z}|req", Limit: l, Cost: 1}}
		for range 200 {
			if d := decide(t, s, bs); !d.Allowed || d.Results[0].Remaining != 1000 {
				t.Fatalf("allowed %v, %d tokens remaining, want 1000: %+v", d.Allowed, d.Results[0].Remaining, d.Results)
			}
			c.Advance(time.Millisecond)
		}
		if st := s.Stats(); st.Local < 150 {
			t.Fatalf("%d of 200 decided on a lease (stats %+v)", st.Local, st)
		}
	})
}
