package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var start = time.Date(2026, 11, 25, 10, 30, 0, 0, time.UTC)

// inner opens the store leases are taken on: the memory store or a real
// Redis, on the test's clock.
func inner(t *testing.T, kind string, clock store.Clock) store.Leaser {
	t.Helper()
	switch kind {
	case "memory":
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	case "redis":
		r, err := store.NewRedis(context.Background(), store.RedisOptions{
			Addrs:     []string{redistest.Shared(t).Addr()},
			KeyPrefix: fmt.Sprintf("lease:%s:%x:", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), rand.Uint32()),
			Clock:     clock, Timeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	panic(kind)
}

// newLease is a lease store over in, on clock, swept only when the test
// says so; Close (at the end of the test) does not close in.
func newLease(t *testing.T, in store.Leaser, clock store.Clock, opts lease.Options) *lease.Store {
	t.Helper()
	opts.Clock, opts.Sweep = clock, -1
	s, err := lease.New(noClose{in}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// leaseOn is a lease store of TTL ttl over a fresh inner store of kind,
// both on a test clock (see newLease).
func leaseOn(t *testing.T, kind string, ttl time.Duration) (*storetest.Clock, store.Leaser, *lease.Store) {
	t.Helper()
	c := storetest.NewClock(start)
	in := inner(t, kind, c.Now)
	return c, in, newLease(t, in, c.Now, lease.Options{TTL: ttl})
}

type noClose struct{ store.Leaser }

func (noClose) Close() error { return nil }

func (n noClose) Reset(ctx context.Context, keys []string) (int, error) {
	return n.Leaser.(store.Resetter).Reset(ctx, keys)
}

func (n noClose) ResetMatching(ctx context.Context, m store.KeyMatch) (int, error) {
	return n.Leaser.(store.Resetter).ResetMatching(ctx, m)
}

func path(user string, cost int64, org, usr rate.Limit) []store.Bucket {
	return []store.Bucket{
		{Key: "{t|acme}|org", Limit: org, Cost: cost},
		{Key: "{t|acme}|user|" + user, Limit: usr, Cost: cost},
	}
}

func decide(t *testing.T, s store.Store, bs []store.Bucket) store.Decision {
	t.Helper()
	d, err := s.Decide(context.Background(), bs)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return d
}

// peekRemaining is what the inner store says remains on each bucket.
func peekRemaining(t *testing.T, s store.Store, bs []store.Bucket) []int64 {
	t.Helper()
	d, err := store.Peek(context.Background(), s, bs)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(bs))
	for i, r := range d.Results {
		out[i] = r.Remaining
	}
	return out
}

// TestLeaseLifecycle follows one path under an injected clock: decided in
// the store at first sight, leased from the second request, spent in
// memory, the lease's end giving back what is left, and nothing lost.
func TestLeaseLifecycle(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Second})
		daily := storetest.GCRA(1000, 24*time.Hour) // drains 0.0116 units/s: still during the test
		bs := path("ann", 1, daily, daily)

		if d := decide(t, s, bs); !d.Allowed || s.Stats().Strict != 1 {
			t.Fatalf("first sight: allowed %v, stats %+v; want decided in the store", d.Allowed, s.Stats())
		}
		c.Advance(10 * time.Millisecond)
		// Second sight, 10ms after the first: 100/s, 100 in a TTL, grown
		// at most fourfold from nothing: a lease of 4 requests (3 leased).
		if d := decide(t, s, bs); !d.Allowed {
			t.Fatal("second request refused")
		}
		if st := s.Stats(); st.Grants != 1 || st.Leased != 1 {
			t.Fatalf("second sight: stats %+v, want one grant", st)
		}
		if got := peekRemaining(t, in, bs); got[0] != 995 || got[1] != 995 {
			t.Fatalf("after the grant the store holds %v, want 995 (2 decided, 3 leased)", got)
		}
		for i := 0; i < 3; i++ {
			d := decide(t, s, bs)
			if !d.Allowed || d.Results[1].Remaining != int64(995+2-i) {
				t.Fatalf("leased request %d: allowed %v remaining %d, want admitted with %d", i, d.Allowed, d.Results[1].Remaining, 995+2-i)
			}
		}
		if st := s.Stats(); st.Local != 3 || st.StoreCalls() != 2 {
			t.Fatalf("stats %+v, want 3 local decisions and 2 store calls", st)
		}
		// The lease is spent: the next request takes a new one, sized
		// from the 4 requests seen since (at most 4×4).
		decide(t, s, bs)
		if st := s.Stats(); st.Grants != 2 {
			t.Fatalf("stats %+v, want a second grant", st)
		}
		leased := 1000 - 6 - peekRemaining(t, in, bs)[1]
		if leased <= 0 {
			t.Fatalf("second grant leased %d", leased)
		}
		// Spend two, let the TTL pass, sweep: the rest comes back.
		decide(t, s, bs)
		decide(t, s, bs)
		c.Advance(1100 * time.Millisecond)
		s.Sweep(context.Background())
		if st := s.Stats(); st.Releases != 1 {
			t.Fatalf("stats %+v, want the ended lease released", st)
		}
		if got := peekRemaining(t, in, bs); got[1] != 1000-8 {
			t.Fatalf("after the release the store holds %v, want %d (8 admitted)", got, 1000-8)
		}
	})
}

