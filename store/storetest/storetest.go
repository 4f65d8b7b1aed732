// Package storetest is the conformance suite every store.Store must pass: the
// same scenarios, under the same injected clock, with the same expected
// decisions, remaining counts and retry times. It is how the Redis scripts
// are held to the Go arithmetic of package rate.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// Clock is a settable clock for stores under test.
type Clock struct{ now atomic.Int64 }

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now reads the clock; pass it as a store.Clock.
func (c *Clock) Now() int64 { return c.now.Load() }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.now.Store(t.UnixMicro()) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.now.Add(d.Microseconds()) }

// GCRA is a GCRA limit of count per period, its burst the count.
func GCRA(count int64, period time.Duration) rate.Limit {
	return rate.Limit{Algorithm: rate.GCRA, Count: count, Period: period}
}

// Kinds are the stores a test that takes a kind runs on: the memory store
// and a real Redis.
var Kinds = []string{"memory", "redis"}

// EachKind runs test once on each of Kinds, as a subtest named after it.
func EachKind(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// Opener returns a fresh, empty store that reads time from clock. Keys used
// by different scenarios never overlap, but an opener may still want to
// flush shared state between them.
type Opener func(t *testing.T, clock store.Clock) store.Store

// start is a Wednesday in mid-month, mid-hour: far from calendar boundaries.
var start = time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC)

func gcra(count int64, period time.Duration, burst int64) rate.Limit {
	return rate.Limit{Algorithm: rate.GCRA, Count: count, Period: period, Burst: burst}
}

func sliding(count int64, period time.Duration) rate.Limit {
	return rate.Limit{Algorithm: rate.Sliding, Count: count, Period: period}
}

func slidingApprox(count int64, period time.Duration) rate.Limit {
	return rate.Limit{Algorithm: rate.SlidingApprox, Count: count, Period: period}
}

// fixed is a fixed window of period aligned to the Unix epoch.
func fixed(count int64, period time.Duration) rate.Limit {
	return rate.Limit{Algorithm: rate.Calendar, Count: count, Unit: rate.Fixed, Period: period}
}

func calendar(count int64, unit rate.Unit, loc *time.Location) rate.Limit {
	return rate.Limit{Algorithm: rate.Calendar, Count: count, Unit: unit, Location: loc}
}

// step is one request (or adjustment) in a scenario and what must come of it.
type step struct {
	advance time.Duration  // move the clock first
	at      time.Time      // or set it (when non-zero)
	buckets []store.Bucket // the path and the costs
	adjust  bool           // Adjust instead of Decide (Cost is the delta)
	charged time.Time      // for Adjust: when the corrected cost was charged (zero: unknown)
	repeat  int            // run the same step this many times (default 1)

	allowed    bool
	impossible bool
	remaining  []int64       // per bucket, when non-nil
	retry      time.Duration // expected RetryAfter; checked when retrySet
	retrySet   bool
	retryToo   bool // then retry once at exactly RetryAfter and expect admission
}

type scenario struct {
	name  string
	steps []step
}

// key gives each scenario its own keys (with a hash tag, as hierarchy builds them).
func key(scn, name string) string { return fmt.Sprintf("{conf|%s}|%s", scn, name) }

func b(scn, name string, l rate.Limit, cost int64) store.Bucket {
	return store.Bucket{Key: key(scn, name), Limit: l, Cost: cost}
}

// slotB is a request of holder taking (cost 1), only looking at (0) or
// giving back (−1) a slot of a concurrency limit of count.
func slotB(scn string, count, holder, cost int64) store.Bucket {
	return store.Bucket{Key: key(scn, "slots"), Limit: rate.Limit{Algorithm: rate.Concurrent, Count: count}, Cost: cost, Holder: holder}
}

// record is an idempotency record (kept an hour, in flight a minute at
// most, two retries let through) for key k: decided at cost 1 (0 only
// looks), or corrected by +1 (its request ended) or −1 (forgotten).
func record(scn, k string, cost int64) store.Bucket {
	return store.Bucket{Key: key(scn, "idem="+k), Limit: rate.Limit{Algorithm: rate.Idempotent, Count: time.Minute.Microseconds(), Period: time.Hour, Burst: 2}, Cost: cost}
}

