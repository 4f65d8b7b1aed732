package store_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/freeport"
	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestMain stops the Redis processes shared by this package's tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// testTimeout bounds decisions in tests that are not about timeouts: long
// enough for 200 concurrent clients under -race on a busy 2-core machine.
const testTimeout = 10 * time.Second

// prefix gives a test its own keys on a shared server: the test's name
// (braces removed, as KeyPrefix requires) and a random part, so -count=N
// runs never see each other's state.
func prefix(t testing.TB) string {
	name := strings.NewReplacer("{", "", "}", "", " ", "_").Replace(t.Name())
	return fmt.Sprintf("%s:%x:", name, rand.Uint32())
}

// newRedis opens a store for t and closes it when t ends.
func newRedis(t testing.TB, opts store.RedisOptions) *store.Redis {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	r, err := store.NewRedis(context.Background(), opts)
	if err != nil {
		t.Fatalf("NewRedis: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// hung is what tests about a hanging Redis give go-redis's own network
// timeouts: a call that the store's Timeout does not end takes this long,
// far past any bound a test sets, however slow the machine.
const hung = time.Minute

// unavailableBound is how long past its Timeout a call to a hanging or
// absent Redis may take to fail: scheduling on a busy machine, with room to
// spare, and still far short of hung.
const unavailableBound = 10 * time.Second

// waitFor polls cond until it returns nil, and fails t if it has not within
// the given time, saying what was awaited and cond's last word on why not.
func waitFor(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", within, what, err)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not timing behaviour
	}
}

// warm has s decide path until Redis has answered once (its connections
// open), and returns that decision: a store with a short Timeout, made for
// a hanging Redis, may time out on a healthy one when the machine is slow.
func warm(t testing.TB, s *store.Redis, path []store.Bucket) store.Decision {
	t.Helper()
	var d store.Decision
	waitFor(t, unavailableBound, "a healthy Redis to answer", func() (err error) {
		d, err = s.Decide(context.Background(), path)
		return err
	})
	return d
}

func TestRedisConformance(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store {
		return newRedis(t, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: prefix(t), Clock: clock})
	})
}

func TestRedisLeaseConformance(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	storetest.RunLeases(t, func(t *testing.T, clock store.Clock) store.Leaser {
		return newRedis(t, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: prefix(t), Clock: clock})
	})
}

// TestRedisClusterLeaseConformance leases on a 3-master Cluster: a path in
// one slot is leased by the master of that slot; with every bucket in a
// slot of its own, slot by slot, with the same outcomes.
func TestRedisClusterLeaseConformance(t *testing.T) {
	addrs := redistest.SharedCluster(t).Addrs()
	t.Run("one slot per path", func(t *testing.T) {
		storetest.RunLeases(t, func(t *testing.T, clock store.Clock) store.Leaser {
			return newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: prefix(t), Clock: clock})
		})
	})
	t.Run("one slot per bucket", func(t *testing.T) {
		storetest.RunLeases(t, func(t *testing.T, clock store.Clock) store.Leaser {
			return &slotPerBucket{Redis: newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: prefix(t), Clock: clock})}
		})
	})
}

// TestRedisClusterConformance runs the suite on a 3-master Redis Cluster
// twice: as the hierarchy lays keys out (one hash tag per path, so one
// script per decision), and with every bucket given a hash tag of its own,
// so that paths span slots and masters and every decision goes through the
// per-slot path, with refunds whenever a slot denies. Both must give the
// memory store's decisions.
// TestRedisUnixSocketConformance runs the suite over the server's Unix
// socket, the fastest way to a Redis on the same machine.
func TestRedisUnixSocketConformance(t *testing.T) {
	socket := redistest.Shared(t).Socket()
	storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store {
		return newRedis(t, store.RedisOptions{Addrs: []string{socket}, KeyPrefix: prefix(t), Clock: clock})
	})
}

func TestRedisClusterConformance(t *testing.T) {
	addrs := redistest.SharedCluster(t).Addrs()
	open := func(t *testing.T, clock store.Clock) *store.Redis {
		return newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: prefix(t), Clock: clock})
	}
	t.Run("one slot per path", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store { return open(t, clock) })
	})
	t.Run("one slot per bucket", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store {
			return &slotPerBucket{Redis: open(t, clock)}
		})
	})
}

// slotPerBucket gives each bucket a hash tag of its own ("{conf|g2}|user"
// becomes "{conf|g2|user}"), so a path's buckets land in different slots.
//
// It also serialises decisions. Across slots, a request denied by one slot
// holds its charge in the others until the refund lands, and a concurrent
// request may be denied by that charge: the documented, brief
// under-admission of the per-slot path, which the suite's exact concurrent
// bursts do not allow for. TestRedisClusterConcurrentRefunds covers
// concurrency across slots instead.
type slotPerBucket struct {
	*store.Redis
	mu sync.Mutex
}

func retag(buckets []store.Bucket) []store.Bucket {
	out := make([]store.Bucket, len(buckets))
	for i, b := range buckets {
		b.Key = "{" + strings.NewReplacer("{", "", "}", "").Replace(b.Key) + "}"
		out[i] = b
	}
	return out
}

func (s *slotPerBucket) Decide(ctx context.Context, buckets []store.Bucket) (store.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Redis.Decide(ctx, retag(buckets))
}

func (s *slotPerBucket) Adjust(ctx context.Context, buckets []store.Bucket) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Redis.Adjust(ctx, retag(buckets))
}

func (s *slotPerBucket) Lease(ctx context.Context, g store.Grant) (store.Leased, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.Buckets, g.Release = retag(g.Buckets), retagReleases(g.Release)
	return s.Redis.Lease(ctx, g)
}

func (s *slotPerBucket) LeaseAll(ctx context.Context, gs []store.Grant) ([]store.Leased, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tagged := make([]store.Grant, len(gs))
	for i, g := range gs {
		g.Buckets, g.Release = retag(g.Buckets), retagReleases(g.Release)
		tagged[i] = g
	}
	return s.Redis.LeaseAll(ctx, tagged)
}

func (s *slotPerBucket) Release(ctx context.Context, r []store.Release) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Redis.Release(ctx, retagReleases(r))
}

