package cascade

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestChargeOn: with charge_on status 401, only failed logins count, on
// the memory store and on Redis. Successful ones are admitted and given
// back their charge before their response leaves (the next request sees
// it); failed ones are charged; once the limit is spent every request is
// refused up front, whatever it would have answered.
func TestChargeOn(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	route {
		rate_limit {
			tree logins {
				tier everyone all {
					limit 5/h sliding
				}
				tier user {header.X-User} {
					limit 3/h
				}
			}
			charge_on status 401
			%s
		}
		@bad header X-Password wrong
		respond @bad "no" 401
		@gone header X-Password gone
		error @gone "gone" 410
		respond "welcome remaining={http.rate_limit.remaining}" 200
	}
}
`, port, storeBlock))
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		for i := range 10 {
			r := do(t, "GET", url, "X-User: ann", "X-Password: right")
			if r.status != 200 || r.header.Get("RateLimit") != `"user";r=2;t=1200` {
				t.Fatalf("successful login %d: %d, RateLimit %q (want 200, and the charge given back each time)", i, r.status, r.header.Get("RateLimit"))
			}
		}
		// An error answered after the handlers (status 410) does not count.
		if r := do(t, "GET", url, "X-User: ann", "X-Password: gone"); r.status != 410 {
			t.Fatalf("an error: %d", r.status)
		}
		for i := range 3 {
			if r := do(t, "GET", url, "X-User: ann", "X-Password: wrong"); r.status != 401 {
				t.Fatalf("failed login %d: %d", i, r.status)
			}
		}
		for _, pw := range []string{"wrong", "right"} {
			if r := do(t, "GET", url, "X-User: ann", "X-Password: "+pw); r.status != http.StatusTooManyRequests {
				t.Fatalf("after 3 failures, password %s: %d, want 429", pw, r.status)
			}
		}
		// The shared sliding window (5/h) counted only the 3 failures
		// (each success and the error gave back its entry): another user
		// has two failures left before everyone is refused.
		for i := range 2 {
			if r := do(t, "GET", url, "X-User: bob", "X-Password: wrong"); r.status != 401 {
				t.Fatalf("bob's failure %d: %d", i, r.status)
			}
		}
		r := do(t, "GET", url, "X-User: carol", "X-Password: right")
		if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "everyone") {
			t.Fatalf("after 5 failures in all: %d %s, want 429 from the everyone tier", r.status, r.body)
		}
	})
}

// TestChargeOnErrors: charge_on's configuration errors name the fix.
func TestChargeOnErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"no matcher", "charge_on", "usage: charge_on status <code...>"},
		{"bad status", "charge_on status forty", "bad status value 'forty'"},
		{"twice", "charge_on status 401\n charge_on status 403", "charge_on given twice"},
		{"out of range", "charge_on status 999", "charge_on status 999: use a status code (100-599) or a class (4xx)"},
		{"with forwarded", "charge_on status 401\n forwarded", "charge_on needs the response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := configError(t, "", tc.body); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestChargeOnCaddyfile: both forms become reverse_proxy's response
// matcher in JSON.
func TestChargeOnCaddyfile(t *testing.T) {
	for body, want := range map[string]string{
		"charge_on status 401 403":                             `"charge_on":{"status_code":[401,403]}`,
		"charge_on {\n status 4xx\n header X-Login failed\n }": `"charge_on":{"headers":{"X-Login":["failed"]},"status_code":[4]}`,
	} {
		cfg, err := adapt(t, globalOptions("")+"http://127.0.0.1:1 {\n rate_limit {\n tree t {\n tier k fixed {\n limit 1/s\n }\n }\n "+body+"\n }\n}")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(cfg), want) {
			t.Fatalf("%q: %s\nwant %s", body, cfg, want)
		}
		if err := caddy.Validate(mustConfig(t, cfg)); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
	}
}

// configError adapts and validates a site whose rate_limit has one tree
// (tier k fixed: limit 1/s, then tier's lines) and the handler's lines,
// and returns the error (nil: the config is good). The tier's lines are on
// line 13 of the Caddyfile, after the global options.
func configError(t *testing.T, tier, handler string) error {
	t.Helper()
	cfg, err := adapt(t, globalOptions("")+"http://127.0.0.1:1 {\n rate_limit {\n tree t {\n tier k fixed {\n limit 1/s\n "+tier+"\n }\n }\n "+handler+"\n }\n}")
	if err == nil {
		err = caddy.Validate(mustConfig(t, cfg))
	}
	return err
}
