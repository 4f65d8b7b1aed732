package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// failoverWithin is how soon after a replica's promotion its slots' decisions
// must be decided again.
const failoverWithin = time.Second

// outcome is one decision of a failover run: when it was answered, and its
// error.
type outcome struct {
	at  time.Time
	err error
}

// failoverLoad decides, from 8 callers, about 400 times a second, round
// robin over tenants, each decision one bucket in the tenant's slot, until
// stop is closed; it returns each tenant's outcomes.
func failoverLoad(s *store.Redis, tenants []string, stop <-chan struct{}) func() map[string][]outcome {
	var mu sync.Mutex
	out := map[string][]outcome{}
	wait := redistest.Drive(stop, func(n int64) {
		tenant := tenants[n%int64(len(tenants))]
		_, err := s.Decide(context.Background(), []store.Bucket{{Key: tenant + "|load", Limit: storetest.GCRA(1_000_000, time.Hour), Cost: 1}})
		mu.Lock()
		out[tenant] = append(out[tenant], outcome{time.Now(), err})
		mu.Unlock()
	})
	return func() map[string][]outcome {
		wait()
		return out
	}
}

// TestClusterMasterFailover: a real Cluster of 3 masters and 3 replicas
// (cluster-node-timeout 1 s), loaded from 60 tenants spread over the
// masters; one master is SIGKILLed, or hangs (SIGSTOP: a host gone, whose
// connections time out rather than being refused). The tenants of the two
// healthy masters see no error at all (each master has its own breaker);
// the dead master's tenants get errors that wrap ErrUnavailable (their
// failure policy applies) until its replica is promoted, and are decided
// on the promoted replica within a second of the promotion, with the
// breaker and, on a killed master, without (a failed call reloads the slot
// map; nothing waits for go-redis's periodic refresh). After it, a moved
// slot admits exactly what its limit allows, from two instances at once.
func TestClusterMasterFailover(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breaker store.BreakerOptions
		hang    bool
		timeout time.Duration
	}{
		{"breaker", store.BreakerOptions{Failures: 3, Cooldown: time.Second}, false, 2 * time.Second},
		{"breaker off", store.BreakerOptions{}, false, 2 * time.Second},
		// A hung master costs each call sent to it the timeout, until
		// the breaker opens: 1 s, for the last of them to end within a
		// second of the promotion, and still what a healthy master
		// cannot miss on a slow machine.
		{"breaker, master hung", store.BreakerOptions{Failures: 3, Cooldown: time.Second}, true, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redistest.StartClusterHA(t, 3, time.Second)
			var changes []string
			var changesMu sync.Mutex
			opts := store.RedisOptions{Addrs: c.Addrs(), Timeout: tc.timeout, Breaker: tc.breaker}
			opts.Breaker.OnChange = func(node string, open bool, err error) {
				changesMu.Lock()
				defer changesMu.Unlock()
				changes = append(changes, fmt.Sprintf("%s open=%v", node, open))
			}
			s := newRedis(t, opts)
			dead := c.Masters[0]
			var tenants []string
			for i := range 60 {
				tenants = append(tenants, fmt.Sprintf("{org%d}", i))
			}
			onDead := c.OnMaster(t, dead, tenants, store.RedisKeySlot)

			stop := make(chan struct{})
			results := failoverLoad(s, tenants, stop)
			time.Sleep(500 * time.Millisecond) // steady load before the kill
			killed := time.Now()
			if tc.hang {
				dead.Pause()
			} else {
				dead.Kill()
			}
			// The promotion, as a healthy master sees it (the view a slot
			// map reload gets).
			var promoted time.Time
			var successor *redistest.Server
			for deadline := time.Now().Add(30 * time.Second); successor == nil || successor == dead; {
				if time.Now().After(deadline) {
					close(stop)
					results()
					t.Fatal("no replica took over the killed master's slots within 30 s")
				}
				time.Sleep(10 * time.Millisecond) // polling the cluster's own state
				successor, _ = c.MasterForSlot(c.Masters[1], store.RedisKeySlot(onDead[0]))
				promoted = time.Now()
			}
			time.Sleep(failoverWithin + 2*time.Second)
			close(stop)
			byTenant := results()

			var healthyErrs, deadErrs, lateErrs, deadOK int
			var lastErr time.Time
			var sample error
			for _, tenant := range tenants {
				onDeadMaster := slices.Contains(onDead, tenant)
				for _, o := range byTenant[tenant] {
					switch {
					case o.err == nil:
						if onDeadMaster && o.at.After(promoted) {
							deadOK++
						}
					case !onDeadMaster:
						healthyErrs++
						sample = o.err
					default:
						deadErrs++
						if !errors.Is(o.err, store.ErrUnavailable) {
							t.Errorf("a dead master's tenant got %v, which does not wrap ErrUnavailable: its failure policy would not apply", o.err)
						}
						if o.at.After(lastErr) {
							lastErr = o.at
						}
						if o.at.After(promoted.Add(failoverWithin)) {
							lateErrs++
							sample = o.err
						}
					}
				}
			}
			changesMu.Lock()
			t.Logf("promotion seen %v after the kill; the dead master's %d tenants: %d errors, the last %v after the kill (%v after the promotion); healthy tenants' errors: %d; breakers: %v",
				promoted.Sub(killed).Round(time.Millisecond), len(onDead), deadErrs, lastErr.Sub(killed).Round(time.Millisecond),
				lastErr.Sub(promoted).Round(time.Millisecond), healthyErrs, changes)
			for _, ch := range changes {
				if !strings.HasPrefix(ch, dead.Addr()+" ") {
					t.Errorf("breaker change %q: only the dead master's breaker may open", ch)
				}
			}
			if tc.breaker.Failures > 0 && !slices.Contains(changes, dead.Addr()+" open=true") {
				t.Errorf("the dead master's breaker did not open (changes %v)", changes)
			}
			changesMu.Unlock()
			for _, b := range s.Breakers() {
				if b.Open || (b.Trips > 0 && b.Node != dead.Addr()) {
					t.Errorf("breaker %+v after the failover: want every breaker closed, only the dead master's tripped", b)
				}
			}
			if healthyErrs > 0 {
				t.Errorf("the healthy masters' tenants got %d errors (e.g. %v); want none", healthyErrs, sample)
			}
			if deadErrs == 0 {
				t.Error("the dead master's tenants got no error: was it killed?")
			}
			if lateErrs > 0 {
				t.Errorf("the dead master's tenants got %d errors more than %v after the promotion (e.g. %v)", lateErrs, failoverWithin, sample)
			}
			if deadOK == 0 {
				t.Error("no decision of the dead master's tenants succeeded after the promotion")
			}

			// No over-admission on a moved slot: 12 a hour at cost 2, from
			// two instances at once, admits exactly 6.
			// A second instance, seeded with the live nodes (a seed that
			// hangs would hold up its start: it loads the scripts).
			other := newRedis(t, store.RedisOptions{Addrs: []string{c.Masters[1].Addr(), c.Masters[2].Addr()}, Timeout: tc.timeout, Breaker: tc.breaker})
			bucket := []store.Bucket{{Key: onDead[0] + "|exact", Limit: storetest.GCRA(12, time.Hour), Cost: 2}}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					inst := s
					if i%2 == 1 {
						inst = other
					}
					d, err := inst.Decide(context.Background(), bucket)
					if err != nil {
						t.Errorf("on the promoted replica: %v", err)
					} else if d.Allowed {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			if admitted.Load() != 6 {
				t.Errorf("a limit of 12 at cost 2 on a moved slot admitted %d of 20, want exactly 6", admitted.Load())
			}
			if st, err := redistest.Do(successor.Addr(), "INFO", "commandstats"); err == nil {
				t.Logf("the promoted replica ran EVAL (a script not loaded before its first call) %v", strings.Contains(st, "cmdstat_eval:"))
			}
		})
	}
}

