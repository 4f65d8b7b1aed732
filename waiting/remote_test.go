package waiting

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hub links registries as Redis Pub/Sub does (store.Bus): every message
// published reaches every registry, the sender's included, in order,
// asynchronously. flush waits until all were delivered.
type hub struct {
	mu      sync.Mutex
	regs    []*Registry
	pending sync.WaitGroup
	lose    atomic.Bool // drop every message published while set
}

type hubLink struct {
	h      *hub
	ch     chan []byte
	mu     sync.Mutex
	closed bool // the test ended: a late publisher (an answer after its timeout) is dropped
}

func (l *hubLink) Publish(msg []byte) bool {
	if l.h.lose.Load() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.h.pending.Add(1)
	l.ch <- msg
	return true
}

func (l *hubLink) Close() error { return nil }

// link returns n registries linked by a hub, their clock at now. Their
// ack timeout is a minute, beyond any test's bounded wait: a wait that
// ends was ended by the answers it waited for (TestRemoteAckLost, which
// tests the timeout, shortens it).
func link(t *testing.T, n int, now *atomic.Pointer[time.Time]) (*hub, []*Registry) {
	h := &hub{}
	for range n {
		r := New()
		r.now = func() time.Time { return *now.Load() }
		r.ackTimeout = time.Minute
		h.regs = append(h.regs, r)
	}
	for _, r := range h.regs {
		l := &hubLink{h: h, ch: make(chan []byte, 1024)}
		r.Connect(l)
		go func() { // one sender's messages, in order
			for msg := range l.ch {
				for _, to := range h.regs {
					to.Receive(msg)
				}
				h.pending.Done()
			}
		}()
		t.Cleanup(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.closed = true
			close(l.ch)
		})
	}
	return h, h.regs
}

func clockAt(ms int) *atomic.Pointer[time.Time] {
	p := new(atomic.Pointer[time.Time])
	tm := at(ms)
	p.Store(&tm)
	return p
}

// TestRemoteBatchYields: a batch request on one instance is refused while
// an interactive request another instance holds waits on one of its
// buckets, and told when that one goes; held again once it left, or once
// its time is up (its leave lost on the way).
func TestRemoteBatchYields(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]

	ia, _, _ := a.Hold(nil, false, []string{"org", "u:ann"}, []string{"u:ann"}, at(700))
	h.pending.Wait()
	if e, busy, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(500)); e != nil || !busy.Equal(at(700)) {
		t.Fatalf("batch beside another instance's interactive request: held %v, busy until %v; want refused until 700 ms", e != nil, busy.Sub(t0))
	}
	if e, _, _ := b.Hold(nil, true, []string{"org", "u:bob"}, nil, at(500)); e == nil {
		t.Fatal("a batch request on buckets the interactive one does not wait on was refused")
	} else {
		e.Leave()
	}
	if !ia.Go() {
		t.Fatal("the interactive request could not go")
	}
	h.pending.Wait()
	e, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(500))
	if e == nil {
		t.Fatal("batch refused after the interactive request left")
	}
	e.Leave()

	// A leave lost: the interactive request counts until its time is up.
	ia, _, _ = a.Hold(nil, false, []string{"u:ann"}, nil, at(900))
	h.pending.Wait()
	h.lose.Store(true)
	ia.Leave()
	h.lose.Store(false)
	if e, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(950)); e != nil {
		t.Fatal("batch held while the interactive request (whose leave was lost) still counts")
	}
	later := at(901)
	clock.Store(&later)
	if e, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(950)); e == nil {
		t.Fatal("batch still refused after the lost interactive request's time was up")
	} else {
		e.Leave()
	}
}

