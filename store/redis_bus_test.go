package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// TestBus: what one process publishes on a Bus reaches every Bus of the
// channel sharing the store — its own included — in order, on a standalone
// Redis and on the 3-master Cluster; another key prefix hears nothing;
// after Close nothing is delivered nor published.
func TestBus(t *testing.T) {
	for _, tt := range redistest.Deployments() {
		t.Run(tt.Name, func(t *testing.T) {
			addrs, p := tt.Addrs(t), prefix(t)
			type inbox struct {
				mu  sync.Mutex
				got []string
			}
			open := func(prefix string) (*store.Bus, *inbox) {
				in := &inbox{}
				r := newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: prefix})
				b := r.OpenBus("waiting", func(msg []byte) {
					in.mu.Lock()
					in.got = append(in.got, string(msg))
					in.mu.Unlock()
				})
				t.Cleanup(func() { b.Close() })
				return b, in
			}
			a, ina := open(p)
			_, inb := open(p)
			o, other := open(p + "other:")
			heard := func(in *inbox, msg string) bool {
				in.mu.Lock()
				defer in.mu.Unlock()
				return slices.Contains(in.got, msg)
			}
			// A subscription is made in the background: publish until it
			// is heard (by the other prefix's Bus too, on its own channel,
			// so that its silence below means something).
			waitFor(t, busWait, "the Buses to subscribe", func() error {
				if heard(ina, "hello") && heard(inb, "hello") && heard(other, "other") {
					return nil
				}
				a.Publish([]byte("hello"))
				o.Publish([]byte("other"))
				time.Sleep(20 * time.Millisecond)
				return errors.New("not all heard their channel's message")
			})
			const n = 500
			for i := range n {
				if !a.Publish([]byte(strconv.Itoa(i))) {
					t.Fatalf("message %d not queued", i)
				}
			}
			for name, in := range map[string]*inbox{"the sender's own Bus": ina, "another Bus": inb} {
				waitFor(t, busWait, fmt.Sprintf("%s to hear message %d", name, n-1), func() error {
					if heard(in, strconv.Itoa(n-1)) {
						return nil
					}
					in.mu.Lock()
					defer in.mu.Unlock()
					return fmt.Errorf("%d messages heard", len(in.got))
				})
				in.mu.Lock()
				next := 0
				for _, m := range in.got {
					if m == "hello" {
						continue
					}
					if m != strconv.Itoa(next) {
						in.mu.Unlock()
						t.Fatalf("%s: message %s heard where %d was due", name, m, next)
					}
					next++
				}
				in.mu.Unlock()
				if next != n {
					t.Fatalf("%s: %d of %d messages heard, in order", name, next, n)
				}
			}
			other.mu.Lock()
			for _, m := range other.got {
				if m != "other" {
					t.Errorf("a Bus of another key prefix heard %q", m)
				}
			}
			other.mu.Unlock()
			if a.Dropped() != 0 {
				t.Fatalf("%d messages dropped", a.Dropped())
			}
			a.Close()
			if a.Publish([]byte("after")) {
				t.Fatal("a closed Bus queued a message")
			}
			// Everything published was heard: a closed Bus that delivered
			// anything now would deliver what it should not have kept.
			ina.mu.Lock()
			before := len(ina.got)
			ina.mu.Unlock()
			time.Sleep(50 * time.Millisecond) // a chance for a wrong delivery to show, not a wait for a right one
			ina.mu.Lock()
			after := len(ina.got)
			ina.mu.Unlock()
			if after != before {
				t.Fatalf("a closed Bus delivered %d more messages", after-before)
			}
		})
	}
}

// busWait bounds a wait for a Bus to subscribe, or to hear: moments on an
// idle machine; a subscription lost is made again within busRetry (2 s).
const busWait = 20 * time.Second

// busInbox counts what a Bus heard.
type busInbox struct {
	mu sync.Mutex
	n  int
}

func (in *busInbox) deliver([]byte) { in.mu.Lock(); in.n++; in.mu.Unlock() }
func (in *busInbox) heard() int     { in.mu.Lock(); defer in.mu.Unlock(); return in.n }

