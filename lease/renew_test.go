package lease_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestLeaseRenewalAgainstAnIdealBucket: several instances, busy paths sharing an
// organisation's bucket, renewals ahead at every sweep, random costs and
// limit changes: whatever they admit, an ideal bucket admits.
func TestLeaseRenewalAgainstAnIdealBucket(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		org := storetest.GCRA(20000, 20*time.Second) // 1000/s, a burst of 20000
		user := storetest.GCRA(8000, 20*time.Second) // 400/s
		rng := rand.New(rand.NewPCG(7, uint64(len(kind))))
		instances := make([]*lease.Store, 3)
		for i := range instances {
			instances[i] = newLease(t, in, c.Now, lease.Options{TTL: 200 * time.Millisecond, MaxShare: 0.5, MinRemaining: 0.02})
		}
		orgs := &ideal{t: t, limit: org, at: c.Now()}
		users := map[string]*ideal{}
		names := []string{"a", "b", "c", "d"}
		for _, n := range names {
			users[n] = &ideal{t: t, limit: user, at: c.Now()}
		}
		var refused int
		lastSweep := c.Now()
		for step := range 30000 {
			gap := 1500
			if step/5000%2 == 1 {
				gap = 400
			}
			c.Advance(time.Duration(rng.IntN(gap)) * time.Microsecond)
			if c.Now()-lastSweep > 12_500 {
				for _, s := range instances {
					s.Sweep(ctx)
				}
				lastSweep = c.Now()
			}
			s := instances[rng.IntN(len(instances))]
			u := names[rng.IntN(len(names))]
			cost := int64(1)
			if rng.IntN(10) == 0 {
				cost = int64(1 + rng.IntN(4))
			}
			bs := []store.Bucket{{Key: "{i}|org", Limit: org, Cost: cost}, {Key: "{i}|user|" + u, Limit: user, Cost: cost}}
			d, err := s.Decide(ctx, bs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				orgs.admit(c.Now(), cost, "a request (org)")
				users[u].admit(c.Now(), cost, "a request ("+u+")")
			} else {
				refused++
			}
			if t.Failed() {
				t.Fatalf("over-admitted by step %d", step)
			}
		}
		var st lease.Stats
		for _, s := range instances {
			x := s.Stats()
			st.Local += x.Local
			st.Renewals += x.Renewals
			st.Leased += x.Leased
			st.Grants += x.Grants
		}
		t.Logf("%+v refused %d admitted %d", st, refused, orgs.admitted)
		if st.Renewals < 100 || refused < 50 {
			t.Fatalf("the test needs renewals and refusals: %+v, %d refused", st, refused)
		}
	})
}

// TestLeaseRenewalConcurrentConservation: instances with a background sweep
// (renewals ahead), many goroutines on busy paths, limits flipping: once
// every instance is closed (everything given back), the store holds at
// least what was admitted (a unit spent twice, or given back twice,
// would leave it holding less).
func TestLeaseRenewalConcurrentConservation(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		in := inner(t, kind, nil)
		a := storetest.GCRA(10_000_000, 1000*time.Hour)
		b := storetest.GCRA(10_000_000, 1001*time.Hour)
		instances := make([]*lease.Store, 3)
		for i := range instances {
			s, err := lease.New(noClose{in}, lease.Options{TTL: 100 * time.Millisecond, MaxShare: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			instances[i] = s
		}
		var admitted [4]int64
		began := time.Now()
		done := make(chan struct{})
		var wg sync.WaitGroup
		var flip atomic.Bool
		for g := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 3))
				n := int64(0)
				u := g % 4
				for {
					select {
					case <-done:
						atomic.AddInt64(&admitted[u], n)
						return
					default:
					}
					l := a
					if flip.Load() && u == 0 {
						l = b
					}
					cost := int64(1)
					if rng.IntN(50) == 0 {
						cost = 3
					}
					bs := []store.Bucket{{Key: "{c}|org", Limit: a, Cost: cost}, {Key: "{c}|user|" + strconv.Itoa(u), Limit: l, Cost: cost}}
					d, err := instances[rng.IntN(len(instances))].Decide(ctx, bs)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						n += cost
					}
				}
			}()
		}
		renewals := func() (n int64) {
			for _, s := range instances {
				n += s.Stats().Renewals
			}
			return n
		}
		// A second of flips at least, and on until a renewal was sent (a
		// starved machine may take longer to see one): at most 30 s.
		for i := 0; i < 20 || renewals() == 0 && i < 600; i++ {
			time.Sleep(50 * time.Millisecond)
			flip.Store(!flip.Load())
		}
		close(done)
		wg.Wait()
		var st lease.Stats
		for _, s := range instances {
			s.Close()
			x := s.Stats()
			st.Local += x.Local
			st.Renewals += x.Renewals
			st.Grants += x.Grants
		}
		// The buckets drain while the test runs (2.8 units a second):
		// what may have drained since the first request, on top of a
		// margin of 10, is not a unit lost.
		var peeked []int64
		for u := range 4 {
			got := peekRemaining(t, in, []store.Bucket{{Key: "{c}|user|" + strconv.Itoa(u), Limit: a}})[0]
			peeked = append(peeked, got)
		}
		peeked = append(peeked, peekRemaining(t, in, []store.Bucket{{Key: "{c}|org", Limit: a}})[0])
		elapsed := time.Since(began)
		slack := 10 + int64(math.Ceil(elapsed.Seconds()*float64(a.Count)/a.Period.Seconds()))
		t.Logf("%v from the first request to the last peek: a margin of %d units", elapsed, slack)
		var total int64
		for u := range 4 {
			total += admitted[u]
			held := a.Count - peeked[u]
			t.Logf("user %d: admitted %d, the store holds %d (%d withheld or drained)", u, admitted[u], held, held-admitted[u])
			if held < admitted[u]-slack {
				t.Errorf("user %d: admitted %d, the store holds only %d", u, admitted[u], held)
			}
		}
		held := a.Count - peeked[4]
		t.Logf("org: admitted %d, holds %d; stats %+v", total, held, st)
		if held < total-slack {
			t.Errorf("org: admitted %d, the store holds only %d", total, held)
		}
		if st.Renewals == 0 {
			t.Errorf("no renewals: %+v", st)
		}
	})
}

