// Package topk finds the heaviest keys of a stream in constant memory: the
// most-denied keys of a rate limiter, under a flood of distinct ones.
//
// It is the Space-Saving algorithm (Metwally, Agrawal and El Abbadi, 2005).
// A Sketch keeps k counters. A key already counted adds to its counter. A
// new key, when all k counters are taken, replaces the key of the smallest
// counter and inherits its count: count = min + n, error = min. So counts
// only overestimate, each by at most its Error, and every key whose true
// count exceeds Total/k is certainly in the sketch. Keys that come and go
// (one denial each) churn the bottom counter and never push out a heavy
// hitter.
//
// It is a hundred lines of stdlib: a dependency for it would weigh more
// than the code.
package topk

import (
	"container/heap"
	"slices"
	"strings"
	"sync"
)

// Entry is one key of the sketch: its true count is in [Count-Error, Count].
type Entry struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// Sketch is a Space-Saving summary of at most k keys. It is safe for
// concurrent use.
type Sketch struct {
	mu    sync.Mutex
	k     int
	total uint64
	index map[string]int // key → position in heap
	heap  counters
}

// New returns a sketch of k counters; k <= 0 means 100.
func New(k int) *Sketch {
	if k <= 0 {
		k = 100
	}
	return &Sketch{k: k, index: make(map[string]int, k)}
}

// Add counts n occurrences of key. The key is copied when the sketch keeps
// it, so the caller may reuse its memory. Keys should be bounded in length:
// the sketch holds k of them.
func (s *Sketch) Add(key string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total += n
	if i, ok := s.index[key]; ok {
		s.heap.items[i].Count += n
		heap.Fix(&s.heap, i)
		s.sync()
		return
	}
	if len(s.heap.items) < s.k {
		heap.Push(&s.heap, Entry{Key: strings.Clone(key), Count: n})
		s.sync()
		return
	}
	// Replace the smallest counter: its count becomes this key's error.
	min := &s.heap.items[0]
	delete(s.index, min.Key)
	*min = Entry{Key: strings.Clone(key), Count: min.Count + n, Error: min.Count}
	heap.Fix(&s.heap, 0)
	s.sync()
}

// sync brings the index up to date with the heap's moves.
func (s *Sketch) sync() {
	for _, i := range s.heap.moved {
		s.index[s.heap.items[i].Key] = i
	}
	s.heap.moved = s.heap.moved[:0]
}

// Top returns the n heaviest keys, by count (then key), heaviest first;
// n <= 0 returns them all.
func (s *Sketch) Top(n int) []Entry {
	s.mu.Lock()
	out := slices.Clone(s.heap.items)
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		switch {
		case a.Count > b.Count:
			return -1
		case a.Count < b.Count:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	if n > 0 && n < len(out) {
		out = out[:n]
	}
	return out
}

// Total is the sum of every n added.
func (s *Sketch) Total() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Reset forgets every key.
func (s *Sketch) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total = 0
	s.heap.items = s.heap.items[:0]
	clear(s.index)
}

// counters is a min-heap of entries by count that records which positions
// it changed (moved), for the sketch's index.
type counters struct {
	items []Entry
	moved []int
}

func (c *counters) Len() int           { return len(c.items) }
func (c *counters) Less(i, j int) bool { return c.items[i].Count < c.items[j].Count }
func (c *counters) Swap(i, j int) {
	c.items[i], c.items[j] = c.items[j], c.items[i]
	c.moved = append(c.moved, i, j)
}
func (c *counters) Push(x any) {
	c.items = append(c.items, x.(Entry))
	c.moved = append(c.moved, len(c.items)-1)
}
func (c *counters) Pop() any {
	e := c.items[len(c.items)-1]
	c.items = c.items[:len(c.items)-1]
	return e
}