func scenarios() []scenario {
	tenPerMin := gcra(10, time.Minute, 0)
	seed004 := gcra(30, time.Minute, 15)
	trade := gcra(10, 15*time.Second, 5)
	notify := sliding(100, 30*time.Minute)
	perCat := sliding(10, 30*time.Minute)
	paris, _ := time.LoadLocation("Europe/Paris")
	if paris == nil {
		paris = time.FixedZone("CET", 3600)
	}
	return []scenario{
		{"gcra counts down then waits one emission interval", []step{
			{buckets: []store.Bucket{b("g1", "k", tenPerMin, 1)}, allowed: true, remaining: []int64{9}},
			{buckets: []store.Bucket{b("g1", "k", tenPerMin, 1)}, repeat: 8, allowed: true},
			{buckets: []store.Bucket{b("g1", "k", tenPerMin, 1)}, allowed: true, remaining: []int64{0}},
			{buckets: []store.Bucket{b("g1", "k", tenPerMin, 1)}, allowed: false, remaining: []int64{0},
				retry: 6*time.Second + time.Microsecond, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("g1", "k", tenPerMin, 1)}, allowed: false},
		}},
		{"gcra burst then refill (seed 004 user and trade)", []step{
			{buckets: []store.Bucket{b("g2", "user", seed004, 1), b("g2", "trade", trade, 1)}, repeat: 5, allowed: true},
			{buckets: []store.Bucket{b("g2", "user", seed004, 1), b("g2", "trade", trade, 1)}, allowed: false,
				remaining: []int64{10, 0}, retry: 1500*time.Millisecond + time.Microsecond, retrySet: true},
			// withdrawal has its own cap but counts against the same user
			{buckets: []store.Bucket{b("g2", "user", seed004, 1), b("g2", "withdrawal", trade, 1)}, repeat: 5, allowed: true},
			{buckets: []store.Bucket{b("g2", "user", seed004, 1)}, repeat: 5, allowed: true},
			{buckets: []store.Bucket{b("g2", "user", seed004, 1)}, allowed: false, remaining: []int64{0},
				retry: 2*time.Second + time.Microsecond, retrySet: true, retryToo: true},
		}},
		{"cost k admits floor(C/k) and retry covers the shortfall", []step{
			{buckets: []store.Bucket{b("g3", "k", tenPerMin, 3)}, repeat: 3, allowed: true},
			{buckets: []store.Bucket{b("g3", "k", tenPerMin, 3)}, allowed: false, remaining: []int64{1},
				retry: 12*time.Second + time.Microsecond, retrySet: true, retryToo: true},
		}},
		{"a cost above capacity is impossible and charges nothing", []step{
			{buckets: []store.Bucket{b("g4", "a", tenPerMin, 1), b("g4", "b", tenPerMin, 11)}, allowed: false, impossible: true,
				remaining: []int64{10, 10}, retry: 0, retrySet: true},
			{buckets: []store.Bucket{b("g4", "a", tenPerMin, 10)}, allowed: true, remaining: []int64{0}},
		}},
		{"all or nothing: a denial below charges nothing above", []step{
			{buckets: []store.Bucket{b("g5", "org", tenPerMin, 1), b("g5", "user", gcra(2, time.Hour, 0), 1)}, repeat: 2, allowed: true},
			{buckets: []store.Bucket{b("g5", "org", tenPerMin, 1), b("g5", "user", gcra(2, time.Hour, 0), 1)}, repeat: 5, allowed: false},
			{buckets: []store.Bucket{b("g5", "org", tenPerMin, 1)}, allowed: true, remaining: []int64{7}},
		}},
		{"retry after is the max over limits", []step{
			{buckets: []store.Bucket{b("g6", "fast", gcra(1, time.Second, 0), 1), b("g6", "slow", gcra(1, 10*time.Second, 0), 1)}, allowed: true},
			{buckets: []store.Bucket{b("g6", "fast", gcra(1, time.Second, 0), 1), b("g6", "slow", gcra(1, 10*time.Second, 0), 1)}, allowed: false,
				retry: 10*time.Second + time.Microsecond, retrySet: true, retryToo: true},
		}},
		{"sliding window: global and per category (seed 001)", []step{
			{buckets: []store.Bucket{b("s1", "all", notify, 1), b("s1", "cat=a", perCat, 1)}, repeat: 10, allowed: true},
			{buckets: []store.Bucket{b("s1", "all", notify, 1), b("s1", "cat=a", perCat, 1)}, allowed: false, remaining: []int64{90, 0}},
			{buckets: []store.Bucket{b("s1", "all", notify, 1), b("s1", "cat=b", perCat, 1)}, repeat: 10, allowed: true},
			{advance: time.Minute, buckets: []store.Bucket{b("s1", "all", notify, 1), b("s1", "cat=a", perCat, 1)}, allowed: false, retryToo: true},
		}},
		{"sliding_approx: first window exact, then the previous window slides out", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC), buckets: []store.Bucket{b("s2", "k", slidingApprox(4, time.Minute), 1)}, repeat: 4, allowed: true},
			{buckets: []store.Bucket{b("s2", "k", slidingApprox(4, time.Minute), 1)}, allowed: false, remaining: []int64{0},
				retry: 75*time.Second + time.Microsecond, retrySet: true},
			{advance: time.Minute + 15*time.Second, buckets: []store.Bucket{b("s2", "k", slidingApprox(4, time.Minute), 1)}, allowed: true, remaining: []int64{0}},
			{buckets: []store.Bucket{b("s2", "k", slidingApprox(4, time.Minute), 1)}, allowed: false,
				retry: 15*time.Second + time.Microsecond, retrySet: true, retryToo: true},
		}},
		{"sliding window: a full window admits again exactly one window after its charges", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 59, 0, time.UTC), buckets: []store.Bucket{b("s3", "k", sliding(4, time.Minute), 1)}, repeat: 4, allowed: true},
			{buckets: []store.Bucket{b("s3", "k", sliding(4, time.Minute), 1)}, allowed: false, remaining: []int64{0},
				retry: time.Minute, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("s3", "k", sliding(4, time.Minute), 1)}, repeat: 3, allowed: true},
			{advance: time.Second, buckets: []store.Bucket{b("s3", "k", sliding(4, time.Minute), 1)}, allowed: false, remaining: []int64{0},
				retry: 59 * time.Second, retrySet: true},
		}},
		{"sliding window: mholt's example, a burst of 8, again a window later, then one per 1.1 s", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 4, 900_000_000, time.UTC), buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, repeat: 2, allowed: true},
			{buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, repeat: 6, allowed: false},
			{advance: 5200 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, repeat: 2, allowed: true},
			{buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, repeat: 6, allowed: false, remaining: []int64{0}, retry: 5 * time.Second, retrySet: true},
			{advance: 1100 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, allowed: false, retry: 3900 * time.Millisecond, retrySet: true},
			{advance: 3300 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, allowed: false},
			{advance: 1100 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, allowed: true},
			{advance: 1100 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, allowed: true},
			{advance: 1100 * time.Millisecond, buckets: []store.Bucket{b("s4", "k", sliding(2, 5*time.Second), 1)}, allowed: false,
				retry: 2800 * time.Millisecond, retrySet: true, retryToo: true},
		}},
		{"sliding window: a cost waits until enough of the oldest charges have left", []step{
			{buckets: []store.Bucket{b("s5", "k", sliding(10, time.Minute), 4)}, allowed: true, remaining: []int64{6}},
			{advance: 10 * time.Second, buckets: []store.Bucket{b("s5", "k", sliding(10, time.Minute), 3)}, allowed: true, remaining: []int64{3}},
			{advance: 10 * time.Second, buckets: []store.Bucket{b("s5", "k", sliding(10, time.Minute), 3)}, allowed: true, remaining: []int64{0}},
			// 5 more need the 4 of 0 s and the 3 of 10 s gone: at 70 s.
			{advance: 10 * time.Second, buckets: []store.Bucket{b("s5", "k", sliding(10, time.Minute), 5)}, allowed: false, remaining: []int64{0},
				retry: 40 * time.Second, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("s5", "k", sliding(10, time.Minute), 11)}, allowed: false, impossible: true, retry: 0, retrySet: true},
		}},
		{"sliding window: all or nothing with a gcra limit", []step{
			{buckets: []store.Bucket{b("s6", "win", sliding(5, time.Minute), 1), b("s6", "user", gcra(1, time.Hour, 0), 1)}, allowed: true},
			{buckets: []store.Bucket{b("s6", "win", sliding(5, time.Minute), 1), b("s6", "user", gcra(1, time.Hour, 0), 1)}, repeat: 5, allowed: false},
			{buckets: []store.Bucket{b("s6", "win", sliding(5, time.Minute), 1)}, allowed: true, remaining: []int64{3}},
		}},
		{"sliding window: a refund comes off its own charge, in the middle of the log", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC), buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 6)}, allowed: true},
			{at: time.Date(2026, 3, 18, 10, 0, 10, 0, time.UTC), buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 4)}, allowed: true},
			{at: time.Date(2026, 3, 18, 10, 0, 20, 0, time.UTC), adjust: true, charged: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC),
				buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), -5)}},
			{buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 5)}, allowed: true, remaining: []int64{0}},
			// The refunded charge leaves at 10:01:00 with the 1 left of it.
			{at: time.Date(2026, 3, 18, 10, 1, 0, 0, time.UTC), buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 1)}, allowed: true, remaining: []int64{0}},
			// A debt is logged now and paid by later requests.
			{adjust: true, buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 3)}},
			// 4 (10:00:10) + 5 (10:00:20) + 1 + 3 of debt (10:01:00): one more
			// waits for the 4 to leave.
			{at: time.Date(2026, 3, 18, 10, 1, 5, 0, time.UTC), buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 1)}, allowed: false,
				retry: 5 * time.Second, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("r5", "k", sliding(10, time.Minute), 1)}, allowed: false, retry: 10 * time.Second, retrySet: true},
		}},
		{"calendar day resets at midnight UTC", []step{
			{at: time.Date(2026, 3, 18, 23, 59, 0, 0, time.UTC), buckets: []store.Bucket{b("c1", "k", calendar(5, rate.Day, nil), 1)}, repeat: 5, allowed: true},
			{buckets: []store.Bucket{b("c1", "k", calendar(5, rate.Day, nil), 1)}, allowed: false, remaining: []int64{0},
				retry: time.Minute, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("c1", "k", calendar(5, rate.Day, nil), 1)}, allowed: true, remaining: []int64{3}},
		}},
		{"a fixed window of 10 minutes is aligned to the epoch, a second one too", []step{
			{at: time.Date(2026, 3, 18, 10, 39, 0, 0, time.UTC), buckets: []store.Bucket{b("f1", "k", fixed(3, 10*time.Minute), 1)}, repeat: 3, allowed: true},
			{buckets: []store.Bucket{b("f1", "k", fixed(3, 10*time.Minute), 1)}, allowed: false, remaining: []int64{0},
				retry: time.Minute, retrySet: true, retryToo: true},
			{buckets: []store.Bucket{b("f1", "k", fixed(3, 10*time.Minute), 2)}, allowed: true, remaining: []int64{0}},
			{at: time.Date(2026, 3, 18, 10, 50, 0, 400_000_000, time.UTC), buckets: []store.Bucket{b("f1", "s", fixed(2, time.Second), 2)}, allowed: true, remaining: []int64{0}},
			{buckets: []store.Bucket{b("f1", "s", fixed(2, time.Second), 1)}, allowed: false, retry: 600 * time.Millisecond, retrySet: true, retryToo: true},
		}},
		{"calendar month resets on the 1st in the configured zone", []step{
			{at: time.Date(2026, 1, 31, 22, 0, 0, 0, time.UTC), buckets: []store.Bucket{b("c2", "k", calendar(100000, rate.Month, paris), 60000)}, allowed: true, remaining: []int64{40000}},
			{buckets: []store.Bucket{b("c2", "k", calendar(100000, rate.Month, paris), 60000)}, allowed: false,
				retry: time.Hour, retrySet: true}, // midnight in Paris is 23:00 UTC
			{advance: time.Hour, buckets: []store.Bucket{b("c2", "k", calendar(100000, rate.Month, paris), 60000)}, allowed: true, remaining: []int64{40000}},
		}},
		{"reconcile: a refund returns capacity, a debt is paid by later requests", []step{
			{buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), 1000)}, repeat: 3, allowed: true},
			{buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), 1000)}, allowed: false},
			{adjust: true, buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), -1500)}},
			{buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), 1000)}, allowed: true, remaining: []int64{500}},
			{adjust: true, buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), 2000)}},
			// level 4500 of 3000: a cost of 100 must wait for 1600 units to drain (32 s at 50/s)
			{buckets: []store.Bucket{b("r1", "tok", gcra(3000, time.Minute, 0), 100)}, allowed: false, remaining: []int64{0},
				retry: 32*time.Second + time.Microsecond, retrySet: true, retryToo: true},
		}},
		{"a refund goes back to the calendar window that was charged, and nowhere else", []step{
			{at: time.Date(2026, 1, 31, 23, 59, 0, 0, time.UTC), buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), 90)}, allowed: true},
			{advance: 2 * time.Minute, buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), 50)}, allowed: true, remaining: []int64{50}},
			// January's 90 turned out to be 1: February never held them.
			{adjust: true, charged: time.Date(2026, 1, 31, 23, 59, 0, 0, time.UTC), buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), -89)}},
			{buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), 51)}, allowed: false, remaining: []int64{50}},
			// February's 50 turned out to be 20: refunded.
			{adjust: true, charged: time.Date(2026, 2, 1, 0, 1, 0, 0, time.UTC), buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), -30)}},
			{buckets: []store.Bucket{b("r3", "k", calendar(100, rate.Month, time.UTC), 80)}, allowed: true, remaining: []int64{0}},
		}},
		{"a sliding window's refund comes off the window it was counted in (both algorithms)", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 10, 0, time.UTC), buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), 6), b("r4", "a", slidingApprox(10, time.Minute), 6)}, allowed: true},
			// The window has slid: the 6 are the previous window's count.
			{at: time.Date(2026, 3, 18, 10, 1, 0, 0, time.UTC), adjust: true, charged: time.Date(2026, 3, 18, 10, 0, 10, 0, time.UTC),
				buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), -5), b("r4", "a", slidingApprox(10, time.Minute), -5)}},
			{buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), 9), b("r4", "a", slidingApprox(10, time.Minute), 9)}, allowed: true, remaining: []int64{0, 0}},
			// Two windows on, the charge has slid out: nothing to refund.
			{at: time.Date(2026, 3, 18, 10, 3, 0, 0, time.UTC), buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), 10), b("r4", "a", slidingApprox(10, time.Minute), 10)}, allowed: true},
			{adjust: true, charged: time.Date(2026, 3, 18, 10, 1, 0, 0, time.UTC), buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), -9), b("r4", "a", slidingApprox(10, time.Minute), -9)}},
			{buckets: []store.Bucket{b("r4", "k", sliding(10, time.Minute), 1)}, allowed: false},
			{buckets: []store.Bucket{b("r4", "a", slidingApprox(10, time.Minute), 1)}, allowed: false},
		}},
		{"sliding window: a key named twice in one decision takes its last mention's state", []step{
			{advance: time.Second, buckets: []store.Bucket{b("d1", "k", sliding(5, time.Minute), 2), b("d1", "k", sliding(5, time.Minute), 2)}, allowed: true, remaining: []int64{3, 3}},
			{advance: time.Second, buckets: []store.Bucket{b("d1", "k", sliding(5, time.Minute), 2), b("d1", "k", sliding(5, time.Minute), 2)}, allowed: true, remaining: []int64{1, 1}},
			{advance: time.Second, buckets: []store.Bucket{b("d1", "k", sliding(5, time.Minute), 2), b("d1", "k", sliding(5, time.Minute), 2)}, allowed: false},
			{buckets: []store.Bucket{b("d1", "k", sliding(5, time.Minute), 1)}, allowed: true, remaining: []int64{0}},
			// A minute after the first: its 2 have left, 2 + 1 are in.
			{advance: time.Minute - 2*time.Second, buckets: []store.Bucket{b("d1", "k", sliding(5, time.Minute), 3)}, allowed: false, remaining: []int64{2},
				retry: time.Second, retrySet: true, retryToo: true},
		}},
		{"sliding window: a key named twice in one correction is corrected twice", []step{
			{at: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC), buckets: []store.Bucket{b("d2", "k", sliding(10, time.Minute), 4)}, allowed: true},
			{advance: time.Second, adjust: true, charged: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC),
				buckets: []store.Bucket{b("d2", "k", sliding(10, time.Minute), -1), b("d2", "k", sliding(10, time.Minute), -1)}},
			{buckets: []store.Bucket{b("d2", "k", sliding(10, time.Minute), 8)}, allowed: true, remaining: []int64{0}},
		}},
		{"concurrency: slots are taken, refused when all are, given back, all or nothing with a tier", []step{
			{buckets: []store.Bucket{slotB("c1", 3, 1, 1)}, allowed: true, remaining: []int64{2}},
			{buckets: []store.Bucket{slotB("c1", 3, 2, 1)}, allowed: true, remaining: []int64{1}},
			{buckets: []store.Bucket{slotB("c1", 3, 3, 1)}, allowed: true, remaining: []int64{0}},
			{buckets: []store.Bucket{slotB("c1", 3, 4, 1)}, allowed: false, remaining: []int64{0}, retry: time.Second, retrySet: true},
			// Refused on the slots: the rate tier beside them is not charged.
			{buckets: []store.Bucket{b("c1", "rate", gcra(2, time.Hour, 0), 1), slotB("c1", 3, 5, 1)}, allowed: false, remaining: []int64{2, 0}},
			// Time frees no slot (well within a shared store's slot TTL).
			{advance: 10 * time.Second, buckets: []store.Bucket{slotB("c1", 3, 6, 1)}, allowed: false},
			// One given back: one more fits, with the rate tier.
			{adjust: true, buckets: []store.Bucket{slotB("c1", 3, 2, -1)}},
			{buckets: []store.Bucket{b("c1", "rate", gcra(2, time.Hour, 0), 1), slotB("c1", 3, 7, 1)}, allowed: true, remaining: []int64{1, 0}},
			// Refused on the rate tier: no slot is taken.
			{buckets: []store.Bucket{b("c1", "rate", gcra(2, time.Hour, 0), 2), slotB("c1", 3, 8, 1)}, allowed: false},
			{adjust: true, buckets: []store.Bucket{slotB("c1", 3, 1, -1), slotB("c1", 3, 3, -1)}},
			{buckets: []store.Bucket{slotB("c1", 3, 9, 1)}, allowed: true, remaining: []int64{1}},
			// Cost 0 only looks.
			{buckets: []store.Bucket{slotB("c1", 3, 10, 0)}, allowed: true, remaining: []int64{1}},
			{buckets: []store.Bucket{slotB("c1", 3, 11, 1)}, allowed: true, remaining: []int64{0}},
		}},
		{"idempotency: a record is written with the charge, refuses its duplicates and is forgotten with the charge", []step{
			// A first request: recorded, charged.
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: true, remaining: []int64{2, 0}},
			// Its duplicate while it is in flight: refused, charged nothing,
			// until it counts as ended at the latest (a minute).
			{advance: 10 * time.Second, buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: false,
				remaining: []int64{2, rate.RecordInFlight}, retry: 50 * time.Second, retrySet: true},
			// It ends (+1): two retries are refused as done (let through by
			// the caller), charged nothing; the third is a new request.
			{adjust: true, buckets: []store.Bucket{record("i1", "k1", 1)}},
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: false, remaining: []int64{2, rate.RecordDone}},
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: false, remaining: []int64{2, rate.RecordDone}},
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: true, remaining: []int64{1, 0}},
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k1", 1)}, allowed: false, remaining: []int64{1, rate.RecordInFlight}},
			{adjust: true, buckets: []store.Bucket{record("i1", "k1", -1)}}, // forgotten: k1 is new again
			// A retry let through but uncounted (refused after all) is not
			// one of the two.
			{buckets: []store.Bucket{record("i1", "k3", 1)}, allowed: true},
			{adjust: true, buckets: []store.Bucket{record("i1", "k3", 1)}},
			{buckets: []store.Bucket{record("i1", "k3", 1)}, allowed: false, remaining: []int64{rate.RecordDone}},
			{adjust: true, buckets: []store.Bucket{record("i1", "k3", rate.UncountRetry)}},
			{adjust: true, buckets: []store.Bucket{record("i1", "k3", rate.UncountRetry)}}, // never below none
			{buckets: []store.Bucket{record("i1", "k3", 1)}, allowed: false, remaining: []int64{rate.RecordDone}},
			{buckets: []store.Bucket{record("i1", "k3", 1)}, allowed: false, remaining: []int64{rate.RecordDone}},
			{buckets: []store.Bucket{record("i1", "k3", 1)}, allowed: true},
			// Another key is another request.
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k2", 1)}, allowed: true, remaining: []int64{0, 0}},
			// A request refused by its limits records nothing.
			{buckets: []store.Bucket{b("i1", "rate", gcra(3, time.Hour, 0), 1), record("i1", "k4", 1)}, allowed: false},
			{buckets: []store.Bucket{record("i1", "k4", 0)}, allowed: true, remaining: []int64{0}},
			// The record is kept an hour: then the key is new again.
			{advance: time.Hour, buckets: []store.Bucket{record("i1", "k1", 1)}, allowed: true},
			// A record forgotten (its charge given back) is new again.
			{adjust: true, buckets: []store.Bucket{record("i1", "k1", -1)}},
			{buckets: []store.Bucket{record("i1", "k1", 1)}, allowed: true},
		}},
		{"a refund never fills a bucket beyond capacity", []step{
			{adjust: true, buckets: []store.Bucket{b("r2", "k", tenPerMin, -50)}},
			{buckets: []store.Bucket{b("r2", "k", tenPerMin, 1)}, repeat: 10, allowed: true},
			{buckets: []store.Bucket{b("r2", "k", tenPerMin, 1)}, allowed: false},
		}},
	}
}

