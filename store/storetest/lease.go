package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// LeaserOpener returns a fresh store that can lease, reading time from clock.
type LeaserOpener func(t *testing.T, clock store.Clock) store.Leaser

// RunLeases runs the lease scenarios (store.Leaser) against the stores open
// makes: the same grants, releases and decisions must come out of both.
func RunLeases(t *testing.T, open LeaserOpener) {
	perSec := gcra(100, time.Second, 0)
	perHour := calendar(100, rate.Hour, time.UTC)
	slow := gcra(100, time.Hour, 0)
	ctx := context.Background()
	grant := func(bs []store.Bucket, want int64, rel ...store.Release) store.Grant {
		return store.Grant{Buckets: bs, Want: want, MaxShare: 0.1, MinRemaining: 0.05, Release: rel}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s store.Leaser, c *Clock)
	}{
		{"granted within max_share", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("l1", "k", perSec, 1)}, 20))
			// 99 remain after the request: a tenth of them, 9, are leased.
			expectLease(t, l, true, 9, []int64{90})
			if l.Levels[0] != 1 {
				t.Fatalf("level under the lease %v, want 1", l.Levels[0])
			}
			expectDecide(t, s, []store.Bucket{b("l1", "k", perSec, 90)}, true)
			expectDecide(t, s, []store.Bucket{b("l1", "k", perSec, 1)}, false)
		}},
		{"want bounds the lease", func(t *testing.T, s store.Leaser, c *Clock) {
			expectLease(t, mustLease(t, s, grant([]store.Bucket{b("l2", "k", perSec, 2)}, 3)), true, 2, []int64{94})
		}},
		{"the tightest bucket sizes the lease", func(t *testing.T, s store.Leaser, c *Clock) {
			org := gcra(1000, time.Second, 0)
			user := gcra(30, time.Second, 0)
			l := mustLease(t, s, grant([]store.Bucket{b("l3", "org", org, 1), b("l3", "user", user, 1)}, 100))
			// user: 29 remain, a tenth is 2.
			expectLease(t, l, true, 2, []int64{997, 27})
		}},
		{"none near exhaustion", func(t *testing.T, s store.Leaser, c *Clock) {
			expectDecide(t, s, []store.Bucket{b("l4", "k", slow, 95)}, true)
			// 4 remain after the request, below 5% of 100: no lease.
			expectLease(t, mustLease(t, s, grant([]store.Bucket{b("l4", "k", slow, 1)}, 50)), true, 0, []int64{4})
		}},
		{"a denial charges nothing anywhere", func(t *testing.T, s store.Leaser, c *Clock) {
			expectDecide(t, s, []store.Bucket{b("l5", "user", slow, 100)}, true)
			l := mustLease(t, s, grant([]store.Bucket{b("l5", "org", slow, 1), b("l5", "user", slow, 1)}, 50))
			expectLease(t, l, false, 0, []int64{100, 0})
			if l.RetryAfter != 36*time.Second+time.Microsecond {
				t.Fatalf("retry after %v, want 36.000001s (one unit of 100/h)", l.RetryAfter)
			}
			expectDecide(t, s, []store.Bucket{b("l5", "org", slow, 100)}, true)
		}},
		{"a refusal by an upper bucket charges nothing below", func(t *testing.T, s store.Leaser, c *Clock) {
			// On a Cluster with the buckets in different slots, the user's
			// slot leases first and is given everything back when the
			// organisation's refuses.
			expectDecide(t, s, []store.Bucket{b("lf", "org", slow, 100)}, true)
			l := mustLease(t, s, grant([]store.Bucket{b("lf", "org", slow, 1), b("lf", "user", slow, 1)}, 50))
			expectLease(t, l, false, 0, []int64{0, 100})
			expectDecide(t, s, []store.Bucket{b("lf", "user", slow, 100)}, true)
		}},
		{"an impossible cost", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("l6", "k", perSec, 101)}, 50))
			if l.Allowed || !l.Impossible || l.Extra != 0 {
				t.Fatalf("got allowed %v impossible %v extra %d, want an impossible denial", l.Allowed, l.Impossible, l.Extra)
			}
		}},
		{"a release gives back the undrained units", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("l7", "k", perSec, 1)}, 20))
			expectLease(t, l, true, 9, []int64{90})
			// 20ms at 100/s drain 2 units: the request's and one leased.
			c.Advance(20 * time.Millisecond)
			rel := store.Release{Bucket: store.Bucket{Key: key("l7", "k"), Limit: perSec, Charged: l.At}, Offset: l.Levels[0], Units: 9}
			if err := s.Release(ctx, []store.Release{rel}); err != nil {
				t.Fatal(err)
			}
			// Level 10 − 2 drained − 8 given back: the bucket is full.
			expectDecide(t, s, []store.Bucket{b("l7", "k", perSec, 100)}, true)
			expectDecide(t, s, []store.Bucket{b("l7", "k", perSec, 1)}, false)
		}},
		{"a late release gives back nothing drained", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("l8", "k", perSec, 1)}, 20))
			expectDecide(t, s, []store.Bucket{b("l8", "k", perSec, 90)}, true)
			c.Advance(200 * time.Millisecond) // 20 units drained: the request's and all nine leased
			rel := store.Release{Bucket: store.Bucket{Key: key("l8", "k"), Limit: perSec, Charged: l.At}, Offset: l.Levels[0], Units: 9}
			if err := s.Release(ctx, []store.Release{rel}); err != nil {
				t.Fatal(err)
			}
			// Level 100 − 20: exactly 20 fit.
			expectDecide(t, s, []store.Bucket{b("l8", "k", perSec, 20)}, true)
			expectDecide(t, s, []store.Bucket{b("l8", "k", perSec, 1)}, false)
		}},
		{"a release with the next grant", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("l9", "k", slow, 1)}, 20))
			expectLease(t, l, true, 9, []int64{90})
			// Three of the nine spent: six given back, then the next grant.
			rel := store.Release{Bucket: store.Bucket{Key: key("l9", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0] + 3, Units: 6}
			l = mustLease(t, s, grant([]store.Bucket{b("l9", "k", slow, 1)}, 20, rel))
			// 96 remained; the request leaves 95, a tenth is 9.
			expectLease(t, l, true, 9, []int64{86})
		}},
		{"padding keeps the leased units for the hold", func(t *testing.T, s store.Leaser, c *Clock) {
			g := grant([]store.Bucket{b("ld", "k", perSec, 1)}, 4)
			g.MaxShare, g.Hold = 1, 100*time.Millisecond
			l := mustLease(t, s, g)
			// 100/s drains 10 units in 100ms: 9 of padding on top of the
			// request's 1, then the 3 leased.
			expectLease(t, l, true, 3, []int64{87})
			if l.Levels[0] != 10 {
				t.Fatalf("level under the lease %v, want 10", l.Levels[0])
			}
			c.Advance(50 * time.Millisecond)
			rel := store.Release{Bucket: store.Bucket{Key: key("ld", "k"), Limit: perSec, Charged: l.At}, Offset: l.Levels[0], Units: 3}
			if err := s.Release(ctx, []store.Release{rel}); err != nil {
				t.Fatal(err)
			}
			// 13 − 5 drained − 3 given back: 95 fit, not 96.
			expectDecide(t, s, []store.Bucket{b("ld", "k", perSec, 95)}, true)
			expectDecide(t, s, []store.Bucket{b("ld", "k", perSec, 1)}, false)
		}},
		{"padding counts against the share", func(t *testing.T, s store.Leaser, c *Clock) {
			g := grant([]store.Bucket{b("le", "k", perSec, 1)}, 4)
			g.Hold = time.Second // 100 units drain in a second: more than a tenth of what remains
			expectLease(t, mustLease(t, s, g), true, 0, []int64{99})
		}},
		{"a calendar release only in its window", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("la", "k", perHour, 1)}, 20))
			expectLease(t, l, true, 9, []int64{90})
			rel := store.Release{Bucket: store.Bucket{Key: key("la", "k"), Limit: perHour, Charged: l.At}, Offset: 0, Units: 9}
			if err := s.Release(ctx, []store.Release{rel}); err != nil {
				t.Fatal(err)
			}
			expectDecide(t, s, []store.Bucket{b("la", "k", perHour, 99)}, true)
			l = mustLease(t, s, grant([]store.Bucket{b("lb", "k", perHour, 1)}, 20))
			c.Set(start.Truncate(time.Hour).Add(time.Hour))
			rel = store.Release{Bucket: store.Bucket{Key: key("lb", "k"), Limit: perHour, Charged: l.At}, Offset: 0, Units: 9}
			if err := s.Release(ctx, []store.Release{rel}); err != nil {
				t.Fatal(err)
			}
			// The new hour is full, and not more than full.
			expectDecide(t, s, []store.Bucket{b("lb", "k", perHour, 100)}, true)
			expectDecide(t, s, []store.Bucket{b("lb", "k", perHour, 1)}, false)
		}},
		{"a lease given back beneath a later one gives back nothing", func(t *testing.T, s store.Leaser, c *Clock) {
			// The later lease's units sit on the earlier one's: taking
			// those from under them would let them drain early.
			g := grant([]store.Bucket{b("lg", "k", slow, 1)}, 40)
			g.MaxShare = 0.5
			l1 := mustLease(t, s, g)
			expectLease(t, l1, true, 39, []int64{60})
			g.Want = 5
			l2 := mustLease(t, s, g)
			expectLease(t, l2, true, 4, []int64{55})
			release(t, s, store.Release{Bucket: store.Bucket{Key: key("lg", "k"), Limit: slow, Charged: l1.At}, Offset: l1.Levels[0], Units: 39})
			expectDecide(t, s, []store.Bucket{b("lg", "k", slow, 56)}, false)
			// The topmost gives back its own, and the top drops under it.
			release(t, s, store.Release{Bucket: store.Bucket{Key: key("lg", "k"), Limit: slow, Charged: l2.At}, Offset: l2.Levels[0], Units: 4})
			expectDecide(t, s, []store.Bucket{b("lg", "k", slow, 60)}, false)
			expectDecide(t, s, []store.Bucket{b("lg", "k", slow, 59)}, true)
		}},
		{"a refund beneath a lease is withheld", func(t *testing.T, s store.Leaser, c *Clock) {
			first := b("lh", "k", slow, 10)
			d, err := s.Decide(ctx, []store.Bucket{first})
			if err != nil || !d.Allowed {
				t.Fatalf("Decide: %v %+v", err, d)
			}
			expectLease(t, mustLease(t, s, grant([]store.Bucket{b("lh", "k", slow, 1)}, 5)), true, 4, []int64{85})
			expectDecide(t, s, []store.Bucket{b("lh", "k", slow, 5)}, true)
			// Refunding the first 10: only the 5 charged above the lease go back.
			first.Cost, first.Charged = -10, d.At
			if err := s.Adjust(ctx, []store.Bucket{first}); err != nil {
				t.Fatal(err)
			}
			expectDecide(t, s, []store.Bucket{b("lh", "k", slow, 86)}, false)
			expectDecide(t, s, []store.Bucket{b("lh", "k", slow, 85)}, true)
		}},
		{"a release after a reset, with no lease since, gives back nothing", func(t *testing.T, s store.Leaser, c *Clock) {
			rs := resetter(t, s)
			l := mustLease(t, s, grant([]store.Bucket{b("li", "k", slow, 1)}, 20))
			expectLease(t, l, true, 9, []int64{90})
			if _, err := rs.Reset(ctx, []string{key("li", "k")}); err != nil {
				t.Fatal(err)
			}
			expectDecide(t, s, []store.Bucket{b("li", "k", slow, 50)}, true)
			release(t, s, store.Release{Bucket: store.Bucket{Key: key("li", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0], Units: 9})
			expectDecide(t, s, []store.Bucket{b("li", "k", slow, 51)}, false)
			expectDecide(t, s, []store.Bucket{b("li", "k", slow, 50)}, true)
		}},
		{"a lease charged before a reset gives nothing back to the bucket leased since", func(t *testing.T, s store.Leaser, c *Clock) {
			rs := resetter(t, s)
			expectDecide(t, s, []store.Bucket{b("lo", "k", slow, 50)}, true)
			g := grant([]store.Bucket{b("lo", "k", slow, 1)}, 20)
			g.MaxShare = 0.5
			old := mustLease(t, s, g)
			expectLease(t, old, true, 19, []int64{30})
			if _, err := rs.Reset(ctx, []string{key("lo", "k")}); err != nil {
				t.Fatal(err)
			}
			expectLease(t, mustLease(t, s, g), true, 19, []int64{80})
			expectDecide(t, s, []store.Bucket{b("lo", "k", slow, 30)}, true)
			// Its units end above the fresh bucket's lease top: not there.
			release(t, s, store.Release{Bucket: store.Bucket{Key: key("lo", "k"), Limit: slow, Charged: old.At}, Offset: old.Levels[0], Units: 19})
			expectDecide(t, s, []store.Bucket{b("lo", "k", slow, 51)}, false)
			expectDecide(t, s, []store.Bucket{b("lo", "k", slow, 50)}, true)
		}},
		{"a lease given back twice in one call gives back once", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("lj", "k", slow, 1)}, 20))
			rel := store.Release{Bucket: store.Bucket{Key: key("lj", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0], Units: 9}
			release(t, s, rel, rel)
			expectDecide(t, s, []store.Bucket{b("lj", "k", slow, 100)}, false)
			expectDecide(t, s, []store.Bucket{b("lj", "k", slow, 99)}, true)
		}},
		{"fractional units given back whole", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("lk", "k", slow, 1)}, 20))
			// 2.5 units spent of 9: 6 whole units of the 6.5 left go back,
			// and the level stays above what was spent.
			release(t, s, store.Release{Bucket: store.Bucket{Key: key("lk", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0] + 2.5, Units: 6.5})
			expectDecide(t, s, []store.Bucket{b("lk", "k", slow, 97)}, false)
			expectDecide(t, s, []store.Bucket{b("lk", "k", slow, 96)}, true)
		}},
		{"a bucket the request does not charge is not leased", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("lm", "org", slow, 0), b("lm", "user", slow, 1)}, 20))
			expectLease(t, l, true, 9, []int64{100, 90})
			expectDecide(t, s, []store.Bucket{b("lm", "org", slow, 100)}, true)
		}},
		{"a release goes through with a refused grant", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("ln", "k", slow, 1)}, 20))
			expectDecide(t, s, []store.Bucket{b("ln", "k", slow, 90)}, true)
			rel := store.Release{Bucket: store.Bucket{Key: key("ln", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0], Units: 9}
			// 9 given back under the 90 charged since; 10 do not fit in 9.
			expectLease(t, mustLease(t, s, grant([]store.Bucket{b("ln", "k", slow, 10)}, 20, rel)), false, 0, []int64{9})
			expectDecide(t, s, []store.Bucket{b("ln", "k", slow, 9)}, true)
			expectDecide(t, s, []store.Bucket{b("ln", "k", slow, 1)}, false)
		}},
		{"a renewal charges only the lease", func(t *testing.T, s store.Leaser, c *Clock) {
			// No request of its own: all 5 wanted are leased, 2 units each.
			r := grant([]store.Bucket{b("lr", "org", slow, 2), b("lr", "user", slow, 2)}, 5)
			r.Renew = true
			expectLease(t, mustRenew(t, s, r)[0], true, 5, []int64{90, 90})
			expectDecide(t, s, []store.Bucket{b("lr", "user", slow, 90)}, true)
			expectDecide(t, s, []store.Bucket{b("lr", "user", slow, 1)}, false)
		}},
		{"a renewal gives back the lease it follows first", func(t *testing.T, s store.Leaser, c *Clock) {
			l := mustLease(t, s, grant([]store.Bucket{b("ls", "k", slow, 1)}, 10))
			expectLease(t, l, true, 9, []int64{90})
			// Nothing of the lease spent: its 9 units go back, then 9.9
			// (a tenth of the 99 remaining) bounds the renewal to 9.
			rel := store.Release{Bucket: store.Bucket{Key: key("ls", "k"), Limit: slow, Charged: l.At}, Offset: l.Levels[0], Units: 9}
			r := grant([]store.Bucket{b("ls", "k", slow, 1)}, 20, rel)
			r.Renew = true
			expectLease(t, mustRenew(t, s, r)[0], true, 9, []int64{90})
			expectDecide(t, s, []store.Bucket{b("ls", "k", slow, 90)}, true)
			expectDecide(t, s, []store.Bucket{b("ls", "k", slow, 1)}, false)
		}},
		{"a renewal near exhaustion leases nothing", func(t *testing.T, s store.Leaser, c *Clock) {
			expectDecide(t, s, []store.Bucket{b("lt", "k", slow, 96)}, true)
			r := grant([]store.Bucket{b("lt", "k", slow, 1)}, 10)
			r.Renew = true
			// The decision charges nothing: 4 remain, below 5% of 100.
			expectLease(t, mustRenew(t, s, r)[0], true, 0, []int64{4})
			expectDecide(t, s, []store.Bucket{b("lt", "k", slow, 4)}, true)
		}},
		{"grants sent together are each their own step, in order", func(t *testing.T, s store.Leaser, c *Clock) {
			// Both paths share the organisation's bucket: the second is
			// sized on what the first left.
			one := grant([]store.Bucket{b("lu", "org", slow, 1), b("lu", "u1", slow, 1)}, 50)
			two := grant([]store.Bucket{b("lu", "org", slow, 1), b("lu", "u2", slow, 1)}, 50)
			two.Renew = true
			ls := mustRenew(t, s, one, two)
			// one: the request, then 9 (a tenth of 99) leased on both.
			expectLease(t, ls[0], true, 9, []int64{90, 90})
			// two: no request; a tenth of the organisation's 90 remaining.
			expectLease(t, ls[1], true, 9, []int64{81, 91})
			expectDecide(t, s, []store.Bucket{b("lu", "org", slow, 81)}, true)
			expectDecide(t, s, []store.Bucket{b("lu", "org", slow, 1)}, false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClock(start)
			tc.run(t, open(t, c.Now), c)
		})
	}
	t.Run("a sliding window is not leased", func(t *testing.T) {
		c := NewClock(start)
		s := open(t, c.Now)
		win := sliding(10, time.Second)
		if _, err := s.Lease(ctx, grant([]store.Bucket{b("lc", "k", win, 1)}, 5)); !errors.Is(err, store.ErrNotLeasable) {
			t.Fatalf("leasing a sliding window: %v, want ErrNotLeasable", err)
		}
		rel := store.Release{Bucket: store.Bucket{Key: key("lc", "k"), Limit: win}, Units: 1}
		if err := s.Release(ctx, []store.Release{rel}); !errors.Is(err, store.ErrNotLeasable) {
			t.Fatalf("giving back a sliding window: %v, want ErrNotLeasable", err)
		}
		if _, err := s.Lease(ctx, grant([]store.Bucket{b("lc", "j", slow, 1)}, 5, rel)); !errors.Is(err, store.ErrNotLeasable) {
			t.Fatalf("giving back a sliding window with a grant: %v, want ErrNotLeasable", err)
		}
	})
}