// heardWithin publishes on from until to has heard more than before, and
// fails after d.
func heardWithin(t *testing.T, from *store.Bus, to *busInbox, before int, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for to.heard() == before {
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing heard within %v", what, d)
		}
		from.Publish([]byte("x"))
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBusSlotMoved: on a Cluster, when the channel's slot moves to another
// master (the node ends the subscription on a connection it keeps open),
// the Bus subscribes again, at the new master, and hears again.
func TestBusSlotMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	c := redistest.StartCluster(t, 3)
	addrs, p := c.Addrs(), prefix(t)
	open := func(in *busInbox) *store.Bus {
		b := newRedis(t, store.RedisOptions{Addrs: addrs, KeyPrefix: p}).OpenBus("waiting", in.deliver)
		t.Cleanup(func() { b.Close() })
		return b
	}
	a, in := open(&busInbox{}), &busInbox{}
	open(in).SetQuiet(time.Second) // it publishes nothing itself: it pings itself when quiet
	heardWithin(t, a, in, 0, busWait, "before the move")

	slot, err := redistest.Do(addrs[0], "CLUSTER", "KEYSLOT", p+"waiting")
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(addrs))
	owner := -1
	for i, ad := range addrs {
		if ids[i], err = redistest.Do(ad, "CLUSTER", "MYID"); err != nil {
			t.Fatal(err)
		}
		if _, err := redistest.Do(ad, "SPUBLISH", p+"waiting", "probe"); err == nil {
			owner = i // the others answer MOVED
		}
	}
	if owner < 0 {
		t.Fatal("no master owns the channel's slot")
	}
	target := (owner + 1) % len(addrs)
	must := func(ad string, args ...string) {
		if out, err := redistest.Do(ad, args...); err != nil {
			t.Fatalf("%v: %q %v", args, out, err)
		}
	}
	// Move the (empty) slot: importing, migrating, then owned by target everywhere.
	must(addrs[target], "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
	must(addrs[owner], "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
	must(addrs[target], "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
	must(addrs[owner], "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
	for i := range addrs {
		if i != owner && i != target {
			must(addrs[i], "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
		}
	}
	heardWithin(t, a, in, in.heard(), busWait, "after the channel's slot moved")
}

// TestBusRedisAway: a Bus opened while Redis is down (the store started
// lazily) hears once Redis is up, and again after a restart; opening it
// and closing it while Redis hangs does not wait for Redis.
func TestBusRedisAway(t *testing.T) {
	s := redistest.Start(t)
	s.Kill()
	p := prefix(t)
	open := func(in *busInbox) (*store.Bus, *observer.ObservedLogs) {
		core, logs := observer.New(zapcore.WarnLevel)
		r := newRedis(t, store.RedisOptions{Addrs: []string{s.Addr()}, KeyPrefix: p, LazyLoad: true, Logger: zap.New(core)})
		b := r.OpenBus("waiting", in.deliver)
		t.Cleanup(func() { b.Close() })
		return b, logs
	}
	in := &busInbox{}
	a, alogs := open(&busInbox{})
	_, inlogs := open(in)
	// Both have tried to subscribe, and failed (each says so once).
	waitFor(t, busWait, "both Buses to fail to subscribe to the absent Redis", func() error {
		if n, m := alogs.FilterMessageSnippet("cannot subscribe").Len(), inlogs.FilterMessageSnippet("cannot subscribe").Len(); n == 0 || m == 0 {
			return fmt.Errorf("%d and %d failures logged", n, m)
		}
		return nil
	})
	s.Restart(t)
	heardWithin(t, a, in, 0, busWait, "once Redis came up")
	s.Restart(t)
	heardWithin(t, a, in, in.heard(), busWait, "after a restart")

	// Redis hangs, and every call of this store would wait a minute for
	// it: OpenBus and Close must wait for none.
	s.Pause()
	defer s.Resume()
	r := newRedis(t, store.RedisOptions{Addrs: []string{s.Addr()}, KeyPrefix: p, LazyLoad: true,
		Timeout: hung, DialTimeout: hung, ReadTimeout: hung, WriteTimeout: hung})
	publishes := &counter{cmds: []string{"publish"}}
	r.Client().(*redis.Client).AddHook(publishes)
	start := time.Now()
	b := r.OpenBus("waiting", func([]byte) {})
	openTook := time.Since(start)
	for range 100 {
		b.Publish([]byte("x"))
	}
	waitFor(t, busWait, "the Bus to publish to the hung Redis", func() error {
		if publishes.sent.Load() == 0 {
			return errors.New("nothing sent")
		}
		return nil
	})
	start = time.Now()
	b.Close()
	closeTook := time.Since(start)
	t.Logf("while Redis hangs, OpenBus took %v, Close %v", openTook, closeTook)
	if openTook > unavailableBound {
		t.Errorf("OpenBus took %v while Redis hangs: it waited for Redis", openTook)
	}
	if n := publishes.ended.Load(); n != 0 || closeTook > unavailableBound {
		t.Errorf("Close took %v while Redis hangs, %d publishes back; want about 1 s, the publish still waiting on Redis", closeTook, n)
	}
}

// BenchmarkBusRoundTrip is the time from Publish to delivery at another
// Bus on a real redis-server on this machine: "the moment" a message
// takes, during which two instances may decide as if they had not heard.
func BenchmarkBusRoundTrip(b *testing.B) {
	addr, p := redistest.Shared(b).Addr(), prefix(b)
	heard := make(chan struct{}, 1)
	from := newRedis(b, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: p}).OpenBus("bench", func([]byte) {})
	to := newRedis(b, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: p}).OpenBus("bench", func([]byte) {
		select {
		case heard <- struct{}{}:
		default:
		}
	})
	b.Cleanup(func() { from.Close(); to.Close() })
	for { // until subscribed
		from.Publish([]byte("x"))
		select {
		case <-heard:
		case <-time.After(20 * time.Millisecond):
			continue
		}
		break
	}
	b.ResetTimer()
	for range b.N {
		from.Publish([]byte(`{"k":"hold","f":"0123456789abcdef","i":42,"b":true,"keys":["{api|acme}|user|ann"],"d":2000000000}`))
		<-heard
	}
}

// msgInbox records what a Bus delivered.
type msgInbox struct {
	mu  sync.Mutex
	got []string
}

func (in *msgInbox) deliver(msg []byte) {
	in.mu.Lock()
	in.got = append(in.got, string(msg))
	in.mu.Unlock()
}

func (in *msgInbox) has(msg string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Contains(in.got, msg)
}

func (in *msgInbox) all() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.got)
}