// TestRemotePreempt: an interactive request on one instance preempts the
// batch requests another instance holds on its buckets, and its wait ends
// only once their holder gave their reservations back; batch requests on
// other buckets are left alone; the preempted one is told to retry when
// the interactive request will have gone.
func TestRemotePreempt(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]

	onAnn, _, _ := b.Hold(nil, true, []string{"org", "u:ann"}, []string{"u:ann"}, at(2000))
	onBob, _, _ := b.Hold(nil, true, []string{"org", "u:bob"}, []string{"u:bob"}, at(2000))
	h.pending.Wait()
	if !a.BatchHeld() {
		t.Fatal("another instance's held batch requests are not seen")
	}
	e, victims := a.Preempt([]string{"org", "u:ann"}, at(500))
	if e == nil || len(victims) != 1 {
		t.Fatalf("preempting another instance's batch request: entry %v, %d victims; want one (standing for the instance)", e != nil, len(victims))
	}
	h.pending.Wait()
	if !preemptedNow(onAnn) || preemptedNow(onBob) {
		t.Fatalf("preempted: ann's %v (want true), bob's %v (want false)", preemptedNow(onAnn), preemptedNow(onBob))
	}
	if onAnn.Go() {
		t.Fatal("a preempted batch request could still go")
	}
	if err := Wait(cancelled, victims); err == nil {
		t.Fatal("the interactive request's wait ended before the batch request gave its reservation back")
	}
	onAnn.GaveBack()
	if err := Wait(bounded(t), victims); err != nil { // bounded: within the ack timeout (a minute)
		t.Fatalf("the interactive request's wait did not end once the batch request gave back: %v", err)
	}
	// The pending interactive request is known to b: a batch request there yields.
	if e, busy, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(600)); e != nil || !busy.Equal(at(500)) {
		t.Fatalf("batch beside a pending interactive request: held %v, busy until %v", e != nil, busy.Sub(t0))
	}
	// The preempted request's Retry waits for the interactive request's
	// decision: held until 400 ms, not the 500 ms it said at the latest.
	retry := make(chan time.Time, 1)
	go func() { retry <- onAnn.Retry(bounded(t)) }()
	select {
	case r := <-retry:
		t.Fatalf("the preempted request's Retry (%v) did not wait for the interactive request's decision", r.Sub(t0))
	case <-time.After(50 * time.Millisecond):
	}
	held, _, more := a.Hold(e, false, []string{"org", "u:ann"}, []string{"u:ann"}, at(400))
	if held == nil || len(more) != 0 {
		t.Fatalf("the interactive request once decided: held %v, %d more victims", held != nil, len(more))
	}
	if r := <-retry; !r.Equal(at(400)) {
		t.Fatalf("the preempted request retries at %v, want 400 ms", r.Sub(t0))
	}
	held.Leave()
	onBob.Leave()
	h.pending.Wait()
	if a.BatchHeld() {
		t.Fatal("batch requests still seen after every one left")
	}
}

// TestRemotePreemptWhenHeld: an interactive request held on buckets on
// which another instance holds batch requests (decided while it was)
// preempts them, as it does its own instance's.
func TestRemotePreemptWhenHeld(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]
	batch, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(2000))
	h.pending.Wait()
	e, _, victims := a.Hold(nil, false, []string{"u:ann"}, nil, at(800))
	if e == nil || len(victims) != 1 {
		t.Fatalf("held interactive: %v, %d victims; want 1", e != nil, len(victims))
	}
	h.pending.Wait()
	if !preemptedNow(batch) {
		t.Fatal("the other instance's batch request was not preempted")
	}
	batch.GaveBack()
	if err := Wait(bounded(t), victims); err != nil {
		t.Fatal(err)
	}
	// Decided already: the preempted request's Retry does not wait for
	// the interactive one to leave (as on one instance), which it would
	// until its context ends.
	ctx := bounded(t)
	start := time.Now()
	r := batch.Retry(ctx)
	t.Logf("Retry returned after %v", time.Since(start))
	if !r.Equal(at(800)) || ctx.Err() != nil {
		t.Fatalf("the preempted request's Retry: %v after %v (its context: %v), want 800 ms before its context ends", r.Sub(t0), time.Since(start), ctx.Err())
	}
	e.Leave()
}

// TestRemoteAckLost: an instance that never answers (gone, or its answer
// lost) holds an interactive request's wait for the ack timeout, no
// longer; with no batch request held anywhere no preemption is asked.
func TestRemoteAckLost(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]
	a.ackTimeout = 200 * time.Millisecond
	batch, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(30000)) // held 30 s
	h.pending.Wait()
	start := time.Now()
	e, victims := a.Preempt([]string{"u:ann"}, at(500))
	if len(victims) != 1 {
		t.Fatalf("%d victims, want 1", len(victims))
	}
	h.pending.Wait() // b heard the preemption; its answer will be lost
	h.lose.Store(true)
	if !preemptedNow(batch) {
		t.Fatal("b's batch request was not preempted")
	}
	if err := Wait(bounded(t), victims); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < a.ackTimeout {
		t.Fatalf("the wait ended after %v with no answer, before the ack timeout (%v)", waited, a.ackTimeout)
	}
	e.Leave()
	// What b held there is forgotten: the next interactive request does
	// not wait for b again.
	if e, v := a.Preempt([]string{"u:ann"}, at(500)); e != nil || v != nil {
		t.Fatalf("a second interactive request waits for the silent instance again (%d victims)", len(v))
	}
	h.lose.Store(false)

	c := New() // unlinked: nothing held elsewhere, nothing asked
	if e, v := c.Preempt([]string{"u:ann"}, at(500)); e != nil || v != nil {
		t.Fatal("an unlinked registry preempted")
	}
}

