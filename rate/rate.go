// Package rate holds the arithmetic of Cascade's three limiting algorithms as
// pure functions over a small State and a clock reading. It is the ONE place
// where the math lives: the memory store calls these functions directly, and
// the Redis scripts in package lua mirror them operation for operation, so the
// two stores reach the same decisions (the conformance suite in
// store/storetest checks that they do).
//
// Time is an int64 count of microseconds since the Unix epoch: the unit of
// Redis TIME, and exactly representable in the float64 numbers of Redis Lua.
//
// # GCRA (the default)
//
// A limit of Count units per Period with a burst capacity B (B defaults to
// Count: "100k tokens per hour" lets 100k through at once, then refills
// continuously). The classic statement of GCRA keeps one theoretical arrival
// time (TAT) per key, with emission interval I = Period/Count and tolerance
// τ = B·I: with cost n at time t, tat' = max(TAT, t) + n·I, and the request is
// admitted iff tat' − t ≤ τ.
//
// This package keeps the same quantity in a form that survives float64
// arithmetic: the "level" u = (TAT − t)/I, the number of units currently
// owed, together with the time it was written. The level drains at Count per
// Period, so at time t it is max(0, u − (t − at)·Count/Period). Admitting
// cost n means u' = level + n ≤ B. Storing TAT directly would put an absolute
// time (≈ 1.8e15 µs) into every sum, and repeated additions of a fractional
// I would drift by whole microseconds; the level stays small, and a burst of
// same-instant requests of integer cost sums exactly, which is what makes
// "C/k concurrent requests admit exactly floor(C/k)" hold.
//
// # Sliding window (exact)
//
// "At most Count units in any window of Period": a request of cost n at time
// t is admitted only if the charges in the window (t − Period, t], plus n,
// come to at most Count. The state is the log of the charges still in the
// window (see Log): each entry a time and a cost, charges that fall in the
// same clock tick coalesced into one entry, and the total kept beside it, so
// a decision reads only the entries that have just left the window.
// Retry-After is exact: the time at which enough of the oldest charges have
// left the window for the cost to fit (a retry then is admitted, one µs
// earlier is refused), never more than Period for a cost that fits (plus
// up to a tick for a coarse window, below).
//
// The tick is one µs while Count ≤ MaxExact (windows over 35 minutes: 1/2³¹
// of the window, 41 µs for a day), so a log holds at most Count entries (and
// the debts of reconciled costs). Above MaxExact the tick is Period/MaxExact
// (see Limit.Tick): a charge then leaves the window up to one tick late, so
// the window never admits more than Count and may admit less, by what the
// last tick of traffic would have added; the log stays within MaxExact + 1
// entries whatever the Count.
//
// # Sliding window (approximate)
//
// SlidingApprox is the O(1) two-counter estimate (as nginx, Cloudflare and
// others use): windows are aligned to multiples of Period; the estimate at
// elapsed time e into the current window is prev·(Period − e)/Period + cur.
// The estimate assumes the previous window's events were spread evenly: it
// is exact whenever the previous window was empty (so the first window
// admits exactly Count), and in the worst case (all of the previous
// window's events at its very end) a trailing window can hold up to
// 2·Count. TestSlidingApproxError measures it against an exact log. Only
// asked for by name: its memory is constant, whatever the Count.
//
// # Concurrency
//
// "At most Count requests in flight at once": not a rate but a count of
// slots, taken when a request is admitted and given back (Adjust by −1)
// when its response ends. The state is the number of slots taken. No clock
// says when a request in flight will end, so a refusal's RetryAfter is a
// fixed ConcurrentRetry, and a bucket is never full "again" on its own:
// its state lasts while any slot is taken (a store shared by several
// processes keeps each slot with a TTL that its holder renews, so that a
// crashed process's slots come back; see store.Bucket.Holder).
//
// # Idempotency records
//
// Idempotent is no limit but the record of a request that carried an
// idempotency key, decided in the same step as the request's charges so
// that a retry of it is not charged twice. Count is how long (µs) the first
// request counts as in flight at most (its response ends it sooner, by an
// Adjust of +1), Period how long the record is kept, Burst how many retries
// it lets through without a charge (an Adjust of UncountRetry takes back
// one that was let through but refused after all). Deciding cost 1
// against no record admits and writes one; against a record it refuses
// (so nothing on the path is charged) and says why in Remaining:
// RecordInFlight while the first request is in flight (RetryAfter: until
// it counts as ended at the latest), RecordDone once it has ended (the
// caller admits the retry without a charge) — a refusal whose state, the
// retry counted, the store keeps (Result.Keep). Once Burst retries have
// been let through, the record admits the next request as a new first one
// (charged, recorded afresh). An Adjust of −1 forgets the record charged
// at the given time (a charge given back).
//
// # Calendar quota
//
// A fixed window aligned to the calendar (hour, day, week starting Monday,
// month) in a time zone (UTC unless configured): a billing quota that resets
// on the 1st. The window's bounds are computed in Go (Limit.Window), because
// only Go knows time zones and month lengths; the Redis store passes the
// bounds of the current and the next window to its script.
//
// A Calendar limit of Unit Fixed is a fixed window of any Period aligned to
// the Unix epoch, not the calendar: the window holding t starts at
// floor(t/Period)·Period, whatever the Location (envoyproxy/ratelimit's
// windows: a minute, a day, its 30-day month).
package rate

