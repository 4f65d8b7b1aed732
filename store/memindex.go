package store

import (
	"iter"
	"math/bits"
)

// index maps the 64-bit hash of a key to the first bucket of its chain
// (see memoryShard): an open-addressed table of (hash, ref) slots with
// linear probing, its length a power of two, kept at most three quarters
// full (16 bytes a slot: 21 to 43 bytes a key, as a Go map's). It is made
// by newIndex only: a zero index has no table.
//
// It stands in for a Go map[uint64]blockRef, which it beats where the
// memory store runs: under load, between one request on a key and the
// next, the shard's index has left the CPU's caches, and a lookup pays a
// cache miss for each line it reads. A map's lookup reads its header, its
// directory and table, then a group's control word and slots; this one
// reads the shard's fields (in the lines the shard's lock and arena bring
// in) and the line of the key's slot, which holds the next slots of its
// probe too. BenchmarkIndex compares the two on an index far larger than
// the caches, as a store's is under load.
//
// What it gives up: a table grows at once, not piece by piece as a Go
// map's does, so the insert that doubles a shard's table holds the shard's
// lock while every slot is moved (about 1 ms at 16,000 keys a shard, a
// million keys in the store). That happens only as the store fills, a
// dozen times a shard at most, and tables never shrink.
type index struct {
	slots []indexSlot
	shift uint8 // 64 - log2(len(slots)): a hash's home is its top bits
	n     int   // slots in use
}

// indexSlot is one entry of an index. Its ref is stored complemented, so
// that a zeroed slot — as make returns it — is empty: the ref of an empty
// slot is noBlock, all ones, which no bucket's ref is.
type indexSlot struct {
	hash   uint64
	notRef blockRef // ^ref
}

func (s *indexSlot) ref() blockRef { return ^s.notRef }
func (s *indexSlot) empty() bool   { return s.notRef == 0 }

// minIndexSlots is an index's smallest table: 16 slots, four cache lines.
const minIndexSlots = 16

func newIndex() index {
	return index{slots: make([]indexSlot, minIndexSlots), shift: uint8(64 - bits.TrailingZeros(minIndexSlots))}
}

// home is the slot where a probe for hash starts: the hash's top bits, as
// its low bits choose the shard (every hash of a shard shares them).
func (x *index) home(hash uint64) int { return int(hash >> x.shift) }

// get returns the ref stored for hash.
func (x *index) get(hash uint64) (blockRef, bool) {
	i, found := x.probe(hash)
	return x.slots[i].ref(), found // noBlock when not found
}

// set stores ref for hash, replacing the ref stored for it if any. Only
// a new hash can grow the table: a replacement leaves the slots where they
// are (see from).
func (x *index) set(hash uint64, ref blockRef) {
	i, found := x.probe(hash)
	if found {
		x.slots[i].notRef = ^ref
		return
	}
	if 4*(x.n+1) > 3*len(x.slots) {
		x.grow()
		i, _ = x.probe(hash)
	}
	x.slots[i] = indexSlot{hash, ^ref}
	x.n++
}

// probe returns the slot of hash, or the empty slot where it would go.
func (x *index) probe(hash uint64) (i int, found bool) {
	mask := len(x.slots) - 1
	for i = x.home(hash); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.empty() {
			return i, false
		}
		if s.hash == hash {
			return i, true
		}
	}
}

// grow doubles the table, moving each slot to its place in the new one.
func (x *index) grow() {
	old := x.slots
	x.slots, x.shift = make([]indexSlot, 2*len(old)), x.shift-1
	for _, s := range old {
		if !s.empty() {
			i, _ := x.probe(s.hash)
			x.slots[i] = s
		}
	}
}

// del removes hash, if stored. The slots after it in its probe sequence
// move back to fill the hole (backward-shift deletion), so no probe ever
// crosses a deleted slot and no tombstone is needed.
func (x *index) del(hash uint64) {
	i, found := x.probe(hash)
	if !found {
		return
	}
	mask := len(x.slots) - 1
	x.n--
	// i is the hole. A later slot j of the same run of used slots moves
	// into it unless its home lies cyclically in (i, j]: it would then be
	// found before reaching i.
	for j := (i + 1) & mask; !x.slots[j].empty(); j = (j + 1) & mask {
		h := x.home(x.slots[j].hash)
		if (j-h)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
}

// from yields every stored hash and its ref, from slot start onwards
// (start is reduced to the table; wrapping around). A yield may delete
// the hash it is given, or replace its ref, and nothing else (an insert
// could grow the table under the iteration). Every hash stored when the
// iteration begins is yielded: a deletion moves later slots back, towards
// the slot just yielded, which is looked at again. One yielded near start
// may be moved back past it, into the last slots of the iteration, and
// yielded twice. (The memory store sweeps, samples and resets with it:
// looking at a chain twice does no harm.)
func (x *index) from(start int) iter.Seq2[uint64, blockRef] {
	return func(yield func(uint64, blockRef) bool) {
		n := len(x.slots)
		start &= n - 1
		for k := 0; k < n; k++ {
			i := (start + k) & (n - 1)
			s := x.slots[i]
			if s.empty() {
				continue
			}
			if !yield(s.hash, s.ref()) {
				return
			}
			// A deletion by yield may have moved a later slot into i:
			// look at i again.
			if !x.slots[i].empty() && x.slots[i].hash != s.hash {
				k--
			}
		}
	}
}

// all yields every stored hash and its ref (see from).
func (x *index) all() iter.Seq2[uint64, blockRef] { return x.from(0) }
