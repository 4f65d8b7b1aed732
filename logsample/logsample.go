// Package logsample keeps a flood of similar events from flooding a log.
// A Sampler logs the first event of each key per interval, counts the
// others, and reports each interval's count once, by the first event
// after it ends; Every lets one event of any kind through per interval.
// Neither needs a timer or a goroutine: the caller's events drive them,
// with the time they happened.
package logsample

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Summary is what an interval held back: Suppressed events from Keys
// distinct keys (as far as remembered), over Interval.
type Summary struct {
	Suppressed int
	Keys       int
	Interval   time.Duration
}

// Sampler decides which events to log. It is safe for concurrent use.
type Sampler struct {
	interval time.Duration
	maxKeys  int

	mu         sync.Mutex
	start      time.Time           // of the current interval
	seen       map[string]struct{} // keys logged in the current interval
	suppressed int
	from       map[string]struct{} // keys suppressed in the current interval
}

// New returns a sampler of intervals of the given length (<= 0: a minute)
// that remembers at most maxKeys keys per interval (<= 0: 10,000): past
// that, new keys are counted, not logged, so memory stays bounded.
func New(interval time.Duration, maxKeys int) *Sampler {
	if interval <= 0 {
		interval = time.Minute
	}
	if maxKeys <= 0 {
		maxKeys = 10000
	}
	return &Sampler{interval: interval, maxKeys: maxKeys, seen: map[string]struct{}{}, from: map[string]struct{}{}}
}

// Allow reports whether the event of key at now is to be logged: the first
// of its key in the current interval. When now has left the interval, a
// new one starts with it, and the summary of the one that ended is
// returned (Suppressed 0 when nothing was held back): the caller logs it
// once.
func (s *Sampler) Allow(key string, now time.Time) (log bool, ended Summary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.start.IsZero() || now.Sub(s.start) >= s.interval || now.Before(s.start) {
		if s.suppressed > 0 {
			ended = Summary{Suppressed: s.suppressed, Keys: len(s.from), Interval: now.Sub(s.start)}
		}
		s.start, s.suppressed = now, 0
		clear(s.seen)
		clear(s.from)
	}
	if _, ok := s.seen[key]; ok {
		s.count(key)
		return false, ended
	}
	if len(s.seen) >= s.maxKeys {
		s.count(key)
		return false, ended
	}
	s.seen[strings.Clone(key)] = struct{}{}
	return true, ended
}

func (s *Sampler) count(key string) {
	s.suppressed++
	if _, ok := s.from[key]; !ok && len(s.from) < s.maxKeys {
		s.from[strings.Clone(key)] = struct{}{}
	}
}

// Every lets one event through per interval and holds back the others,
// counting them: the next event let through learns how many were held
// back since the one before. It takes no lock, so a hot path may ask it
// on every request (a dead Redis under load must not turn every request
// into a log line). The zero value lets one event through a second.
type Every struct {
	// Interval is the least time between two events let through; zero
	// means a second. Set it before first use.
	Interval time.Duration

	last atomic.Int64 // when the last event was let through (Unix ns)
	held atomic.Int64 // events held back since
}

// Allow tells whether the event happening at now is let through and, when
// it is, how many events were held back since the last one let through.
func (e *Every) Allow(now time.Time) (ok bool, held int64) {
	interval := e.Interval
	if interval <= 0 {
		interval = time.Second
	}
	t, last := now.UnixNano(), e.last.Load()
	if last != 0 && t-last < int64(interval) || !e.last.CompareAndSwap(last, t) {
		e.held.Add(1)
		return false, 0
	}
	return true, e.held.Swap(0)
}
