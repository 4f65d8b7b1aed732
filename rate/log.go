package rate

import (
	"encoding/binary"
	"errors"
	"math"
)

// MaxExact is the largest Count of a sliding window timed to the µs. Its
// log holds at most one entry per charge (and per debt) in the window, so
// its memory grows with Count; above MaxExact the window coarsens its tick
// instead (see Limit.Tick), which bounds its log at MaxExact + 1 entries,
// 10 bytes each. The bound is memory, measured (store's
// BenchmarkSlidingWindow): a full key at 1,000 holds 12 KB on either
// store, a GCRA key 0.1–0.2 KB; the time of a decision does not grow with
// the log (0.12–0.17 µs in memory, 8–9 µs of Redis time, at N = 10 as at
// 1,000).
const MaxExact = 1000

const (
	// entrySize is the size of one log entry: a uint48 gap, a uint32 cost.
	entrySize = 10
	// maxEntryCost is the most one entry holds; more in the same tick
	// opens another entry. Sliding limits count at most this per window.
	maxEntryCost = 1<<32 - 1
	// maxGap is the longest gap between two entries (µs), and so the
	// longest sliding window: 8.9 years.
	maxGap = 1<<48 - 1
	// exactTicks is how many ticks a window of a timed-to-the-µs log
	// spans at most: windows longer than 2³¹ µs (35 minutes) coarsen to
	// Period/2³¹, a few µs, so every Apply stays within exact float64
	// arithmetic whatever the window.
	exactTicks = 1 << 31
)

// Log is the part of an exact sliding window's state older than its newest
// charge (which State.B and State.T hold, so that a charge in the same tick
// as the newest changes no byte here): its entries, oldest first. Apply
// never changes a Log a State holds; a new state gets a new Log, which may
// share this one's array (see Limit.Apply) — or the Log a caller of
// Limit.ApplyTo gives, which that call overwrites.
//
// The Redis store keeps H (and the number of entries) in the bucket's key,
// and each entry's 10 bytes as one element of a list (see package lua).
type Log struct {
	// H is the time (µs) of the oldest entry.
	H int64
	// buf holds the entries, oldest first, entrySize bytes each, little
	// endian: the gap (µs, uint48) from this entry to the next newer one
	// (for the last, to the newest charge at State.T), then its cost
	// (uint32). Each entry's cost is positive.
	buf []byte
}

// Len is the number of entries in the log; a nil Log has none.
func (g *Log) Len() int {
	if g == nil {
		return 0
	}
	return len(g.buf) / entrySize
}

// LogView is a Log whose oldest entry is at h and whose entries are
// entries (as Entries returns them), sharing their memory: how a store
// that keeps logs in memory of its own gives one to Apply without copying
// it. Apply never changes entries[:len(entries)], but a charge may append
// an entry within their capacity: a store that gives it spare capacity
// must treat those bytes as Apply's, and copy the new state's Entries
// back when it keeps that state (they may be those very bytes).
func LogView(h int64, entries []byte) Log { return Log{H: h, buf: entries} }

// Entries are the log's entries, oldest first, 10 bytes each: its memory,
// not a copy. A nil Log has none.
func (g *Log) Entries() []byte {
	if g == nil {
		return nil
	}
	return g.buf
}

// AppendBinary appends the log: H as a little-endian float64, then the
// entries. A nil Log appends nothing.
func (g *Log) AppendBinary(dst []byte) ([]byte, error) {
	if g == nil {
		return dst, nil
	}
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(g.H)))
	return append(dst, g.buf...), nil
}

// ParseLog reads a log written by AppendBinary (nil for no bytes).
func ParseLog(b []byte) (*Log, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 8+entrySize || (len(b)-8)%entrySize != 0 {
		return nil, errors.New("rate: a sliding log is 8 bytes and whole 10-byte entries")
	}
	h := math.Float64frombits(binary.LittleEndian.Uint64(b))
	return &Log{H: int64(h), buf: append([]byte(nil), b[8:]...)}, nil
}

func appendEntry(buf []byte, gap, cost int64) []byte {
	g := uint64(gap)
	return binary.LittleEndian.AppendUint32(append(buf, byte(g), byte(g>>8), byte(g>>16), byte(g>>24), byte(g>>32), byte(g>>40)), uint32(cost))
}

