package store

import "testing"

// TestArenaBlocksBeyond4GiB: a block's offset is 32 bits: a first chunk
// past 4 GiB (a Reserve that large, now that one arena takes all of it)
// would name blocks beyond it by a chunk that is not theirs.
func TestArenaBlocksBeyond4GiB(t *testing.T) {
	if testing.Short() || ^uint(0)>>32 == 0 {
		t.Skip("reserves 4 GiB of address space")
	}
	four := uint64(1) << 32
	a := newArena(int(four + chunkSize))
	a.tail = int(four - 32)
	for range 3 {
		ref, c := a.alloc(32)
		if n := len(*a.chunks.Load()); int(ref>>32) >= n {
			t.Fatalf("block %#x (class %d) in chunk %d of %d", ref, c, ref>>32, n)
		}
	}
}
