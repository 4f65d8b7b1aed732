package lease

import (
	"context"
	"fmt"
	"reflect"
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