// TestBusDropsForgedMessages is the attack on a Bus with a bus key: a
// process that may PUBLISH on the Redis but does not hold the key sends,
// on the channel, an unsigned message, one signed under another key, one
// with a forged HMAC, a signed message recorded from the channel and
// played again, one too long, and one moved from another channel. None
// is delivered; each is counted, on the Bus and on its store; the
// instances' own messages still are delivered.
func TestBusDropsForgedMessages(t *testing.T) {
	addr, p := redistest.Shared(t).Addr(), prefix(t)
	r := newRedis(t, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: p})
	r.SetBusKey(store.BusKey("correct horse battery staple", false))
	in := &msgInbox{}
	b := r.OpenBus("leases", in.deliver)
	t.Cleanup(func() { b.Close() })

	// Record what travels on the channel, as an eavesdropper would.
	spy := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { spy.Close() })
	ps := spy.Subscribe(t.Context(), p+"leases")
	t.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, busWait, "the Bus to subscribe", func() error {
		if in.has("hello") {
			return nil
		}
		b.Publish([]byte("hello"))
		return errors.New("not heard yet")
	})
	// The message recorded to replay is one the Bus has heard: a "hello"
	// published before it subscribed would be new to it, not a replay.
	b.Publish([]byte("heard"))
	waitFor(t, busWait, "the Bus to hear the recorded message", func() error {
		if in.has("heard") {
			return nil
		}
		return errors.New("not heard yet")
	})
	var recorded string
	for recorded == "" {
		m, err := ps.ReceiveMessage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(m.Payload, "heard") {
			recorded = m.Payload
		}
	}
	if recorded == "heard" {
		t.Fatalf("the message travelled unsigned")
	}

	other := store.NewBusCodec(store.BusKey("another secret", false), p+"leases")
	forged := []byte(recorded)
	forged[len(forged)-1] ^= 1 // "heare" under the recorded HMAC
	moved := store.NewBusCodec(store.BusKey("correct horse battery staple", false), p+"waiting").Seal([]byte("moved"))
	attacks := []struct{ name, msg string }{
		{"unsigned", `{"f":"x","glob":"*"}`},
		{"another key", string(other.Seal([]byte("other key")))},
		{"forged", string(forged)},
		{"replayed", recorded},
		{"too long", strings.Repeat("x", store.MaxBusMessage+100)},
		{"another channel", string(moved)},
		{"truncated", recorded[:20]},
	}
	for _, a := range attacks {
		if _, err := redistest.Do(addr, "PUBLISH", p+"leases", a.msg); err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
	}
	// Messages reach the Bus in order: once the marker is delivered, every
	// attack was heard before it.
	waitFor(t, busWait, "the marker after the attacks", func() error {
		if in.has("marker") {
			return nil
		}
		b.Publish([]byte("marker"))
		return errors.New("not heard yet")
	})
	for _, got := range in.all() {
		if got != "hello" && got != "heard" && got != "marker" {
			t.Errorf("the Bus delivered %.40q", got)
		}
	}
	want := store.BusStats{Unauthenticated: 5, Replayed: 1, Oversized: 1}
	if st := b.Stats(); st != want {
		t.Errorf("Bus stats %+v, want %+v", st, want)
	}
	if st := r.BusStats(); st != want {
		t.Errorf("store's bus stats %+v, want %+v", st, want)
	}
}

