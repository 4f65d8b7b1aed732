package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// chanLeaser is a gatedLeaser that blocks one grant (blockNext), after
// the store charged it, until told (proceed).
type chanLeaser struct {
	gatedLeaser
	mu               sync.Mutex
	block            bool
	charged, proceed chan struct{}
}

func newChanLeaser(in store.Leaser) chanLeaser {
	return chanLeaser{gatedLeaser: gatedLeaser{Leaser: in}, charged: make(chan struct{}), proceed: make(chan struct{})}
}

func (g *chanLeaser) blockNext() {
	g.mu.Lock()
	g.block = true
	g.mu.Unlock()
}

func (g *chanLeaser) Lease(ctx context.Context, gr store.Grant) (store.Leased, error) {
	l, err := g.Leaser.Lease(ctx, gr)
	g.mu.Lock()
	b := g.block
	g.block = false
	g.mu.Unlock()
	if b {
		close(g.charged)
		<-g.proceed
	}
	return l, err
}

// TestLeaseGrantStraddlingResetEnd: a grant that begins after a reset's
// first revoke, is charged before the store's reset and would be installed
// after the reset returned (after its last revoke) is not installed: the
// reset's last bump says so. The fresh bucket admits its 100, no more.
func TestLeaseGrantStraddlingResetEnd(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		cl := newChanLeaser(in)
		g := &cl
		s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
		bs := []store.Bucket{{Key: "{r}|k", Limit: storetest.GCRA(100, 24*time.Hour), Cost: 1}}
		decide(t, in, []store.Bucket{{Key: bs[0].Key, Limit: bs[0].Limit, Cost: 50}})
		decide(t, s, bs)
		c.Advance(time.Millisecond)
		done := make(chan struct{})
		g.resetHook = func() {
			g.blockNext()
			go func() { defer close(done); s.Decide(ctx, bs) }()
			<-g.charged
		}
		if _, err := s.Reset(ctx, []string{bs[0].Key}); err != nil {
			t.Fatal(err)
		}
		close(g.proceed)
		<-done
		if admitted := alternate(t, c, bs, s); admitted != 100 {
			t.Fatalf("admitted %d after the reset, want 100 (stats %+v)", admitted, s.Stats())
		}
	})
}

// TestLeaseWithheldGivesNothingBackOnReset: a grant withheld by a reset
// gives nothing back on the reset bucket (a calendar quota's store cannot
// tell a give-back into the fresh window from one into the wiped one).
func TestLeaseWithheldGivesNothingBackOnReset(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c, in, g, s := gatedStore(t, kind)
		day := rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}
		cat := []store.Bucket{{Key: "{t|cats}|org", Limit: day, Cost: 1}, {Key: "{t|cats}|user|cat", Limit: day, Cost: 1}}
		decide(t, s, cat)
		c.Advance(time.Millisecond)
		g.hook = func() {
			if _, err := s.Reset(ctx, []string{cat[1].Key}); err != nil {
				t.Error(err)
			}
			decide(t, in, cat[1:]) // admitted after the reset
		}
		decide(t, s, cat)
		s.Sweep(ctx)
		if u := peekRemaining(t, in, cat)[1]; u != 99 {
			t.Fatalf("cat's user bucket holds %d after a reset and one admission, want 99", u)
		}
	})
}

// postLeaser is a chanLeaser with hooks before (pre) and after (post) the
// store's next reset.
type postLeaser struct {
	chanLeaser
	pre, post func()
}

func (g *postLeaser) Reset(ctx context.Context, keys []string) (int, error) {
	if h := g.pre; h != nil {
		g.pre = nil
		h()
	}
	n, err := g.Leaser.(store.Resetter).Reset(ctx, keys)
	if h := g.post; h != nil {
		g.post = nil
		h()
	}
	return n, err
}

// TestLeaseGiveBackDuringAnotherReset: a grant in flight while bucket b's
// reset is under way (b wiped, the reset not yet ended), then withheld
// because a is reset meanwhile — or installed, then revoked by a's reset:
// what it held on b, charged before b was wiped, does not go back into the
// fresh b (Store.resetting).
func TestLeaseGiveBackDuringAnotherReset(t *testing.T) {
	for _, tt := range []struct {
		name      string
		installed bool // a's reset after the grant was installed
		limit     rate.Limit
	}{
		{"withheld/calendar", false, rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}},
		{"withheld/gcra", false, storetest.GCRA(100, 24*time.Hour)},
		{"revoked/calendar", true, rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			storetest.EachKind(t, func(t *testing.T, kind string) {
				ctx := context.Background()
				c := storetest.NewClock(start)
				in := inner(t, kind, c.Now)
				g := &postLeaser{chanLeaser: newChanLeaser(in)}
				s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
				path := []store.Bucket{{Key: "{t}|a", Limit: tt.limit, Cost: 1}, {Key: "{t}|b", Limit: tt.limit, Cost: 1}}
				decide(t, s, path)
				c.Advance(time.Millisecond)
				done := make(chan struct{})
				resetA := func() {
					if _, err := s.Reset(ctx, []string{path[0].Key}); err != nil {
						t.Error(err)
					}
				}
				g.pre = func() { // b's reset, after its first revoke: a grant charges a and b
					g.blockNext()
					go func() { defer close(done); s.Decide(ctx, path) }()
					<-g.charged
				}
				g.post = func() { // b wiped, its reset not ended
					decide(t, in, path[1:]) // one request on the fresh b
					if !tt.installed {
						resetA()
					}
					close(g.proceed)
					<-done
					if tt.installed {
						resetA()
					}
					s.Sweep(ctx)
				}
				if _, err := s.Reset(ctx, []string{path[1].Key}); err != nil {
					t.Fatal(err)
				}
				if r := peekRemaining(t, in, path)[1]; r != 99 {
					t.Fatalf("b holds %d after its reset and one admission, want 99 (stats %+v)", r, s.Stats())
				}
			})
		})
	}
}

// TestLeasePeerResetDuringGrant: another instance's reset heard while a
// grant is in flight here keeps the grant from being installed (its charge
// may be among what the reset wiped): the two instances then admit exactly
// the fresh bucket's 100.
func TestLeasePeerResetDuringGrant(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c, _, g, a, b := linkedGated(t, kind)
		bs := []store.Bucket{{Key: "{p}|k", Limit: storetest.GCRA(100, 24*time.Hour), Cost: 1}}
		decide(t, b, bs) // first sight: in the store
		c.Advance(time.Millisecond)
		g.hook = func() { // b's grant charged; a resets, b hears it at once
			if _, err := a.Reset(ctx, []string{bs[0].Key}); err != nil {
				t.Error(err)
			}
		}
		decide(t, b, bs)
		if g.hook != nil || b.Stats().Leased != 1 || b.Stats().PeerResets != 1 {
			t.Fatalf("no lease granted during a peer's reset: %+v", b.Stats())
		}
		if admitted := alternate(t, c, bs, a, b); admitted != 100 {
			t.Fatalf("after the reset the two instances admitted %d, want exactly the fresh capacity, 100 (b %+v)", admitted, b.Stats())
		}
	})
}