// TestSentinelFailover: a master, its replica and 3 Sentinels (down after
// 1 s); the master is SIGKILLed. Decisions fail (wrapping ErrUnavailable)
// until the Sentinels promote the replica, and go to the new master within
// a second of the announcement (+switch-master) with the breaker, which
// the announcement has ping the new master at once. Without it, go-redis's
// pool, which stops dialing after pool_size failed dials in a row and
// tries again once a second, is what the next decisions wait for: within
// two seconds.
func TestSentinelFailover(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breaker store.BreakerOptions
		within  time.Duration
	}{
		{"breaker", store.BreakerOptions{Failures: 3, Cooldown: time.Second}, failoverWithin},
		{"breaker off", store.BreakerOptions{}, failoverWithin + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			master := redistest.Start(t)
			replica := redistest.StartReplica(t, master)
			sentinels := redistest.StartSentinels(t, "mymaster", master, 3, time.Second)
			var addrs []string
			for _, s := range sentinels {
				addrs = append(addrs, s.Addr())
			}
			s := newRedis(t, store.RedisOptions{Addrs: addrs, MasterName: "mymaster", Timeout: 2 * time.Second, Breaker: tc.breaker})
			stop := make(chan struct{})
			results := failoverLoad(s, []string{"{a}", "{b}", "{c}"}, stop)
			time.Sleep(500 * time.Millisecond)
			killed := time.Now()
			master.Kill()
			var switched time.Time
			for deadline := time.Now().Add(30 * time.Second); ; {
				if time.Now().After(deadline) {
					close(stop)
					results()
					t.Fatal("the Sentinels did not promote the replica within 30 s")
				}
				// The first Sentinel to say so: the others hear it up to
				// 2 s later, and the store must not wait for them.
				announced := slices.ContainsFunc(sentinels, func(s *redistest.Server) bool {
					addr, err := redistest.Do(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
					return err == nil && strings.HasSuffix(addr, fmt.Sprint(replica.Port()))
				})
				if announced {
					switched = time.Now()
					break
				}
				time.Sleep(10 * time.Millisecond) // polling the Sentinels' own state
			}
			time.Sleep(tc.within + 2*time.Second)
			close(stop)
			var errs, late, okAfter int
			var first, last time.Time
			var sample, lastErr error
			for _, os := range results() {
				for _, o := range os {
					if o.err == nil {
						if o.at.After(switched) {
							okAfter++
						}
						continue
					}
					errs++
					if !errors.Is(o.err, store.ErrUnavailable) {
						t.Errorf("got %v, which does not wrap ErrUnavailable", o.err)
					}
					if first.IsZero() || o.at.Before(first) {
						first = o.at
					}
					if o.at.After(last) {
						last, lastErr = o.at, o.err
					}
					if o.at.After(switched.Add(tc.within)) {
						late++
						sample = o.err
					}
				}
			}
			t.Logf("new master announced %v after the kill; %d errors from %v to %v after the kill (%v after the announcement), the last: %v",
				switched.Sub(killed).Round(time.Millisecond), errs, first.Sub(killed).Round(time.Millisecond),
				last.Sub(killed).Round(time.Millisecond), last.Sub(switched).Round(time.Millisecond), lastErr)
			if errs == 0 {
				t.Error("no decision failed: was the master killed?")
			}
			if late > 0 {
				t.Errorf("%d errors more than %v after the new master was announced (e.g. %v)", late, tc.within, sample)
			}
			if okAfter == 0 {
				t.Error("no decision succeeded on the new master")
			}
		})
	}
}
