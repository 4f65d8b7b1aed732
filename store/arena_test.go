package store

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want int // the class's block size; 0: a chunk of its own
	}{
		{0, 32}, {1, 32}, {32, 32}, {33, 48}, {48, 48}, {49, 64}, {64, 64}, {65, 96},
		{97, 128}, {1000, 1024}, {1025, 1536}, {10_010, 12 << 10},
		{chunkSize / 2, chunkSize / 2}, {chunkSize/2 + 1, 3 * chunkSize / 4},
		{chunkSize, chunkSize}, {chunkSize + 1, 0},
	} {
		c := classOf(tc.n)
		got := 0
		if c != ownChunk {
			got = blockSize(c)
		}
		if got != tc.want {
			t.Errorf("classOf(%d): blocks of %d bytes, want %d", tc.n, got, tc.want)
		}
	}
	for c := range uint8(arenaClasses) {
		if classOf(blockSize(c)) != c || (c > 0 && classOf(blockSize(c-1)+1) != c) {
			t.Errorf("class %d (%d bytes) is not the smallest holding its size", c, blockSize(c))
		}
		if classBelow(blockSize(c)) != c || (c+1 < arenaClasses && classBelow(blockSize(c+1)-1) != c) {
			t.Errorf("classBelow around class %d (%d bytes)", c, blockSize(c))
		}
	}
}

// TestArenaBlocksDoNotOverlap: blocks allocated, filled and released at
// random (every class, and chunks of their own) each keep their bytes, and
// released blocks are reused.
func TestArenaBlocksDoNotOverlap(t *testing.T) {
	a := newArena(0)
	type live struct {
		ref  blockRef
		c    uint8
		fill byte
		n    int
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var blocks []live
	check := func() {
		t.Helper()
		for _, b := range blocks {
			blk := a.block(b.ref, b.c)
			if len(blk) < b.n {
				t.Fatalf("a block for %d bytes has %d", b.n, len(blk))
			}
			if !bytes.Equal(blk[:b.n], bytes.Repeat([]byte{b.fill}, b.n)) {
				t.Fatalf("block %x (class %d) lost its bytes", b.ref, b.c)
			}
		}
	}
	for step := range 20_000 {
		if len(blocks) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(blocks))
			a.release(blocks[k].ref, blocks[k].c)
			blocks = append(blocks[:k], blocks[k+1:]...)
		} else {
			n := 1 + rng.IntN(2000)
			if rng.IntN(50) == 0 {
				n = chunkSize/2 + rng.IntN(2*chunkSize)
			}
			ref, c := a.alloc(n)
			fill := byte(step)
			blk := a.block(ref, c)
			for i := range n {
				blk[i] = fill
			}
			blocks = append(blocks, live{ref, c, fill, n})
		}
		if step%1000 == 0 {
			check()
		}
	}
	check()
	for _, b := range blocks {
		a.release(b.ref, b.c)
	}
	// Everything given back: the chunks carved so far are enough for the
	// same again.
	before := len(*a.chunks.Load())
	for range 100 {
		ref, c := a.alloc(1000)
		defer a.release(ref, c)
	}
	if len(*a.chunks.Load()) != before {
		t.Fatalf("released blocks were not reused: %d chunks, then %d", before, len(*a.chunks.Load()))
	}
}
