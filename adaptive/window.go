package adaptive

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// The latency histogram is log-linear (as in HdrHistogram): each power of
// two from 2^minExp ns (16µs) to 2^maxExp ns (275s) is split into
// 2^subBits equal buckets, so a bucket is at most 1/8 = 12.5% of its lower
// bound wide. The p99 is interpolated inside its bucket, so its error is a
// few percent, far below the gap between any sane warn and critical
// thresholds. Bucket 0 holds everything faster than 16µs, the last bucket
// everything slower than 275s.
const (
	subBits    = 3
	subCount   = 1 << subBits
	minExp     = 14
	maxExp     = 38
	numBuckets = 1 + (maxExp-minExp)*subCount + 1
)

// bucketOf returns the histogram bucket of a latency: a few shifts, no
// branches beyond the range checks.
func bucketOf(d time.Duration) int {
	if d < 1<<minExp {
		return 0
	}
	ns := uint64(d)
	if ns >= 1<<maxExp {
		return numBuckets - 1
	}
	e := bits.Len64(ns) - 1
	sub := int(ns>>(e-subBits)) & (subCount - 1)
	return 1 + (e-minExp)*subCount + sub
}

// bucketBounds returns the bucket's range [lo, hi) in nanoseconds.
func bucketBounds(i int) (lo, hi float64) {
	switch {
	case i <= 0:
		return 0, 1 << minExp
	case i >= numBuckets-1:
		return 1 << maxExp, 1 << maxExp
	}
	e := (i-1)/subCount + minExp
	sub := (i - 1) % subCount
	unit := float64(uint64(1) << (e - subBits))
	return float64(subCount+sub) * unit, float64(subCount+sub+1) * unit
}

// slot counts the requests recorded during one slice of the window.
type slot struct {
	buckets [numBuckets]atomic.Uint64
	errors  atomic.Uint64
	headers []sumCount // one per response-header signal
}

func (s *slot) reset() {
	for i := range s.buckets {
		s.buckets[i].Store(0)
	}
	s.errors.Store(0)
	for i := range s.headers {
		s.headers[i].sum.Store(0)
		s.headers[i].n.Store(0)
	}
}

// sumCount accumulates the numbers a response-header signal reads: their
// sum (float64 bits, added with compare-and-swap) and their count.
type sumCount struct {
	sum atomic.Uint64
	n   atomic.Uint64
}

func (a *sumCount) add(v float64) {
	for {
		old := a.sum.Load()
		if a.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	a.n.Add(1)
}

// window is a ring of time slots, each a histogram of latencies plus an
// error count. Record (any goroutine, hot path) adds to the current slot
// with atomic increments; only the sampling goroutine moves the current
// slot, so Record needs no clock and no lock. The slot about to become
// current is the oldest one: it is cleared before the index moves, so a
// Record never lands in a slot that is being cleared unless it stalled for
// a whole window between loading the index and adding.
type window struct {
	cur    atomic.Uint32
	slots  []slot
	width  time.Duration // time covered by one slot
	tick   time.Duration // the sample interval, for rounding
	start  time.Time     // when the current slot began; zero before the first sample
	merged [numBuckets]uint64
	// headers is the number of response-header signals: each slot has
	// an accumulator for each.
	headers int
}

// newWindow returns a window covering at least span, advanced by samples
// every tick, with an accumulator in each slot for each of headers
// response-header signals. The slot width is tick, or larger when span/tick
// exceeds maxSlots; one extra slot is the one being filled.
func newWindow(span, tick time.Duration, headers int) *window {
	width := tick
	if n := (span + tick - 1) / tick; n > maxSlots {
		width = tick * ((n + maxSlots - 1) / maxSlots)
	}
	n := int((span+width-1)/width) + 1
	w := &window{slots: make([]slot, n), width: width, tick: tick, headers: headers}
	if headers > 0 {
		for i := range w.slots {
			w.slots[i].headers = make([]sumCount, headers)
		}
	}
	return w
}

// recordHeader adds a response-header signal's number to the current slot.
func (w *window) recordHeader(i int, v float64) {
	w.slots[w.cur.Load()].headers[i].add(v)
}

// headerStats sums a response-header signal's numbers over the whole
// window. Called by the sampler only.
func (w *window) headerStats(i int) (sum float64, n uint64) {
	for s := range w.slots {
		a := &w.slots[s].headers[i]
		sum += math.Float64frombits(a.sum.Load())
		n += a.n.Load()
	}
	return sum, n
}

// record adds one request. It is the hot path: one atomic load, one or two
// atomic adds, no allocation.
func (w *window) record(d time.Duration, failed bool) {
	s := &w.slots[w.cur.Load()]
	s.buckets[bucketOf(d)].Add(1)
	if failed {
		s.errors.Add(1)
	}
}

// windowStats is what a sample reads from the window.
type windowStats struct {
	requests uint64
	errors   uint64
	p99      time.Duration
}

// healthier returns the healthier of two windows' readings, per signal.
func healthier(a, b windowStats) windowStats {
	out := a
	out.p99 = min(a.p99, b.p99)
	if b.requests > 0 && float64(b.errors)/float64(b.requests) < float64(a.errors)/float64(a.requests) {
		out.errors = uint64(math.Round(float64(a.requests) * float64(b.errors) / float64(b.requests)))
	}
	return out
}

// advance moves the current slot to the one that covers now, clearing the
// slots that fall out of the window. A sample within half a tick of a slot
// boundary counts as past it, so a ticker's jitter cannot skip or repeat a
// slot.
func (w *window) advance(now time.Time) {
	if w.start.IsZero() {
		w.start = now
		return
	}
	steps := int64(now.Sub(w.start)+w.tick/2) / int64(w.width)
	if steps <= 0 {
		return
	}
	w.start = w.start.Add(time.Duration(steps) * w.width)
	n := int64(len(w.slots))
	cur := int64(w.cur.Load())
	for i := int64(1); i <= min(steps, n); i++ {
		w.slots[(cur+i)%n].reset()
	}
	w.cur.Store(uint32((cur + steps) % n))
}

// stats sums the newest n slots (the current one and n−1 before it) and
// computes their p99. Called by the sampler only.
func (w *window) stats(n int) windowStats {
	var st windowStats
	clear(w.merged[:])
	cur := int(w.cur.Load())
	n = min(n, len(w.slots))
	for i := range n {
		s := &w.slots[(cur-i+len(w.slots))%len(w.slots)]
		for b := range s.buckets {
			w.merged[b] += s.buckets[b].Load()
		}
		st.errors += s.errors.Load()
	}
	for _, c := range w.merged {
		st.requests += c
	}
	st.p99 = quantile(&w.merged, st.requests, 0.99)
	// Records race with the sums above: an error may be counted before its
	// latency. Never report more errors than requests.
	st.errors = min(st.errors, st.requests)
	return st
}

// quantile returns the q-quantile of a histogram holding total counts,
// interpolating linearly inside the bucket that holds it.
func quantile(h *[numBuckets]uint64, total uint64, q float64) time.Duration {
	if total == 0 {
		return 0
	}
	rank := math.Ceil(q * float64(total)) // 1-based rank of the quantile
	var cum float64
	for i, c := range h {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank {
			lo, hi := bucketBounds(i)
			return time.Duration(lo + (hi-lo)*(rank-cum)/float64(c))
		}
		cum += float64(c)
	}
	lo, _ := bucketBounds(numBuckets - 1)
	return time.Duration(lo)
}