// TestLeaseMaxPaths: past MaxPaths a new path is decided in the store on
// every request, never leased; once the tracked paths have been idle for
// ten TTLs the sweep forgets them, and the new path is leased as any.
func TestLeaseMaxPaths(t *testing.T) {
	c := storetest.NewClock(start)
	in := inner(t, "memory", c.Now)
	s := newLease(t, in, c.Now, lease.Options{TTL: time.Second, MaxPaths: 2})
	daily := storetest.GCRA(1000, 24*time.Hour)
	for _, user := range []string{"ann", "bob"} {
		decide(t, s, path(user, 1, daily, daily))
		c.Advance(10 * time.Millisecond)
		decide(t, s, path(user, 1, daily, daily))
	}
	if st := s.Stats(); st.Grants != 2 {
		t.Fatalf("stats %+v, want a lease on each of the two paths", st)
	}
	cid := path("cid", 1, daily, daily)
	for i := range 5 {
		c.Advance(10 * time.Millisecond)
		if d := decide(t, s, cid); !d.Allowed {
			t.Fatalf("request %d of a path past MaxPaths refused", i)
		}
	}
	if st := s.Stats(); st.Grants != 2 || st.Strict != 2+5 {
		t.Fatalf("stats %+v, want the third path's 5 requests decided in the store (7 in all), no grant", st)
	}
	c.Advance(11 * time.Second) // the leases end, and the paths are idle for ten TTLs
	s.Sweep(context.Background())
	decide(t, s, cid)
	c.Advance(10 * time.Millisecond)
	decide(t, s, cid)
	if st := s.Stats(); st.Grants != 3 {
		t.Fatalf("stats %+v, want the third path leased once the idle paths are forgotten", st)
	}
}

