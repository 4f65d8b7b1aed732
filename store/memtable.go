package store

import (
	"sync"
	"unsafe"

	"github.com/caddy-cascade/cascade/rate"
)

// memoryShard is one independently locked part of the memory store. Each
// bucket is a block of the store's arena holding its state (a bucket
// header) and its key; an exact sliding window's log has a block of its
// own, which the header names. The index maps the 64-bit hash of a key
// (computed once per key and decision; it also picks the shard) to the
// first bucket of its chain: buckets whose keys share a hash are chained,
// and every lookup compares the key itself — exact, whatever the hash
// says. Neither the arena nor the index holds a pointer, so the collector
// scans none of it (see arena).
type memoryShard struct {
	shardFields
	// A whole number of cache lines: cores locking neighbouring shards
	// must not contend for one line (false sharing).
	_ [64 - unsafe.Sizeof(shardFields{})%64]byte // never empty: a last field of size 0 would be padded
}

type shardFields struct {
	mu    sync.Mutex
	index index
	arena *arena // the store's
	n     int    // buckets, chains included
	swept int64  // when the shard's expired state was last dropped (µs)
	// views are the logs that the decision holding the lock reads (one
	// per bucket of its path, up to maxPath): giving Apply a log costs no
	// allocation.
	views [maxPath]rate.Log
	// logs are the logs of the new states it computes, which are written
	// to the arena before the lock is released (see rate.ApplyTo and
	// writeLog).
	logs [maxPath]rate.Log
}

// bucket is the header of a bucket's block, which its key follows:
// rate.State without its log's bytes.
type bucket struct {
	hash     uint64
	expires  int64 // µs; the state is as good as fresh after this
	a, b     float64
	t        int64
	h        int64    // the log's H
	next     blockRef // the next bucket of the chain (noBlock: none)
	log      blockRef // the log's entries (noBlock: none)
	keyLen   uint32
	logOff   uint32 // where the log's entries start in its block (see writeLog)
	logLen   uint32
	class    uint8 // the block's
	logClass uint8 // the log block's class
	// record: an idempotency record (rate.Idempotent), evicted before any
	// limit's state: losing one charges a retry again, losing a limit's
	// state admits more than the limit.
	record bool
}

const headerSize = int(unsafe.Sizeof(bucket{}))

// reservedBytes is the arena a store sets aside up front by default: 16
// MiB, room for some 100,000 buckets, which pages in only as buckets
// arrive (carved from its start, in the order buckets come). It spares the
// first buckets any allocation and, being pointer-free, costs the
// collector nothing to hold; but it counts as heap for the Go runtime,
// which paces collections by the heap's size: a busy Caddy then collects
// several times less often (as with a higher GOGC), for the memory its
// garbage takes in between — and it counts towards a GOMEMLIMIT.
const reservedBytes = 16 << 20

func newShard(a *arena) memoryShard {
	return memoryShard{shardFields: shardFields{index: newIndex(), arena: a}}
}

// at is the header of the bucket in block ref.
func (sh *memoryShard) at(ref blockRef) *bucket {
	// The arena's chunks are plain bytes, allocated aligned (to 8 bytes at
	// least), and blocks start at multiples of 32: a header there is
	// aligned, and holds no pointer for the collector to miss.
	return (*bucket)(sh.arena.at(ref))
}

// key is the bucket's key, sharing the arena's bytes: valid while the
// caller holds the lock and the bucket stays.
func (b *bucket) key() string { return unsafe.String(b.keyStart(), b.keyLen) }

// keyStart is where the bucket's key is: right after its header.
func (b *bucket) keyStart() *byte { return (*byte)(unsafe.Add(unsafe.Pointer(b), headerSize)) }

// find returns the bucket of key, expired or not, nil if there is none.
func (sh *memoryShard) find(hash uint64, key string) *bucket {
	ref, _ := sh.index.get(hash) // noBlock if none
	for ref != noBlock {
		b := sh.at(ref)
		if b.key() == key {
			return b
		}
		ref = b.next
	}
	return nil
}

// state is the state of bucket b, its log read through view (whose bytes
// stay the bucket's, with the rest of their block spare: see rate.LogView).
func (sh *memoryShard) state(b *bucket, view *rate.Log) rate.State {
	st := rate.State{A: b.a, B: b.b, T: b.t}
	if b.logLen > 0 {
		*view = rate.LogView(b.h, sh.entries(b))
		st.Log = view
	}
	return st
}

// entries are the bytes of b's log entries, oldest first, with the rest of
// their block as spare capacity. b must have a log block.
func (sh *memoryShard) entries(b *bucket) []byte {
	return sh.arena.block(b.log, b.logClass)[b.logOff:][:b.logLen]
}