func (s *slotPerBucket) Reset(ctx context.Context, keys []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tagged := make([]string, len(keys))
	for i, k := range keys {
		tagged[i] = retag([]store.Bucket{{Key: k}})[0].Key
	}
	return s.Redis.Reset(ctx, tagged)
}

func retagReleases(r []store.Release) []store.Release {
	out := make([]store.Release, len(r))
	for i, rel := range r {
		rel.Bucket = retag([]store.Bucket{rel.Bucket})[0]
		out[i] = rel
	}
	return out
}

// TestRedisClusterConcurrentRefunds: 200 concurrent requests on a path of
// three tiers in three slots never over-admit, and once they are done every
// refund has landed: each bucket holds exactly the admitted requests' cost.
func TestRedisClusterConcurrentRefunds(t *testing.T) {
	clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC))
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs(), KeyPrefix: p, Clock: clock.Now})
	path := retag([]store.Bucket{
		{Key: "{r}|org", Limit: storetest.GCRA(1000, time.Hour), Cost: 7},
		{Key: "{r}|team", Limit: storetest.GCRA(500, time.Hour), Cost: 7},
		{Key: "{r}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 7},
	})
	slots := map[int]bool{}
	for _, b := range path {
		slots[store.RedisKeySlot(p+b.Key)] = true
	}
	if len(slots) != 3 {
		t.Fatalf("the path spans %d slots, want 3", len(slots))
	}
	admitted := burst(t, []*store.Redis{s}, 200, path)
	if admitted < 1 || admitted > 14 {
		t.Fatalf("admitted %d, want between 1 and floor(100/7) = 14", admitted)
	}
	for _, b := range path {
		if got := storedLevel(t, s, p+b.Key); got != float64(7*admitted) {
			t.Errorf("%s: level %v, want %d: a charge was not refunded", b.Key, got, 7*admitted)
		}
	}
	t.Logf("%d of 200 admitted across slots (floor(C/k) = 14)", admitted)
}

// storedLevel reads a GCRA bucket's level (rate.State.A) from Redis: the
// first of the little-endian float64s package lua stores.
func storedLevel(t *testing.T, s *store.Redis, key string) float64 {
	t.Helper()
	v, err := s.Client().Get(context.Background(), key).Bytes()
	if err != nil || len(v) != 32 {
		t.Fatalf("state of %s: %q (%v), want 32 bytes", key, v, err)
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(v))
}

// burst runs n concurrent decisions of path, spread over stores, and
// returns how many were admitted.
func burst(t *testing.T, stores []*store.Redis, n int, path []store.Bucket) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := stores[i%len(stores)].Decide(context.Background(), path)
			if err != nil {
				errs <- err
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Decide: %v", err)
	}
	return int(admitted.Load())
}

// TestRedisClusterRefund: a global ceiling in one slot admits, a tenant's
// limit in another slot denies; the global charge must be refunded, so
// that nothing is consumed anywhere.
func TestRedisClusterRefund(t *testing.T) {
	cluster := redistest.SharedCluster(t)
	clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC))
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: cluster.Addrs(), KeyPrefix: p, Clock: clock.Now})
	global := store.Bucket{Key: "{global}|all", Limit: storetest.GCRA(100, time.Hour), Cost: 1}
	tenant := store.Bucket{Key: "{tenant-a}|user", Limit: storetest.GCRA(2, time.Hour), Cost: 1}
	if store.RedisKeySlot(p+global.Key) == store.RedisKeySlot(p+tenant.Key) {
		t.Fatal("the test's keys share a slot; pick other hash tags")
	}
	ctx := context.Background()
	path := []store.Bucket{global, tenant}

	steps := []struct {
		name      string
		path      []store.Bucket
		allowed   bool
		remaining []int64
	}{
		{"both admit", path, true, []int64{99, 1}},
		{"both admit again", path, true, []int64{98, 0}},
		{"tenant denies: global refunded", path, false, []int64{98, 0}},
		{"and again", path, false, []int64{98, 0}},
		{"global alone sees no charge from the denials", []store.Bucket{global}, true, []int64{97}},
	}
	for _, st := range steps {
		d, err := s.Decide(ctx, st.path)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if d.Allowed != st.allowed {
			t.Fatalf("%s: allowed = %v, want %v", st.name, d.Allowed, st.allowed)
		}
		for i, want := range st.remaining {
			if got := d.Results[i].Remaining; got != want {
				t.Fatalf("%s: bucket %d remaining %d, want %d", st.name, i, got, want)
			}
		}
	}
	// The refund is exact: the global bucket's stored level is 3 (three
	// admissions), not 5.
	if got := storedLevel(t, s, p+global.Key); got != 3 {
		t.Fatalf("global level %v, want 3", got)
	}
}

// TestRedisKeySlot holds RedisKeySlot to Redis's own CLUSTER KEYSLOT.
func TestRedisKeySlot(t *testing.T) {
	tests := []struct {
		key  string
		want int // -1: ask Redis only
	}{
		{"123456789", 0x31C3}, // the CRC-16/XMODEM check value
		{"foo", 12182},
		{"{user1000}.following", -1},
		{"{user1000}.followers", -1},
		{"foo{}{bar}", -1},    // empty tag: the whole key
		{"foo{{bar}}zap", -1}, // tag "{bar"
		{"foo{bar}{zap}", -1}, // first tag only
		{"{", -1},
		{"}{", -1},
		{"cascade:{acme|org%7Bx}|team|eng", -1},
		{"", -1},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		b := make([]byte, r.IntN(24))
		for j := range b {
			b[j] = "ab{}|:%\x00\xff"[r.IntN(9)]
		}
		tests = append(tests, struct {
			key  string
			want int
		}{string(b), -1})
	}
	node := redistest.SharedCluster(t).Masters[0].Addr()
	for _, tt := range tests {
		got := store.RedisKeySlot(tt.key)
		reply, err := redistest.Do(node, "CLUSTER", "KEYSLOT", tt.key)
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", tt.key, err)
		}
		redisSlot, _ := strconv.Atoi(reply)
		if got != redisSlot || tt.want >= 0 && got != tt.want {
			t.Errorf("RedisKeySlot(%q) = %d; Redis says %d, want %d", tt.key, got, redisSlot, tt.want)
		}
	}
}

