package cascade

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// cascadeACLCommands are the commands a Cascade user needs, as the
// documentation lists them (issue 33, finding 5). Commands that scripts
// call are checked against the user's ACL as well, so they are here too.
var cascadeACLCommands = []string{
	// connecting (go-redis: HELLO with AUTH, which every user may send,
	// and SETNAME), the breaker's probe
	"+client|setname", "+ping",
	// decisions, leases, refunds, slots, shared factors: Lua scripts
	"+evalsha", "+eval", "+script|load",
	// what the scripts call
	"+get", "+set", "+del", "+mget", "+time", "+pexpire", "+pttl",
	"+hget", "+hset", "+hdel", "+hgetall", "+incr",
	"+rpush", "+lpop", "+lindex", "+llen", "+lrange",
	"+zadd", "+zcard", "+zrem", "+zremrangebyscore",
	// runtime state (overrides, modes): a read in MULTI/EXEC, a repair
	// of its version with WATCH
	"+multi", "+exec", "+watch",
	// the fingerprint secret (SET NX), the admin API's reset of a whole
	// tree (SCAN, DEL)
	"+setnx", "+scan",
	// messages between instances (sharded on a Cluster)
	"+publish", "+subscribe", "+unsubscribe", "+spublish", "+ssubscribe", "+sunsubscribe",
	// a Cluster's topology
	"+cluster|slots", "+cluster|shards", "+readonly",
}

// cascadeACLSince72 are added on Redis 7.2 and later, which know them
// (go-redis sends CLIENT SETINFO there, and ignores an older Redis's
// error).
var cascadeACLSince72 = []string{"+client|setinfo"}

// cascadeACL is `ACL SETUSER` of a user that may use only keys and
// channels under prefix, and only the commands above.
func cascadeACL(user, password, prefix string) []string {
	return append([]string{"ACL", "SETUSER", user, "reset", "on", ">" + password,
		"resetkeys", "~" + prefix + "*", "resetchannels", "&" + prefix + "*", "-@all"}, cascadeACLCommands...)
}

// TestRedisACL runs Cascade as a Redis user with exactly the documented
// ACL: decisions on leases and in Redis, overrides and modes through the
// admin API, a reset, and a version the state's writer must repair. Any
// command, key or channel the ACL misses is a NOPERM, which Redis records
// in its ACL LOG: it must stay empty. Then the same user cannot touch a
// key outside its prefix.
func TestRedisACL(t *testing.T) {
	srv := redistest.Start(t) // its own: the ACL LOG is the server's
	prefix := fmt.Sprintf("acl%d:", testSeq.Add(1))
	if _, err := redistest.Do(srv.Addr(), cascadeACL("cascade", "s3cret-acl", prefix)...); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	if _, err := redistest.Do(srv.Addr(), append([]string{"ACL", "SETUSER", "cascade"}, cascadeACLSince72...)...); err != nil &&
		!strings.Contains(err.Error(), "Unknown command") {
		t.Fatalf("ACL SETUSER (Redis 7.2): %v", err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	aclLog := func() []string {
		entries, err := admin.ACLLog(ctx, 100).Result()
		if err != nil {
			t.Fatalf("ACL LOG: %v", err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, fmt.Sprintf("%s %s %s (%s)", e.Username, e.Reason, e.Object, e.Context))
		}
		return out
	}

	site, api := adminSite(t, fmt.Sprintf(`
		tree api {
			tier org {header.X-Org} {
				limit 1000/min sliding
				limit 50 concurrent
			}
			tier user {header.X-User} {
				limit 3/min
				limit 100 tokens/min
				sensitive
			}
		}
		cost tokens {header.X-Tokens}
		store redis {
			address %s
			username cascade
			password s3cret-acl
			key_prefix %s
			timeout 2s
			lease {
				ttl 300ms
			}
		}
`, srv.Addr(), prefix))

	// Decisions.
	alice := []string{"X-Org: acme", "X-User: alice", "X-Tokens: 1"}
	if got := admitN(t, 5, site, alice...); got != 3 {
		t.Fatalf("alice: %d of 5 admitted, want 3 (%v)", got, aclLog())
	}
	if r := do(t, "GET", site, "X-Org: acme"); r.status == http.StatusOK {
		t.Fatalf("no user: %d", r.status)
	}

	// Overrides and modes through the admin API: written with control.lua,
	// read back with MULTI/EXEC.
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/bob", `{"limits":[{"count":1,"per":"min"},{"count":100,"per":"min","dimension":"tokens"}]}`, nil); code != 200 {
		t.Fatalf("override: %d %s (%v)", code, body, aclLog())
	}
	if got := admitN(t, 3, site, "X-Org: acme", "X-User: bob", "X-Tokens: 1"); got != 1 {
		t.Fatalf("bob, overridden to 1 a minute: %d of 3 admitted", got)
	}
	if code, body := call(t, "PUT", api+"/rate_limit/mode/api", `{"mode":"shadow"}`, nil); code != 200 {
		t.Fatalf("mode: %d %s (%v)", code, body, aclLog())
	}
	if got := admitN(t, 2, site, alice...); got != 2 {
		t.Fatalf("alice in shadow mode: %d of 2 admitted", got)
	}
	if code, body := call(t, "DELETE", api+"/rate_limit/mode/api", nil, nil); code != 200 {
		t.Fatalf("mode back: %d %s", code, body)
	}
	if code, body := call(t, "POST", api+"/rate_limit/reset?tree=api&org=acme&user=alice", nil, nil); code != 200 {
		t.Fatalf("reset: %d %s (%v)", code, body, aclLog())
	}
	if got := admitN(t, 4, site, alice...); got != 3 {
		t.Fatalf("alice after the reset: %d of 4 admitted, want 3 (%v)", got, aclLog())
	}

	// A version the writer must repair: WATCH, MULTI, SET.
	if err := admin.Set(ctx, prefix+"{cascade-control}version", "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/carol", `{"unlimited":true}`, nil); code != 200 {
		t.Fatalf("override on a bad version: %d %s (%v)", code, body, aclLog())
	}
	deadline := time.Now().Add(propagation)
	for {
		v, err := admin.Get(ctx, prefix+"{cascade-control}version").Int64()
		if err == nil && v > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the version was not repaired: %v (%v)", err, aclLog())
		}
		time.Sleep(5 * time.Millisecond)
	}

	if log := aclLog(); len(log) != 0 {
		t.Fatalf("the documented ACL misses what Cascade uses:\n%s", strings.Join(log, "\n"))
	}

	// The ACL confines the user: a key outside its prefix is refused.
	user := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "cascade", Password: "s3cret-acl"})
	t.Cleanup(func() { user.Close() })
	if err := user.Set(ctx, "other:key", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("SET outside the prefix: %v, want NOPERM", err)
	}
	if err := user.Do(ctx, "FLUSHALL").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("FLUSHALL: %v, want NOPERM", err)
	}
}
