package cascade

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestRedisAddressErrorNamesTheTemplate: an address placeholder that
// resolves to nothing is reported by its template, so the user knows which
// variable to set.
func TestRedisAddressErrorNamesTheTemplate(t *testing.T) {
	t.Setenv("CASCADE_TEST_UNSET_REDIS_ADDR", "")
	_, err := (&RedisStoreConfig{Addresses: []string{"{env.CASCADE_TEST_UNSET_REDIS_ADDR}"}}).options(nil)
	if err == nil || !strings.Contains(err.Error(), "{env.CASCADE_TEST_UNSET_REDIS_ADDR}") {
		t.Fatalf("error %v does not name {env.CASCADE_TEST_UNSET_REDIS_ADDR}", err)
	}
}

// TestLeaseOptionsInJSON: lease options that cannot work are refused when
// the configuration loads (caddy validate), whatever wrote the JSON.
func TestLeaseOptionsInJSON(t *testing.T) {
	for _, tc := range []struct {
		lease RedisLease
		err   string
	}{
		{RedisLease{}, ""},
		{RedisLease{MaxShare: 0.5, MinRemaining: 0.1, TTL: caddy.Duration(2 * time.Second)}, ""},
		{RedisLease{MaxShare: 3}, "lease max_share must be in (0, 1], got 3"},
		{RedisLease{MinRemaining: 1}, "lease min_remaining must be in [0, 1), got 1"},
		{RedisLease{TTL: caddy.Duration(-time.Second)}, "lease ttl must not be negative"},
		{RedisLease{TTL: caddy.Duration(time.Hour)}, "lease ttl 1h0m0s is longer than a minute"},
		{RedisLease{MaxPaths: -1}, "lease max_paths must not be negative, got -1"},
	} {
		_, err := tc.lease.options(nil)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: error %v, want %q", tc.lease, err, tc.err)
		}
	}
	o, err := (&RedisLease{MaxShare: 0.2, MinRemaining: 0.01, TTL: caddy.Duration(time.Second), MaxPaths: 1000}).options(nil)
	if err != nil || o.MaxShare != 0.2 || o.MinRemaining != 0.01 || o.TTL != time.Second || o.MaxPaths != 1000 {
		t.Errorf("options: %+v, %v; want every option carried over", o, err)
	}
}
