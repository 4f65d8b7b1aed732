package cascade

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// Attacks on the runtime state kept in Redis (issue 33, findings 5 and
// 8): whoever can write the store's keys (a co-tenant of a shared Redis,
// a stray script) writes entries no admin call would accept. Each test
// writes them with HSET/SET, as such a writer would, and checks through a
// real Caddy that requests are still limited as configured.

// trustTree is limited to 2 requests a minute per user; a user of no
// header is refused (missing deny, the default).
const trustTree = `
		tree api {
			tier user {header.X-User} {
				limit 2/min
			}
		}
`

// stateKeys are the runtime state's keys under prefix (see
// control.NewRedisBackend).
func stateKeys(prefix string) (state, version string) {
	return prefix + "{cascade-control}state", prefix + "{cascade-control}version"
}

// redisDo runs one command on the Redis at addr, failing t on an error.
func redisDo(t *testing.T, addr string, args ...string) string {
	t.Helper()
	v, err := redistest.Do(addr, args...)
	if err != nil {
		t.Fatalf("redis %s: %v", strings.Join(args, " "), err)
	}
	return v
}

// plantFields writes fields (field -> JSON) into the state hash, as a
// writer other than Cascade would, plus an override that exempts user
// "probe", valid: once probe is exempt, the instance has loaded them.
func plantFields(t *testing.T, addr, prefix string, fields map[string]string) {
	t.Helper()
	state, _ := stateKeys(prefix)
	args := []string{"HSET", state, "o\x00api\x00user\x00probe", `{"unlimited":true,"updated":"2026-01-01T00:00:00Z"}`}
	for f, v := range fields {
		args = append(args, f, v)
	}
	redisDo(t, addr, args...)
}

// plantState plants fields and bumps the version, so that every instance
// reloads the state.
func plantState(t *testing.T, addr, prefix string, fields map[string]string) {
	t.Helper()
	plantFields(t, addr, prefix, fields)
	_, version := stateKeys(prefix)
	redisDo(t, addr, "INCR", version)
}

// waitLoaded waits until user probe is exempt from its limit of 2 a
// minute: the state planted with it is in force.
func waitLoaded(t *testing.T, site string) {
	t.Helper()
	deadline := time.Now().Add(propagation)
	for ok := 0; ok <= 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the state written to Redis was not loaded within %v (user probe is still limited)", propagation)
		}
		if do(t, "GET", site, "X-User: probe").status == http.StatusOK {
			ok++
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// redisTrustSite runs a site with the admin API on trustTree (and extra
// configuration) over its own key prefix of a shared Redis.
func redisTrustSite(t *testing.T, extra string) (site, api, addr, prefix string) {
	t.Helper()
	addr = redistest.Shared(t).Addr()
	prefix = fmt.Sprintf("trust%d:", testSeq.Add(1))
	site, api = adminSite(t, trustTree+extra+fmt.Sprintf(`
		store redis {
			address %s
			key_prefix %s
			timeout 2s
		}
`, addr, prefix))
	return site, api, addr, prefix
}

// TestStateTrustBadMode: a mode "x" written into the store does not turn
// enforcement off: the tree counts as enforced, so a user over the limit
// and a request without the key are still refused.
func TestStateTrustBadMode(t *testing.T) {
	site, _, addr, prefix := redisTrustSite(t, "")
	if got := admitN(t, 3, site, "X-User: alice"); got != 2 {
		t.Fatalf("before: %d of 3 admitted, want 2", got)
	}
	plantState(t, addr, prefix, map[string]string{"m\x00api": `{"mode":"x"}`})
	waitLoaded(t, site)
	if r := do(t, "GET", site, "X-User: alice"); r.status != http.StatusTooManyRequests {
		t.Fatalf("alice over her limit after mode \"x\" was planted: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", site); r.status == http.StatusOK {
		t.Fatalf("a request without X-User after mode \"x\" was planted: %d %s", r.status, r.body)
	}
	if got := admitN(t, 3, site, "X-User: bob"); got != 2 {
		t.Fatalf("bob: %d of 3 admitted, want 2", got)
	}
}

// TestStateTrustBadOverride: overrides that no admin call would store (a
// note over 1 KiB, a null limit) are skipped, and the instance keeps
// running and limiting as configured.
func TestStateTrustBadOverride(t *testing.T) {
	site, _, addr, prefix := redisTrustSite(t, "")
	plantState(t, addr, prefix, map[string]string{
		"o\x00api\x00user\x00carol": `{"unlimited":true,"note":"` + strings.Repeat("n", 2<<10) + `"}`,
		"o\x00api\x00user\x00dave":  `{"limits":[null]}`,
		"o\x00api\x00user\x00erin":  `{"limits":[{"count":1000,"per":"min"}],"expires":"not a time"}`,
	})
	waitLoaded(t, site)
	for _, user := range []string{"carol", "dave", "erin"} {
		if got := admitN(t, 3, site, "X-User: "+user); got != 2 {
			t.Errorf("%s, whose override in the store is not valid: %d of 3 admitted, want 2 (the configured limit)", user, got)
		}
	}
}

// TestStateTrustBadVersion: a version key that is not an integer does
// not keep the state from loading (a restrictive override still
// applies), nor later changes through the admin API from being stored.
func TestStateTrustBadVersion(t *testing.T) {
	site, api, addr, prefix := redisTrustSite(t, "")
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/frank", `{"limits":[{"count":5,"per":"min"}]}`, nil); code != 200 {
		t.Fatalf("an override before the attack: %d %s", code, body)
	}
	// A restrictive override, then a version that is not one: the
	// instances must still load the override.
	plantFields(t, addr, prefix, map[string]string{
		"o\x00api\x00user\x00gina": `{"limits":[{"count":1,"per":"min"}]}`,
	})
	_, version := stateKeys(prefix)
	redisDo(t, addr, "SET", version, "garbage")
	waitLoaded(t, site)
	if got := admitN(t, 3, site, "X-User: gina"); got != 1 {
		t.Fatalf("gina, restricted to 1 a minute by an override in the store: %d of 3 admitted", got)
	}
	if v := redisDo(t, addr, "GET", version); strings.Trim(v, "0123456789") != "" {
		t.Fatalf("the version was not repaired: %q", v)
	}
	if code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/hal", `{"limits":[{"count":1,"per":"min"}]}`, nil); code != 200 {
		t.Fatalf("an override after the attack: %d %s", code, body)
	}
	if got := admitN(t, 3, site, "X-User: hal"); got != 1 {
		t.Fatalf("hal, restricted to 1 a minute through the admin API: %d of 3 admitted", got)
	}
}

