package store

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxReplayBytes is the memory store's budget for kept responses
// when MemoryOptions.MaxReplayBytes is zero.
const DefaultMaxReplayBytes = 64 << 20

// ReplayEntryOverhead is what the memory store counts against its
// MaxReplayBytes for each kept response besides its key and its bytes: an
// estimate of the entry and its map slot.
const ReplayEntryOverhead = 128

// minResponseTTL is the least time a response is kept: Redis's PX counts
// milliseconds, and both stores keep a response alike.
const minResponseTTL = time.Millisecond

// Response implements Responses. The slice returned is a copy: the
// caller owns it.
func (m *Memory) Response(_ context.Context, key string) ([]byte, int64, error) {
	data, reads := m.replay.get(key, m.clock())
	if data == nil {
		return nil, 0, nil
	}
	// The kept bytes are never written again (a truncation makes a new
	// slice), so they are copied outside the lock.
	return bytes.Clone(data), reads, nil
}

// KeepResponse implements Responses. When the store's MaxReplayBytes would
// be exceeded, the oldest kept responses longer than ResponseHead are cut
// to their first ResponseHead bytes, oldest first; only when those stubs
// alone exceed it are the oldest of them dropped. A response whose whole
// bytes exceed the budget is kept as a stub at once; one whose stub alone
// does (a budget of a few hundred bytes) is not kept. A ttl under a
// millisecond keeps it for a millisecond, as Redis does.
func (m *Memory) KeepResponse(_ context.Context, key string, response []byte, ttl time.Duration) error {
	if entryCost(key, len(response)) > m.replay.max.Load() && len(response) > ResponseHead {
		response = response[:ResponseHead]
		m.replay.evictions.Add(1) // cut on its way in
	}
	// Copied before the lock is taken: a large response costs the other
	// callers nothing. Never nil, so an empty response reads back as kept.
	data := append([]byte{}, response...)
	ttl = max(ttl, minResponseTTL)
	now := m.clock()
	m.replay.put(key, data, now, now+ttl.Microseconds())
	return nil
}

// ReplayBytes is what the kept responses count against MaxReplayBytes:
// their keys, their bytes and ReplayEntryOverhead each.
func (m *Memory) ReplayBytes() int64 {
	m.replay.mu.Lock()
	defer m.replay.mu.Unlock()
	return m.replay.bytes
}

// ReplayEvictions is how many kept responses were cut to ResponseHead
// bytes, or dropped, to keep within MaxReplayBytes so far (those that
// expired are not counted).
func (m *Memory) ReplayEvictions() int64 { return m.replay.evictions.Load() }

// replayTable is the memory store's table of kept responses, apart from
// its buckets' shards: making room for a response never evicts the state
// of a limit. One lock guards it: a response is kept once per request that
// carries an idempotency key and read once per retry, and a large
// response is copied outside the lock.
type replayTable struct {
	max       atomic.Int64 // MaxReplayBytes
	evictions atomic.Int64

	mu      sync.Mutex
	entries map[string]*replayEntry
	bytes   int64      // what entries count against max (see entryCost)
	all     replayList // every entry, oldest kept first
	whole   replayList // the entries longer than ResponseHead, oldest kept first
	swept   int64      // when expired entries were last dropped (µs)
}

// replayEntry is one kept response. Its data are never written once kept:
// cutting it to a stub replaces the slice.
type replayEntry struct {
	key     string
	data    []byte
	expires int64 // µs: gone from then on
	reads   int64 // reads since it was kept
	links   [2]replayLinks
	whole   bool // in the table's whole list
}

type replayLinks struct{ prev, next *replayEntry }

// replayList is a list of entries in the order they were kept, linked
// through their links[which].
type replayList struct {
	head, tail *replayEntry
	which      int
}

func (l *replayList) push(e *replayEntry) {
	e.links[l.which] = replayLinks{prev: l.tail}
	if l.tail != nil {
		l.tail.links[l.which].next = e
	} else {
		l.head = e
	}
	l.tail = e
}