// TestLeaseRenewalLosesNothing: one instance, one busy path, background
// sweep (renewals ahead): once closed, the store holds what was admitted,
// no more (the buckets drain about 3 units in the test). It caught a lease
// and its renewal that had both ended given back in the wrong order (the
// lease beneath the renewal: withheld).
func TestLeaseRenewalLosesNothing(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		in := inner(t, kind, nil)
		a := storetest.GCRA(10_000_000, 1000*time.Hour)
		s, err := lease.New(noClose{in}, lease.Options{TTL: 100 * time.Millisecond, MaxShare: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		var admitted int64
		bs := []store.Bucket{{Key: "{c}|org", Limit: a, Cost: 1}, {Key: "{c}|user", Limit: a, Cost: 1}}
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			d, err := s.Decide(ctx, bs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			time.Sleep(20 * time.Microsecond)
		}
		s.Close()
		got := peekRemaining(t, in, bs)
		more := []int64{a.Count - got[0] - admitted, a.Count - got[1] - admitted}
		t.Logf("admitted %d, the store holds %v more; %+v", admitted, more, s.Stats())
		// The buckets drain about 3 units in the test's second.
		if more[0] > 3 || more[1] > 3 {
			t.Errorf("once closed, the store holds %v more than the %d admitted: lost capacity", more, admitted)
		}
	})
}

// TestLeaseRenewalLeftoverGivenBack: a lease with units unspent when its
// renewal follows is charged beneath the renewal (the same path's), where a
// give-back would be withheld: it goes on being spent past its own end
// rather than given back, and when both end the renewal goes back first,
// then the lease, each the topmost. Once every lease has ended the store
// holds exactly what was admitted, whether the leases end by time (one
// after the other, or both before the path's next request) or by Close.
func TestLeaseRenewalLeftoverGivenBack(t *testing.T) {
	for _, end := range []string{"the lease ends", "both end before a request", "Close"} {
		t.Run(end, func(t *testing.T) {
			storetest.EachKind(t, func(t *testing.T, kind string) {
				c, in, s := leaseOn(t, kind, time.Second)
				daily := storetest.GCRA(1000, 24*time.Hour)
				busy := path("ann", 1, daily, daily)
				admitted := int64(0)
				req := func() {
					t.Helper()
					if d := decide(t, s, busy); !d.Allowed {
						t.Fatal("refused")
					}
					admitted++
				}
				req() // first sight: decided in the store
				c.Advance(10 * time.Millisecond)
				req() // a grant: 4 requests, 3 leased
				c.Advance(100 * time.Millisecond)
				req()
				c.Advance(840 * time.Millisecond)
				s.Sweep(context.Background())
				req() // 2 of 3 spent
				s.Sweep(context.Background())
				if st := s.Stats(); st.Renewals != 1 || st.Leased != 2 {
					t.Fatalf("stats %+v, want one renewal leased", st)
				}
				// The lease's last unit is not spent before its end.
				switch end {
				case "Close":
					s.Close()
				case "both end before a request":
					// The next request finds both ended, and takes a lease
					// of its own, giving both back with it: the renewal's
					// first, then the lease's, each the topmost.
					c.Advance(1100 * time.Millisecond)
					req()
					c.Advance(2 * time.Second)
					s.Sweep(context.Background())
				default:
					c.Advance(300 * time.Millisecond) // past the lease's end
					req()                             // the lease's last unit
					c.Advance(2 * time.Second)
					s.Sweep(context.Background())
				}
				got := peekRemaining(t, in, busy)
				if want := 1000 - admitted; got[0] != want || got[1] != want {
					t.Errorf("once every lease has ended the buckets hold %v of 1000 (remaining), want %d: %d admitted (stats %+v)",
						got, want, admitted, s.Stats())
				}
			})
		})
	}
}