// view is a log for the bucket at position i of a path to be read through.
func (sh *memoryShard) view(i int) *rate.Log {
	if i < maxPath {
		return &sh.views[i]
	}
	return new(rate.Log)
}

// nextLog is where the new state of the bucket at position i of a path
// keeps its log until it is written (nil: a new allocation).
func (sh *memoryShard) nextLog(i int) *rate.Log {
	if i < maxPath {
		return &sh.logs[i]
	}
	return nil
}

// write sets the state of a bucket. Its log's bytes are kept in the
// bucket's log block (a larger one when they do not fit): left where they
// are when a charge dropped entries from the front of its view and
// appended its own in place (see rate.LogView), copied in otherwise (see
// writeLog).
func (sh *memoryShard) write(b *bucket, st rate.State, expires int64) {
	b.a, b.b, b.t, b.expires, b.h = st.A, st.B, st.T, expires, 0
	entries := st.Log.Entries()
	if len(entries) > 0 {
		b.h = st.Log.H
	}
	sh.writeLog(b, entries)
}

// writeLog keeps entries as b's log, in its log block, which keeps room
// for one more entry after them: the next charge drops the entries that
// have left the window from the front of the view Apply is given and
// appends its own (see rate.LogView), then appends in place. The log then
// moves through its block as a window slides, the entries left where they
// are: only when the block's end leaves no room for the next entry are
// they copied back to its start (or, when they no longer fit, to a larger
// block). How often that is depends on the spare bytes the block's class
// leaves after the log and one entry: none, and the log is copied at every
// charge that drops an entry, as this store once copied every log; a
// block a third larger than its log, and the log is copied once every
// dozen or more. Copying at every charge moved the whole log for each
// request: at a full window of 1,000 entries (10 KB), a decision took 1.6
// times as long (BenchmarkSlidingWindow, sliding/N=1000).
func (sh *memoryShard) writeLog(b *bucket, entries []byte) {
	n, off := len(entries), 0
	switch {
	case n == 0: // the block stays, for the log's next entries
	case b.log == noBlock:
		b.log, b.logClass = sh.arena.alloc(n + logEntry)
		copy(sh.arena.block(b.log, b.logClass), entries)
	default:
		blk := sh.arena.block(b.log, b.logClass)
		switch at := offsetIn(blk, entries); {
		case n+logEntry > len(blk):
			ref, c := sh.arena.alloc(n + logEntry)
			copy(sh.arena.block(ref, c), entries) // before blk is released: entries may be in it
			sh.arena.release(b.log, b.logClass)
			b.log, b.logClass = ref, c
		case at >= 0 && at+n+logEntry <= len(blk): // where they are
			off = at
		default:
			copy(blk, entries) // entries may overlap blk: copy moves them as memmove does
		}
	}
	b.logOff, b.logLen = uint32(off), uint32(n)
}

// offsetIn is where b starts in blk's memory, -1 if it is not in it.
func offsetIn(blk, b []byte) int {
	at := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(blk)))
	if at >= uintptr(len(blk)) {
		return -1
	}
	return int(at)
}

// logEntry is the size of a sliding log's entry (see rate.Log).
const logEntry = 10

// insert adds a bucket for key, which must have none.
func (sh *memoryShard) insert(hash uint64, key string, st rate.State, expires int64, record bool) {
	ref, c := sh.arena.alloc(headerSize + len(key))
	next, _ := sh.index.get(hash) // noBlock if none
	b := sh.at(ref)
	*b = bucket{hash: hash, expires: expires, a: st.A, b: st.B, t: st.T, next: next, log: noBlock,
		keyLen: uint32(len(key)), class: c, record: record}
	copy(unsafe.Slice(b.keyStart(), len(key)), key)
	if entries := st.Log.Entries(); len(entries) > 0 {
		b.h = st.Log.H
		sh.writeLog(b, entries)
	}
	sh.index.set(hash, ref)
	sh.n++
}

// unlink removes the bucket ref, which follows prev in its chain (noBlock:
// it is the chain's first), and releases its blocks.
func (sh *memoryShard) unlink(ref, prev blockRef) {
	b := sh.at(ref)
	switch {
	case prev != noBlock:
		sh.at(prev).next = b.next
	case b.next != noBlock:
		sh.index.set(b.hash, b.next)
	default:
		sh.index.del(b.hash)
	}
	if b.log != noBlock {
		sh.arena.release(b.log, b.logClass)
	}
	sh.arena.release(ref, b.class) // last: it overwrites the header's first bytes
	sh.n--
}