import (
	"fmt"
	"math"
	"time"
)

// Algorithm names one of the limiting algorithms.
type Algorithm string

// The algorithms.
const (
	GCRA          Algorithm = "gcra"
	Sliding       Algorithm = "sliding"        // exact: a log of the charges in the window
	SlidingApprox Algorithm = "sliding_approx" // the two-counter estimate
	Calendar      Algorithm = "calendar"
	Concurrent    Algorithm = "concurrent" // requests in flight at once
	Idempotent    Algorithm = "idempotent" // a retried request's record (not a limit)
)

// What an Idempotent bucket's Remaining says of a refusal (see Idempotency
// records).
const (
	RecordDone     = 1 // the first request has ended: a retry is not charged again
	RecordInFlight = 2 // the first request is still in flight
)

// UncountRetry is the Adjust of an Idempotent record that takes back one
// of the retries it counted as let through: a retry the caller refused
// after all (for want of a concurrency slot) is not one of Burst.
const UncountRetry = -2

// ConcurrentRetry is the RetryAfter of a refused Concurrent limit: how
// soon a request in flight ends is unknown, so the client is asked to come
// back in a second.
const ConcurrentRetry = int64(time.Second / time.Microsecond)

// StateName names the form of an algorithm's stored state. Storage keys
// carry it rather than the algorithm's name, so that state written in one
// form is never read as another: the exact sliding window ("sliding-log")
// does not read what the two-counter estimate wrote, and the estimate keeps
// the name ("sliding") under which it has always stored its counters.
func (a Algorithm) StateName() string {
	switch a {
	case Sliding:
		return "sliding-log"
	case SlidingApprox:
		return "sliding"
	}
	return string(a)
}

// Unit is the calendar unit of a Calendar limit.
type Unit string

// The calendar units.
const (
	Hour  Unit = "hour"
	Day   Unit = "day"
	Week  Unit = "week"
	Month Unit = "month"
	// Fixed is a window of the limit's Period aligned to the Unix epoch.
	Fixed Unit = "fixed"
)

// Limit is one limit: at most Count units per Period (or per calendar Unit).
type Limit struct {
	Algorithm Algorithm
	// Count is the number of units allowed per Period (or per Unit).
	Count int64
	// Period is the GCRA refill period or the sliding window; for
	// Calendar, the window of Unit Fixed only.
	Period time.Duration
	// Burst is GCRA's capacity; 0 means Count.
	Burst int64
	// Unit and Location align a Calendar window.
	Unit     Unit
	Location *time.Location
}