// tokensTree limits each user to 2 requests and 10 tokens a minute; a
// request costs its X-Tokens.
const tokensTree = `
		tree api {
			tier user {header.X-User} {
				limit 2/min
				limit 10 tokens/min
			}
		}
		cost tokens {header.X-Tokens}
`

// TestOverrideKeepsDimensions: an override that names only a requests
// limit must not lift the tier's tokens limit. Through the admin API it
// is refused (400, naming tokens) unless it says "replace": true; written
// into the store directly, it is skipped.
func TestOverrideKeepsDimensions(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	prefix := fmt.Sprintf("dims%d:", testSeq.Add(1))
	site, api := adminSite(t, tokensTree+fmt.Sprintf(`
		store redis {
			address %s
			key_prefix %s
			timeout 2s
		}
`, addr, prefix))
	tokens := func(user string, n int) int {
		return admitN(t, n, site, "X-User: "+user, "X-Tokens: 6")
	}

	code, body := call(t, "PUT", api+"/rate_limit/overrides/api/user/alice", `{"limits":[{"count":1000,"per":"min"}],"note":"more requests"}`, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "tokens") {
		t.Fatalf("an override naming only requests: %d %s, want 400 naming tokens", code, body)
	}
	if got := tokens("alice", 2); got != 1 {
		t.Fatalf("alice, 6 tokens twice against 10 a minute: %d of 2 admitted", got)
	}

	// Written into the store by something other than the admin API.
	plantState(t, addr, prefix, map[string]string{
		"o\x00api\x00user\x00bob":  `{"limits":[{"count":1000,"per":"min"}]}`,
		"o\x00api\x00user\x00carl": `{"limits":[{"count":1000,"per":"min"}],"replace":true}`,
	})
	waitLoaded(t, site)
	if got := tokens("bob", 2); got != 1 {
		t.Errorf("bob, whose override in the store names only requests: %d of 2 admitted, want 1 (the tokens limit holds)", got)
	}
	if got := tokens("carl", 3); got != 3 {
		t.Errorf("carl, whose override in the store says replace: %d of 3 admitted, want 3", got)
	}

	code, body = call(t, "PUT", api+"/rate_limit/overrides/api/user/dora", `{"limits":[{"count":1000,"per":"min"}],"replace":true}`, nil)
	if code != 200 {
		t.Fatalf("an override naming only requests, with replace: %d %s", code, body)
	}
	if got := tokens("dora", 3); got != 3 {
		t.Fatalf("dora, replaced through the admin API: %d of 3 admitted, want 3", got)
	}
}
