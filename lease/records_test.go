package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestRecordsHoldNoPointers: the reservation is worth having only if the
// collector never scans it, which takes a record type without pointers.
func TestRecordsHoldNoPointers(t *testing.T) {
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, at string) {
		switch ty.Kind() {
		case reflect.Struct:
			for i := range ty.NumField() {
				walk(ty.Field(i).Type, at+"."+ty.Field(i).Name)
			}
		case reflect.Array:
			walk(ty.Elem(), at+"[]")
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		default:
			t.Errorf("%s is a %v: the records would be scanned by the collector", at, ty.Kind())
		}
	}
	walk(reflect.TypeFor[leased](), "leased")
}

// TestReservationFollowsMaxPaths: the room set aside is 16 records a
// path, up to reservedBytes, shared out among the shards.
func TestReservationFollowsMaxPaths(t *testing.T) {
	for _, tc := range []struct{ maxPaths, records int }{
		{0, reservedBytes / recordSize}, // the default, 100,000 paths: the cap
		{1000, 16000},
		{64, 1024},
		{1 << 59, reservedBytes / recordSize}, // maxPaths*16 would overflow
	} {
		in := store.NewMemory(store.MemoryOptions{SweepInterval: -1})
		s, err := New(in, Options{Sweep: -1, MaxPaths: tc.maxPaths})
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for i := range s.paths {
			total += cap(s.paths[i].rec.mem)
		}
		if want := tc.records / shards * shards; total != want {
			t.Errorf("MaxPaths %d: %d records set aside, want %d", tc.maxPaths, total, want)
		}
		s.Close()
	}
}

func TestRecords(t *testing.T) {
	r := records{mem: make([]leased, 10)}
	a, at := r.get(4)
	if len(a) != 4 || cap(a) != 4 || at != 0 {
		t.Fatalf("first run: len %d cap %d at %d", len(a), cap(a), at)
	}
	a[3].units = 7
	b, bt := r.get(4)
	if bt != 4 || &b[0] != &r.mem[4] {
		t.Fatalf("second run at %d", bt)
	}
	// Two records are left: a third run of four is an ordinary allocation.
	c, ct := r.get(4)
	if ct != -1 || len(c) != 4 || &c[0] == &r.mem[8] {
		t.Fatalf("a run beyond the reservation: at %d", ct)
	}
	r.put(ct, 4) // nothing: not the reservation's
	if len(r.free[4]) != 0 {
		t.Fatalf("an ordinary allocation was taken back: %v", r.free[4])
	}
	// A run given back is the next of its length, zeroed; other lengths
	// are carved from what is left.
	r.put(at, 4)
	if d, dt := r.get(2); dt != 8 {
		t.Fatalf("a run of two at %d (%v), want 8, carved", dt, d)
	}
	d, dt := r.get(4)
	if dt != 0 || d[3].units != 0 {
		t.Fatalf("the run given back: at %d, record 3 %+v (want at 0, zeroed)", dt, d[3])
	}
	if e, et := r.get(maxRun + 1); et != -1 || len(e) != maxRun+1 {
		t.Fatalf("a run longer than maxRun: at %d len %d", et, len(e))
	}
}