// TestLeaseRenewal: the sweep renews the lease of a busy path shortly
// before it ends, with no request of its own, sized for what the path is
// expected to ask beyond what the lease has left; the lease goes on being
// spent, and the renewal takes over when it is spent or ends, so that the
// path's requests go on being decided in memory past the lease's end
// without taking a lease themselves. An idle path's lease is left to end.
// Nothing is lost: once every lease has ended the store holds exactly what
// was admitted.
func TestLeaseRenewal(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		// Swept by the test as if every TTL/16: a lease is renewed by the
		// sweep when it ends within 1¼ sweeps (78.125ms).
		c, in, s := leaseOn(t, kind, time.Second)
		daily := storetest.GCRA(1000, 24*time.Hour)
		busy := path("ann", 1, daily, daily)
		idle := []store.Bucket{{Key: "{t|beta}|org", Limit: daily, Cost: 1}, {Key: "{t|beta}|user|bob", Limit: daily, Cost: 1}}
		admitted := map[string]int64{}
		req := func(bs []store.Bucket) {
			t.Helper()
			if d := decide(t, s, bs); !d.Allowed {
				t.Fatal("refused")
			}
			admitted[bs[1].Key]++
		}
		for _, bs := range [][]store.Bucket{busy, idle} {
			req(bs) // first sight: decided in the store
		}
		c.Advance(10 * time.Millisecond)
		req(busy) // a grant: 4 requests, 3 leased
		req(idle) // the same
		if st := s.Stats(); st.Leased != 2 {
			t.Fatalf("stats %+v, want two leases", st)
		}
		c.Advance(100 * time.Millisecond)
		req(busy) // on the lease
		c.Advance(840 * time.Millisecond)
		s.Sweep(context.Background()) // 60ms before the leases end: no request since the last sweep
		if st := s.Stats(); st.Renewals != 0 {
			t.Fatalf("stats %+v: a path with no request in the last sweep renewed", st)
		}
		req(busy) // on the lease: 2 of 3 spent
		s.Sweep(context.Background())
		st := s.Stats()
		if st.Renewals != 1 || st.RenewCalls != 1 || st.Leased != 3 || st.Grants != 2 {
			t.Fatalf("stats %+v, want one renewal leased, no more grants", st)
		}
		// The 2 requests seen since the grant, over 940ms, make 2.1 in a
		// TTL: 3, of which the lease still has 1: the renewal leased 2.
		if got := peekRemaining(t, in, busy)[1]; got != 1000-4-1-2 {
			t.Fatalf("after the renewal the user's bucket holds %d, want %d (4 admitted, 1 and 2 leased)", got, 1000-4-1-2)
		}
		c.Advance(50 * time.Millisecond)
		req(busy) // the lease's last unit
		// Past the lease's end, on the renewal (sent 940ms after the grant).
		c.Advance(300 * time.Millisecond)
		req(busy)
		req(busy)
		if st := s.Stats(); st.Local != 5 || st.Grants != 2 || st.Strict != 2 {
			t.Fatalf("stats %+v, want every request since the grant decided on a lease", st)
		}
		// Everything ends; the sweeps give back what is left.
		c.Advance(2 * time.Second)
		s.Sweep(context.Background())
		for _, bs := range [][]store.Bucket{busy, idle} {
			got := peekRemaining(t, in, bs)
			if want := 1000 - admitted[bs[1].Key]; got[0] != want || got[1] != want {
				t.Errorf("%s: the buckets hold %v, want %d", bs[1].Key, got, want)
			}
		}
	})
}

// TestLeaseNoRenewalNearLimit: a lease that is not small next to what
// remains (more than a tenth of max_share of it) is not renewed ahead: the
// path's next lease is taken by the request that needs it, as without
// renewals, so that no capacity is held ahead near a limit.
func TestLeaseNoRenewalNearLimit(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c, _, s := leaseOn(t, kind, time.Second)
		hourly := storetest.GCRA(100, time.Hour)
		bs := path("ann", 1, hourly, hourly)
		decide(t, s, bs)
		c.Advance(10 * time.Millisecond)
		decide(t, s, bs) // a lease of 3: more than 1% of the 95 remaining
		for range 3 {
			c.Advance(300 * time.Millisecond)
			decide(t, s, bs)
			s.Sweep(context.Background())
		}
		if st := s.Stats(); st.Leased < 1 || st.Renewals != 0 {
			t.Fatalf("stats %+v, want a lease and no renewal", st)
		}
	})
}

// TestLeaseExact has three instances (lease stores over one store) decide
// 20 clients' requests at once against 1000 per day with cost 7: together
// they never admit more than floor(1000/7) = 142, and once every lease
// has ended, what they admitted and what the store holds add up exactly.
func TestLeaseExact(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		var inst [3]*lease.Store
		for i := range inst {
			inst[i] = newLease(t, in, c.Now, lease.Options{TTL: time.Second})
		}
		daily := storetest.GCRA(1000, 24*time.Hour)
		bs := func() []store.Bucket { return path("ann", 7, storetest.GCRA(1_000_000, time.Hour), daily) }
		var admitted atomic.Int64
		burst := func(n int) {
			var wg sync.WaitGroup
			for w := 0; w < 20; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := 0; j < n; j++ {
						d, err := inst[(w+j)%3].Decide(context.Background(), bs())
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
						c.Advance(time.Millisecond)
					}
				}()
			}
			wg.Wait()
		}
		burst(20)
		first := admitted.Load()
		if first > 142 {
			t.Fatalf("admitted %d, more than floor(1000/7) = 142", first)
		}
		// Every lease ends and gives back what it held.
		c.Advance(2 * time.Second)
		for _, s := range inst {
			s.Sweep(context.Background())
		}
		// Then one client, until the store refuses three times in a row:
		// its leases are spent before the next is taken, so nothing is
		// left unspent.
		for refused := 0; refused < 3; {
			d, err := inst[0].Decide(context.Background(), bs())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted.Add(1)
				refused = 0
			} else {
				refused++
			}
			c.Advance(time.Millisecond)
		}
		if got := admitted.Load(); got != 142 {
			t.Fatalf("admitted %d in all (%d in the first burst), want exactly 142", got, first)
		}
		var local int64
		for _, s := range inst {
			local += s.Stats().Local
		}
		if local == 0 {
			t.Fatal("no request was decided on a lease")
		}
		t.Logf("%s: first burst admitted %d of 142 (%d decided on leases in all)", kind, first, local)
	})
}