// Validate reports whether the limit can be enforced.
func (l Limit) Validate() error {
	if l.Count <= 0 {
		return fmt.Errorf("count must be positive, got %d", l.Count)
	}
	switch l.Algorithm {
	case GCRA, Sliding, SlidingApprox:
		if l.Period < time.Microsecond {
			return fmt.Errorf("period must be at least 1µs, got %v", l.Period)
		}
		if l.Algorithm == Sliding {
			if l.Count > maxEntryCost {
				return fmt.Errorf("a sliding window counts at most %d per window, got %d: use gcra (or sliding_approx) for more", int64(maxEntryCost), l.Count)
			}
			if l.Period.Microseconds() > maxGap {
				return fmt.Errorf("a sliding window is at most %v long, got %v", time.Duration(maxGap)*time.Microsecond, l.Period)
			}
		}
		if l.Burst < 0 {
			return fmt.Errorf("burst must not be negative, got %d", l.Burst)
		}
		if l.Burst != 0 && l.Algorithm != GCRA {
			return fmt.Errorf("burst applies only to the gcra algorithm")
		}
	case Calendar:
		switch l.Unit {
		case Hour, Day, Week, Month:
		case Fixed:
			if l.Period < time.Microsecond {
				return fmt.Errorf("a fixed window must be at least 1µs, got %v", l.Period)
			}
		default:
			return fmt.Errorf("calendar limits need a unit of hour, day, week, month or fixed, got %q", l.Unit)
		}
		if l.Burst != 0 {
			return fmt.Errorf("burst applies only to the gcra algorithm")
		}
	case Concurrent:
		if l.Burst != 0 || l.Period != 0 || l.Unit != "" {
			return fmt.Errorf("a concurrency limit counts requests in flight: it has no period, unit or burst")
		}
	case Idempotent:
		if l.Period < time.Microsecond || l.Burst < 0 || l.Unit != "" {
			return fmt.Errorf("an idempotency record needs a period (how long it is kept), retries not negative and no unit")
		}
	default:
		return fmt.Errorf("unknown algorithm %q (want gcra, sliding, sliding_approx, calendar or concurrent)", l.Algorithm)
	}
	return nil
}

// Capacity is the largest cost a single request can ever be admitted with:
// the burst for GCRA, Count otherwise. A larger cost is refused as impossible.
//
// An Idempotent record's is the retries it lets through (Burst).
func (l Limit) Capacity() int64 {
	if l.Algorithm == GCRA && l.Burst > 0 || l.Algorithm == Idempotent {
		return l.Burst
	}
	return l.Count
}

// WindowSeconds is the policy window advertised in RateLimit-Policy (w=)
// with the quota q = Capacity(): the length of the calendar unit (a month
// counts 30 days), or the period — except for a GCRA limit whose burst is
// not its count, which advertises the time the bucket takes to refill
// from empty (Burst · Period / Count), so that q/w is still the sustained
// rate: `10/min burst 100` is q=100;w=600, not 100 per minute.
//
// A Concurrent limit has no window: 0.
func (l Limit) WindowSeconds() int64 {
	switch l.Algorithm {
	case Concurrent:
		return 0
	case Calendar:
		switch l.Unit {
		case Hour:
			return 3600
		case Day:
			return 86400
		case Week:
			return 7 * 86400
		case Fixed:
			return max(int64(math.Ceil(l.Period.Seconds())), 1)
		default:
			return 30 * 86400
		}
	default:
		period := l.Period.Seconds()
		if l.Algorithm == GCRA && l.Burst > 0 && l.Burst != l.Count && l.Count > 0 {
			period = period * float64(l.Burst) / float64(l.Count)
		}
		s := int64(math.Ceil(period))
		if s < 1 {
			s = 1
		}
		return s
	}
}