// TestReceiveIgnores: a registry ignores its own messages and malformed
// ones.
func TestReceiveIgnores(t *testing.T) {
	r := New()
	for _, msg := range []string{``, `{`, `[]`, `{"k":"hold","keys":["u:ann"],"d":1000000000}`,
		`{"k":"hold","f":"` + r.self + `","i":1,"b":true,"keys":["u:ann"],"d":1000000000}`} {
		r.Receive([]byte(msg))
	}
	if r.BatchHeld() || len(r.remote) != 0 {
		t.Fatalf("messages kept: %d", len(r.remote))
	}
	r.Receive([]byte(`{"k":"hold","f":"peer","i":1,"b":true,"keys":["u:ann"],"d":1000000000}`))
	if !r.BatchHeld() {
		t.Fatal("a peer's batch request not kept")
	}
	r.Receive([]byte(`{"k":"leave","f":"peer","i":1}`))
	if r.BatchHeld() || len(r.byKey) != 0 {
		t.Fatal("a peer's batch request kept after it left")
	}
}

// bounded is a context for a wait that must end: a test that would hang
// fails instead, well before the ack timeout (link's) would end it.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestRemotePendingLeft: an interactive request that preempted another
// instance's batch requests, then was decided and not held (it fit, or was
// refused), leaves: the preempted requests' Retry returns at once, not
// when its wait would have ended.
func TestRemotePendingLeft(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]
	batch, _, _ := b.Hold(nil, true, []string{"u:ann"}, nil, at(2000))
	h.pending.Wait()
	e, victims := a.Preempt([]string{"u:ann"}, at(3000))
	h.pending.Wait()
	batch.GaveBack()
	if err := Wait(bounded(t), victims); err != nil {
		t.Fatal(err)
	}
	retry := make(chan time.Time, 1)
	go func() { retry <- batch.Retry(bounded(t)) }()
	e.Leave()
	select {
	case r := <-retry:
		if !r.IsZero() {
			t.Fatalf("Retry %v after the interactive request left, want none (nobody waits)", r.Sub(t0))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the preempted request's Retry still waits 20 s after the interactive request left")
	}
}

// TestRemotePreemptThree: an interactive request preempting the batch
// requests of two other instances waits for both to give back, not the
// first; an answer addressed to another instance, or to an earlier
// preemption, does not count.
func TestRemotePreemptThree(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 3, clock)
	a, b, c := regs[0], regs[1], regs[2]
	onB, _, _ := b.Hold(nil, true, []string{"org"}, nil, at(2000))
	onC, _, _ := c.Hold(nil, true, []string{"org"}, nil, at(2000))
	h.pending.Wait()
	e, victims := a.Preempt([]string{"org"}, at(500))
	h.pending.Wait()
	if len(victims) != 1 || !preemptedNow(onB) || !preemptedNow(onC) {
		t.Fatalf("victims %d, b's preempted %v, c's %v", len(victims), preemptedNow(onB), preemptedNow(onC))
	}
	onB.GaveBack()
	waiting := func() int { // the instances a still waits for
		a.mu.Lock()
		defer a.mu.Unlock()
		if p := a.preemptions[e.id]; p != nil {
			return len(p.peers)
		}
		return 0
	}
	for deadline := time.Now().Add(20 * time.Second); waiting() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a waits for %d instances 20 s after b gave back, want 1 (c)", waiting())
		}
	}
	// Answers that must not count: to another instance, for an earlier preemption.
	a.Receive([]byte(`{"k":"gaveback","f":"` + c.self + `","i":` + fmt.Sprint(e.id) + `,"s":1,"t":"` + b.self + `"}`))
	a.Receive([]byte(`{"k":"gaveback","f":"` + c.self + `","i":` + fmt.Sprint(e.id) + `,"s":99,"t":"` + a.self + `"}`))
	select {
	case <-victims[0].done:
		t.Fatal("the wait ended before the second instance gave back")
	default:
	}
	onC.GaveBack()
	if err := Wait(bounded(t), victims); err != nil {
		t.Fatal(err)
	}
	e.Leave()
}

// TestRemoteExpired: another instance's batch entry whose time is up (its
// leave lost) is not preempted, nor waited for.
func TestRemoteExpired(t *testing.T) {
	clock := clockAt(0)
	h, regs := link(t, 2, clock)
	a, b := regs[0], regs[1]
	b.Hold(nil, true, []string{"u:ann"}, nil, at(300))
	h.pending.Wait()
	later := at(301)
	clock.Store(&later)
	if e, v := a.Preempt([]string{"u:ann"}, at(800)); e != nil || v != nil {
		t.Fatalf("an expired batch entry of another instance was preempted (%d victims)", len(v))
	}
	if a.BatchHeld() {
		t.Fatal("an expired batch entry still counts as held")
	}
}

