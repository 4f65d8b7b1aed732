package store_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

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
			_, other := open(p + "other:")
			count := func(in *inbox) int { in.mu.Lock(); defer in.mu.Unlock(); return len(in.got) }
			// A subscription is made in the background: publish until one is heard.
			deadline := time.Now().Add(10 * time.Second)
			for count(inb) == 0 || count(ina) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no message heard within 10 s")
				}
				a.Publish([]byte("hello"))
				time.Sleep(20 * time.Millisecond)
			}
			const n = 500
			for i := range n {
				if !a.Publish([]byte(strconv.Itoa(i))) {
					t.Fatalf("message %d not queued", i)
				}
			}
			for _, in := range []*inbox{ina, inb} {
				for time.Now().Before(deadline) {
					in.mu.Lock()
					last := ""
					if len(in.got) > 0 {
						last = in.got[len(in.got)-1]
					}
					in.mu.Unlock()
					if last == strconv.Itoa(n-1) {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				in.mu.Lock()
				next := 0
				for _, m := range in.got {
					if m == "hello" {
						continue
					}
					if m != strconv.Itoa(next) {
						in.mu.Unlock()
						t.Fatalf("message %s heard where %d was due", m, next)
					}
					next++
				}
				in.mu.Unlock()
				if next != n {
					t.Fatalf("%d of %d messages heard, in order", next, n)
				}
			}
			if c := count(other); c != 0 {
				t.Fatalf("a Bus of another key prefix heard %d messages", c)
			}
			if a.Dropped() != 0 {
				t.Fatalf("%d messages dropped", a.Dropped())
			}
			a.Close()
			if a.Publish([]byte("after")) {
				t.Fatal("a closed Bus queued a message")
			}
			before := count(ina)
			time.Sleep(50 * time.Millisecond)
			if got := count(ina); got != before {
				t.Fatal(fmt.Sprintf("a closed Bus delivered %d more messages", got-before))
			}
		})
	}
}

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
	heardWithin(t, a, in, 0, 10*time.Second, "before the move")

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
	heardWithin(t, a, in, in.heard(), 15*time.Second, "after the channel's slot moved")
}

// TestBusRedisAway: a Bus opened while Redis is down (the store started
// lazily) hears once Redis is up, and again after a restart; opening it
// and closing it while Redis hangs takes no longer than a moment.
func TestBusRedisAway(t *testing.T) {
	s := redistest.Start(t)
	s.Kill()
	p := prefix(t)
	open := func(in *busInbox) *store.Bus {
		r := newRedis(t, store.RedisOptions{Addrs: []string{s.Addr()}, KeyPrefix: p, LazyLoad: true, Timeout: 200 * time.Millisecond})
		b := r.OpenBus("waiting", in.deliver)
		t.Cleanup(func() { b.Close() })
		return b
	}
	a, in := open(&busInbox{}), &busInbox{}
	open(in)
	time.Sleep(100 * time.Millisecond)
	s.Restart(t)
	heardWithin(t, a, in, 0, 15*time.Second, "once Redis came up")
	s.Restart(t)
	heardWithin(t, a, in, in.heard(), 15*time.Second, "after a restart")

	s.Pause()
	defer s.Resume()
	r := newRedis(t, store.RedisOptions{Addrs: []string{s.Addr()}, KeyPrefix: p, LazyLoad: true, Timeout: 200 * time.Millisecond})
	start := time.Now()
	b := r.OpenBus("waiting", func([]byte) {})
	if took := time.Since(start); took > time.Second {
		t.Errorf("OpenBus took %v while Redis hangs", took)
	}
	for range 100 {
		b.Publish([]byte("x"))
	}
	time.Sleep(500 * time.Millisecond)
	start = time.Now()
	b.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %v while Redis hangs, want about 1 s at most", took)
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
