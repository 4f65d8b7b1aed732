package cascade

import (
	"strings"
	"testing"
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
