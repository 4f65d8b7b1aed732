// Package logsample keeps a flood of similar events from flooding a log:
// the first event of each key per interval is logged, the others are
// counted, and each interval's count is reported once, by the first event
// after it ends. It needs no timer and no goroutine: the caller's events
// drive it, with the time they happened.
package logsample

import (
	"strings"
	"sync"
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
