package rate

import "math"

// # Leases
//
// A lease is capacity charged to a bucket ahead of the requests that will
// spend it: one decision charges a request's cost plus a slice of Extra
// more units, and the instance that asked spends the slice on later
// requests without asking again. Because every leased unit was charged
// before it is spent, what all instances admit together never exceeds what
// the charges admitted. Two things keep that exact rather than merely
// bounded, and both are here so that the memory store and the Redis script
// compute them alike.
//
// A GCRA charge drains: the bucket forgets it at Count per Period. A leased
// unit spent after its charge has drained would be admitted twice (once as
// the drained charge's refill, once by the lease), so the leased units
// expire as they drain. Units charged on top of a level u drain in order:
// at time t after the charge at t0, the first (t − t0)·Count/Period − u of
// them are gone (LeaseDrained). So that a lease's units last as long as
// the lease, a lease on a bucket whose level is below what it drains in
// that time first charges the difference (LeasePad): capacity held and
// never spent, the price of a lease on a bucket that refills fast. A lease
// spends its units from the oldest, skipping drained ones, and gives back,
// when it ends, only the units that have not drained when the bucket is
// corrected (the store computes that at its own clock, so a late
// correction gives back less, never more). The padding is not given back:
// the units spent above it must stay where they were charged.
//
// That reckoning assumes the level under a lease's units only drains: a
// refund that took units from beneath them (another lease given back, a
// reconciled estimate) would let them drain early, and a lease would spend
// units its bucket no longer counts. So a GCRA bucket keeps its lease top
// (State.B, drained like the level): the level at which the newest lease's
// units end, beneath which every lease's units lie. A refund never lowers
// the level below it (Adjust withholds the rest: under-admission, never
// over), and a lease given back lowers it only when the lease is the
// topmost, to the level under its unspent units (LeaseGiveBack); a lease
// given back beneath a later one gives back only what was charged above
// the top since.
//
// A calendar charge belongs to its window: leased units are spent only
// within the window they were charged in, and given back only while it is
// still the current window. Sliding windows are never leased: a unit
// charged at t0 leaves the window at t0 + Period, while the request that
// spends it later would have to count until its own time + Period.

// Leasable reports whether a lease can be taken on the limit (see Leases).
func (l Limit) Leasable() bool {
	return l.Algorithm == GCRA || l.Algorithm == Calendar || l.Algorithm == ""
}

// LeaseDrained is how many of the units leased on a GCRA limit at t0 (µs),
// charged on top of a level of off units, have drained by now: the units
// from the oldest that the bucket no longer holds. It is 0 for the other
// algorithms (see Leases) and may exceed the units leased (the caller clamps
// it). The Redis script computes the same expression in the same order.
func (l Limit) LeaseDrained(t0 int64, off float64, now int64) float64 {
	if l.Algorithm == Calendar {
		return 0
	}
	elapsed := now - t0
	if elapsed < 0 {
		elapsed = 0
	}
	return math.Max(0, float64(elapsed)*float64(l.Count)/float64(l.Period.Microseconds())-off)
}

// LeaseRefund is what a lease gives back to a GCRA bucket at now when it
// ends with units unspent units whose charge sat on top of a level of off
// (the level after the lease's own request plus what the lease spent or
// skipped): the units that have not drained, in whole units. Calendar
// limits give back every unspent unit (Adjust then refunds them only to the
// window they were charged in).
func (l Limit) LeaseRefund(t0 int64, off, units float64, now int64) int64 {
	if l.Algorithm == Calendar {
		return floorNonNeg(units)
	}
	return floorNonNeg(units - math.Min(units, l.LeaseDrained(t0, off, now)))
}

// LeasePad is how many units a lease must charge a GCRA bucket under its
// leased units so that none of them drains before hold (µs) has passed:
// the units drain after the level under them, so that level must be at
// least what the bucket drains in hold (Count·hold/Period). level is the
// bucket's level after the request that takes the lease. A bucket already
// that full (other requests' charges, other leases) needs no padding; a
// fresh one refilling fast needs a lot, which LeaseExtra counts against
// the lease's share. Calendar limits need none: their leases end with
// their window. The Redis script computes the same.
func (l Limit) LeasePad(level float64, hold int64) int64 {
	if l.Algorithm == Calendar {
		return 0
	}
	return ceilMicros(float64(l.Count)*float64(hold)/float64(l.Period.Microseconds()) - level)
}

// LeaseExtra is how many more requests of cost n a lease may take on a
// bucket after charging one, given what remains after that charge and the
// padding the lease needs (LeasePad): none when less than minRemaining of
// the capacity remains (near exhaustion every request is decided on its
// own), else at most share of what remains, padding included. A bucket
// the request does not charge (n = 0) sets no bound (the result is then
// want). The Redis script computes the same.
func (l Limit) LeaseExtra(remaining, pad, n int64, want int64, share, minRemaining float64) int64 {
	if n <= 0 {
		return want
	}
	if float64(remaining) < minRemaining*float64(l.Capacity()) {
		return 0
	}
	extra := int64(math.Floor((share*float64(remaining) - float64(pad)) / float64(n)))
	return max(0, min(extra, want))
}

// LeaseGranted returns the state of a GCRA bucket just charged a lease's
// units (on top of everything): its lease top is its level. Other
// algorithms keep no lease top.
func (l Limit) LeaseGranted(s State) State {
	if l.Algorithm != Calendar {
		s.B = s.A
	}
	return s
}

// topSlack is the relative rounding LeaseGiveBack allows between a
// bucket's lease top and the top of the lease given back, both drained
// since their own times: rounding on the order of 1e-16 per write, so a
// lease is recognised as the topmost however many writes drained the top
// since, while another lease's top is only taken for it by a coincidence
// within a billionth (a later lease ends at least a unit higher).
const topSlack = 1e-9

// LeaseGiveBack returns state s after a lease charged at t0 (µs) ends at
// now with units unspent, sitting on a level of off (see LeaseRefund): the
// undrained units are refunded (into the window they were charged in, for
// a calendar limit) and, on a GCRA bucket, no deeper than the lease top,
// which drops to the level under the unspent units when this lease's are
// the topmost (see topSlack). Every lease's units lie beneath the top, so
// nothing is given back to a bucket whose top lies below where this
// lease's units end: it no longer holds them (it was reset since, or
// drained). A bucket reset, then charged and leased above where the old
// lease ended, cannot tell: a lease charged before the reset may then take
// back up to its units from the fresh bucket, as it could have spent them.
// See Leases. The Redis script computes the same.
func (l Limit) LeaseGiveBack(s State, now, t0 int64, off, units float64) State {
	refund := l.LeaseRefund(t0, off, units, now)
	if l.Algorithm == Calendar {
		if refund <= 0 {
			return s
		}
		return l.Adjust(s, now, -refund, l.ChargeWindow(t0))
	}
	u := l.level(s, now)
	top := math.Min(l.leaseTop(s, now), u)
	band := l.drain(off+units, t0, now) // this lease's top
	slack := topSlack * math.Max(1, band)
	switch {
	case top+slack < band:
		// Every lease's units lie beneath the top: this bucket does not
		// hold these (it was reset since they were charged).
		refund = 0
	case top <= band+slack: // the topmost
		top = math.Min(top, l.drain(off, t0, now))
	}
	s.A = math.Max(top, u-float64(refund))
	s.B = top
	s.T = now
	return s
}