// TestRedisExactBurst: 200 concurrent clients against capacity C with cost
// k admit exactly floor(C/k), on Redis's own clock (no injected time: the
// refill of 100/h is too slow to add a unit during the burst), through one
// store or through three stores with their own clients and pools, as three
// Caddy instances would.
func TestRedisExactBurst(t *testing.T) {
	standalone := func(t *testing.T) []string { return []string{redistest.Shared(t).Addr()} }
	cluster := func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }
	oneBucket := []store.Bucket{{Key: "{x}|k", Limit: storetest.GCRA(100, time.Hour), Cost: 3}}
	threeTiers := []store.Bucket{
		{Key: "{x}|org", Limit: storetest.GCRA(1000, time.Hour), Cost: 7},
		{Key: "{x}|team", Limit: storetest.GCRA(500, time.Hour), Cost: 7},
		{Key: "{x}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 7},
	}
	// Across slots a request is charged slot by slot and refunded on a
	// denial. Only the user's slot can deny here (the global ceiling holds
	// all 200 at once), so admissions are still exactly the user's floor(C/k).
	crossSlot := []store.Bucket{
		{Key: "{global}|all", Limit: storetest.GCRA(10000, time.Hour), Cost: 7},
		{Key: "{x}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 7},
	}
	// The ceiling (70/7 = 10) binds before the user (100/7 = 14): the
	// user's slot decides first, so requests it refuses never hold the
	// ceiling's capacity while they wait for a refund.
	ceilingBinds := []store.Bucket{
		{Key: "{global}|all", Limit: storetest.GCRA(70, time.Hour), Cost: 7},
		{Key: "{x}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 7},
	}
	tests := []struct {
		name   string
		addrs  func(t *testing.T) []string
		stores int
		path   []store.Bucket
		want   int
	}{
		{"one store, one bucket", standalone, 1, oneBucket, 33},
		{"three stores, one bucket", standalone, 3, oneBucket, 33},
		{"three stores, three tiers", standalone, 3, threeTiers, 14},
		{"cluster, three stores, three tiers", cluster, 3, threeTiers, 14},
		{"cluster, three stores, global ceiling in another slot", cluster, 3, crossSlot, 14},
		{"cluster, three stores, the global ceiling binds", cluster, 3, ceilingBinds, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := prefix(t)
			addrs := tt.addrs(t)
			stores := make([]*store.Redis, tt.stores)
			for i := range stores {
				stores[i] = newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: p})
			}
			if got := burst(t, stores, 200, tt.path); got != tt.want {
				t.Fatalf("admitted %d of 200, want exactly %d", got, tt.want)
			}
		})
	}
}

// TestRedisEveryKeyHasTTL decides and adjusts buckets of every algorithm on
// Redis's clock, then requires a positive PTTL on every key left behind.
func TestRedisEveryKeyHasTTL(t *testing.T) {
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, KeyPrefix: p})
	ctx := context.Background()
	paris, _ := time.LoadLocation("Europe/Paris")
	path := []store.Bucket{
		{Key: "{ttl}|gcra", Limit: storetest.GCRA(10, time.Minute), Cost: 1},
		{Key: "{ttl}|burst", Limit: rate.Limit{Algorithm: rate.GCRA, Count: 30, Period: time.Minute, Burst: 15}, Cost: 1},
		{Key: "{ttl}|sliding", Limit: rate.Limit{Algorithm: rate.Sliding, Count: 100, Period: 30 * time.Minute}, Cost: 1},
		{Key: "{ttl}|day", Limit: rate.Limit{Algorithm: rate.Calendar, Count: 1000, Unit: rate.Day}, Cost: 1},
		{Key: "{ttl}|month", Limit: rate.Limit{Algorithm: rate.Calendar, Count: 100000, Unit: rate.Month, Location: paris}, Cost: 1},
		{Key: "{ttl}|slots", Limit: rate.Limit{Algorithm: rate.Concurrent, Count: 5}, Cost: 1, Holder: 1},
	}
	for i := 0; i < 12; i++ { // past the 10/min limit: denials too
		if _, err := s.Decide(ctx, path); err != nil {
			t.Fatal(err)
		}
	}
	debt := []store.Bucket{{Key: "{ttl}|debt", Limit: storetest.GCRA(100, time.Hour), Cost: 500}}
	if err := s.Adjust(ctx, debt); err != nil {
		t.Fatal(err)
	}
	// A refund down to a full bucket leaves no key at all.
	refunded := []store.Bucket{{Key: "{ttl}|refunded", Limit: storetest.GCRA(100, time.Hour), Cost: 5}}
	if _, err := s.Decide(ctx, refunded); err != nil {
		t.Fatal(err)
	}
	refunded[0].Cost = -50
	if err := s.Adjust(ctx, refunded); err != nil {
		t.Fatal(err)
	}
	// An exact sliding window's log is rewritten by a correction.
	slidingDebt := []store.Bucket{{Key: "{ttl}|sliding-debt", Limit: rate.Limit{Algorithm: rate.Sliding, Count: 100, Period: time.Hour}, Cost: 1}}
	for i := 0; i < 3; i++ {
		if _, err := s.Decide(ctx, slidingDebt); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // three entries, not one
	}
	slidingDebt[0].Cost = 7
	if err := s.Adjust(ctx, slidingDebt); err != nil {
		t.Fatal(err)
	}

	keys, err := s.Client().Keys(ctx, p+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// The decided buckets, the debt, and the two sliding windows with
	// their logs.
	if len(keys) != len(path)+4 {
		t.Fatalf("found keys %v, want the %d decided, the debt, a second sliding window and the logs of both", keys, len(path))
	}
	for _, k := range keys {
		pttl, err := s.Client().PTTL(ctx, k).Result()
		if err != nil || pttl <= 0 {
			t.Errorf("key %q: PTTL %v (%v), want a positive TTL", k, pttl, err)
		}
	}
}