// TestBusKeysMustAgree: instances sharing a bus key hear each other;
// an instance with another key, or none, hears neither — each drops and
// counts the others' messages — nor do they hear it.
func TestBusKeysMustAgree(t *testing.T) {
	addr, p := redistest.Shared(t).Addr(), prefix(t)
	open := func(key []byte) (*store.Bus, *msgInbox) {
		r := newRedis(t, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: p})
		r.SetBusKey(key)
		in := &msgInbox{}
		b := r.OpenBus("waiting", in.deliver)
		t.Cleanup(func() { b.Close() })
		return b, in
	}
	key := store.BusKey("pw", true)
	a, ina := open(key)
	_, inb := open(key)
	c, inc := open(store.BusKey("pw", false)) // the same text as a secret: another key
	d, ind := open(nil)
	waitFor(t, busWait, "the Buses to subscribe", func() error {
		// Each Bus subscribes on its own, so a message published before one
		// of them did is lost to it: publish until every inbox and counter
		// shows a message published after all had subscribed.
		if ina.has("a") && inb.has("a") && inc.has("c") && ind.has("d") &&
			c.Stats().Unauthenticated > 0 && d.Stats().Unauthenticated > 0 {
			return nil
		}
		a.Publish([]byte("a"))
		c.Publish([]byte("c"))
		d.Publish([]byte("d"))
		return fmt.Errorf("not all heard yet: c's stats %+v, d's %+v", c.Stats(), d.Stats())
	})
	for name, in := range map[string]*msgInbox{"a": ina, "b": inb, "c": inc, "d": ind} {
		for _, got := range in.all() {
			if name == "b" && got != "a" || name != "b" && got != name {
				t.Errorf("%s heard %q", name, got)
			}
		}
	}
}

// FuzzBusOpen: whatever is heard, opening it never panics, and only a
// message sealed under the key opens (once); with no key, a message opens
// as itself unless it is signed or too long.
func FuzzBusOpen(f *testing.F) {
	key := store.BusKey("fuzz", false)
	f.Add([]byte("hello"), []byte(nil))
	f.Add([]byte(`{"f":"x","glob":"*"}`), []byte("\x00cb1"))
	f.Add([]byte(""), store.NewBusCodec(store.BusKey("other", false), "ch").Seal([]byte("x")))
	f.Fuzz(func(t *testing.T, payload, heard []byte) {
		signed, unsigned := store.NewBusCodec(key, "ch"), store.NewBusCodec(nil, "ch")
		if got, err := signed.Open(heard); err == nil {
			t.Fatalf("%q opened as %q without being sealed", heard, got)
		}
		if got, err := unsigned.Open(heard); err == nil && !bytes.Equal(got, heard) {
			t.Fatalf("%q opened as %q", heard, got)
		}
		if len(payload) > store.MaxBusMessage {
			return
		}
		sealed := signed.Seal(payload)
		if got, err := signed.Open(sealed); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("a sealed %q opened as %q, %v", payload, got, err)
		}
		if _, err := signed.Open(sealed); err == nil {
			t.Fatalf("a sealed %q opened twice", payload)
		}
	})
}

// TestBusDropsStaleRecordings: a receiver that has not heard a sender yet
// (a process just started) takes a recording of its messages only while
// the recording is fresh: one sent more than half a minute ago, or dated
// ahead, is dropped as replayed, however valid its HMAC.
func TestBusDropsStaleRecordings(t *testing.T) {
	key := store.BusKey("correct horse battery staple", false)
	sender := store.NewBusCodec(key, "p:leases")
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	sender.SetClock(func() time.Time { return t0 })
	recorded := sender.Seal([]byte(`{"reset":1}`))
	for _, tc := range []struct {
		name string
		at   time.Time
		want error
	}{
		{"fresh", t0.Add(2 * time.Second), nil},
		{"an hour later", t0.Add(time.Hour), store.ErrBusReplayed},
		{"dated ahead", t0.Add(-time.Minute), store.ErrBusReplayed},
	} {
		receiver := store.NewBusCodec(key, "p:leases") // has heard nobody
		receiver.SetClock(func() time.Time { return tc.at })
		if _, err := receiver.Open(recorded); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