// TestLeasePadding checks that a lease on a bucket that refills fast is
// padded so that its units last the TTL (spent to the last one just
// before it ends), and that a bucket refilling more than max_share within
// the TTL is not leased at all.
func TestLeasePadding(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: 100 * time.Millisecond, MaxShare: 1})
		hundredPerSec := storetest.GCRA(100, time.Second)
		bs := []store.Bucket{{Key: "{t|d}|k", Limit: hundredPerSec, Cost: 1}}
		decide(t, s, bs)
		c.Advance(time.Millisecond)
		decide(t, s, bs) // a lease of 3 more over ~9 of padding
		if s.Stats().Leased != 1 {
			t.Fatalf("stats %+v, want a lease", s.Stats())
		}
		c.Advance(98 * time.Millisecond) // 9.9 units drained: the padding, not the lease
		for i := 0; i < 3; i++ {
			if d := decide(t, s, bs); !d.Allowed {
				t.Fatalf("leased request %d refused", i)
			}
		}
		if st := s.Stats(); st.Local != 3 {
			t.Fatalf("stats %+v, want the 3 leased units spent", st)
		}

		slow := newLease(t, in, c.Now, lease.Options{TTL: time.Second}) // 100 units refill in a second
		bs = []store.Bucket{{Key: "{t|e}|k", Limit: hundredPerSec, Cost: 1}}
		for i := 0; i < 5; i++ {
			c.Advance(time.Millisecond)
			decide(t, slow, bs)
		}
		if st := slow.Stats(); st.Leased != 0 || st.Local != 0 {
			t.Fatalf("stats %+v: a bucket refilling within the TTL was leased", st)
		}
	})
}

// TestLeaseRevoked checks that a reset ends the instance's leases on the
// reset buckets (nothing given back into the fresh bucket), and that a
// changed limit ends the lease taken on the old one.
func TestLeaseRevoked(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Minute})
		daily := storetest.GCRA(1000, 24*time.Hour)
		bs := path("bob", 1, daily, daily)
		decide(t, s, bs)
		c.Advance(time.Millisecond)
		decide(t, s, bs)
		if s.Stats().Leased != 1 {
			t.Fatalf("stats %+v, want a lease", s.Stats())
		}
		if _, err := s.Reset(context.Background(), []string{bs[1].Key}); err != nil {
			t.Fatal(err)
		}
		before := s.Stats()
		decide(t, s, bs)
		if after := s.Stats(); after.Local != before.Local {
			t.Fatalf("the lease outlived the reset of its bucket: %+v", after)
		}
		c.Advance(time.Millisecond)
		decide(t, s, bs) // leased again (or still)
		// An override halves the user's limit: the lease on the old limit
		// is not spent, and goes back.
		before = s.Stats()
		half := storetest.GCRA(500, 24*time.Hour)
		d := decide(t, s, path("bob", 1, daily, half))
		if after := s.Stats(); after.Local != before.Local || !d.Allowed {
			t.Fatalf("a lease on the old limit was spent: %+v", after)
		}
	})
}

// TestLeaseNearExhaustion checks that no lease is taken when less than
// min_remaining is left: each request is decided in the store.
func TestLeaseNearExhaustion(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Minute})
		hourly := storetest.GCRA(100, time.Hour)
		bs := []store.Bucket{{Key: "{t|x}|k", Limit: hourly, Cost: 1}}
		if d := decide(t, in, []store.Bucket{{Key: "{t|x}|k", Limit: hourly, Cost: 96}}); !d.Allowed {
			t.Fatal("setup refused")
		}
		for i := 0; i < 4; i++ {
			c.Advance(time.Millisecond)
			if d := decide(t, s, bs); !d.Allowed {
				t.Fatalf("request %d refused", i)
			}
		}
		d := decide(t, s, bs)
		if d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("the 101st unit: allowed %v retry %v, want a denial with a retry", d.Allowed, d.RetryAfter)
		}
		if st := s.Stats(); st.Leased != 0 || st.Local != 0 {
			t.Fatalf("stats %+v: leased near exhaustion", st)
		}
	})
}