// TestRedisUnavailable: whatever is wrong with Redis, Decide, Adjust and
// Ping return an error wrapping store.ErrUnavailable within the store's
// Timeout, and never hang.
//
// The stores here give go-redis's own network timeouts a minute (hung), so
// that a call the store's Timeout does not end takes a minute or forever:
// the bound a call must return within can then be generous (unavailableBound,
// seconds past the timeout) and still tell the two apart on a slow machine.
func TestRedisUnavailable(t *testing.T) {
	const timeout = 200 * time.Millisecond
	bucket := []store.Bucket{{Key: "{dead}|k", Limit: storetest.GCRA(10, time.Minute), Cost: 1}}
	opts := func(addrs []string, timeout time.Duration) store.RedisOptions {
		return store.RedisOptions{Addrs: addrs, Timeout: timeout, DialTimeout: hung, ReadTimeout: hung, WriteTimeout: hung}
	}

	check := func(t *testing.T, s *store.Redis, timeout time.Duration) {
		t.Helper()
		calls := []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"Decide", func(ctx context.Context) error { _, err := s.Decide(ctx, bucket); return err }},
			{"Adjust", func(ctx context.Context) error { return s.Adjust(ctx, bucket) }},
			{"Ping", s.Ping},
		}
		for _, c := range calls {
			began := time.Now()
			err := c.call(context.Background())
			elapsed := time.Since(began)
			t.Logf("%s failed after %v (timeout %v): %v", c.name, elapsed, timeout, err)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s: error %v, want one wrapping store.ErrUnavailable", c.name, err)
			}
			if elapsed > timeout+unavailableBound {
				t.Errorf("%s took %v: the %v timeout did not end it (go-redis's own timeouts are %v)", c.name, elapsed, timeout, hung)
			}
		}
	}

	t.Run("closed port", func(t *testing.T) {
		// A port below the kernel's ephemeral range: a dial to a closed
		// port of that range may be given that very port as its own, and
		// connect to itself.
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freeport.Get(t)))
		began := time.Now()
		_, err := store.NewRedis(context.Background(), opts([]string{addr}, timeout))
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("NewRedis on a closed port: %v, want an error wrapping store.ErrUnavailable", err)
		}
		t.Logf("NewRedis failed after %v: %v", time.Since(began), err)
		o := opts([]string{addr}, timeout)
		o.LazyLoad = true
		check(t, newRedis(t, o), timeout)
		// A refused connection fails the decision at once: one dial, no
		// retries 100 ms apart, so the failure policy applies without
		// waiting out the timeout. The dials are counted on a store whose
		// timeout no slow machine can reach: the refusal ends the call.
		o.Timeout = testTimeout
		s := newRedis(t, o)
		dials := &counter{}
		s.Client().(*redis.Client).AddHook(dials)
		began = time.Now()
		_, err = s.Decide(context.Background(), bucket)
		t.Logf("Decide on a refused port failed after %v, %d dials: %v", time.Since(began), dials.dials.Load(), err)
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("Decide on a refused port: %v, want ErrUnavailable with the refusal", err)
		}
		if n := dials.dials.Load(); n != 1 {
			t.Errorf("Decide on a refused port dialled %d times, want once", n)
		}
	})

	t.Run("killed server, then restarted", func(t *testing.T) {
		// A killed server refuses at once, whatever the timeout: a long one
		// lets the decision after the restart take what a slow machine needs.
		srv := redistest.Start(t)
		s := newRedis(t, opts([]string{srv.Addr()}, testTimeout))
		if _, err := s.Decide(context.Background(), bucket); err != nil {
			t.Fatal(err)
		}
		srv.Kill()
		check(t, s, testTimeout)
		srv.Restart(t)
		// A restarted Redis has lost the scripts: EVALSHA answers
		// NOSCRIPT and the store sends the script again.
		d, err := s.Decide(context.Background(), bucket)
		if err != nil || !d.Allowed {
			t.Fatalf("after restart: %+v, %v", d, err)
		}
	})

	t.Run("hanging server", func(t *testing.T) {
		srv := redistest.Start(t)
		s := newRedis(t, opts([]string{srv.Addr()}, timeout))
		warm(t, s, bucket)
		srv.Pause() // connections open, nothing answers
		defer srv.Resume()
		check(t, s, timeout)
	})

	t.Run("cluster with a hanging master", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		s := newRedis(t, opts(c.Addrs(), timeout))
		for _, m := range c.Masters {
			m.Pause()
			defer m.Resume()
		}
		check(t, s, timeout)
	})

	t.Run("cluster hanging after a path's first slot admitted", func(t *testing.T) {
		// The tenant's slot admits, then every master stops answering:
		// the ceiling's slot times out, and the refund of the tenant's
		// slot runs in the background, bounded by a timeout of its own,
		// rather than making the request wait a second timeout: when
		// Decide returns, the refund has not come back (the master that
		// would answer it hangs for another timeout). The timeout is long
		// enough for the tenant's slot to answer on a slow machine.
		const timeout = 3 * time.Second
		c := redistest.StartCluster(t, 3)
		o := opts(c.Addrs(), timeout)
		o.KeyPrefix = prefix(t)
		s := newRedis(t, o)
		path := []store.Bucket{
			{Key: "{global}|all", Limit: storetest.GCRA(100, time.Hour), Cost: 1},
			{Key: "{tenant-a}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 1},
		}
		if _, err := s.Decide(context.Background(), path); err != nil { // connections warm
			t.Fatal(err)
		}
		var once sync.Once
		pause := afterScript(func() {
			once.Do(func() {
				for _, m := range c.Masters {
					m.Pause()
				}
			})
		})
		refunds := &counter{sha: lua.Adjust.Hash()}
		s.Client().(*redis.ClusterClient).ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error {
			n.AddHook(pause) // scripts go to each master's own client
			n.AddHook(refunds)
			return nil
		})
		resume := func() {
			for _, m := range c.Masters {
				m.Resume()
			}
		}
		defer resume()
		began := time.Now()
		_, err := s.Decide(context.Background(), path)
		elapsed := time.Since(began)
		sent, ended := refunds.sent.Load(), refunds.ended.Load()
		t.Logf("Decide failed after %v (timeout %v), %d refunds sent, %d back: %v", elapsed, timeout, sent, ended, err)
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Decide: %v, want ErrUnavailable", err)
		}
		if ended != 0 {
			t.Fatalf("Decide returned after %v, once the refund had come back: the request waited for it", elapsed)
		}
		if elapsed > timeout+unavailableBound {
			t.Fatalf("Decide took %v: the %v timeout did not end it", elapsed, timeout)
		}
		resume()
		waitFor(t, timeout+unavailableBound, "the refund to be sent and answered once Redis is back", func() error {
			if n := refunds.ended.Load(); n == 0 {
				return fmt.Errorf("%d refunds sent, none answered", refunds.sent.Load())
			}
			return nil
		})
	})

	t.Run("cluster hanging before its slot map is known", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		for _, m := range c.Masters {
			m.Pause()
			defer m.Resume()
		}
		// Started lazily (as Caddy does when Redis is down at start-up):
		// the first decision must load the slot map within its timeout.
		o := opts(c.Addrs(), timeout)
		o.LazyLoad = true
		check(t, newRedis(t, o), timeout)
	})

	t.Run("caller's context already done", func(t *testing.T) {
		s := newRedis(t, store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, KeyPrefix: prefix(t)})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Decide(ctx, bucket); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Decide with a cancelled context: %v, want store.ErrUnavailable", err)
		}
	})
}