// resetter is s as a store.Resetter; the test is skipped if it cannot reset.
func resetter(t *testing.T, s store.Leaser) store.Resetter {
	t.Helper()
	rs, ok := s.(store.Resetter)
	if !ok {
		t.Skip("the store cannot reset")
	}
	return rs
}

func release(t *testing.T, s store.Leaser, r ...store.Release) {
	t.Helper()
	if err := s.Release(context.Background(), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func mustLease(t *testing.T, s store.Leaser, g store.Grant) store.Leased {
	t.Helper()
	l, err := s.Lease(context.Background(), g)
	if err != nil {
		t.Fatalf("Lease: %v", err)
	}
	return l
}

// mustRenew sends gs together (store.Leaser's LeaseAll). A store that does
// not renew a path across Cluster slots skips the test.
func mustRenew(t *testing.T, s store.Leaser, gs ...store.Grant) []store.Leased {
	t.Helper()
	ls, errs := s.LeaseAll(context.Background(), gs)
	for i, err := range errs {
		if errors.Is(err, store.ErrNotRenewable) {
			t.Skipf("renewal %d: %v", i, err)
		}
		if err != nil {
			t.Fatalf("LeaseAll, grant %d: %v", i, err)
		}
	}
	return ls
}

func expectLease(t *testing.T, l store.Leased, allowed bool, extra int64, remaining []int64) {
	t.Helper()
	if l.Allowed != allowed || l.Extra != extra {
		t.Fatalf("lease: allowed %v extra %d, want %v and %d", l.Allowed, l.Extra, allowed, extra)
	}
	for i, r := range remaining {
		if l.Results[i].Remaining != r {
			t.Fatalf("lease: bucket %d remaining %d, want %d", i, l.Results[i].Remaining, r)
		}
	}
}

func expectDecide(t *testing.T, s store.Store, bs []store.Bucket, allowed bool) {
	t.Helper()
	d, err := s.Decide(context.Background(), bs)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Allowed != allowed {
		t.Fatalf("Decide: allowed %v, want %v (%+v)", d.Allowed, allowed, d.Results)
	}
}
