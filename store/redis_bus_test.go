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
	for _, tt := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{redistest.Shared(t).Addr()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addrs, p := tt.addrs(t), prefix(t)
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