func entryAt(buf []byte, off int) (gap, cost int64) {
	b := buf[off : off+entrySize]
	gap = int64(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 | uint64(b[4])<<32 | uint64(b[5])<<40)
	return gap, int64(binary.LittleEndian.Uint32(b[6:]))
}

// Tick is the resolution (µs) at which a sliding window times its charges:
// a charge is logged at the end of its tick (never early, so never leaving
// the window early), and charges of one tick share an entry. It is 1 µs for
// a Count up to MaxExact (and a window up to 35 minutes), and Period /
// MaxExact, rounded up, above it.
func (l Limit) Tick() int64 {
	ticks := int64(exactTicks)
	if l.Count > MaxExact {
		ticks = MaxExact
	}
	p := l.Period.Microseconds()
	return max(1, (p+ticks-1)/ticks)
}

// tickOf is the end of the tick holding t: the time a charge at t is logged at.
func (l Limit) tickOf(t int64) int64 {
	g := l.Tick()
	if m := mod(t, g); m > 0 {
		t += g - m
	}
	return t
}

// view is a sliding log as seen at one instant: what is left once the
// entries at or before the window's start have left it.
type view struct {
	used float64 // the cost of the charges in the window
	off  int     // byte offset in Log.buf of the first entry in the window
	h    int64   // that entry's time (the newest's, State.T, when none is)
	live bool    // false: nothing is in the window
}

// scan reads the log of s at time now, walking only the entries that have
// left the window.
func (l Limit) scan(s State, now int64) view {
	cut := now - l.Period.Microseconds() // at or before: out of the window
	if s.B == 0 || s.T <= cut {
		return view{}
	}
	v := view{used: s.A, h: s.T, live: true}
	if s.Log != nil {
		buf := s.Log.buf
		v.h = s.Log.H
		for v.off < len(buf) && v.h <= cut {
			gap, cost := entryAt(buf, v.off)
			v.used -= float64(cost)
			v.h += gap
			v.off += entrySize
		}
	}
	return v
}

// reset is the wait until the window holds nothing: until its newest
// charge, at t, leaves it.
func (l Limit) reset(live bool, t, now int64) int64 {
	if !live {
		return 0
	}
	return t + l.Period.Microseconds() - now
}

func (l Limit) slidingLog(s State, now, n int64, dst *Log) (State, Result) {
	v := l.scan(s, now)
	max := float64(l.Count)
	before := floorNonNeg(max - v.used)
	if n > l.Count {
		return s, Result{Impossible: true, Remaining: before, Before: before, Reset: l.reset(v.live, s.T, now)}
	}
	if v.used+float64(n) <= max {
		c, g := l.compact(s, v)
		next := l.record(c, g, now, n, dst)
		return next, Result{Allowed: true, Remaining: floorNonNeg(max - v.used - float64(n)), Before: before, Reset: l.reset(next.B > 0, next.T, now)}
	}
	return s, Result{Remaining: before, Before: before, RetryAfter: l.retry(s, v, now, v.used+float64(n)-max), Reset: l.reset(v.live, s.T, now)}
}

// compact is s without the entries that have left the window (v). Its log
// is also returned as a value, g, for record (g.H is the state's T when no
// entry is left): the state holds s.Log when no entry has left it, and no
// Log otherwise, which record makes from g only once it knows whether a new
// entry joins it, so that a charge allocates at most one Log.
func (l Limit) compact(s State, v view) (next State, g Log) {
	if !v.live {
		return State{}, Log{}
	}
	next, g = State{A: v.used, B: s.B, T: s.T}, Log{H: s.T}
	switch {
	case s.Log == nil:
	case v.off == 0:
		next.Log, g = s.Log, *s.Log
	case v.off < len(s.Log.buf):
		g = Log{H: v.h, buf: s.Log.buf[v.off:]}
	}
	return next, g
}