// TestReceiveRefusesMalformed: a message not of the shape registries send
// — an unknown kind, no sender or one too long, a gaveback to nobody, too
// many keys, an empty or too long key, a negative duration, too long — is
// counted and keeps nothing; a well-formed one is kept.
func TestReceiveRefusesMalformed(t *testing.T) {
	r := New()
	many, _ := json.Marshal(make([]string, maxKeys+1))
	for _, msg := range []string{
		`{`, `[]`, `{"k":"hold","keys":["u:ann"],"d":1000000000}`,
		`{"k":"steal","f":"peer","i":1,"b":true,"keys":["u:ann"],"d":1000000000}`,
		`{"k":"hold","f":"` + strings.Repeat("p", maxFrom+1) + `","i":1,"b":true,"keys":["u:ann"],"d":1000000000}`,
		`{"k":"gaveback","f":"peer","i":1,"s":1}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":` + string(many) + `,"d":1000000000}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":[""],"d":1000000000}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":["` + strings.Repeat("k", maxKey+1) + `"],"d":1000000000}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":["u:ann"],"d":-1}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":["u:ann"],"d":"1s"}`,
		`{"k":"hold","f":"peer","i":1,"b":true,"keys":["u:ann"],"x":"` + strings.Repeat("x", maxMessage) + `"}`,
	} {
		before := r.Rejected()
		r.Receive([]byte(msg))
		if r.Rejected() != before+1 {
			t.Errorf("%.60q not refused", msg)
		}
	}
	if r.BatchHeld() || len(r.remote) != 0 {
		t.Fatalf("malformed messages kept: %d", len(r.remote))
	}
	r.Receive([]byte(`{"k":"hold","f":"peer","i":1,"b":true,"keys":["u:ann"],"d":1000000000}`))
	if !r.BatchHeld() || r.Rejected() != 12 {
		t.Fatalf("a peer's batch request not kept, or counted as refused (%d)", r.Rejected())
	}
}

// TestRemoteEntriesBounded: holds from other processes beyond maxRemote —
// a flood of forged senders — are refused and counted; the Registry keeps
// maxRemote entries at most, and makes room as they expire.
func TestRemoteEntriesBounded(t *testing.T) {
	r := New()
	now := time.Unix(1e9, 0)
	r.now, r.maxRemote = func() time.Time { return now }, 100
	for i := range 110 {
		r.Receive(fmt.Appendf(nil, `{"k":"hold","f":"p%d","i":1,"keys":["u:%d"],"d":1000000000}`, i, i))
	}
	if len(r.remote) != 100 || r.Rejected() != 10 {
		t.Fatalf("%d entries kept, %d refused; want 100 and 10", len(r.remote), r.Rejected())
	}
	now = now.Add(2 * time.Second) // every entry expired
	r.Receive([]byte(`{"k":"hold","f":"late","i":1,"keys":["u:x"],"d":1000000000}`))
	if len(r.remote) != 1 || r.Rejected() != 10 {
		t.Fatalf("after the entries expired, %d kept, %d refused; want the new one kept", len(r.remote), r.Rejected())
	}
}

// FuzzDecodeMessage: any message heard decodes without panicking, and one
// taken is within the bounds; what a Registry sends is taken as sent.
func FuzzDecodeMessage(f *testing.F) {
	for _, m := range []message{
		{Kind: "hold", From: "a", ID: 1, Batch: true, Keys: []string{"u:ann", "o:acme"}, For: int64(time.Second)},
		{Kind: "leave", From: "a", ID: 1},
		{Kind: "preempt", From: "a", ID: 2, Seq: 3, Pending: true, Keys: []string{"u:ann"}, For: 5},
		{Kind: "gaveback", From: "b", ID: 2, Seq: 3, To: "a"},
	} {
		b, _ := json.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"k":"hold","f":"p","keys":[""],"d":-5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		if m.From == "" || len(m.Keys) > maxKeys || m.For < 0 || m.For > int64(maxRemoteFor) {
			t.Fatalf("%q taken as %+v", b, m)
		}
		again, _ := json.Marshal(m)
		if m2, err := decodeMessage(again); err != nil || !reflect.DeepEqual(m, m2) && (len(m.Keys) != 0 || len(m2.Keys) != 0) {
			t.Fatalf("%q re-encoded decodes as %+v, %v", b, m2, err)
		}
	})
}