// TestRedisOneEvalshaPerDecision counts the commands Redis executed: one
// EVALSHA per decision whatever the number of tiers, and a SCRIPT FLUSH
// between decisions is survived by one EVAL that reloads the script.
func TestRedisOneEvalshaPerDecision(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	path := make([]store.Bucket, 5)
	for i := range path {
		path[i] = store.Bucket{Key: fmt.Sprintf("{one}|tier%d", i), Limit: storetest.GCRA(1000, time.Hour), Cost: 1}
	}
	decide := func(n int, wantRemaining int64) {
		t.Helper()
		for i := 0; i < n; i++ {
			d, err := s.Decide(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || d.Results[4].Remaining != wantRemaining {
				t.Fatalf("decision: allowed %v remaining %d, want %d", d.Allowed, d.Results[4].Remaining, wantRemaining)
			}
			wantRemaining--
		}
	}
	resetStats(t, srv.Addr())
	decide(10, 999)
	st := commandStats(t, srv.Addr())
	if st["evalsha"].calls != 10 || st["eval"].calls != 0 {
		t.Fatalf("10 decisions ran %d EVALSHA and %d EVAL, want 10 and 0", st["evalsha"].calls, st["eval"].calls)
	}

	if _, err := redistest.Do(srv.Addr(), "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	resetStats(t, srv.Addr())
	decide(10, 989) // the state survived, only the script cache was flushed
	st = commandStats(t, srv.Addr())
	if st["evalsha"].calls != 10 || st["eval"].calls != 1 {
		t.Fatalf("after SCRIPT FLUSH, 10 decisions ran %d EVALSHA and %d EVAL, want 10 (one NOSCRIPT) and 1",
			st["evalsha"].calls, st["eval"].calls)
	}
}

// TestRedisBatchesConcurrentDecisions fires 200 concurrent decisions of
// five tenants, each under one organisation-wide bucket, at one store. The
// decisions that queue up while others are on the wire go to Redis
// together, as one script call per batch (per slot on a Cluster): there
// must be fewer script calls than decisions, and still exactly each
// tenant's floor(C/k) admitted — 40 requests of cost 1 against 20 each,
// under an organisation of 90 that every tenant shares on a standalone
// Redis (so 90 in all), and on a Cluster, where tenants sit in different
// slots, each tenant's 20.
func TestRedisBatchesConcurrentDecisions(t *testing.T) {
	tests := []struct {
		name    string
		cluster bool
		want    int
	}{{"standalone", false, 90}, {"cluster", true, 100}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []string
			if tt.cluster {
				addrs = redistest.StartCluster(t, 3).Addrs()
			} else {
				addrs = []string{redistest.Start(t).Addr()}
			}
			s := newRedis(t, store.RedisOptions{Addrs: addrs})
			paths := make([][]store.Bucket, 5)
			for i := range paths {
				tenant := fmt.Sprintf("{tenant%d}", i)
				org := "{org}|all"
				if tt.cluster { // no cross-slot path: each tenant's own ceiling
					org = tenant + "|org"
				}
				paths[i] = []store.Bucket{
					{Key: org, Limit: storetest.GCRA(90, time.Hour), Cost: 1},
					{Key: tenant + "|team", Limit: storetest.GCRA(20, time.Hour), Cost: 1},
					{Key: tenant + "|user", Limit: storetest.GCRA(1000, time.Hour), Cost: 1},
				}
			}
			for _, a := range addrs {
				resetStats(t, a)
			}
			start := make(chan struct{})
			admitted := make([]atomic.Int64, len(paths))
			var wg sync.WaitGroup
			for i := 0; i < 200; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d, err := s.Decide(context.Background(), paths[i%len(paths)])
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted[i%len(paths)].Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			total, calls := 0, int64(0)
			for i := range admitted {
				n := int(admitted[i].Load())
				total += n
				if n > 20 {
					t.Errorf("tenant %d: admitted %d, more than its 20", i, n)
				}
			}
			if total != tt.want {
				t.Errorf("admitted %d of 200, want exactly %d", total, tt.want)
			}
			for _, a := range addrs {
				st := commandStats(t, a)
				calls += st["evalsha"].calls + st["eval"].calls
			}
			t.Logf("200 decisions in %d script calls", calls)
			if calls >= 200 {
				t.Errorf("200 concurrent decisions took %d script calls: nothing was batched", calls)
			}
		})
	}
}

// tiers is a path of n GCRA buckets under one hash tag, each of 1,000,000
// per hour: a benchmark's few hundred thousand decisions all admit and so
// write every key (the slow path), while the buckets fill as real ones do,
// so that their TTLs are those of busy buckets (minutes, not microseconds).
func tiers(n int) []store.Bucket {
	path := make([]store.Bucket, n)
	for i := range path {
		path[i] = store.Bucket{Key: fmt.Sprintf("{bench%d}|tier%d", n, i), Limit: storetest.GCRA(1_000_000, time.Hour), Cost: 1}
	}
	return path
}

