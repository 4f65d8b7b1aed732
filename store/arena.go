package store

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// An arena holds the bytes of a memory store's buckets — each bucket's
// state and key, and its sliding log's entries — in blocks carved from
// chunks of plain bytes. Nothing in it is a pointer, so the collector
// never scans it, however many buckets it holds: a map of entries that
// each point to a key and a log is scanned on every collection (at a
// million keys, some 100 MB of pointers), and each new bucket or longer
// log is an allocation. The arena allocates only a chunk at a time.
//
// Blocks come in sizes (classes) from 32 bytes to 64 KiB, powers of two
// and the halfway steps;
// each class keeps a list of its free blocks, linked through their first
// eight bytes. A larger block gets a chunk of its own.
//
// One arena serves all of a store's shards, so that the buckets of a path,
// created together, are carved next to one another (the first chunk in
// particular, which is reserved up front), whichever shards their keys
// fall in: a decision then finds them in neighbouring memory (with 64
// arenas, a path of 7 fresh buckets took 37% longer to decide). Allocating
// and releasing take the arena's lock; reading a block does not: a block
// is read and written only by the shard that holds it, under its lock, and
// the chunks are replaced, never changed, when one is added or dropped.
type arena struct {
	// first is the first chunk, where most buckets are: found without
	// loading the list of chunks. Read-only.
	first  []byte
	chunks atomic.Pointer[[][]byte] // read without the lock
	// The rest is written at each allocation: a line of its own, apart
	// from what every decision reads. The heap aligns an arena to its size
	// class (16 bytes), not to a cache line: 64 bytes of padding keep mu
	// off the line of chunks' last byte wherever the arena falls.
	_     [64]byte
	mu    sync.Mutex
	free  [arenaClasses]blockRef // each class's free blocks (noBlock: none)
	spare []uint32               // chunks given back by blocks of their own
	cur   uint32                 // the chunk being carved
	tail  int                    // bytes of it carved so far
	held  int                    // bytes of the blocks allocated and not released
}

// blockRef names a block: its chunk (high 32 bits), and its offset in
// that chunk.
type blockRef uint64

func refOf(chunk uint32, off int) blockRef { return blockRef(chunk)<<32 | blockRef(off) }

const (
	chunkBits    = 16 // 64 KiB chunks
	chunkSize    = 1 << chunkBits
	maxChunk     = 1 << 32 // the most a blockRef's offset addresses
	minBlockBits = 5       // 32 bytes: a free block holds its successor
	// arenaClasses: 32, 48, 64, 96, 128, … 48 KiB, 64 KiB — powers of two
	// and the halfway steps, so that a block wastes at most a third of
	// itself (a full log of 10,010 bytes takes 12 KiB, not 16).
	arenaClasses = 2*(chunkBits-minBlockBits) + 1
	ownChunk     = uint8(255) // the class of a block with a chunk of its own
	noBlock      = ^blockRef(0)
)

// classOf is the smallest class whose blocks hold n bytes, or ownChunk.
func classOf(n int) uint8 {
	if n <= 1<<minBlockBits {
		return 0
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n ≤ 2^(k+1)
	c := 2 * (k - minBlockBits + 1)
	if n <= 3<<(k-1) {
		c-- // the halfway class, 1.5 × 2^k, holds it
	}
	if c >= arenaClasses {
		return ownChunk
	}
	return uint8(c)
}

// blockSize is the size of a block of class c (not ownChunk): 2^(5+c/2),
// or 1.5 times that for an odd c.
func blockSize(c uint8) int {
	return (2 + int(c&1)) << (int(c)/2 + minBlockBits - 1)
}

// classBelow is the largest class whose blocks fit in n bytes (n ≥ 32).
func classBelow(n int) uint8 {
	c := uint8(arenaClasses - 1)
	for blockSize(c) > n {
		c--
	}
	return c
}

// newArena returns an arena whose first chunk, of reserve bytes (a chunk's
// at least, 4 GiB at most: a block's offset is 32 bits), is allocated at once.
func newArena(reserve int) *arena {
	reserve = int(min(uint64(max(reserve, 0)), maxChunk)) // int: 32 bits on some platforms
	a := &arena{}
	for i := range a.free {
		a.free[i] = noBlock
	}
	a.chunks.Store(&[][]byte{})
	a.cur = a.newChunk(max(reserve, chunkSize))
	a.first = (*a.chunks.Load())[0]
	return a
}

// alloc returns a block of at least n bytes, and its class. Its bytes are
// whatever they were.
func (a *arena) alloc(n int) (blockRef, uint8) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := classOf(n)
	if c == ownChunk {
		size := 1 << bits.Len(uint(n-1)) // a log growing in it is not copied at every entry
		a.held += size
		return refOf(a.newChunk(size), 0), c
	}
	a.held += blockSize(c)
	if ref := a.free[c]; ref != noBlock {
		a.free[c] = blockRef(binary.LittleEndian.Uint64(a.block(ref, c)))
		return ref, c
	}
	size := blockSize(c)
	chunk := (*a.chunks.Load())[a.cur]
	if a.tail+size > len(chunk) {
		// What is left of the chunk being carved (less than this block)
		// goes to the free lists, in the largest blocks it holds.
		for len(chunk)-a.tail >= 1<<minBlockBits {
			r := classBelow(len(chunk) - a.tail)
			a.releaseLocked(refOf(a.cur, a.tail), r)
			a.tail += blockSize(r)
		}
		a.cur, a.tail = a.newChunk(chunkSize), 0
	}
	ref := refOf(a.cur, a.tail)
	a.tail += size
	return ref, c
}

// newChunk adds a chunk of size bytes and returns its index. The caller
// holds the lock.
func (a *arena) newChunk(size int) uint32 {
	chunks := slices.Clone(*a.chunks.Load())
	i := uint32(len(chunks))
	if k := len(a.spare); k > 0 {
		i, a.spare = a.spare[k-1], a.spare[:k-1]
		chunks[i] = make([]byte, size)
	} else {
		chunks = append(chunks, make([]byte, size))
	}
	a.chunks.Store(&chunks)
	return i
}

// release gives a block back.
func (a *arena) release(ref blockRef, c uint8) {
	a.mu.Lock()
	a.held -= len(a.block(ref, c))
	a.releaseLocked(ref, c)
	a.mu.Unlock()
}

// heldBytes is the bytes of the blocks allocated and not released.
func (a *arena) heldBytes() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

func (a *arena) releaseLocked(ref blockRef, c uint8) {
	if c == ownChunk {
		i := uint32(ref >> 32)
		chunks := slices.Clone(*a.chunks.Load())
		chunks[i] = nil
		a.chunks.Store(&chunks)
		a.spare = append(a.spare, i)
		return
	}
	binary.LittleEndian.PutUint64(a.block(ref, c), uint64(a.free[c]))
	a.free[c] = ref
}

// at is where block ref starts.
func (a *arena) at(ref blockRef) unsafe.Pointer {
	if ref>>32 == 0 {
		return unsafe.Pointer(&a.first[uint32(ref)])
	}
	return unsafe.Pointer(&(*a.chunks.Load())[ref>>32][uint32(ref)])
}

// block is the whole of a block: its bytes stay valid until it is
// released.
func (a *arena) block(ref blockRef, c uint8) []byte {
	chunk := a.first
	if ref>>32 != 0 {
		chunk = (*a.chunks.Load())[ref>>32]
	}
	if c == ownChunk {
		return chunk
	}
	off := int(uint32(ref))
	end := off + blockSize(c)
	return chunk[off:end:end]
}
