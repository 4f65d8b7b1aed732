package lease

import "unsafe"

// A lease's per-bucket records (leased) live in one reservation that the
// Store makes when it is made, shard by shard, as the memory store keeps
// its buckets in its arena (store's reservedBytes): the records hold no
// pointers, so the collector never scans them, and the reservation counts
// as heap for the Go runtime, which paces collections by the heap's size.
// A busy Caddy deciding on leases then collects several times less often,
// for the memory its garbage takes in between. Measured with
// scripts/load.sh (8 rounds, 1,000 paths, 4 tiers): 0.32 collections per
// 1,000 requests instead of 0.94 when a lease's records were an ordinary
// allocation, the collector's CPU 2.8 µs a request instead of 9.6,
// throughput 0.89× plain Caddy instead of 0.80×. The pages of the
// reservation are touched only as records are first carved; it counts
// towards a GOMEMLIMIT.
//
// Records are carved in runs, one per lease (a run's length is its path's
// buckets), and a run given back is kept for the next lease of the same
// length. When a shard's part is used up, or a path is longer than
// maxRun, a lease's records are an ordinary allocation.

// reservedBytes is the reservation of a Store with the default MaxPaths
// (room for a lease and its renewal of four buckets on some 20,000
// paths); a Store of fewer paths reserves less (two leases of eight
// buckets a path).
const reservedBytes = 16 << 20

// maxRun is the longest run carved from the reservation.
const maxRun = 16

// recordSize is the size of one record.
const recordSize = int(unsafe.Sizeof(leased{}))

// reservedRecords is how many records a Store of maxPaths paths reserves.
func reservedRecords(maxPaths int) int {
	most := reservedBytes / recordSize
	return min(most, min(maxPaths, most)*2*8) // min first: a huge maxPaths must not overflow
}

// records is one shard's part of the reservation. Its methods are called
// with the shard's lock held.
type records struct {
	mem  []leased // carved from the start as runs are first needed
	used int      // records carved so far
	// free holds the starts of runs given back, by length.
	free [maxRun + 1][]int32
}

// get returns a zeroed run of n records and where it starts in r (-1: an
// ordinary allocation, for which put does nothing).
func (r *records) get(n int) ([]leased, int32) {
	if n > maxRun {
		return make([]leased, n), -1
	}
	if f := r.free[n]; len(f) > 0 {
		at := f[len(f)-1]
		r.free[n] = f[:len(f)-1]
		run := r.mem[at : int(at)+n : int(at)+n]
		clear(run)
		return run, at
	}
	if r.used+n > len(r.mem) {
		return make([]leased, n), -1
	}
	at := r.used
	r.used += n
	return r.mem[at : at+n : at+n], int32(at)
}

// put takes back the run of n records that get returned starting at at.
func (r *records) put(at int32, n int) {
	if at >= 0 {
		r.free[n] = append(r.free[n], at)
	}
}
