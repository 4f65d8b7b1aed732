package store_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
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
