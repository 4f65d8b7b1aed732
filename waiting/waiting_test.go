package waiting

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// held is a request held in a scenario: its class, its buckets and the
// ones it waits on, and when it goes.
type held struct {
	batch       bool
	keys, waits []string
	until       int // ms
}

// cancelled is a context already done.
var cancelled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func preemptedNow(e *Entry) bool {
	select {
	case <-e.Preempted():
		return true
	default:
		return false
	}
}

// TestHoldBatch: a batch request is held unless an interactive (or
// critical) request waits on one of its buckets — any of them, not only
// those it waits on itself — and is then told when the last of those goes.
func TestHoldBatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		before   []held
		keys     []string
		waits    []string
		wantHeld bool
		wantBusy int
	}{
		{"nobody waits", nil, []string{"u:ann"}, nil, true, 0},
		{"batch waits too", []held{{true, []string{"u:ann"}, nil, 500}}, []string{"u:ann"}, nil, true, 0},
		{"interactive waits on its bucket", []held{{false, []string{"u:ann"}, nil, 700}}, []string{"u:ann"}, nil, false, 700},
		{"the last interactive counts", []held{
			{false, []string{"u:ann"}, nil, 700},
			{false, []string{"org"}, nil, 900},
			{false, []string{"u:bob"}, nil, 2000},
		}, []string{"org", "u:ann"}, []string{"u:ann"}, false, 900},
		{"interactive on a bucket it does not wait on", []held{{false, []string{"org", "u:bob"}, []string{"org"}, 300}},
			[]string{"org", "u:ann"}, []string{"u:ann"}, false, 300},
		{"interactive elsewhere", []held{{false, []string{"u:bob"}, nil, 300}}, []string{"org", "u:ann"}, nil, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			for _, h := range tc.before {
				if e, _, _ := r.Hold(nil, h.batch, h.keys, h.waits, at(h.until)); e == nil {
					t.Fatalf("setup: %+v not held", h)
				}
			}
			e, busy, victims := r.Hold(nil, true, tc.keys, tc.waits, at(100))
			if (e != nil) != tc.wantHeld || len(victims) != 0 {
				t.Fatalf("held %v (victims %d), want %v", e != nil, len(victims), tc.wantHeld)
			}
			if !tc.wantHeld && !busy.Equal(at(tc.wantBusy)) {
				t.Fatalf("busy until %v, want %v", busy.Sub(t0), at(tc.wantBusy).Sub(t0))
			}
		})
	}
}

// TestPreempt: an interactive request about to be decided preempts the
// batch requests that wait on one of its buckets (not those held on a
// bucket they do not wait on), and waits on their buckets in their place,
// so that a batch request arriving meanwhile gives way.
func TestPreempt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batch   []held
		keys    []string
		victims []int // indexes in batch
		pending []string
	}{
		{"none held", nil, []string{"u:ann"}, nil, nil},
		{"same bucket", []held{{true, []string{"u:ann"}, nil, 500}, {true, []string{"u:ann"}, nil, 1000}},
			[]string{"u:ann"}, []int{0, 1}, []string{"u:ann"}},
		{"a shared organisation", []held{
			{true, []string{"org", "u:bob"}, []string{"org"}, 500},
			{true, []string{"org", "u:cat"}, []string{"u:cat"}, 500}, // waits on its own user: not in the way
			{true, []string{"org2", "u:dan"}, nil, 500},
		}, []string{"org", "u:ann"}, []int{0}, []string{"org"}},
		{"waits on two buckets", []held{{true, []string{"org", "u:ann"}, nil, 500}},
			[]string{"org", "u:ann", "agent"}, []int{0}, []string{"org", "u:ann"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			var batch []*Entry
			for _, h := range tc.batch {
				e, _, _ := r.Hold(nil, true, h.keys, h.waits, at(h.until))
				batch = append(batch, e)
			}
			if r.BatchHeld() != (len(tc.batch) > 0) {
				t.Fatalf("BatchHeld %v with %d held", r.BatchHeld(), len(tc.batch))
			}
			pending, victims := r.Preempt(tc.keys, at(3000))
			if (pending != nil) != (len(tc.victims) > 0) {
				t.Fatalf("pending entry %v, want one only with victims", pending)
			}
			for i, e := range batch {
				want := slices.Contains(tc.victims, i)
				if slices.Contains(victims, e) != want || preemptedNow(e) != want {
					t.Errorf("batch %d: preempted %v (signalled %v), want %v", i, slices.Contains(victims, e), preemptedNow(e), want)
				}
				if want {
					if e.Go() {
						t.Errorf("batch %d: goes after being preempted", i)
					}
					// Before the interactive request is decided: the
					// latest time it said it could go.
					if got := e.Retry(cancelled); !got.Equal(at(3000)) {
						t.Errorf("batch %d: retry at %v, want the interactive request's latest time", i, got.Sub(t0))
					}
				}
			}
			if len(victims) != len(tc.victims) {
				t.Fatalf("%d victims, want %d", len(victims), len(tc.victims))
			}
			if pending != nil && !slices.Equal(pending.keys, tc.pending) {
				t.Fatalf("pending on %v, want %v", pending.keys, tc.pending)
			}
			// Meanwhile a batch request on a bucket the interactive one
			// took over gives way.
			for _, k := range tc.pending {
				if e, busy, _ := r.Hold(nil, true, []string{k}, nil, at(200)); e != nil || !busy.Equal(at(3000)) {
					t.Fatalf("a batch request on %s while the interactive one is pending: held %v, busy %v", k, e != nil, busy)
				}
			}
			// The interactive request is held: its entry now waits on the
			// buckets it waits on, until its real time.
			if pending != nil {
				e, _, more := r.Hold(pending, false, tc.keys, tc.keys[:1], at(700))
				if e != pending || len(more) != 0 {
					t.Fatalf("Hold of the pending entry: %p %d victims, want %p and none", e, len(more), pending)
				}
				if _, busy, _ := r.Hold(nil, true, tc.keys[:1], nil, at(200)); !busy.Equal(at(700)) {
					t.Fatalf("busy until %v after Hold, want its real time", busy.Sub(t0))
				}
				// Once it is decided, the batch requests it preempted
				// are told its real time.
				for _, v := range victims {
					if got := v.Retry(context.Background()); !got.Equal(at(700)) {
						t.Errorf("a preempted request's retry at %v once the interactive one is decided, want %v", got.Sub(t0), at(700).Sub(t0))
					}
				}
				pending.Leave()
				if e, _, _ := r.Hold(nil, true, tc.keys, nil, at(200)); e == nil {
					t.Fatalf("a batch request is refused after the interactive one left")
				}
				for _, v := range victims {
					if got := v.Retry(context.Background()); !got.IsZero() {
						t.Errorf("a preempted request's retry at %v with no interactive request waiting, want now (zero)", got.Sub(t0))
					}
				}
			}
		})
	}
}