func TestRedisOptionsRejected(t *testing.T) {
	tests := []struct {
		name string
		opts store.RedisOptions
		want string
	}{
		{"prefix with a brace", store.RedisOptions{KeyPrefix: "app{1}:"}, "must not contain"},
		{"negative timeout", store.RedisOptions{Timeout: -time.Second}, "must not be negative"},
		{"db on a cluster", store.RedisOptions{Addrs: []string{"a:1", "b:2"}, DB: 2}, "only database 0"},
		{"sentinel and cluster", store.RedisOptions{MasterName: "m", Cluster: true}, "exclusive"},
		{"socket on a cluster", store.RedisOptions{Addrs: []string{"/run/redis.sock"}, Cluster: true}, "Unix socket"},
		{"socket among cluster seeds", store.RedisOptions{Addrs: []string{"a:1", "/run/redis.sock"}}, "Unix socket"},
		{"socket as a sentinel", store.RedisOptions{Addrs: []string{"/run/redis.sock"}, MasterName: "m"}, "Unix socket"},
		{"a URL", store.RedisOptions{Addrs: []string{"redis://127.0.0.1:6379"}}, "is a URL"},
		{"a socket URL", store.RedisOptions{Addrs: []string{"unix:///run/redis.sock"}}, "is a URL"},
		{"no port", store.RedisOptions{Addrs: []string{"127.0.0.1"}}, "missing port"},
		{"a relative socket path", store.RedisOptions{Addrs: []string{"redis.sock"}}, "absolute path of a Unix socket"},
		{"addresses joined by a comma", store.RedisOptions{Addrs: []string{"127.0.0.1:1,127.0.0.1:2"}}, "separate arguments"},
		{"a port that is not one", store.RedisOptions{Addrs: []string{"localhost:redis"}}, "not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := store.NewRedis(context.Background(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("NewRedis: %v, want a configuration error containing %q", err, tt.want)
			}
		})
	}
}

func TestRedisEmptyPath(t *testing.T) {
	s := newRedis(t, store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, LazyLoad: true})
	d, err := s.Decide(context.Background(), nil)
	if err != nil || !d.Allowed || len(d.Results) != 0 {
		t.Fatalf("empty path: %+v, %v; want allowed with no results", d, err)
	}
	if err := s.Adjust(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

func TestRedisSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, "cascade-master", master)
	clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC))
	s := newRedis(t, store.RedisOptions{Addrs: []string{sentinel.Addr()}, MasterName: "cascade-master", Clock: clock.Now})
	if _, ok := s.Client().(*redis.Client); !ok {
		t.Fatalf("client is %T, want a Sentinel-backed *redis.Client", s.Client())
	}
	storetest.ExactBurst(t, s, 50, store.Bucket{Key: "{sentinel}|k", Limit: storetest.GCRA(10, time.Minute), Cost: 1}, 10)
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	calls       int64
	usecPerCall float64
}

func resetStats(t testing.TB, addr string) {
	t.Helper()
	if _, err := redistest.Do(addr, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
}

// commandStats reads INFO commandstats: "cmdstat_evalsha:calls=3,usec=30,
// usec_per_call=10.00,rejected_calls=0,failed_calls=0" for each command.
func commandStats(t testing.TB, addr string) map[string]cmdStat {
	t.Helper()
	info, err := redistest.Do(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec_per_call":
				st.usecPerCall, _ = strconv.ParseFloat(v, 64)
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return stats
}

// lostReply lets every script run on the server, then reports the
// connection lost (io.EOF) instead of its reply: a reset after Redis ran it.
type lostReply struct{}

func (lostReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); err == nil && (n == "evalsha" || n == "eval") {
			cmd.SetErr(io.EOF)
			return io.EOF
		}
		return err
	}
}
func (lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisNeverResendsAScript: a script whose reply is lost after Redis
// ran it is not sent again — a decision is charged once, a refund applied
// once — on a standalone server and on a Cluster, whose client would
// otherwise resend it on its own.
func TestRedisNeverResendsAScript(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			var s *store.Redis
			p := prefix(t)
			if mode == "cluster" {
				s = newRedis(t, store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs(), KeyPrefix: p})
			} else {
				s = newRedis(t, store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, KeyPrefix: p})
			}
			ctx := context.Background()
			b := []store.Bucket{{Key: "{resend}|k", Limit: storetest.GCRA(100, time.Hour), Cost: 40}}
			if d, err := s.Decide(ctx, b); err != nil || !d.Allowed {
				t.Fatal(d, err)
			}
			hook := func(c *redis.Client) { c.AddHook(lostReply{}) }
			if cc, ok := s.Client().(*redis.ClusterClient); ok {
				cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error { hook(c); return nil })
			} else {
				hook(s.Client().(*redis.Client))
			}
			b[0].Cost = 10
			if _, err := s.Decide(ctx, b); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("Decide with its reply lost: %v, want ErrUnavailable", err)
			}
			if got := storedLevel(t, s, p+b[0].Key); math.Abs(got-50) > 0.1 {
				t.Fatalf("level %v after 40 and one decision of 10 whose reply was lost; want 50 (charged once)", got)
			}
			b[0].Cost = -10
			if err := s.Adjust(ctx, b); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("Adjust with its reply lost: %v, want ErrUnavailable", err)
			}
			if got := storedLevel(t, s, p+b[0].Key); math.Abs(got-40) > 0.1 {
				t.Fatalf("level %v after a refund of 10 from 50 whose reply was lost; want 40 (refunded once)", got)
			}
		})
	}
}

// afterScript is a hook that calls fn after each script a client runs.
type afterScript func()

func (h afterScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h afterScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h()
		}
		return err
	}
}
func (h afterScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// counter is a client hook that counts dials, and the scripts the client
// sends (sent) and whose replies or errors have come back (ended) — only
// those of the script sha when it is set, and the commands cmds instead of
// scripts when they are: what reached Redis or tried to, seen from the
// client, which works while Redis hangs.
type counter struct {
	sha                string
	cmds               []string
	dials, sent, ended atomic.Int64
}

func (c *counter) counts(cmd redis.Cmder) bool {
	name := cmd.Name()
	if len(c.cmds) > 0 {
		return slices.Contains(c.cmds, name)
	}
	if name != "evalsha" && name != "eval" {
		return false
	}
	return c.sha == "" || len(cmd.Args()) > 1 && cmd.Args()[1] == c.sha
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !c.counts(cmd) {
			return next(ctx, cmd)
		}
		c.sent.Add(1)
		defer c.ended.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := int64(0)
		for _, cmd := range cmds {
			if c.counts(cmd) {
				n++
			}
		}
		c.sent.Add(n)
		defer c.ended.Add(n)
		return next(ctx, cmds)
	}
}

