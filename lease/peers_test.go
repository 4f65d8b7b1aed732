package lease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/internal/redistest"

	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// link joins lease stores as a store.Bus does: each message reaches every
// store, the sender's included (here at once).
type link struct{ to []*lease.Store }

func (l *link) Publish(msg []byte) bool {
	for _, s := range l.to {
		s.Receive(msg)
	}
	return true
}

func (*link) Close() error { return nil }

// linkedPair is two instances' lease stores (leases of a minute, half of
// what remains at most) over one inner store of kind, linked, on c.
func linkedPair(t *testing.T, kind string) (c *storetest.Clock, in store.Leaser, a, b *lease.Store) {
	c, in, _, a, b = linkedGated(t, kind)
	return c, in, a, b
}

// linkedGated is linkedPair with b's grants and resets through g.
func linkedGated(t *testing.T, kind string) (c *storetest.Clock, in store.Leaser, g *gatedLeaser, a, b *lease.Store) {
	c = storetest.NewClock(start)
	in = inner(t, kind, c.Now)
	g = &gatedLeaser{Leaser: in}
	a = newLease(t, in, c.Now, lease.Options{TTL: time.Minute, MaxShare: 0.5})
	b = newLease(t, g, c.Now, lease.Options{TTL: time.Minute, MaxShare: 0.5})
	l := &link{to: []*lease.Store{a, b}}
	a.Connect(l)
	b.Connect(l)
	return c, in, g, a, b
}

// TestLeaseResetToldToPeers: an admin reset on one instance revokes the
// leases another instance holds on the reset bucket, at once: after the
// reset the two instances together admit exactly the fresh capacity
// (without the message the other would also spend what its lease held,
// charged before the reset and wiped by it). A reset of other buckets
// leaves the lease alone; a reset by pattern revokes the leases on the
// buckets its glob selects, and only those.
func TestLeaseResetToldToPeers(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c, _, a, b := linkedPair(t, kind)
		daily := storetest.GCRA(100, 24*time.Hour) // refills 0.07 a minute: nothing during the test
		bs := path("ann", 1, daily, daily)
		for range 20 { // b leases, and grows its lease
			decide(t, b, bs)
			c.Advance(time.Millisecond)
		}
		if st := b.Stats(); st.Leased == 0 || st.Local == 0 {
			t.Fatalf("b's stats %+v, want leases spent", st)
		}
		// A reset of another user's bucket: b's lease stands.
		if _, err := a.Reset(context.Background(), []string{path("bob", 1, daily, daily)[1].Key}); err != nil {
			t.Fatal(err)
		}
		before := b.Stats().Local
		decide(t, b, bs)
		if b.Stats().Local != before+1 || b.Stats().PeerResets != 1 {
			t.Fatalf("b's stats %+v after a reset of bob: want its lease on ann still spent, one peer reset", b.Stats())
		}

		if _, err := a.Reset(context.Background(), []string{bs[0].Key, bs[1].Key}); err != nil {
			t.Fatal(err)
		}
		if admitted := alternate(t, c, bs, a, b); admitted != 100 {
			t.Fatalf("after the reset the two instances admitted %d, want exactly the fresh capacity, 100", admitted)
		}

		// A reset by pattern revokes the other instance's leases on the
		// buckets it selects, and only those (keys and globs of the shape
		// hierarchy makes: only those are told).
		c.Advance(24 * time.Hour)
		sub := []store.Bucket{
			{Key: "{t|acme}org=acme#requests", Limit: daily, Cost: 1},
			{Key: "{t|acme}org=acme/user=ann#requests", Limit: daily, Cost: 1},
		}
		for range 20 {
			decide(t, b, sub)
			c.Advance(time.Millisecond)
		}
		nothing := store.KeyMatch{Glob: "{t|*}org=nobody[#/]*", Match: func(string) bool { return false }}
		if _, err := a.ResetMatching(context.Background(), nothing); err != nil {
			t.Fatal(err)
		}
		before = b.Stats().Local
		decide(t, b, sub)
		if b.Stats().Local != before+1 {
			t.Fatalf("b's lease was not spent after a reset by a pattern that selects none of its buckets: %+v", b.Stats())
		}
		anns := store.KeyMatch{Glob: "{t|*}org=acme/user=ann[#/]*", Match: func(k string) bool { return k == sub[1].Key }}
		if _, err := a.ResetMatching(context.Background(), anns); err != nil {
			t.Fatal(err)
		}
		before = b.Stats().Local
		decide(t, b, sub)
		if b.Stats().Local != before {
			t.Fatalf("b's lease was spent after a reset by a pattern that selects its bucket: %+v", b.Stats())
		}
	})
}

