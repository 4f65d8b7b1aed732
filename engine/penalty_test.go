package engine

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// penaltyTree is a tree whose user tier allows 2 a minute and boxes a user
// for 10 minutes after 3 refusals within a minute.
func penaltyTree(name string) *hierarchy.Tree {
	return &hierarchy.Tree{Name: name, Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 2, Per: "min"}},
			Penalty: &hierarchy.Penalty{For: "10m", After: 3, Within: "1m"}},
	}}
}

// penaltyEngine is an engine on a memory store under a test clock, over
// trees, each in its mode (Enforce when not given).
func penaltyEngine(t *testing.T, st func(store.Store) store.Store, trees []*hierarchy.Tree, modes ...string) (*Engine, *clock) {
	t.Helper()
	var ts []*Tree
	for i, tree := range trees {
		if err := tree.Compile(); err != nil {
			t.Fatal(err)
		}
		tt := &Tree{Tree: tree}
		if i < len(modes) {
			tt.mode.Store(&modes[i])
		}
		ts = append(ts, tt)
	}
	hierarchy.QualifyPolicies(trees)
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	var s store.Store = mem
	if st != nil {
		s = st(mem)
	}
	e := New(Config{Trees: ts, Store: s, StoreName: "memory", Headers: Headers{IETF: true, RetryAfter: true}, DenialLog: "off"})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	return e, c
}

