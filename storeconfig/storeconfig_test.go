package storeconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestRedisAddressErrorNamesTheTemplate: an address placeholder that
// resolves to nothing is reported by its template, so the user knows which
// variable to set.
func TestRedisAddressErrorNamesTheTemplate(t *testing.T) {
	t.Setenv("CASCADE_TEST_UNSET_REDIS_ADDR", "")
	_, err := (&Redis{Addresses: []string{"{env.CASCADE_TEST_UNSET_REDIS_ADDR}"}}).Options(nil)
	if err == nil || !strings.Contains(err.Error(), "{env.CASCADE_TEST_UNSET_REDIS_ADDR}") {
		t.Fatalf("error %v does not name {env.CASCADE_TEST_UNSET_REDIS_ADDR}", err)
	}
}

// TestLeaseOptionsInJSON: lease options that cannot work are refused when
// the configuration loads (caddy validate), whatever wrote the JSON.
func TestLeaseOptionsInJSON(t *testing.T) {
	for _, tc := range []struct {
		lease Lease
		err   string
	}{
		{Lease{}, ""},
		{Lease{MaxShare: 0.5, MinRemaining: 0.1, TTL: caddy.Duration(2 * time.Second)}, ""},
		{Lease{MaxShare: 3}, "lease max_share must be in (0, 1], got 3"},
		{Lease{MinRemaining: 1}, "lease min_remaining must be in [0, 1), got 1"},
		{Lease{TTL: caddy.Duration(-time.Second)}, "lease ttl must not be negative"},
		{Lease{TTL: caddy.Duration(time.Hour)}, "lease ttl 1h0m0s is longer than a minute"},
		{Lease{MaxPaths: -1}, "lease max_paths must not be negative, got -1"},
	} {
		_, err := tc.lease.Options(nil)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: error %v, want %q", tc.lease, err, tc.err)
		}
	}
	o, err := (&Lease{MaxShare: 0.2, MinRemaining: 0.01, TTL: caddy.Duration(time.Second), MaxPaths: 1000}).Options(nil)
	if err != nil || o.MaxShare != 0.2 || o.MinRemaining != 0.01 || o.TTL != time.Second || o.MaxPaths != 1000 {
		t.Errorf("options: %+v, %v; want every option carried over", o, err)
	}
}

// TestBusKeyChoice: bus_secret (a placeholder resolved) keys the Pub/Sub
// messages, the same on every instance; without it the credentials do,
// when there is a password; with neither, or with insecure_bus, nothing
// does. A secret that resolves to nothing or is too short is refused by
// its template, never echoed; bus_secret with insecure_bus is refused.
func TestBusKeyChoice(t *testing.T) {
	t.Setenv("CASCADE_TEST_BUS_SECRET", "0123456789abcdef-bus")
	t.Setenv("CASCADE_TEST_BUS_SHORT", "tiny-secret")
	t.Setenv("CASCADE_TEST_BUS_UNSET", "")
	key := func(c Redis) ([]byte, string) {
		t.Helper()
		k, how, err := c.busKey()
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		return k, how
	}
	fromEnv, how := key(Redis{BusSecret: "{env.CASCADE_TEST_BUS_SECRET}"})
	literal, _ := key(Redis{BusSecret: "0123456789abcdef-bus", Password: "pw"})
	if how != "bus_secret" || len(fromEnv) != 32 || string(fromEnv) != string(literal) {
		t.Fatalf("bus_secret from the environment and literal give different keys (%s)", how)
	}
	derived, how := key(Redis{Username: "cascade", Password: "pw"})
	other, _ := key(Redis{Username: "cascade", Password: "pw2"})
	if how != "credentials" || derived == nil || string(derived) == string(other) || string(derived) == string(fromEnv) {
		t.Fatalf("the key derived from the credentials (%s): %x, %x", how, derived, other)
	}
	for _, c := range []Redis{{}, {InsecureBus: true, Password: "pw"}} {
		if k, _ := key(c); k != nil {
			t.Errorf("%+v keys the messages", c)
		}
	}
	for _, tc := range []struct {
		c    Redis
		want string
	}{
		{Redis{BusSecret: "{env.CASCADE_TEST_BUS_UNSET}"}, "bus_secret {env.CASCADE_TEST_BUS_UNSET} resolved to nothing"},
		{Redis{BusSecret: "{env.CASCADE_TEST_BUS_SHORT}"}, "bus_secret {env.CASCADE_TEST_BUS_SHORT} is 11 bytes: give at least 16"},
		{Redis{BusSecret: "tiny-secret"}, "bus_secret is 11 bytes"},
		{Redis{BusSecret: "0123456789abcdef-bus", InsecureBus: true}, "contradict"},
	} {
		_, _, err := tc.c.busKey()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.c, err, tc.want)
		} else if strings.Contains(err.Error(), "tiny-secret") || strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
}

// TestParseRedisBus: the bus options of a store redis block, and their
// errors naming the line and the fix (a short secret is not echoed).
func TestParseRedisBus(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Redis
		err  string
	}{
		{"bus_secret {env.CASCADE_BUS_SECRET}", Redis{BusSecret: "{env.CASCADE_BUS_SECRET}"}, ""},
		{"bus_secret 0123456789abcdef", Redis{BusSecret: "0123456789abcdef"}, ""},
		{"insecure_bus", Redis{InsecureBus: true}, ""},
		{"bus_secret", Redis{}, "bus_secret needs a value"},
		{"bus_secret tiny-secret", Redis{}, "bus_secret is 11 bytes: give at least 16"},
		{"bus_secret 0123456789abcdef more", Redis{}, "bus_secret takes one value"},
		{"insecure_bus yes", Redis{}, "insecure_bus takes no value"},
	} {
		d := caddyfile.NewTestDispenser(tc.in)
		d.Next()
		var got Redis
		err := parseRedisBus(d, &got)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err == "" && (got.BusSecret != tc.want.BusSecret || got.InsecureBus != tc.want.InsecureBus):
			t.Errorf("%q: %+v, want %+v", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), ":1")):
			t.Errorf("%q: error %v, want %q at line 1", tc.in, err, tc.err)
		case err != nil && strings.Contains(err.Error(), "tiny-secret"):
			t.Errorf("%q: the error shows the secret: %v", tc.in, err)
		}
	}
	d := caddyfile.NewTestDispenser("insecure_bus")
	d.Next()
	if err := parseRedisBus(d, &Redis{BusSecret: "0123456789abcdef"}); err == nil || !strings.Contains(err.Error(), "contradict") {
		t.Errorf("bus_secret with insecure_bus: %v", err)
	}
}

// TestSentinelCredentials: the Sentinels' own credentials reach the store's
// options, from the Caddyfile and placeholders, apart from Redis's.
func TestSentinelCredentials(t *testing.T) {
	t.Setenv("SENTINEL_PW", "s3cret")
	d := caddyfile.NewTestDispenser(`redis {
		master_name mymaster
		address 10.0.0.1:26379 10.0.0.2:26379
		password redis-pw
		sentinel_username watcher
		sentinel_password {env.SENTINEL_PW}
	}`)
	d.Next()
	var r Redis
	if err := ParseRedis(d, &r); err != nil {
		t.Fatal(err)
	}
	opts, err := r.Options(nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.SentinelUsername != "watcher" || opts.SentinelPassword != "s3cret" || opts.Password != "redis-pw" || opts.MasterName != "mymaster" {
		t.Fatalf("options: sentinel %q/%q, password %q, master %q", opts.SentinelUsername, opts.SentinelPassword, opts.Password, opts.MasterName)
	}
}