// TestLeaseRevokedGivesBackTheRest: a lease revoked by a reset of one of
// its path's buckets (another instance's reset of a user) gives back what
// it held on the others (the organisation's): nothing is lost there.
func TestLeaseRevokedGivesBackTheRest(t *testing.T) {
	storetest.EachKind(t, func(t *testing.T, kind string) {
		c, in, a, b := linkedPair(t, kind)
		daily := storetest.GCRA(100, 24*time.Hour)
		bs := path("ann", 1, daily, daily)
		admitted := int64(0)
		for range 20 {
			if decide(t, b, bs).Allowed {
				admitted++
			}
			c.Advance(time.Millisecond)
		}
		if b.Stats().Local == 0 {
			t.Fatalf("b's stats %+v, want leases spent", b.Stats())
		}
		if _, err := a.Reset(context.Background(), []string{bs[1].Key}); err != nil { // ann only
			t.Fatal(err)
		}
		b.Sweep(context.Background()) // gives back what was queued
		if org := peekRemaining(t, in, bs)[0]; org != 100-admitted {
			t.Fatalf("the organisation's bucket holds %d after the reset of ann, want %d (100 less the %d admitted: the lease's rest given back)", org, 100-admitted, admitted)
		}
	})
}

// TestLeaseResetToldOverRedis is TestLeaseResetToldToPeers's reset
// between two instances each with its own connection to a real Redis, told
// over its Pub/Sub (store.Bus), as Caddy instances are.
func TestLeaseResetToldOverRedis(t *testing.T) {
	resetToldOverRedis(t, []string{redistest.Shared(t).Addr()}, true)
}

// TestLeaseResetToldByInstanceWithoutLeases: an instance deciding in
// Redis without leases (a) tells the others of its resets too
// (TellResets): the lease b holds on the reset buckets ends, and the two
// admit exactly the fresh capacity afterwards, on a real Redis and on a
// Cluster (a sharded channel).
func TestLeaseResetToldByInstanceWithoutLeases(t *testing.T) {
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) { resetToldOverRedis(t, dep.Addrs(t), false) })
	}
}