// TestLeaseRecordsReused: a path's leases, taken, renewed, ended and given
// back again and again, keep to a few runs of the reservation, and a
// lease that ends gives its records back (its buckets are nil: a lease
// read after its end panics, rather than read another's records).
func TestLeaseRecordsReused(t *testing.T) {
	c := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	in := store.NewMemory(store.MemoryOptions{Clock: c.Now, SweepInterval: -1})
	s, err := New(in, Options{TTL: time.Second, Clock: c.Now, Sweep: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	limit := rate.Limit{Algorithm: rate.GCRA, Count: 1e6, Period: time.Hour}
	paths := make([][]store.Bucket, 5)
	for i := range paths {
		for j := range 4 {
			paths[i] = append(paths[i], store.Bucket{Key: fmt.Sprintf("{t}|%d|%d", i, j), Limit: limit, Cost: 1})
		}
	}
	var ended []*held
	for round := range 200 {
		for _, p := range paths {
			for range 10 {
				if d, err := s.Decide(ctx, p); err != nil || !d.Allowed {
					t.Fatalf("round %d: %+v %v", round, d, err)
				}
			}
		}
		s.Sweep(ctx) // renews the busy paths ahead, ends what expired
		for i := range s.paths {
			for _, p := range s.paths[i].m {
				if p.lease != nil && len(ended) < 1000 {
					ended = append(ended, p.lease)
				}
			}
		}
		c.Advance(300 * time.Millisecond)
	}
	used := 0
	for i := range s.paths {
		used += s.paths[i].rec.used
	}
	// Each path holds at most a lease and its renewal, and one more run
	// while a grant is installed: 5 paths × 3 runs × 4 records.
	if st := s.Stats(); st.Leased < 100 || used > 5*3*4 {
		t.Fatalf("%d leases over 200 rounds carved %d records", st.Leased, used)
	}
	s.Close()
	for i, l := range ended {
		if l.buckets != nil {
			t.Fatalf("lease %d still holds its records after Close", i)
		}
	}
}

// checkRecords checks, with every shard locked, that each live lease (a
// path's lease or renewal) holds its own run of its shard's reservation,
// that no run is both live and free or free twice, and that every record
// carved is either live or free (none leaked).
func checkRecords(t *testing.T, s *Store) {
	t.Helper()
	for i := range s.paths {
		s.paths[i].mu.Lock()
	}
	defer func() {
		for i := range s.paths {
			s.paths[i].mu.Unlock()
		}
	}()
	for i := range s.paths {
		sh := &s.paths[i]
		owner := make([]string, sh.rec.used)
		mark := func(at int32, n int, who string) {
			if int(at)+n > sh.rec.used {
				t.Fatalf("shard %d: %s at %d+%d beyond the %d carved", i, who, at, n, sh.rec.used)
			}
			for k := int(at); k < int(at)+n; k++ {
				if owner[k] != "" {
					t.Fatalf("shard %d: record %d is %s's and %s's", i, k, owner[k], who)
				}
				owner[k] = who
			}
		}
		for h, p := range sh.m {
			if p.next != nil && p.lease == nil {
				t.Fatalf("shard %d: a renewal without a lease", i)
			}
			for j, l := range []*held{p.lease, p.next} {
				if l == nil {
					continue
				}
				who := fmt.Sprintf("path %x lease %d", h, j)
				if l.buckets == nil || len(l.buckets) != len(p.keys) || len(l.limits) != len(p.keys) {
					t.Fatalf("shard %d: %s: %d records, %d limits for %d keys", i, who, len(l.buckets), len(l.limits), len(p.keys))
				}
				if l.at < 0 {
					continue
				}
				if l.from != &sh.rec || &l.buckets[0] != &sh.rec.mem[l.at] {
					t.Fatalf("shard %d: %s's records are not where it says", i, who)
				}
				mark(l.at, len(l.buckets), who)
			}
		}
		for n, f := range sh.rec.free {
			for _, at := range f {
				mark(at, n, fmt.Sprintf("free run of %d", n))
			}
		}
		for k, o := range owner {
			if o == "" {
				t.Fatalf("shard %d: record %d neither live nor free (leaked)", i, k)
			}
		}
	}
}

// TestRecordsInvariantUnderLoad: requests on paths of many lengths (one
// longer than maxRun), limit changes, resets, sweeps and collisions
// race; every record of the reservation stays with one lease or on one
// free list.
func TestRecordsInvariantUnderLoad(t *testing.T) {
	c := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	in := store.NewMemory(store.MemoryOptions{Clock: c.Now, SweepInterval: -1})
	s, err := New(in, Options{TTL: 200 * time.Millisecond, Clock: c.Now, Sweep: -1, MaxPaths: 300})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := rate.Limit{Algorithm: rate.GCRA, Count: 1e6, Period: time.Hour}
	other := rate.Limit{Algorithm: rate.GCRA, Count: 2e6, Period: time.Hour}
	cal := rate.Limit{Algorithm: rate.Calendar, Count: 1e7, Unit: rate.Day, Location: time.UTC}
	var paths [][]store.Bucket
	for i := range 60 {
		n := 1 + i%5
		if i == 59 {
			n = maxRun + 1
		}
		var p []store.Bucket
		for j := range n {
			l := base
			if j == 0 {
				l = cal
			}
			p = append(p, store.Bucket{Key: fmt.Sprintf("{t}|%d|%d", i%7, j*100+i), Limit: l, Cost: 1})
		}
		paths = append(paths, p)
	}
	var flip atomic.Bool
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := paths[r.IntN(len(paths))]
				bs := append([]store.Bucket(nil), p...)
				if flip.Load() && len(bs) > 1 {
					bs[1].Limit = other
				}
				if _, err := s.Decide(ctx, bs); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	r := rand.New(rand.NewPCG(99, 2))
	// 400 rounds, and on (at most 20,000) until the workers, which a busy
	// machine may starve, have taken enough leases to tell.
	enough := func() bool { st := s.Stats(); return st.Leased >= 100 && st.Renewals > 0 }
	for round := 0; round < 400 || !enough() && round < 20_000; round++ {
		switch r.IntN(10) {
		case 0:
			flip.Store(!flip.Load())
		case 1:
			k := paths[r.IntN(len(paths))][0].Key
			if _, err := s.Reset(ctx, []string{k}); err != nil {
				t.Fatal(err)
			}
		case 2:
			// A collision: another path hashing as one tracked.
			sh := &s.paths[r.IntN(shards)]
			sh.mu.Lock()
			for h := range sh.m {
				s.track(sh, h, paths[r.IntN(len(paths))], c.Now())
				break
			}
			sh.mu.Unlock()
		}
		s.Sweep(ctx)
		c.Advance(time.Duration(r.IntN(40)) * time.Millisecond)
		time.Sleep(200 * time.Microsecond)
		checkRecords(t, s)
	}
	close(stop)
	wg.Wait()
	checkRecords(t, s)
	st := s.Stats()
	t.Logf("%+v", st)
	if st.Leased < 100 || st.Renewals == 0 {
		t.Fatalf("too few leases to tell: %+v", st)
	}
	s.Close()
	checkRecords(t, s)
	for i := range s.paths {
		if live := s.paths[i].rec.used; live > 0 {
			// every record is free after Close (checkRecords: none leaked)
			free := 0
			for n, f := range s.paths[i].rec.free {
				free += n * len(f)
			}
			if free != live {
				t.Fatalf("shard %d: %d carved, %d free after Close", i, live, free)
			}
		}
	}
}
