package store

import (
	"encoding/binary"
	"math/bits"
)

// An arena holds the bytes of a memory store shard's buckets — each
// bucket's key followed by its sliding log's entries — in blocks carved
// from chunks of plain bytes. Nothing in it is a pointer, so the collector
// never scans it, however many buckets it holds: a map of entries that
// each point to a key and a log is scanned on every collection (at a
// million keys, some 100 MB of pointers), and each new bucket or longer
// log is an allocation. The arena allocates only a chunk at a time.
//
// Blocks come in power-of-two sizes (classes) from 32 bytes to 64 KiB;
// each class keeps a list of its free blocks, linked through their first
// eight bytes. A larger block gets a chunk of its own. The
// arena is not safe for concurrent use: its shard's lock guards it.
type arena struct {
	chunks [][]byte
	free   [arenaClasses]blockRef // each class's free blocks (noBlock: none)
	spare  []uint32               // chunks given back by blocks of their own
	cur    uint32                 // the chunk being carved
	tail   int                    // bytes of it carved so far
}

// blockRef names a block: its chunk (high 32 bits), and its offset in
// that chunk.
type blockRef uint64

func (a *arena) ref(chunk uint32, off int) blockRef { return blockRef(chunk)<<32 | blockRef(off) }

const (
	chunkBits    = 16 // 64 KiB chunks: 64 shards start with 4 MiB
	chunkSize    = 1 << chunkBits
	minBlockBits = 5 // 32 bytes: a free block holds its successor
	arenaClasses = chunkBits - minBlockBits + 1
	ownChunk     = uint8(255) // the class of a block with a chunk of its own
	noBlock      = ^blockRef(0)
)

// classOf is the smallest class whose blocks hold n bytes, or ownChunk.
func classOf(n int) uint8 {
	if n <= 1<<minBlockBits {
		return 0
	}
	c := bits.Len(uint(n-1)) - minBlockBits
	if c >= arenaClasses {
		return ownChunk
	}
	return uint8(c)
}

// newArena returns an arena whose first chunk, of reserve bytes (a chunk's
// at least), is allocated at once.
func newArena(reserve int) arena {
	a := arena{}
	for i := range a.free {
		a.free[i] = noBlock
	}
	a.cur = a.newChunk(max(reserve, chunkSize))
	return a
}

// alloc returns a block of at least n bytes, and its
// class. Its bytes are whatever they were.
func (a *arena) alloc(n int) (blockRef, uint8) {
	c := classOf(n)
	if c == ownChunk {
		return a.allocOwn(n), c
	}
	if ref := a.free[c]; ref != noBlock {
		a.free[c] = blockRef(binary.LittleEndian.Uint64(a.block(ref, c)))
		return ref, c
	}
	size := 1 << (int(c) + minBlockBits)
	if a.tail+size > len(a.chunks[a.cur]) {
		// What is left of the chunk being carved (less than this block)
		// goes to the free lists, in the largest blocks it holds.
		for len(a.chunks[a.cur])-a.tail >= 1<<minBlockBits {
			r := 1 << (bits.Len(uint(len(a.chunks[a.cur])-a.tail)) - 1)
			a.release(a.ref(a.cur, a.tail), classOf(r))
			a.tail += r
		}
		a.cur, a.tail = a.newChunk(chunkSize), 0
	}
	ref := a.ref(a.cur, a.tail)
	a.tail += size
	return ref, c
}

// allocOwn returns a chunk of its own for a block of n bytes, rounded up to
// a power of two so that a log growing in it is not copied at every entry.
func (a *arena) allocOwn(n int) blockRef {
	return a.ref(a.newChunk(1<<bits.Len(uint(n-1))), 0)
}

// newChunk adds a chunk of size bytes and returns its index.
func (a *arena) newChunk(size int) uint32 {
	if k := len(a.spare); k > 0 {
		i := a.spare[k-1]
		a.spare = a.spare[:k-1]
		a.chunks[i] = make([]byte, size)
		return i
	}
	a.chunks = append(a.chunks, make([]byte, size))
	return uint32(len(a.chunks) - 1)
}

// release gives a block back.
func (a *arena) release(ref blockRef, c uint8) {
	if c == ownChunk {
		i := uint32(ref >> 32)
		a.chunks[i] = nil
		a.spare = append(a.spare, i)
		return
	}
	binary.LittleEndian.PutUint64(a.block(ref, c), uint64(a.free[c]))
	a.free[c] = ref
}

// block is the whole of a block: its bytes stay valid until it is
// released.
func (a *arena) block(ref blockRef, c uint8) []byte {
	chunk := a.chunks[ref>>32]
	if c == ownChunk {
		return chunk
	}
	off := int(uint32(ref))
	end := off + 1<<(int(c)+minBlockBits)
	return chunk[off:end:end]
}

// chunkBytes is the memory the arena holds, free blocks included.
func (a *arena) chunkBytes() int {
	n := 0
	for _, c := range a.chunks {
		n += len(c)
	}
	return n
}