// resetToldOverRedis: instances a and b, each with its own connection to
// the Redis at addrs; b spends leases, linked to the others over Pub/Sub;
// a is a lease store linked as b (aLeases) or the Redis store alone,
// telling its resets (TellResets). After a reset through a, b's lease on
// the reset buckets has ended: the two admit exactly the fresh capacity.
func resetToldOverRedis(t *testing.T, addrs []string, aLeases bool) {
	c := storetest.NewClock(start)
	prefix := fmt.Sprintf("leasebus:%x:", rand.Uint32())
	redisStore := func() *store.Redis {
		r, err := store.NewRedis(context.Background(), store.RedisOptions{
			Addrs: addrs, KeyPrefix: prefix, Clock: c.Now, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	var heardMu sync.Mutex
	var heard [][]byte // what b's Bus delivered, once b took it
	leased := func(r *store.Redis, record bool) *lease.Store {
		s := newLease(t, r, c.Now, lease.Options{TTL: time.Minute, MaxShare: 0.5})
		bus := r.OpenBus("leases", func(msg []byte) {
			s.Receive(msg)
			if record {
				heardMu.Lock()
				heard = append(heard, msg)
				heardMu.Unlock()
			}
		})
		s.Connect(bus)
		t.Cleanup(func() { bus.Close() })
		return s
	}
	var a interface {
		store.Store
		store.Resetter
	}
	if aLeases {
		a = leased(redisStore(), false)
	} else {
		r := redisStore()
		lease.TellResets(r, "leases", zap.NewNop())
		a = r
	}
	b := leased(redisStore(), true)
	daily := storetest.GCRA(100, 24*time.Hour)
	bs := path("ann", 1, daily, daily)
	for range 20 {
		decide(t, b, bs)
		c.Advance(time.Millisecond)
	}
	if st := b.Stats(); st.Local == 0 {
		t.Fatalf("b's stats %+v, want leases spent", st)
	}
	resetUntilHeard(t, a, b, bs, func(key string) bool {
		heardMu.Lock()
		defer heardMu.Unlock()
		for _, msg := range heard {
			if bytes.Contains(msg, []byte(strconv.Quote(key))) {
				return true
			}
		}
		return false
	})
	if admitted := alternate(t, c, bs, a, b); admitted != 100 {
		t.Fatalf("after the reset the two instances admitted %d, want exactly the fresh capacity, 100", admitted)
	}
}

// resetUntilHeard resets bs's buckets through a until b has heard of a
// reset (b subscribes in the background); then resets a bucket no lease
// is on, a marker, until b has taken (heard) that reset too. a's messages
// reach b in order, so none of the resets of bs is then still on its way,
// to revoke a lease b takes on the fresh buckets afterwards.
func resetUntilHeard(t *testing.T, a store.Resetter, b *lease.Store, bs []store.Bucket, heard func(key string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().PeerResets == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b heard of no reset within 10 s")
		}
		if _, err := a.Reset(context.Background(), []string{bs[0].Key, bs[1].Key}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	const marker = "{t|acme}|user|marker"
	deadline = time.Now().Add(10 * time.Second)
	var again time.Time // when to reset the marker again
	for ; !heard(marker); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("b did not hear the reset of the marker bucket within 10 s (%d resets heard)", b.Stats().PeerResets)
		}
		if time.Now().After(again) { // again after a second: a message lost to a new subscription
			if _, err := a.Reset(context.Background(), []string{marker}); err != nil {
				t.Fatal(err)
			}
			again = time.Now().Add(time.Second)
		}
	}
}

// alternate decides 300 requests of bs on the instances in turn, 1 ms
// apart, and returns how many were admitted.
func alternate(t *testing.T, c *storetest.Clock, bs []store.Bucket, instances ...store.Store) int {
	t.Helper()
	admitted := 0
	for i := range 300 {
		if decide(t, instances[i%len(instances)], bs).Allowed {
			admitted++
		}
		c.Advance(time.Millisecond)
	}
	return admitted
}

// TestLeaseResetGlobAttack is the attack of a process that may PUBLISH on
// the Redis of the lease stores: a reset message whose glob,
// *a*a*…*a*b, took the backtracking matcher exponential time against
// keys full of a's — minutes per key, under the lock of the leases'
// shard, so that every decision on those paths waited. Here an instance
// holds a lease on a path of 110-byte keys; the raw PUBLISH is handled
// (refused, counted) and a decision on the path made meanwhile completes,
// both well within a bound the unfixed matcher could not meet.
func TestLeaseResetGlobAttack(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	c := storetest.NewClock(start)
	prefix := fmt.Sprintf("leaseattack:%x:", rand.Uint32())
	r, err := store.NewRedis(context.Background(), store.RedisOptions{
		Addrs: []string{addr}, KeyPrefix: prefix, Clock: c.Now, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s := newLease(t, r, c.Now, lease.Options{TTL: time.Minute, MaxShare: 0.5})
	var mu sync.Mutex
	var handled []string // the messages Receive returned from
	bus := r.OpenBus("leases", func(msg []byte) {
		s.Receive(msg)
		mu.Lock()
		handled = append(handled, string(msg))
		mu.Unlock()
	})
	t.Cleanup(func() { bus.Close() })
	s.Connect(bus)
	wasHandled := func(msg string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(handled, msg)
	}

	daily := storetest.GCRA(100, 24*time.Hour)
	as := strings.Repeat("a", 100)
	bs := []store.Bucket{
		{Key: "{t|" + as + "}#r", Limit: daily, Cost: 1},
		{Key: "{t|" + as + "}/a#r", Limit: daily, Cost: 1},
	}
	for range 20 {
		decide(t, s, bs)
		c.Advance(time.Millisecond)
	}
	if st := s.Stats(); st.Local == 0 {
		t.Fatalf("stats %+v, want leases spent", st)
	}
	// The Bus subscribes in the background: until it hears, a message
	// published is lost.
	hello := `{"f":"peer","keys":["{t|other}#r"]}`
	waitUntil(t, 20*time.Second, "the Bus to subscribe", func() bool {
		if wasHandled(hello) {
			return true
		}
		if _, err := redistest.Do(addr, "PUBLISH", prefix+"leases", hello); err != nil {
			t.Fatal(err)
		}
		return false
	})

	attack := `{"f":"attacker","glob":"` + strings.Repeat("*a", 40) + `*b"}`
	if _, err := redistest.Do(addr, "PUBLISH", prefix+"leases", attack); err != nil {
		t.Fatal(err)
	}
	decided := make(chan error, 1)
	go func() {
		for !wasHandled(attack) { // the decision runs while the attack is handled
			if _, err := s.Decide(context.Background(), bs); err != nil {
				decided <- err
				return
			}
			c.Advance(time.Millisecond)
		}
		_, err := s.Decide(context.Background(), bs)
		decided <- err
	}()
	select {
	case err := <-decided:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing
		// The stalled store holds the test's cleanup (its Close waits for
		// the decision in flight) as long as the matching, and t's log
		// with it: say why now.
		msg := "the attack's reset message is not handled, or a decision beside it does not complete, after 10 s"
		fmt.Fprintln(os.Stderr, t.Name()+": "+msg)
		t.Fatal(msg)
	}
	if n := s.PeerRejected(); n != 1 {
		t.Errorf("%d messages refused, want the attack's", n)
	}
	if st := s.Stats(); st.PeerResets != 1 {
		t.Errorf("stats %+v: want one peer reset (the first message), none from the attack", st)
	}
}

// waitUntil polls cond until it holds, and fails after within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not timing behaviour
	}
}

// TestLeaseResetMalformedRefused: a reset message that is not of the
// shape Cascade sends — no sender, neither keys nor glob, both, too many
// keys, an empty or too long key, a glob of another shape, not JSON — is
// counted and not taken as a reset; the same reset well formed is.
func TestLeaseResetMalformedRefused(t *testing.T) {
	c, _, _, b := linkedPair(t, "memory")
	daily := storetest.GCRA(100, 24*time.Hour)
	bs := path("ann", 1, daily, daily)
	for range 20 {
		decide(t, b, bs)
		c.Advance(time.Millisecond)
	}
	many := make([]string, 1025)
	for i := range many {
		many[i] = fmt.Sprintf("{t|acme}|user|%d", i)
	}
	manyJSON, _ := json.Marshal(many)
	for _, msg := range []string{
		`not json`,
		`{"keys":["{t|acme}|org"]}`,
		`{"f":"peer"}`,
		`{"f":"` + strings.Repeat("p", 65) + `","keys":["{t|acme}|org"]}`,
		`{"f":"peer","keys":["{t|acme}|org"],"glob":"{t|*}x[#/]*"}`,
		`{"f":"peer","keys":` + string(manyJSON) + `}`,
		`{"f":"peer","keys":[""]}`,
		`{"f":"peer","keys":["` + strings.Repeat("k", 4097) + `"]}`,
		`{"f":"peer","glob":"*"}`,
		`{"f":"peer","glob":"{t|acme}*"}`,
		`{"f":"peer","glob":"{t|*}a*b[#/]*"}`,
		`{"f":"peer","glob":"{t|*}[a][#/]*"}`,
		`{"f":"peer","glob":"{|*}x[#/]*"}`,
		`{"f":"peer","keys":"{t|acme}|org"}`,
	} {
		before := b.PeerRejected()
		b.Receive([]byte(msg))
		if b.PeerRejected() != before+1 {
			t.Errorf("%.60q was not refused", msg)
		}
		if st := b.Stats(); st.PeerResets != 0 {
			t.Fatalf("after %.60q b's stats are %+v: taken as a reset", msg, st)
		}
	}
	// The same reset, well formed, is taken.
	b.Receive([]byte(`{"f":"peer","keys":["` + bs[1].Key + `"]}`))
	if st := b.Stats(); st.PeerResets != 1 {
		t.Fatalf("after a reset of ann b's stats are %+v: not taken", st)
	}
}

// TestLeaseResetSplit: a reset of more keys than one message may carry is
// told in several, each of which a peer takes; a glob of another shape
// than Cascade's, which peers would refuse, is not told.
func TestLeaseResetSplit(t *testing.T) {
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("{t|acme}org=acme/user=%d#requests.gcra.60000000", i)
	}
	msgs := lease.EncodeReset("me", keys, "")
	var got []string
	for _, m := range msgs {
		if len(m) > store.MaxBusMessage {
			t.Errorf("a message of %d bytes", len(m))
		}
		k, _, err := lease.DecodeReset(m)
		if err != nil {
			t.Fatalf("a peer refuses a message the store sends: %v", err)
		}
		got = append(got, k...)
	}
	if !slices.Equal(got, keys) || len(msgs) < 3 {
		t.Fatalf("%d messages carry %d keys, want all 3000 in order, in 3 or more", len(msgs), len(got))
	}
	if msgs := lease.EncodeReset("me", nil, "*a*b"); msgs != nil {
		t.Errorf("a glob of another shape is told: %q", msgs)
	}
	if msgs := lease.EncodeReset("me", nil, "{t|*}org=acme[#/]*"); len(msgs) != 1 {
		t.Errorf("a glob of Cascade's shape is told in %d messages", len(msgs))
	}
}

// FuzzDecodeReset: any message heard decodes without panicking, and one
// taken is within the bounds the matcher relies on; what the store sends
// is taken as sent.
func FuzzDecodeReset(f *testing.F) {
	for _, m := range lease.EncodeReset("from", []string{"{t|acme}|org", "{t|acme}|user|ann"}, "") {
		f.Add(m)
	}
	for _, m := range lease.EncodeReset("from", nil, "{api|*}org=acme/user=ann[#/]*") {
		f.Add(m)
	}
	f.Add([]byte(`{"f":"x","glob":"*a*a*a*a*b"}`))
	f.Add([]byte(`{"f":"x","keys":[""],"glob":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, glob, err := lease.DecodeReset(b)
		if err != nil {
			return
		}
		if len(keys) > 1024 || len(glob) > 4096 || glob == "" && len(keys) == 0 {
			t.Fatalf("%q taken: %d keys, a glob of %d bytes", b, len(keys), len(glob))
		}
		if glob != "" {
			if strings.Count(glob, "*") != 2 || strings.Count(glob, "[") != 1 {
				t.Fatalf("glob %q taken", glob)
			}
			_ = store.GlobMatch(glob, strings.Repeat("a", 200))
		}
		for _, m := range lease.EncodeReset("from", keys, glob) {
			k, g, err := lease.DecodeReset(m)
			if err != nil || g != glob || !slices.Equal(k, keys) && glob == "" && len(k) != 0 && !slices.Equal(k, keys[:len(k)]) {
				t.Fatalf("%q, re-encoded, decodes as %q, %q, %v", b, k, g, err)
			}
		}
	})
}
