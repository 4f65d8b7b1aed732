package engine

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// TestMaxWait: with max_wait 2s on a limit of 2/s (a burst of 2), requests
// arriving at once are admitted at GCRA's times — the first two at once,
// then one each half second — as long as the wait is within 2s; the next
// is refused at once with a Retry-After after which it fits with a wait.
// A request that gives its reservation back (Refund) frees its slot.
func TestMaxWait(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 2, Per: "s"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: mem, StoreName: "memory", DenialLog: "off",
		MaxWait: 2 * time.Second, Headers: Headers{IETF: true, RetryAfter: true}})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	decideOne := func() Decision {
		t.Helper()
		var d Decision
		e.Begin(&d)
		if err := e.Add(&d, e.Tree("api"), []string{"bob"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(context.Background(), &d, Request{}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i, want := range []time.Duration{0, 0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second} {
		d := decideOne()
		if !d.Allowed || d.Wait < want || d.Wait > want+time.Millisecond {
			t.Fatalf("request %d: allowed %v wait %v, want admitted after %v", i, d.Allowed, d.Wait, want)
		}
		if d.Results[0].Remaining != 0 && i >= 1 {
			t.Fatalf("request %d: remaining %d, want 0 (the reservations are not capacity)", i, d.Results[0].Remaining)
		}
		if d.Limits[0].Limit.Capacity() != 2 {
			t.Fatalf("request %d: the decision shows a capacity of %d, want the limit's 2", i, d.Limits[0].Limit.Capacity())
		}
	}
	d := decideOne()
	if d.Allowed || d.Retry < 500*time.Millisecond || d.Retry > 501*time.Millisecond {
		t.Fatalf("the seventh: allowed %v retry %v, want refused, retry in 0.5s (then it fits, waiting 2s)", d.Allowed, d.Retry)
	}
	// The sixth gives its reservation back (its client went away): the
	// next takes its place.
	sixth := decideOne() // refused: nothing to give back
	if sixth.Allowed {
		t.Fatal("admitted beyond max_wait")
	}
	c.now += (500 * time.Millisecond).Microseconds()
	d = decideOne() // fits now, waiting 2s: the place of a request at 2.5s
	if !d.Allowed || d.Wait < 2*time.Second-time.Millisecond {
		t.Fatalf("after 0.5s: allowed %v wait %v, want admitted after 2s", d.Allowed, d.Wait)
	}
	if err := d.Refund(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := decideOne(); !d.Allowed || d.Wait < 2*time.Second-time.Millisecond || d.Wait > 2*time.Second+time.Millisecond {
		t.Fatalf("after a refund: allowed %v wait %v, want the refunded place (2s)", d.Allowed, d.Wait)
	}
}

// TestMaxWaitOnly: only what can wait waits — a cost above a limit's
// capacity is impossible, a path with a sliding window must fit on
// arrival, and a tree in shadow mode makes nobody wait.
func TestMaxWaitOnly(t *testing.T) {
	newEngine := func(limit *hierarchy.Limit, shadow *hierarchy.Limit, more ...*hierarchy.Limit) (*Engine, []string) {
		trees := []*Tree{{Tree: &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: "user", Key: "{user}", Limits: append([]*hierarchy.Limit{limit}, more...)}}}}}
		names := []string{"api"}
		if shadow != nil {
			s := &Tree{Tree: &hierarchy.Tree{Name: "trial", Tiers: []*hierarchy.Tier{{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{shadow}}}}}
			mode := Shadow
			s.mode.Store(&mode)
			trees = append(trees, s)
			names = append(names, "trial")
		}
		var hs []*hierarchy.Tree
		for _, tt := range trees {
			if err := tt.Compile(); err != nil {
				t.Fatal(err)
			}
			hs = append(hs, tt.Tree)
		}
		hierarchy.QualifyPolicies(hs)
		c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
		mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
		e := New(Config{Trees: trees, Store: mem, StoreName: "memory", DenialLog: "off", MaxWait: 30 * time.Second,
			Dimensions: []string{"tokens"}})
		t.Cleanup(func() { e.Close(); _ = mem.Close() })
		return e, names
	}
	decide := func(e *Engine, trees []string, tokens int64) Decision {
		t.Helper()
		var d Decision
		e.Begin(&d)
		for _, tr := range trees {
			if err := e.Add(&d, e.Tree(tr), []string{"bob"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Decide(context.Background(), &d, Request{Estimates: []int64{tokens}}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	e, trees := newEngine(&hierarchy.Limit{Count: 1000, Per: "min", Dimension: "tokens"}, nil)
	if d := decide(e, trees, 1400); d.Allowed || d.Reason != ReasonImpossible {
		t.Fatalf("1400 tokens on 1000/min: allowed %v reason %s, want impossible", d.Allowed, d.Reason)
	}
	// 1/s makes the second wait a second, which 10/min (sliding) would
	// allow now: but it would count it now, not when it goes.
	e, trees = newEngine(&hierarchy.Limit{Count: 1, Per: "s"}, nil, &hierarchy.Limit{Count: 10, Per: "min", Algorithm: "sliding"})
	decide(e, trees, 1)
	if d := decide(e, trees, 1); d.Allowed {
		t.Fatalf("a path with a sliding window admitted a request with a wait of %v", d.Wait)
	}
	e, trees = newEngine(&hierarchy.Limit{Count: 100, Per: "s"}, &hierarchy.Limit{Count: 1, Per: "s"})
	for i := range 3 {
		if d := decide(e, trees, 1); !d.Allowed || d.Wait != 0 {
			t.Fatalf("request %d: allowed %v wait %v: a shadow tree made it wait", i, d.Allowed, d.Wait)
		}
	}
}

// TestRedecide: a request decided behind a reservation that is then given
// back, decided again after giving back its own, takes the earlier place —
// nothing of its first decision (its wait) is kept.
func TestRedecide(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 2, Per: "s"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: mem, StoreName: "memory", DenialLog: "off", MaxWait: 2 * time.Second})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	ctx := context.Background()
	decide := func() *Decision {
		t.Helper()
		d := new(Decision)
		e.Begin(d)
		if err := e.Add(d, e.Tree("api"), []string{"bob"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(ctx, d, Request{}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	decide()
	decide() // the burst is spent
	batch := decide()
	interactive := decide()
	if batch.Wait != 500*time.Millisecond || interactive.Wait != time.Second {
		t.Fatalf("waits %v and %v, want 0.5s and 1s", batch.Wait, interactive.Wait)
	}
	// The batch request gives its place back; the interactive one gives
	// back its own and is decided again: it goes at 0.5s.
	if err := batch.Refund(ctx); err != nil {
		t.Fatal(err)
	}
	if err := interactive.Refund(ctx); err != nil {
		t.Fatal(err)
	}
	if err := interactive.Redecide(ctx); err != nil {
		t.Fatal(err)
	}
	if !interactive.Allowed || interactive.Wait < 499*time.Millisecond || interactive.Wait > 501*time.Millisecond {
		t.Fatalf("decided again: allowed %v wait %v, want admitted after 0.5s", interactive.Allowed, interactive.Wait)
	}
}