// Window returns the calendar window [start, end) containing t, in µs.
func (l Limit) Window(t int64) (start, end int64) {
	if l.Unit == Fixed {
		p := l.Period.Microseconds()
		start := t - mod(t, p)
		return start, start + p
	}
	loc := l.Location
	if loc == nil {
		loc = time.UTC
	}
	tm := time.UnixMicro(t).In(loc)
	var s, e time.Time
	switch l.Unit {
	case Hour:
		// The local hour holding t, found from t's own UTC offset rather
		// than by time.Date: when clocks fall back, a local hour happens
		// twice, and time.Date may pick the other occurrence, a window
		// that does not hold t.
		_, offset := tm.Zone()
		hour := int64(time.Hour / time.Microsecond)
		start := t - ((t+int64(offset)*1e6)%hour+hour)%hour
		return start, start + hour
	case Day:
		s = dayStart(tm.Year(), tm.Month(), tm.Day(), loc)
		e = dayStart(tm.Year(), tm.Month(), tm.Day()+1, loc)
	case Week:
		off := (int(tm.Weekday()) + 6) % 7 // Monday = 0
		s = dayStart(tm.Year(), tm.Month(), tm.Day()-off, loc)
		e = dayStart(tm.Year(), tm.Month(), tm.Day()-off+7, loc)
	default:
		s = dayStart(tm.Year(), tm.Month(), 1, loc)
		e = dayStart(tm.Year(), tm.Month()+1, 1, loc)
	}
	return s.UnixMicro(), e.UnixMicro()
}

// dayStart is the first instant of a local day (d may be out of its
// month's range, as time.Date allows). That is midnight, except where a
// clock change skips midnight (Santiago in September, Beirut, …): then
// time.Date may answer an hour of the day before, and the day starts when
// that hour's zone ends, at the change.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if noon := time.Date(y, m, d, 12, 0, 0, 0, loc); t.Day() != noon.Day() {
		_, t = t.ZoneBounds()
	}
	return t
}

// State is what a store keeps for one bucket. Its meaning depends on the
// algorithm:
//
//	GCRA:          A = level u (units owed),  B = the lease top (see Leases),
//	               T = when A and B were written (both drain at Count per Period)
//	Sliding:       A = the cost of every charge logged, B = the cost of the newest,
//	               T = the newest's time, Log = the older charges (nil: none)
//	SlidingApprox: A = previous window's count, B = current window's count, T = current window's start
//	Calendar:      A = count in the window,   T = the window's start
//	Concurrent:    A = slots taken, T = when A last rose from 0
//	Idempotent:    A = when its request counts as ended (µs; 0: no record), T = when written
//
// The zero State is a fresh, full bucket for every algorithm.
type State struct {
	A, B float64
	T    int64
	Log  *Log
}

// Result says what a bucket thinks of one request.
type Result struct {
	// Allowed is true when the cost fits.
	Allowed bool
	// Impossible is true when the cost exceeds the limit's Capacity, so no
	// amount of waiting helps. Allowed is false then.
	Impossible bool
	// Remaining is the whole number of units left: after this request when
	// Allowed, before it otherwise. Never negative.
	Remaining int64
	// Before is the whole number of units left before this request. A store
	// reports it as Remaining when another bucket on the path denied, since
	// then nothing was charged.
	Before int64
	// RetryAfter (µs) is the earliest wait after which this cost would fit;
	// 0 when Allowed or Impossible.
	RetryAfter int64
	// Reset (µs) is the wait until the bucket is entirely full again.
	Reset int64
	// Keep marks a refusal whose new state the store must write all the
	// same (an idempotency record counting a retry): nothing else on the
	// path is charged.
	Keep bool
}

// Apply decides cost n at time now against state s. It returns the state to
// store if the request is admitted (the caller stores it only when every
// bucket on the path admits: all or nothing) and the Result.
//
// Apply does not change s. A sliding window's new state may use the spare
// capacity of s's log, as append does: of several states computed from one
// s, keep at most one (a store keeps the state it writes, or s).
//
// (State and Result are kept small enough for Go to return them in
// registers: the time of the decision, which a correction names, is the
// store's to report, see store.Decision.)
func (l Limit) Apply(s State, now, n int64) (State, Result) {
	switch l.Algorithm {
	case Sliding:
		return l.slidingLog(s, now, n, nil)
	case SlidingApprox:
		return l.sliding(s, now, n)
	case Calendar:
		return l.calendar(s, now, n)
	case Concurrent:
		return l.concurrent(s, now, n)
	case Idempotent:
		return l.idempotent(s, now, n)
	default:
		return l.gcra(s, now, n)
	}
}