// record logs a charge of n at time now in s, a compacted state whose log
// is g (see compact): in the newest entry when now falls in its tick (and
// the entry has room), else in a new newest entry, the previous newest
// joining the Log. A clock that went back logs at the newest entry's time:
// entries stay in time order. A new Log is written to dst when it is not
// nil (see ApplyTo).
func (l Limit) record(s State, g Log, now, n int64, dst *Log) State {
	if n == 0 {
		return s.withLog(g, dst)
	}
	at := l.tickOf(now)
	if s.B == 0 {
		return State{A: float64(n), B: float64(n), T: at}
	}
	if at < s.T {
		at = s.T
	}
	if at == s.T && s.B+float64(n) <= maxEntryCost {
		s.A += float64(n)
		s.B += float64(n)
		return s.withLog(g, dst)
	}
	return State{A: s.A + float64(n), B: float64(n), T: at, Log: newLog(dst, g.H, appendEntry(g.buf, at-s.T, int64(s.B)))}
}

// withLog is s, compacted, holding its log g: s.Log when it already does,
// else a new Log (dst when not nil) if g has entries.
func (s State) withLog(g Log, dst *Log) State {
	if s.Log == nil && len(g.buf) > 0 {
		s.Log = newLog(dst, g.H, g.buf)
	}
	return s
}

// newLog is a Log of h and buf: dst, so set, when it is not nil, else a new
// one.
func newLog(dst *Log, h int64, buf []byte) *Log {
	if dst == nil {
		return &Log{H: h, buf: buf}
	}
	*dst = Log{H: h, buf: buf}
	return dst
}

// retry is the wait until need units of the oldest charges in the window
// (v) have left it: until the entry where their sum reaches need leaves.
func (l Limit) retry(s State, v view, now int64, need float64) int64 {
	p := l.Period.Microseconds()
	t, sum := v.h, float64(0)
	if s.Log != nil {
		buf := s.Log.buf
		for off := v.off; off < len(buf); off += entrySize {
			gap, cost := entryAt(buf, off)
			if sum += float64(cost); sum >= need {
				return t + p - now
			}
			t += gap
		}
	}
	return s.T + p - now // the newest entry, which holds the rest
}

// entry is one charge of a sliding log, unpacked: its time and cost.
type entry struct{ t, c int64 }

// adjustLog is Adjust for an exact sliding window. A debt is logged now (at
// most Count of it: a larger debt fills the window for a whole Period
// either way). A refund is taken off the entry of the tick the corrected
// cost was charged in (charged, from ChargeWindow; the tick of now when
// unknown) if that entry is still in the window, never below zero, and an
// entry left with nothing is dropped so that refunds cannot grow a log.
// Adjust is rare beside Apply: it unpacks the log, changes it and packs a
// new one, sharing no memory with s.
func (l Limit) adjustLog(s State, now, delta, charged int64) State {
	v := l.scan(s, now)
	var es []entry
	if v.live {
		es = make([]entry, 0, s.Log.Len()+2)
		t := v.h
		if s.Log != nil {
			for off := v.off; off < len(s.Log.buf); off += entrySize {
				gap, cost := entryAt(s.Log.buf, off)
				es = append(es, entry{t, cost})
				t += gap
			}
		}
		es = append(es, entry{s.T, int64(s.B)})
	}
	used := v.used
	switch {
	case delta > 0:
		d := min(delta, l.Count)
		at := l.tickOf(now)
		if k := len(es) - 1; k >= 0 && at <= es[k].t && es[k].c+d <= maxEntryCost {
			es[k].c += d
		} else {
			if k >= 0 && at < es[k].t {
				at = es[k].t
			}
			es = append(es, entry{at, d})
		}
		used += float64(d)
	case delta < 0:
		if charged == 0 {
			charged = l.tickOf(now)
		}
		for i := range es {
			if es[i].t == charged {
				take := min(es[i].c, -delta)
				es[i].c -= take
				used -= float64(take)
				if es[i].c == 0 {
					es = append(es[:i], es[i+1:]...)
				}
				break
			}
		}
	}
	return packLog(es, used)
}

// packLog builds the state of a log from its entries, oldest first, and
// their total.
func packLog(es []entry, used float64) State {
	k := len(es) - 1
	if k < 0 {
		return State{}
	}
	s := State{A: used, B: float64(es[k].c), T: es[k].t}
	if k > 0 {
		g := &Log{H: es[0].t, buf: make([]byte, 0, k*entrySize)}
		for i := 0; i < k; i++ {
			g.buf = appendEntry(g.buf, es[i+1].t-es[i].t, es[i].c)
		}
		s.Log = g
	}
	return s
}