// TestRedisClusterStalledMasterHoldsUpOnlyItsSlots: while one master of a
// Cluster hangs, decisions for slots on the other masters are still
// answered: each master has its own batch workers. The stalled master's
// decisions, their timeout long, are all still waiting when the healthy
// master's have been answered: none of these queued behind them.
func TestRedisClusterStalledMasterHoldsUpOnlyItsSlots(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newRedis(t, store.RedisOptions{Addrs: c.Addrs(), KeyPrefix: prefix(t), Timeout: testTimeout})
	ctx := context.Background()
	cc := s.Client().(*redis.ClusterClient)
	// Two tenants whose slots are on different masters.
	masterOf := func(tag string) string {
		n, err := cc.MasterForKey(ctx, tag)
		if err != nil {
			t.Fatal(err)
		}
		return n.Options().Addr
	}
	stalled, healthy := "{t0}", ""
	for i := 1; healthy == ""; i++ {
		if tag := fmt.Sprintf("{t%d}", i); masterOf(tag) != masterOf(stalled) {
			healthy = tag
		}
	}
	path := func(tag string) []store.Bucket {
		return []store.Bucket{{Key: tag + "|user", Limit: storetest.GCRA(1_000_000, time.Hour), Cost: 1}}
	}
	for _, tag := range []string{stalled, healthy} { // connections warm
		if _, err := s.Decide(ctx, path(tag)); err != nil {
			t.Fatal(err)
		}
	}
	var paused *redistest.Server
	for _, m := range c.Masters {
		if m.Addr() == masterOf(stalled) {
			paused = m
		}
	}
	// The scripts on their way to the stalled master, seen by its client.
	onStalled := &counter{}
	cc.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		if n.Options().Addr == paused.Addr() {
			n.AddHook(onStalled)
		}
		return nil
	})
	// The pause lasts moments: past the Cluster's node timeout (5 s) the
	// other masters would declare the cluster down.
	paused.Pause()
	defer paused.Resume()
	var wg sync.WaitGroup
	var returned atomic.Int64
	stall := func() {
		wg.Add(1)
		go func() { defer wg.Done(); s.Decide(ctx, path(stalled)); returned.Add(1) }()
	}
	// A master's batcher has two workers: one call each, stuck on the
	// wire, then more queued behind them.
	for i := range int64(2) {
		stall()
		waitFor(t, unavailableBound, fmt.Sprintf("worker %d of the stalled master to send its call", i+1), func() error {
			if n := onStalled.sent.Load(); n <= i {
				return fmt.Errorf("%d scripts sent to it", n)
			}
			return nil
		})
	}
	for range 6 {
		stall()
	}
	began := time.Now()
	for i := 0; i < 5; i++ {
		if d, err := s.Decide(ctx, path(healthy)); err != nil || !d.Allowed {
			t.Fatalf("a tenant on a healthy master while another master hangs: %+v, %v", d, err)
		}
	}
	t.Logf("5 decisions on a healthy master took %v while another master hung", time.Since(began))
	if n := returned.Load(); n != 0 {
		t.Fatalf("%d of the stalled master's 8 decisions had returned (timeout %v) by the time the healthy master's were answered: "+
			"these waited for them", n, testTimeout)
	}
	paused.Resume()
	wg.Wait()
}

// TestRedisClusterFollowsAMovedSlot: the store does not follow redirects
// (a script is never sent twice), but a MOVED reply has the client reload
// its slot map, in the background: the decisions sent before it lands fail
// (MOVED), and from then on every decision goes to the slot's new master.
func TestRedisClusterFollowsAMovedSlot(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: c.Addrs(), KeyPrefix: p})
	ctx := context.Background()
	cc := s.Client().(*redis.ClusterClient)
	tag := "{t0}"
	n, err := cc.MasterForKey(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	var src, dst *redistest.Server
	for _, m := range c.Masters {
		if m.Addr() == n.Options().Addr {
			src = m
		} else if dst == nil {
			dst = m
		}
	}
	path := []store.Bucket{{Key: tag + "|user", Limit: storetest.GCRA(1_000_000, time.Hour), Cost: 1}}
	if _, err := s.Decide(ctx, path); err != nil {
		t.Fatal(err)
	}
	// Move the (emptied) slot to dst, telling every master.
	slot := strconv.Itoa(store.RedisKeySlot(p + path[0].Key))
	keys, _ := redistest.Do(src.Addr(), "CLUSTER", "GETKEYSINSLOT", slot, "1000")
	for _, k := range strings.Fields(keys) {
		redistest.Do(src.Addr(), "DEL", k)
	}
	id, err := redistest.Do(dst.Addr(), "CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Masters {
		if _, err := redistest.Do(m.Addr(), "CLUSTER", "SETSLOT", slot, "NODE", strings.TrimSpace(id)); err != nil {
			t.Fatalf("SETSLOT on %s: %v", m.Addr(), err)
		}
	}
	// go-redis also reloads by itself a slot map older than 10 s; the map
	// here is a moment old, so recovering within 5 s is the store's doing.
	failed := 0
	waitFor(t, 5*time.Second, "a decision to succeed after its slot moved (the MOVED reply reloading the slot map)", func() error {
		_, err := s.Decide(ctx, path)
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "MOVED ") && !strings.Contains(msg, "ASK ") {
				t.Fatalf("decision %d after the slot moved: %v, want a redirect not followed (MOVED)", failed+1, err)
			}
			failed++
		}
		return err
	})
	t.Logf("%d decisions failed (MOVED) before the reloaded slot map took over", failed)
	for i := 0; i < 20; i++ {
		if _, err := s.Decide(ctx, path); err != nil {
			t.Fatalf("decision %d after the slot map was reloaded: %v", i+1, err)
		}
	}
}

func TestRedisOps(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	storetest.RunOps(t, func(t *testing.T, clock store.Clock) store.Store {
		return newRedis(t, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: prefix(t), Clock: clock})
	})
}

func TestRedisClusterOps(t *testing.T) {
	addrs := redistest.SharedCluster(t).Addrs()
	storetest.RunOps(t, func(t *testing.T, clock store.Clock) store.Store {
		return newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: prefix(t), Clock: clock})
	})
}

