package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestRedisResponsesConformance runs the responses' suite on a single
// Redis, through a Sentinel, and on a 3-master Cluster.
func TestRedisResponsesConformance(t *testing.T) {
	deployments := []struct {
		name string
		opts func(t *testing.T) store.RedisOptions
	}{
		{"standalone", func(t *testing.T) store.RedisOptions {
			return store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}}
		}},
		{"cluster", func(t *testing.T) store.RedisOptions {
			return store.RedisOptions{Addrs: redistest.SharedCluster(t).Addrs()}
		}},
		{"sentinel", func(t *testing.T) store.RedisOptions {
			sentinel := redistest.StartSentinel(t, "cascade-master", redistest.Shared(t))
			return store.RedisOptions{Addrs: []string{sentinel.Addr()}, MasterName: "cascade-master"}
		}},
	}
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			opts := d.opts(t)
			storetest.RunResponses(t, func(t *testing.T, clock store.Clock) store.Store {
				o := opts
				o.KeyPrefix, o.Clock = prefix(t), clock
				return newRedis(t, o)
			})
		})
	}
}

// TestRedisResponseTTL: a response is SET with the ttl asked for, to the
// millisecond (PTTL), and a ttl under a millisecond still keeps it (PX 0
// would be refused).
func TestRedisResponseTTL(t *testing.T) {
	srv := redistest.Shared(t)
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: p})
	ctx := context.Background()
	for _, ttl := range []time.Duration{1500 * time.Millisecond, 2 * time.Second, time.Hour} {
		key := "{ttl}|" + ttl.String()
		if err := s.KeepResponse(ctx, key, []byte("x"), ttl); err != nil {
			t.Fatal(err)
		}
		reply, err := redistest.Do(srv.Addr(), "PTTL", p+key)
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := strconv.ParseInt(reply, 10, 64)
		if ms <= ttl.Milliseconds()-1000 || ms > ttl.Milliseconds() {
			t.Errorf("ttl %v: PTTL %s ms", ttl, reply)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, time.Microsecond, 1500 * time.Microsecond} {
		if err := s.KeepResponse(ctx, "{ttl}|short", []byte("x"), ttl); err != nil {
			t.Errorf("ttl %v: %v", ttl, err)
		}
	}
}

// TestRedisClusterResponseLivesInItsTagsSlot: on a Cluster, a response
// is kept by the master of its key's hash tag, beside the idempotency
// record of that tag.
func TestRedisClusterResponseLivesInItsTagsSlot(t *testing.T) {
	c := redistest.SharedCluster(t)
	p := prefix(t)
	s := newRedis(t, store.RedisOptions{Addrs: c.Addrs(), KeyPrefix: p})
	ctx := context.Background()
	masters := map[string]bool{}
	for i := range 12 {
		tag := fmt.Sprintf("{tenant%d}", i)
		record, response := tag+"|idem=abc", tag+"|idem=abc#response"
		if _, err := s.Decide(ctx, []store.Bucket{{Key: record, Limit: storetest.GCRA(10, time.Hour), Cost: 1}}); err != nil {
			t.Fatal(err)
		}
		body := storetest.Blob(500)
		if err := s.KeepResponse(ctx, response, body, time.Hour); err != nil {
			t.Fatal(err)
		}
		master, err := c.MasterForSlot(c.Masters[0], store.RedisKeySlot(tag))
		if err != nil || master == nil {
			t.Fatalf("the master of %s: %v %v", tag, master, err)
		}
		masters[master.Addr()] = true
		// Asked of that master alone: a key of another slot would be MOVED.
		if got, err := redistest.Do(master.Addr(), "GET", p+response); err != nil || got != string(body) {
			t.Fatalf("%s on its tag's master %s: %d bytes, %v", response, master.Addr(), len(got), err)
		}
		if n, err := redistest.Do(master.Addr(), "EXISTS", p+record, p+response); err != nil || n != "2" {
			t.Fatalf("the record and the response of %s on %s: EXISTS %q, %v; want both", tag, master.Addr(), n, err)
		}
	}
	if len(masters) < 2 {
		t.Fatalf("12 tags all on one master of 3: the test shows nothing of routing")
	}
}

// TestRedisClusterResponseBreaker: once a Cluster master is dead, its
// breaker open, the responses of its slots fail at once with
// ErrUnavailable (ErrBreakerOpen: nothing sent), while those of the other
// masters are kept and read.
func TestRedisClusterResponseBreaker(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newRedis(t, store.RedisOptions{Addrs: c.Addrs(), KeyPrefix: prefix(t),
		Breaker: store.BreakerOptions{Failures: 1, Cooldown: time.Minute}}) // no probe closes it during the test
	ctx := context.Background()
	dead := c.Masters[0]
	var onDead, onLive string
	for i := 0; onDead == "" || onLive == ""; i++ {
		tag := fmt.Sprintf("{t%d}", i)
		m, err := c.MasterForSlot(c.Masters[1], store.RedisKeySlot(tag))
		if err != nil || m == nil {
			t.Fatalf("the master of %s: %v %v", tag, m, err)
		}
		if m == dead {
			onDead = tag + "|response"
		} else {
			onLive = tag + "|response"
		}
	}
	for _, k := range []string{onDead, onLive} { // connections and breakers made
		if err := s.KeepResponse(ctx, k, []byte("kept"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// The other masters mark the dead one failed after the node timeout
	// (5 s), and the Cluster then refuses every slot: what follows takes
	// moments.
	dead.Kill()
	err := s.KeepResponse(ctx, onDead, []byte("again"), time.Hour)
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrBreakerOpen) {
		t.Fatalf("keeping on a dead master: %v, want the failure itself, wrapping ErrUnavailable", err)
	}
	began := time.Now()
	_, _, err = s.Response(ctx, onDead)
	took := time.Since(began)
	if !errors.Is(err, store.ErrBreakerOpen) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("reading from a dead master whose breaker opened: %v, want ErrBreakerOpen (ErrUnavailable)", err)
	}
	t.Logf("refused after %v: %v", took, err)
	if got, _, err := s.Response(ctx, onLive); err != nil || string(got) != "kept" {
		t.Fatalf("a live master's response while another is dead: %q, %v", got, err)
	}
}