// decideUsers decides one request with the given user on each tree
// (the trees in order; several values on one tree are several paths).
func decideUsers(t *testing.T, e *Engine, paths ...[2]string) Decision {
	t.Helper()
	var d Decision
	e.Begin(&d)
	for _, p := range paths {
		if err := e.Add(&d, e.Tree(p[0]), []string{p[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Decide(context.Background(), &d, Request{}); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPenalty: a value its tier's limits refuse three times within a minute
// is refused outright for ten minutes — from the refusal that boxes it —
// with that Retry-After, however much its limits refill; then it is
// admitted again, and boxed again for ten minutes, not more. The box is no
// policy of the headers. A tree in shadow mode boxes nobody.
func TestPenalty(t *testing.T) {
	for _, mode := range []string{Enforce, Shadow} {
		t.Run(mode, func(t *testing.T) {
			e, c := penaltyEngine(t, nil, []*hierarchy.Tree{penaltyTree("api")}, mode)
			bob := [2]string{"api", "bob"}
			for round := range 2 {
				for i := range 2 {
					d := decideUsers(t, e, bob)
					if !d.Allowed {
						t.Fatalf("round %d: request %d refused", round, i)
					}
					hdr := http.Header{}
					d.WriteHeaders(hdr)
					if p := hdr.Get("RateLimit-Policy"); p != `"user";q=2;w=60` {
						t.Fatalf("RateLimit-Policy %q, want the user limit alone", p)
					}
				}
				for i := range 2 {
					if d := decideUsers(t, e, bob); d.Allowed || d.Reason != ReasonLimited {
						t.Fatalf("round %d: refusal %d: allowed %v reason %s, want limited", round, i, d.Allowed, d.Reason)
					}
				}
				d := decideUsers(t, e, bob)
				if mode == Shadow {
					if d.Reason != ReasonLimited || d.Mode != Shadow {
						t.Fatalf("shadow: reason %s mode %s, want a limited shadow denial", d.Reason, d.Mode)
					}
					c.now += time.Minute.Microseconds()
					if d := decideUsers(t, e, bob); d.Reason != ReasonOK {
						t.Fatalf("shadow: reason %s a minute on, want ok: a tree in shadow mode boxed a value", d.Reason)
					}
					return
				}
				// The third refusal boxes, and says so.
				if d.Allowed || d.Reason != ReasonPenalty || d.Blocked != "api/user" || d.Retry != 10*time.Minute {
					t.Fatalf("round %d: the third refusal: allowed %v reason %s blocked %s retry %v, want the penalty of 10m",
						round, d.Allowed, d.Reason, d.Blocked, d.Retry)
				}
				c.now += time.Minute.Microseconds() // the limit has refilled
				d = decideUsers(t, e, bob)
				if d.Allowed || d.Reason != ReasonPenalty || d.Retry < 9*time.Minute || d.Retry > 9*time.Minute+time.Second {
					t.Fatalf("round %d: a minute on: allowed %v reason %s retry %v, want the 9 minutes left of the penalty", round, d.Allowed, d.Reason, d.Retry)
				}
				hdr := http.Header{}
				d.WriteHeaders(hdr)
				if hdr.Get("Retry-After") != "541" || hdr.Get("RateLimit") != "" { // 540 s and a µs, rounded up
					t.Fatalf("headers %v, want Retry-After 541 and no RateLimit", hdr)
				}
				if !strings.Contains(d.Detail(), "refused outright") {
					t.Fatalf("detail %q", d.Detail())
				}
				c.now += (9*time.Minute - time.Second).Microseconds()
				if d := decideUsers(t, e, bob); d.Allowed {
					t.Fatalf("round %d: admitted a second before the penalty ends", round)
				}
				c.now += time.Second.Microseconds()
			}
		})
	}
}

// TestPenaltyWithinWindow: three refusals spread over a minute box, as
// "3 within 1m" says (the strikes are an exact sliding window); three
// spread over more than a minute do not.
func TestPenaltyWithinWindow(t *testing.T) {
	for _, gap := range []time.Duration{20 * time.Second, 31 * time.Second} {
		e, c := penaltyEngine(t, nil, []*hierarchy.Tree{{Name: "api", Tiers: []*hierarchy.Tier{
			{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 1, Per: "h"}},
				Penalty: &hierarchy.Penalty{For: "10m", After: 3, Within: "1m"}},
		}}})
		bob := [2]string{"api", "bob"}
		decideUsers(t, e, bob) // the hour's one request
		var d Decision
		for range 3 {
			c.now += gap.Microseconds()
			d = decideUsers(t, e, bob)
		}
		if boxed := d.Reason == ReasonPenalty; boxed != (gap*2 < time.Minute+time.Second) {
			t.Fatalf("refusals %v apart: the third's reason %s", gap, d.Reason)
		}
	}
}

// TestPenaltyCountsItsOwnValue: when one decision holds several paths of
// a tree (an Envoy call with two descriptors), a refusal strikes the value
// refused, not another.
func TestPenaltyCountsItsOwnValue(t *testing.T) {
	e, _ := penaltyEngine(t, nil, []*hierarchy.Tree{penaltyTree("api")})
	ann, bob := [2]string{"api", "ann"}, [2]string{"api", "bob"}
	decideUsers(t, e, ann)
	decideUsers(t, e, ann)
	for range 3 {
		if d := decideUsers(t, e, bob, ann); d.Allowed {
			t.Fatal("admitted beyond ann's limit")
		}
	}
	if d := decideUsers(t, e, bob); !d.Allowed {
		t.Fatalf("bob refused (%s): ann's refusals boxed him", d.Reason)
	}
	if d := decideUsers(t, e, ann); d.Reason != ReasonPenalty {
		t.Fatalf("ann: reason %s, want penalty", d.Reason)
	}
}

// TestPenaltyEnforcingTreesOnly: a tree in shadow mode refusing first
// hides no strike of an enforcing tree, and a shadow tree's box does not
// answer for an enforcing tree's refusal.
func TestPenaltyEnforcingTreesOnly(t *testing.T) {
	e, _ := penaltyEngine(t, nil, []*hierarchy.Tree{penaltyTree("shadow"), penaltyTree("web")}, Shadow, Enforce)
	both := [][2]string{{"shadow", "bob"}, {"web", "bob"}}
	decideUsers(t, e, both...)
	decideUsers(t, e, both...)
	var d Decision
	for range 3 {
		d = decideUsers(t, e, both...)
	}
	if d.Reason != ReasonPenalty || d.Blocked != "web/user" {
		t.Fatalf("third refusal: reason %s blocked %s, want web's penalty", d.Reason, d.Blocked)
	}
	// The shadow tree's box (never filled: it boxes nobody) cannot
	// answer; the enforcing tree's can.
	d = decideUsers(t, e, both...)
	if d.Reason != ReasonPenalty || d.Blocked != "web/user" {
		t.Fatalf("in the box: reason %s blocked %s, want web's penalty", d.Reason, d.Blocked)
	}
}

// cancelAfterDecide cancels the request's context once its decision is
// made, as a client hanging up would.
type cancelAfterDecide struct {
	store.Store
	cancel context.CancelFunc
}

func (c cancelAfterDecide) Decide(ctx context.Context, b []store.Bucket) (store.Decision, error) {
	d, err := c.Store.Decide(ctx, b)
	c.cancel()
	if err := ctx.Err(); err != nil && len(b) == 1 && strings.Contains(b[0].Key, "#strikes") {
		return store.Decision{}, err // a store call on a cancelled context fails
	}
	return d, err
}

// TestPenaltyClientHangsUp: a client that hangs up as soon as it is
// refused is counted all the same.
func TestPenaltyClientHangsUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e, _ := penaltyEngine(t, func(s store.Store) store.Store { return cancelAfterDecide{s, cancel} }, []*hierarchy.Tree{penaltyTree("api")})
	var d Decision
	for range 5 {
		d = Decision{}
		e.Begin(&d)
		if err := e.Add(&d, e.Tree("api"), []string{"bob"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(ctx, &d, Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if d.Reason != ReasonPenalty {
		t.Fatalf("reason %s after 3 refusals of a client that hung up, want penalty", d.Reason)
	}
}