// ApplyTo is Apply for a store that copies a new state's log into memory
// of its own before it applies again (the memory store): when an exact
// sliding window's new state needs a Log of its own — a charge in a new
// tick, on most requests — it is written to *log, which the state then
// points to, rather than allocated. The state returned is valid until
// *log is written again, and log must not be s.Log (s would change). A
// nil log is Apply.
func (l Limit) ApplyTo(s State, now, n int64, log *Log) (State, Result) {
	if l.Algorithm == Sliding {
		return l.slidingLog(s, now, n, log)
	}
	return l.Apply(s, now, n)
}

// Adjust changes a bucket by delta units at time now: a negative delta
// refunds capacity (never beyond a full bucket), a positive one adds debt
// that later requests pay for. It is how a reconciled cost corrects the
// estimate charged at decision time.
//
// charged is ChargeWindow of the time the corrected cost was charged, or 0
// when unknown (then a refund is taken as charged now). A refund goes back
// where the charge went, and only there: a sliding window's charge that has
// slid into the previous count is refunded from it, and a charge whose
// window has slid out, or whose calendar window has ended, is not refunded
// at all (refunding it from a window that never held it would admit more
// than the limit there). A debt is always added now: later requests pay it.
// An exact sliding window refunds the very charge (the entry of its tick),
// as long as it is still in the window.
func (l Limit) Adjust(s State, now, delta, charged int64) State {
	refund := delta < 0 && charged != 0
	switch l.Algorithm {
	case Sliding:
		return l.adjustLog(s, now, delta, charged)
	case SlidingApprox:
		s = l.slide(s, now)
		switch {
		case !refund || charged == s.T:
			s.B = math.Max(0, s.B+float64(delta))
		case charged+l.Period.Microseconds() == s.T:
			s.A = math.Max(0, s.A+float64(delta))
		}
	case Calendar:
		start, _ := l.Window(now)
		if s.T != start {
			s = State{T: start}
		}
		if !refund || charged == start {
			s.A = math.Max(0, s.A+float64(delta))
		}
	case Concurrent:
		// A slot given back (−1), unless taken before the counter last
		// started from nothing (a reset since: the slot is not counted);
		// a debt has no meaning for slots.
		if delta < 0 && (charged == 0 || charged >= s.T) {
			s.A = math.Max(0, s.A+float64(delta))
		}
	case Idempotent:
		// Only the record charged at charged (a newer one is another
		// request's): −1 forgets it, +1 ends its request's flight,
		// UncountRetry takes back a retry it counted.
		switch {
		case s.A == 0 || charged != 0 && s.T != charged:
		case delta == UncountRetry:
			s.B = math.Max(0, s.B-1)
		case delta < 0:
			s = State{}
		case delta > 0 && float64(now) < s.A:
			s.A = float64(now)
		}
	default:
		// A refund never lowers the level beneath the lease top: the
		// leased units below it must drain no sooner than their leases
		// reckon (see Leases). What it cannot give back is withheld.
		u := l.level(s, now)
		top := math.Min(l.leaseTop(s, now), u)
		s.A = math.Max(top, u+float64(delta))
		s.B = top
		s.T = now
	}
	return s
}

// ChargeWindow identifies, for Adjust, the window in which a cost charged
// at time at (µs) was counted: the start of its approximate sliding or
// calendar window, the tick of an exact sliding window's entry, or 0 for
// GCRA, whose level has no windows (and for at = 0, unknown).
func (l Limit) ChargeWindow(at int64) int64 {
	if at == 0 {
		return 0
	}
	switch l.Algorithm {
	case Sliding:
		return l.tickOf(at)
	case SlidingApprox:
		return at - mod(at, l.Period.Microseconds())
	case Calendar:
		start, _ := l.Window(at)
		return start
	case Idempotent, Concurrent:
		return at // the record's, or the slot's, own time
	default:
		return 0
	}
}