// TestLeaseCostTooBig checks that a cost larger than what the lease has
// left goes to the store, which gives the old lease back in the same call.
func TestLeaseCostTooBig(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c := storetest.NewClock(start)
		in := inner(t, kind, c.Now)
		s := newLease(t, in, c.Now, lease.Options{TTL: time.Minute})
		daily := storetest.GCRA(100_000, 365*24*time.Hour) // 0.4 units drain in the test's two minutes
		decide(t, s, path("cy", 10, daily, daily))
		c.Advance(time.Millisecond)
		decide(t, s, path("cy", 10, daily, daily)) // 3 more requests of 10 leased
		big := path("cy", 500, daily, daily)
		if d := decide(t, s, big); !d.Allowed {
			t.Fatal("the big request was refused")
		}
		st := s.Stats()
		if st.Grants != 2 || st.Released != 1 {
			t.Fatalf("stats %+v, want a second grant giving back the first lease", st)
		}
		// What was admitted (10 + 10 + 500) and what is leased now account
		// for every unit: once the lease ends nothing is lost.
		c.Advance(2 * time.Minute)
		s.Sweep(context.Background())
		if got := peekRemaining(t, in, big); got[1] != 100_000-520 {
			t.Fatalf("the store holds %v, want %d", got, 100_000-520)
		}
	})
}

// BenchmarkLeaseLocal is a request decided on a lease (a 4-tier path, the
// lease never running out), against the same path on the memory store:
// what deciding in memory on a lease costs over deciding in memory.
func BenchmarkLeaseLocal(b *testing.B) {
	huge := storetest.GCRA(1_000_000_000_000, time.Hour)
	path := []store.Bucket{
		{Key: "{t|org=o}", Limit: huge, Cost: 1}, {Key: "{t|org=o}team=t", Limit: huge, Cost: 1},
		{Key: "{t|org=o}team=t/user=u", Limit: huge, Cost: 1}, {Key: "{t|org=o}team=t/user=u/agent=a", Limit: huge, Cost: 1},
	}
	b.Run("memory store", func(b *testing.B) {
		m := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
		defer m.Close()
		buf := make([]rate.Result, len(path))
		for b.Loop() {
			m.DecideInto(context.Background(), path, buf)
		}
	})
	b.Run("on a lease", func(b *testing.B) {
		m := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
		s, err := lease.New(m, lease.Options{TTL: time.Minute, MaxShare: 1, Sweep: -1})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		buf := make([]rate.Result, len(path))
		for range 20 { // past the first sight and the fourfold growth
			s.DecideInto(context.Background(), path, buf)
			time.Sleep(time.Millisecond)
		}
		before := s.Stats()
		for b.Loop() {
			s.DecideInto(context.Background(), path, buf)
		}
		if after := s.Stats(); after.Local-before.Local < int64(b.N)*9/10 {
			b.Fatalf("%d of %d decided on the lease", after.Local-before.Local, b.N)
		}
	})
	// 1,000 paths in turn (the load script's 1,000 users), as a busy
	// instance sees them: a path's state is rarely still in the cache.
	b.Run("on a lease, 1,000 paths", func(b *testing.B) {
		m := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
		s, err := lease.New(m, lease.Options{TTL: time.Minute, MaxShare: 1, Sweep: -1})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		paths := make([][]store.Bucket, 1000)
		for u := range paths {
			for i, b := range path {
				b.Key += strings.Repeat("/", i) + strconv.Itoa(u)
				paths[u] = append(paths[u], b)
			}
		}
		buf := make([]rate.Result, len(path))
		for range 20 {
			for _, p := range paths {
				s.DecideInto(context.Background(), p, buf)
			}
			time.Sleep(time.Millisecond)
		}
		before, n := s.Stats(), 0
		for b.Loop() {
			s.DecideInto(context.Background(), paths[n%len(paths)], buf)
			n++
		}
		if after := s.Stats(); after.Local-before.Local < int64(b.N)*9/10 {
			b.Fatalf("%d of %d decided on the lease", after.Local-before.Local, b.N)
		}
	})
}