// TestPresence: instances sharing a Redis count each other from their
// heartbeats; one not heard from within three intervals drops out; when
// Redis is gone the last count stands.
func TestPresence(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	// The default timeout of these tests: once Redis is killed, a
	// heartbeat fails at once (refused), whatever its timeout.
	opts := store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix(t), Clock: clock.Now}
	a, b := newRedis(t, opts).NewPresence(time.Second), newRedis(t, opts).NewPresence(time.Second)
	ctx := context.Background()
	beat := func(p *store.Presence, want int64) {
		t.Helper()
		if err := p.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		if got := p.Count(); got != want {
			t.Fatalf("count %d, want %d", got, want)
		}
	}
	if a.Count() != 1 {
		t.Fatalf("before any heartbeat: %d, want 1 (this instance)", a.Count())
	}
	beat(a, 1)
	beat(b, 2)
	clock.Advance(2 * time.Second)
	beat(a, 2)
	clock.Advance(2 * time.Second) // b last heard 4 s ago
	beat(a, 1)
	beat(b, 2) // back
	beat(a, 2)
	srv.Kill()
	if err := a.Beat(ctx); err == nil {
		t.Fatal("a heartbeat to a dead Redis succeeded")
	}
	if got := a.Count(); got != 2 {
		t.Fatalf("with Redis gone: %d, want the last count, 2", got)
	}
	a.Close()
	b.Close()
}

// TestRedisClusterRenewalAcrossSlots: a renewal (a grant with no request of
// its own) of a path across Cluster slots is refused, by Lease as by
// LeaseAll, before anything is sent: the slot-by-slot grant sizes and
// gives back as for a request's charge, which a renewal does not make.
func TestRedisClusterRenewalAcrossSlots(t *testing.T) {
	s := newRedis(t, store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs(), KeyPrefix: prefix(t)})
	path := retag([]store.Bucket{
		{Key: "{r}|org", Limit: storetest.GCRA(1000, time.Hour), Cost: 1},
		{Key: "{r}|user", Limit: storetest.GCRA(100, time.Hour), Cost: 1},
	})
	g := store.Grant{Buckets: path, Want: 10, MaxShare: 0.1, MinRemaining: 0.05, Renew: true}
	if _, err := s.Lease(context.Background(), g); !errors.Is(err, store.ErrNotRenewable) {
		t.Fatalf("Lease: %v, want ErrNotRenewable", err)
	}
	if _, errs := s.LeaseAll(context.Background(), []store.Grant{g}); !errors.Is(errs[0], store.ErrNotRenewable) {
		t.Fatalf("LeaseAll: %v, want ErrNotRenewable", errs[0])
	}
	d, err := store.Peek(context.Background(), s, path)
	if err != nil {
		t.Fatal(err)
	}
	if d.Results[0].Remaining != 1000 || d.Results[1].Remaining != 100 {
		t.Fatalf("the buckets hold %+v, want nothing charged", d.Results)
	}
}

// TestRedisLeaseAllOneCall: grants sent together go to Redis as one script
// call (one EVALSHA for all of a slot), each applied in turn; after a
// SCRIPT FLUSH the call is refused (NOSCRIPT, nothing ran), the script is
// loaded and the call sent again: every grant is applied once.
func TestRedisLeaseAllOneCall(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	hourly := storetest.GCRA(1000, time.Hour)
	grants := func() []store.Grant {
		var gs []store.Grant
		for u := range 5 {
			gs = append(gs, store.Grant{Buckets: []store.Bucket{
				{Key: "{all}|org", Limit: hourly, Cost: 1}, {Key: fmt.Sprintf("{all}|user%d", u), Limit: hourly, Cost: 1},
			}, Want: 10, MaxShare: 0.1, MinRemaining: 0.05, Renew: true})
		}
		return gs
	}
	renew := func() {
		t.Helper()
		ls, errs := s.LeaseAll(ctx, grants())
		for i, l := range ls {
			if errs[i] != nil || l.Extra != 10 {
				t.Fatalf("grant %d: extra %d, error %v; want 10 leased", i, l.Extra, errs[i])
			}
		}
	}
	resetStats(t, srv.Addr())
	renew()
	if st := commandStats(t, srv.Addr()); st["evalsha"].calls != 1 {
		t.Fatalf("5 grants sent together ran %d EVALSHA, want 1", st["evalsha"].calls)
	}
	if _, err := redistest.Do(srv.Addr(), "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	renew()
	// Each grant leased 10 on the organisation's bucket, in turn: 100.
	d, err := store.Peek(ctx, s, []store.Bucket{{Key: "{all}|org", Limit: hourly}})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Results[0].Remaining; got != 1000-100 {
		t.Fatalf("the organisation's bucket has %d remaining, want 900: a grant applied twice or not at all", got)
	}
}

// TestRedisClusterLeaseAllSlots: grants of different slots sent together go
// one call per slot, pipelined, and each gets its own answer, in order.
func TestRedisClusterLeaseAllSlots(t *testing.T) {
	s := newRedis(t, store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs(), KeyPrefix: prefix(t)})
	hourly := storetest.GCRA(1000, time.Hour)
	var gs []store.Grant
	slots := map[int]bool{}
	for u := range 6 {
		key := fmt.Sprintf("{slot%d}|user", u)
		slots[store.RedisKeySlot(prefix(t)+key)] = true
		gs = append(gs, store.Grant{Buckets: []store.Bucket{{Key: key, Limit: hourly, Cost: int64(u + 1)}},
			Want: 10, MaxShare: 0.5, MinRemaining: 0.05, Renew: true})
	}
	if len(slots) < 2 {
		t.Fatalf("the grants are in %d slots, want several", len(slots))
	}
	ls, errs := s.LeaseAll(context.Background(), gs)
	for u, l := range ls {
		// No request of its own: 10 requests of cost u+1 leased.
		if errs[u] != nil || l.Extra != 10 || l.Results[0].Remaining != 1000-10*int64(u+1) {
			t.Fatalf("grant %d: extra %d, remaining %d, error %v; want 10 leased, %d remaining",
				u, l.Extra, l.Results[0].Remaining, errs[u], 1000-10*(u+1))
		}
	}
}