func (l *replayList) remove(e *replayEntry) {
	lk := &e.links[l.which]
	if lk.prev != nil {
		lk.prev.links[l.which].next = lk.next
	} else {
		l.head = lk.next
	}
	if lk.next != nil {
		lk.next.links[l.which].prev = lk.prev
	} else {
		l.tail = lk.prev
	}
	*lk = replayLinks{}
}

// entryCost is what a response of n bytes kept under key counts against
// the budget.
func entryCost(key string, n int) int64 {
	return int64(len(key)) + int64(n) + ReplayEntryOverhead
}

func (t *replayTable) init(maxBytes int64) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxReplayBytes
	}
	t.max.Store(maxBytes)
	t.entries = map[string]*replayEntry{}
	t.whole.which = 1
}

// setMax changes the budget (a reloaded configuration); zero or negative
// keeps it. A lower budget is reached at the next KeepResponse, which
// makes room as for any response.
func (t *replayTable) setMax(maxBytes int64) {
	if maxBytes > 0 {
		t.max.Store(maxBytes)
	}
}

// get returns the live bytes kept under key (nil if none) and counts the
// read, dropping them once expired.
func (t *replayTable) get(key string, now int64) ([]byte, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[key]
	if e == nil {
		return nil, 0
	}
	if e.expires <= now {
		t.remove(e)
		return nil, 0
	}
	e.reads++
	return e.data, e.reads
}

// put keeps data under key from now until expires, replacing what was
// kept there, after making room for it.
func (t *replayTable) put(key string, data []byte, now, expires int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.entries[key]; old != nil {
		t.remove(old)
	}
	cost := entryCost(key, len(data))
	if !t.makeRoom(cost, now) {
		t.evictions.Add(1) // not even its stub fits: dropped on its way in
		return
	}
	e := &replayEntry{key: key, data: data, expires: expires, whole: len(data) > ResponseHead}
	t.entries[key] = e
	t.all.push(e)
	if e.whole {
		t.whole.push(e)
	}
	t.bytes += cost
}

// makeRoom brings the table down to max − need: first by dropping expired
// entries (a full scan at most once a second), then by cutting the oldest
// whole responses to stubs, then by dropping the oldest stubs. It reports
// whether need fits.
func (t *replayTable) makeRoom(need, now int64) bool {
	limit := t.max.Load()
	if need > limit {
		return false
	}
	if t.bytes+need <= limit {
		return true
	}
	if now-t.swept >= sweepShardEvery {
		t.sweep(now)
	}
	for t.bytes+need > limit && t.whole.head != nil {
		e := t.whole.head
		if e.expires <= now {
			t.remove(e)
			continue
		}
		t.bytes -= int64(len(e.data) - ResponseHead)
		e.data = append([]byte{}, e.data[:ResponseHead]...) // frees the rest
		t.whole.remove(e)
		e.whole = false
		t.evictions.Add(1)
	}
	for t.bytes+need > limit && t.all.head != nil {
		e := t.all.head
		if e.expires > now {
			t.evictions.Add(1)
		}
		t.remove(e)
	}
	return true
}

// remove drops e from the table.
func (t *replayTable) remove(e *replayEntry) {
	delete(t.entries, e.key)
	t.all.remove(e)
	if e.whole {
		t.whole.remove(e)
	}
	t.bytes -= entryCost(e.key, len(e.data))
}

// sweep drops every expired entry. The caller holds the lock.
func (t *replayTable) sweep(now int64) {
	for e := t.all.head; e != nil; {
		next := e.links[0].next
		if e.expires <= now {
			t.remove(e)
		}
		e = next
	}
	t.swept = now
}

// sweepReplay drops every expired response (see Memory.Sweep).
func (t *replayTable) sweepReplay(now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now)
}

// Memory keeps responses.
var _ Responses = (*Memory)(nil)
