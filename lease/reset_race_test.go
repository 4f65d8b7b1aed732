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

// chanLeaser blocks one grant, after the store charged it, until told
// (proceed); resetHook runs before the store's next reset.
type chanLeaser struct {
	store.Leaser
	mu               sync.Mutex
	block            bool
	charged, proceed chan struct{}
	resetHook        func()
}

func (g *chanLeaser) Close() error { return nil }
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
func (g *chanLeaser) Reset(ctx context.Context, keys []string) (int, error) {
	if h := g.resetHook; h != nil {
		g.resetHook = nil
		h()
	}
	return g.Leaser.(store.Resetter).Reset(ctx, keys)
}
func (g *chanLeaser) ResetMatching(ctx context.Context, m store.KeyMatch) (int, error) {
	return g.Leaser.(store.Resetter).ResetMatching(ctx, m)
}

// TestLeaseGrantStraddlingResetEnd: a grant that begins after a reset's
// first revoke, is charged before the store's reset and would be installed
// after the reset returned (after its last revoke) is not installed: the
// reset's last bump says so. The fresh bucket admits its 100, no more.
func TestLeaseGrantStraddlingResetEnd(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		g := &chanLeaser{Leaser: in, charged: make(chan struct{}), proceed: make(chan struct{})}
		s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
		bs := []store.Bucket{{Key: "{r}|k", Limit: gcra(100, 24*time.Hour), Cost: 1}}
		decide(t, in, []store.Bucket{{Key: bs[0].Key, Limit: bs[0].Limit, Cost: 50}})
		decide(t, s, bs)
		c.Advance(time.Millisecond)
		done := make(chan struct{})
		g.resetHook = func() {
			g.mu.Lock()
			g.block = true
			g.mu.Unlock()
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
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		g := &gatedLeaser{Leaser: in}
		s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
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

// TestLeaseWithheldGiveBackDuringAnotherReset: a grant in flight while
// bucket b's reset is under way (b wiped, the reset not yet ended) is
// withheld because of a reset of a: what it held on b, charged before b was
// wiped, does not go back into the fresh b (Store.resetting).
func TestLeaseWithheldGiveBackDuringAnotherReset(t *testing.T) {
	for _, alg := range []string{"calendar", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind string) {
				ctx := context.Background()
				c := storetest.NewClock(start)
				in := inner(t, kind, c.Now)
				g := &postLeaser{chanLeaser: chanLeaser{Leaser: in, charged: make(chan struct{}), proceed: make(chan struct{})}}
				s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
				lim := rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}
				if alg == "gcra" {
					lim = gcra(100, 24*time.Hour)
				}
				path := []store.Bucket{{Key: "{t}|a", Limit: lim, Cost: 1}, {Key: "{t}|b", Limit: lim, Cost: 1}}
				decide(t, s, path)
				c.Advance(time.Millisecond)
				done := make(chan struct{})
				g.pre = func() { // B's reset: after its first bump and revoke
					g.mu.Lock()
					g.block = true
					g.mu.Unlock()
					go func() { defer close(done); s.Decide(ctx, path) }()
					<-g.charged // G charged a and b, b's charge about to be wiped
				}
				g.post = func() { // B wiped; B's reset not ended
					decide(t, in, path[1:])                                        // one request on the fresh b
					if _, err := s.Reset(ctx, []string{path[0].Key}); err != nil { // A's reset
						t.Error(err)
					}
					close(g.proceed)
					<-done // G withheld (A reset): gives back on b
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

// TestLeaseRevokedGiveBackDuringAnotherReset: as above with the grant
// installed, then revoked by a's reset: what it held on b does not go back
// into the fresh b either.
func TestLeaseRevokedGiveBackDuringAnotherReset(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		g := &postLeaser{chanLeaser: chanLeaser{Leaser: in, charged: make(chan struct{}), proceed: make(chan struct{})}}
		s := newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 1})
		lim := rate.Limit{Algorithm: rate.Calendar, Count: 100, Unit: rate.Day, Location: time.UTC}
		path := []store.Bucket{{Key: "{t}|a", Limit: lim, Cost: 1}, {Key: "{t}|b", Limit: lim, Cost: 1}}
		decide(t, s, path)
		c.Advance(time.Millisecond)
		done := make(chan struct{})
		g.pre = func() {
			g.mu.Lock()
			g.block = true
			g.mu.Unlock()
			go func() { defer close(done); s.Decide(ctx, path) }()
			<-g.charged
		}
		g.post = func() {
			decide(t, in, path[1:])
			close(g.proceed)
			<-done // G installed
			if _, err := s.Reset(ctx, []string{path[0].Key}); err != nil {
				t.Error(err)
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
}
