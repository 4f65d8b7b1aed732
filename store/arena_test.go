package store

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want uint8
	}{
		{0, 0}, {1, 0}, {32, 0}, {33, 1}, {64, 1}, {65, 2}, {1000, 5},
		{chunkSize / 2, arenaClasses - 2}, {chunkSize/2 + 1, arenaClasses - 1},
		{chunkSize, arenaClasses - 1}, {chunkSize + 1, ownChunk},
	} {
		if got := classOf(tc.n); got != tc.want {
			t.Errorf("classOf(%d) = %d, want %d", tc.n, got, tc.want)
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
