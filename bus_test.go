package cascade

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// TestBusSecretDropsForgedReset is the attack through a real Caddy and a
// real Redis: a store with bus_secret (from the environment) and leases;
// a process that may PUBLISH on the Redis, without the secret, sends a
// reset of the tenant's buckets on the lease channel, and the catastrophic
// glob of finding 4. Neither is taken (no peer reset; the store's Bus
// counts both as unauthenticated), and the Caddy still decides.
func TestBusSecretDropsForgedReset(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	prefix := fmt.Sprintf("busattack%x:", rand.Uint32())
	t.Setenv("CASCADE_TEST_BUS_SECRET", "a-secret-of-at-least-16-bytes")
	port := freePort(t)
	cf := globalOptions("") + fmt.Sprintf(`
:%d {
	rate_limit {
		tree api {
			tier org {header.X-Org} {
				limit 1000/min
			}
		}
		store redis {
			address %s
			key_prefix %s
			timeout 2s
			lease
		}
	}
	respond "ok"
}`, port, addr, prefix)
	cfg, err := adapt(t, cf)
	if err != nil {
		t.Fatal(err)
	}
	// bus_secret in the JSON (the Caddyfile option parses into the same field).
	json := strings.Replace(string(cfg), `"key_prefix":`, `"bus_secret":"{env.CASCADE_TEST_BUS_SECRET}","key_prefix":`, 1)
	if json == string(cfg) {
		t.Fatalf("no redis store in %s", cfg)
	}
	if err := caddy.Load([]byte(json), true); err != nil {
		t.Fatalf("loading config: %v\n%s", err, json)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	site := fmt.Sprintf("http://127.0.0.1:%d/", port)
	for range 5 {
		if r := do(t, "GET", site, "X-Org: acme"); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	var p storeconfig.Pooled
	storeconfig.Each(func(key string, sp storeconfig.Pooled) bool {
		if strings.Contains(key, prefix) {
			p = sp
			return false
		}
		return true
	})
	if p.Redis == nil || p.Lease == nil {
		t.Fatal("the redis store with leases is not in the pool")
	}
	forged := []string{
		`{"f":"attacker","glob":"{api|*}org=acme[#/]*"}`,
		`{"f":"attacker","glob":"` + strings.Repeat("*a", 40) + `*b"}`,
	}
	// The Bus subscribes in the background: publish until it has heard.
	deadline := time.Now().Add(propagation)
	for p.Redis.BusStats().Unauthenticated < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the forged messages were not counted within %v: %+v", propagation, p.Redis.BusStats())
		}
		for _, m := range forged {
			if _, err := redistest.Do(addr, "PUBLISH", prefix+"leases", m); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not timing behaviour
	}
	if st := p.Lease.Stats(); st.PeerResets != 0 {
		t.Fatalf("a forged reset was taken: %+v", st)
	}
	if r := do(t, "GET", site, "X-Org: acme"); r.status != 200 {
		t.Fatalf("status %d after the attack", r.status)
	}
}