// TTL (µs) is how long a store must keep state s written at now: after it
// the state is equivalent to a fresh bucket.
func (l Limit) TTL(s State, now int64) int64 {
	switch l.Algorithm {
	case Sliding:
		if s.B == 0 {
			return 0
		}
		return s.T + l.Period.Microseconds() - now
	case SlidingApprox:
		p := l.Period.Microseconds()
		return s.T + 2*p - now
	case Calendar:
		_, end := l.Window(now)
		return end - now
	case Concurrent:
		if s.A > 0 {
			return ForeverTTL // until its slots are given back
		}
		return 0
	case Idempotent:
		if s.A == 0 {
			return 0
		}
		return s.T + l.Period.Microseconds() - now
	default:
		return ceilMicros(l.level(s, now) * float64(l.Period.Microseconds()) / float64(l.Count))
	}
}

// level is the GCRA level at time now: the stored level drained at Count per Period.
func (l Limit) level(s State, now int64) float64 {
	return l.drain(s.A, s.T, now)
}

// leaseTop is the GCRA lease top at time now, drained like the level.
func (l Limit) leaseTop(s State, now int64) float64 {
	return l.drain(s.B, s.T, now)
}

// drain is x written at t, drained at Count per Period until now.
func (l Limit) drain(x float64, t, now int64) float64 {
	elapsed := now - t
	if elapsed < 0 {
		elapsed = 0
	}
	return math.Max(0, x-float64(elapsed)*float64(l.Count)/float64(l.Period.Microseconds()))
}

func (l Limit) gcra(s State, now, n int64) (State, Result) {
	b := float64(l.Capacity())
	perUnit := float64(l.Period.Microseconds()) / float64(l.Count) // I, in µs
	u := l.level(s, now)
	if n > l.Capacity() {
		return s, Result{Impossible: true, Remaining: floorNonNeg(b - u), Before: floorNonNeg(b - u), Reset: ceilMicros(u * perUnit)}
	}
	next := u + float64(n)
	if next <= b {
		var top float64 // the lease top, kept (most buckets have none)
		if s.B > 0 {
			top = l.leaseTop(s, now)
		}
		return State{A: next, B: top, T: now}, Result{Allowed: true, Remaining: floorNonNeg(b - next), Before: floorNonNeg(b - u), Reset: ceilMicros(next * perUnit)}
	}
	return s, Result{
		Remaining:  floorNonNeg(b - u),
		Before:     floorNonNeg(b - u),
		RetryAfter: ceilMicros((next-b)*perUnit) + 1,
		Reset:      ceilMicros(u * perUnit),
	}
}

// ForeverTTL is the TTL of state that must be kept until it changes (a
// Concurrent state with slots taken): a century. A store must never evict
// it to make room.
const ForeverTTL = int64(100 * 365 * 24 * time.Hour / time.Microsecond)

// concurrent takes n slots if they are free. T is when the counter last
// started from nothing: a slot taken before it is not given back.
func (l Limit) concurrent(s State, now, n int64) (State, Result) {
	max := float64(l.Count)
	before := floorNonNeg(max - s.A)
	if n > l.Count {
		return s, Result{Impossible: true, Remaining: before, Before: before}
	}
	if s.A+float64(n) <= max {
		next := State{A: s.A + float64(n), T: s.T}
		if s.A == 0 {
			next.T = now
		}
		return next, Result{Allowed: true, Remaining: floorNonNeg(max - s.A - float64(n)), Before: before}
	}
	return s, Result{Remaining: before, Before: before, RetryAfter: ConcurrentRetry}
}