// Run runs the conformance suite against the stores open makes.
func Run(t *testing.T, open Opener) {
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			clock := NewClock(start)
			s := open(t, clock.Now)
			ctx := context.Background()
			for i, st := range sc.steps {
				if !st.at.IsZero() {
					clock.Set(st.at)
				}
				clock.Advance(st.advance)
				n := st.repeat
				if n == 0 {
					n = 1
				}
				for j := 0; j < n; j++ {
					if st.adjust {
						if !st.charged.IsZero() {
							for k := range st.buckets {
								st.buckets[k].Charged = st.charged.UnixMicro()
							}
						}
						if err := s.Adjust(ctx, st.buckets); err != nil {
							t.Fatalf("step %d: Adjust: %v", i, err)
						}
						continue
					}
					d, err := s.Decide(ctx, st.buckets)
					if err != nil {
						t.Fatalf("step %d.%d: Decide: %v", i, j, err)
					}
					check(t, fmt.Sprintf("step %d.%d", i, j), st, d)
					if st.retryToo && j == n-1 {
						clock.Advance(d.RetryAfter)
						d2, err := s.Decide(ctx, st.buckets)
						if err != nil {
							t.Fatalf("step %d retry: %v", i, err)
						}
						if !d2.Allowed {
							t.Fatalf("step %d: a retry after exactly %v was denied: %+v", i, d.RetryAfter, d2.Results)
						}
					}
				}
			}
		})
	}
	t.Run("concurrent burst admits exactly floor(C/k)", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		ExactBurst(t, s, 200, b("x1", "k", gcra(100, time.Hour, 0), 3), 33)
	})
	t.Run("concurrent burst across three tiers", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		path := []store.Bucket{
			b("x2", "org", gcra(1000, time.Hour, 0), 7),
			b("x2", "team", gcra(500, time.Hour, 0), 7),
			b("x2", "user", gcra(100, time.Hour, 0), 7),
		}
		ExactBurstPath(t, s, 200, path, 100/7)
	})
	t.Run("concurrent burst on an exact sliding window and a gcra tier", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		path := []store.Bucket{
			b("x3", "org", gcra(1000, time.Hour, 0), 3),
			b("x3", "win", sliding(100, time.Hour), 3),
		}
		ExactBurstPath(t, s, 200, path, 33)
	})
	t.Run("concurrent burst takes exactly the slots there are", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Go(func() {
				d, err := s.Decide(context.Background(), []store.Bucket{
					b("x4", "org", gcra(1000, time.Hour, 0), 1), slotB("x4", 37, int64(i+1), 1)})
				if err != nil {
					t.Error(err)
				} else if d.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 37 {
			t.Fatalf("admitted %d of 200 concurrent requests on 37 slots, want exactly 37", got)
		}
	})
	t.Run("decisions report when they were made", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		d, err := s.Decide(context.Background(), []store.Bucket{b("at", "k", sliding(10, time.Hour), 1), b("at", "g", gcra(10, time.Hour, 0), 1)})
		if err != nil {
			t.Fatal(err)
		}
		if d.At != start.UnixMicro() || d.ChargedAt(0) != d.At || d.ChargedAt(1) != d.At {
			t.Fatalf("decision at %d, buckets at %d and %d, want the clock's %d", d.At, d.ChargedAt(0), d.ChargedAt(1), start.UnixMicro())
		}
	})
}