// TestHoldInteractivePreempts: an interactive request registered after its
// decision preempts the batch requests still held on its buckets (held
// after it looked, before it registered): none may go ahead of it.
func TestHoldInteractivePreempts(t *testing.T) {
	r := New()
	b, _, _ := r.Hold(nil, true, []string{"org", "u:bob"}, []string{"org"}, at(500))
	other, _, _ := r.Hold(nil, true, []string{"org2"}, nil, at(500))
	e, _, victims := r.Hold(nil, false, []string{"org", "u:ann"}, nil, at(800))
	if e == nil || len(victims) != 1 || victims[0] != b || !preemptedNow(b) || preemptedNow(other) {
		t.Fatalf("victims %d, b preempted %v, other %v: want b only", len(victims), preemptedNow(b), preemptedNow(other))
	}
	if got := b.Retry(context.Background()); !got.Equal(at(800)) {
		t.Fatalf("retry %v, want when the interactive request goes", got.Sub(t0))
	}
	if !other.Go() || r.BatchHeld() {
		t.Fatalf("the other batch request must go, and none be left: BatchHeld %v", r.BatchHeld())
	}
}

// TestGoOrPreempt: exactly one of a held batch request's release (its
// timer, or its client leaving) and its preemption wins, whatever their
// order, and the registry ends empty.
func TestGoOrPreempt(t *testing.T) {
	t.Run("released first", func(t *testing.T) {
		r := New()
		b, _, _ := r.Hold(nil, true, []string{"k"}, nil, at(100))
		if !b.Go() {
			t.Fatal("a held request was not released")
		}
		if p, v := r.Preempt([]string{"k"}, at(500)); p != nil || len(v) != 0 || preemptedNow(b) {
			t.Fatal("a released request was preempted")
		}
		if !b.Go() { // Leave after Go
			t.Fatal("Go after Go")
		}
	})
	t.Run("preempted first", func(t *testing.T) {
		r := New()
		b, _, _ := r.Hold(nil, true, []string{"k"}, nil, at(100))
		p, v := r.Preempt([]string{"k"}, at(500))
		if len(v) != 1 || b.Go() {
			t.Fatal("a preempted request went")
		}
		b.GaveBack()
		if err := Wait(context.Background(), v); err != nil {
			t.Fatal(err)
		}
		p.Leave()
		if len(r.keys) != 0 || r.BatchHeld() {
			t.Fatalf("left behind: %v", r.keys)
		}
	})
	t.Run("wait for a give-back cut short", func(t *testing.T) {
		r := New()
		r.Hold(nil, true, []string{"k"}, nil, at(100))
		_, v := r.Preempt([]string{"k"}, at(500))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := Wait(ctx, v); err == nil {
			t.Fatal("Wait returned nil with the reservation not given back")
		}
	})
}

// TestConcurrent: batch and interactive requests held, released and
// preempting at once from many goroutines (run with -race): each batch
// request either goes or is preempted, never both, each preempted one is
// given back exactly once, and the registry ends empty.
func TestConcurrent(t *testing.T) {
	r := New()
	keys := [][]string{{"org", "u:a"}, {"org", "u:b"}, {"u:a"}, {"u:c"}}
	var went, preempted, gaveBack atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				k := keys[(g+i)%len(keys)]
				if g%2 == 0 { // batch
					e, _, _ := r.Hold(nil, true, k, k[len(k)-1:], at(i))
					if e == nil {
						continue
					}
					runtime.Gosched()
					if e.Go() {
						went.Add(1)
						if preemptedNow(e) {
							t.Error("went and was preempted")
						}
						continue
					}
					preempted.Add(1)
					gaveBack.Add(1)
					e.GaveBack()
					continue
				}
				p, v := r.Preempt(k, at(i+1000))
				if err := Wait(context.Background(), v); err != nil {
					t.Error(err)
				}
				e, _, _ := r.Hold(p, false, k, nil, at(i+500))
				e.Leave()
			}
		})
	}
	wg.Wait()
	if len(r.keys) != 0 || r.BatchHeld() {
		t.Fatalf("left behind: %d keys, BatchHeld %v", len(r.keys), r.BatchHeld())
	}
	t.Logf("went %d, preempted %d", went.Load(), preempted.Load())
}