// idempotent decides against an idempotency record (see Idempotency
// records): A is when its request counts as ended (µs), T when it was
// written.
func (l Limit) idempotent(s State, now, n int64) (State, Result) {
	if s.A == 0 || now >= s.T+l.Period.Microseconds() { // no record
		if n <= 0 {
			return s, Result{Allowed: true}
		}
		return State{A: float64(now + l.Count), T: now}, Result{Allowed: true}
	}
	if float64(now) < s.A {
		return s, Result{Remaining: RecordInFlight, Before: RecordInFlight, RetryAfter: ceilMicros(s.A - float64(now))}
	}
	if s.B < float64(l.Burst) { // a retry let through, counted (not when only looked at)
		if n <= 0 {
			return s, Result{Remaining: RecordDone, Before: RecordDone, RetryAfter: 1}
		}
		return State{A: s.A, B: s.B + 1, T: s.T}, Result{Remaining: RecordDone, Before: RecordDone, RetryAfter: 1, Keep: true}
	}
	if n <= 0 { // its retries used up: a new first request
		return s, Result{Allowed: true}
	}
	return State{A: float64(now + l.Count), T: now}, Result{Allowed: true}
}

// slide moves a two-counter (SlidingApprox) state forward to the window
// containing now.
func (l Limit) slide(s State, now int64) State {
	p := l.Period.Microseconds()
	start := now - mod(now, p)
	switch {
	case s.T == start:
		return s
	case s.T+p == start:
		return State{A: s.B, T: start}
	default:
		return State{T: start}
	}
}

// sliding is the two-counter estimate, SlidingApprox.
func (l Limit) sliding(s State, now, n int64) (State, Result) {
	p := float64(l.Period.Microseconds())
	max := float64(l.Count)
	s = l.slide(s, now)
	e := float64(now - s.T)
	est := s.A*(p-e)/p + s.B
	if n > l.Count {
		return s, Result{Impossible: true, Remaining: floorNonNeg(max - est), Before: floorNonNeg(max - est), Reset: slidingReset(s, p, e)}
	}
	if est+float64(n) <= max {
		next := s
		next.B += float64(n)
		return next, Result{Allowed: true, Remaining: floorNonNeg(max - est - float64(n)), Before: floorNonNeg(max - est), Reset: slidingReset(next, p, e)}
	}
	var wait float64
	if s.B+float64(n) <= max {
		// Fits in this window once enough of the previous window has slid out:
		// prev·(p − e − w)/p ≤ max − cur − n.
		wait = p - e - (max-s.B-float64(n))*p/s.A
	} else {
		// Must wait for the next window, where this window's count becomes
		// the previous one: cur·(p − e2)/p + n ≤ max.
		wait = p - e + math.Max(0, p-(max-float64(n))*p/s.B)
	}
	return s, Result{Remaining: floorNonNeg(max - est), Before: floorNonNeg(max - est), RetryAfter: ceilMicros(wait) + 1, Reset: slidingReset(s, p, e)}
}

// slidingReset is the wait until the estimate is back to zero: the previous
// window slides out at the end of this one, the current one a window later.
func slidingReset(s State, p, e float64) int64 {
	switch {
	case s.B > 0:
		return ceilMicros(2*p - e)
	case s.A > 0:
		return ceilMicros(p - e)
	}
	return 0
}

func (l Limit) calendar(s State, now, n int64) (State, Result) {
	start, end := l.Window(now)
	if s.T != start {
		s = State{T: start}
	}
	max := float64(l.Count)
	reset := end - now
	if s.A == 0 {
		reset = 0
	}
	if n > l.Count {
		return s, Result{Impossible: true, Remaining: floorNonNeg(max - s.A), Before: floorNonNeg(max - s.A), Reset: reset}
	}
	if s.A+float64(n) <= max {
		return State{A: s.A + float64(n), T: start}, Result{Allowed: true, Remaining: floorNonNeg(max - s.A - float64(n)), Before: floorNonNeg(max - s.A), Reset: end - now}
	}
	return s, Result{Remaining: floorNonNeg(max - s.A), Before: floorNonNeg(max - s.A), RetryAfter: end - now, Reset: reset}
}

func floorNonNeg(x float64) int64 {
	if x <= 0 {
		return 0
	}
	return int64(math.Floor(x))
}

func ceilMicros(x float64) int64 {
	if x <= 0 {
		return 0
	}
	return int64(math.Ceil(x))
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