// ExactBurst fires clients concurrent decisions of one bucket and requires
// exactly want admissions.
func ExactBurst(t *testing.T, s store.Store, clients int, bucket store.Bucket, want int) {
	t.Helper()
	ExactBurstPath(t, s, clients, []store.Bucket{bucket}, want)
}

// ExactBurstPath is ExactBurst for a whole path of buckets.
func ExactBurstPath(t *testing.T, s store.Store, clients int, path []store.Bucket, want int) {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := s.Decide(context.Background(), path)
			if err != nil {
				errs <- err
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Decide: %v", err)
	}
	if got := admitted.Load(); got != int64(want) {
		t.Fatalf("admitted %d of %d concurrent requests, want exactly %d", got, clients, want)
	}
}

func check(t *testing.T, where string, st step, d store.Decision) {
	t.Helper()
	if d.Allowed != st.allowed {
		t.Fatalf("%s: allowed = %v, want %v (results %+v)", where, d.Allowed, st.allowed, d.Results)
	}
	if d.Impossible != st.impossible {
		t.Fatalf("%s: impossible = %v, want %v", where, d.Impossible, st.impossible)
	}
	if len(d.Results) != len(st.buckets) {
		t.Fatalf("%s: %d results for %d buckets", where, len(d.Results), len(st.buckets))
	}
	if st.remaining != nil {
		for i, want := range st.remaining {
			if got := d.Results[i].Remaining; got != want {
				t.Fatalf("%s: bucket %d remaining = %d, want %d", where, i, got, want)
			}
		}
	}
	if st.retrySet && d.RetryAfter != st.retry {
		t.Fatalf("%s: retry after = %v, want %v", where, d.RetryAfter, st.retry)
	}
	if !d.Allowed && !d.Impossible && d.RetryAfter <= 0 {
		t.Fatalf("%s: denied without a retry time", where)
	}
}
