package cascade

import (
	"fmt"
	"testing"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestMain stops the Redis processes shared by this package's tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// redisStore runs a scenario on a real redis-server, started once per test
// binary; each scenario gets its own key prefix.
func redisStore() storeKind {
	return storeKind{"redis", func(t *testing.T) string {
		srv := redistest.Shared(t)
		// The tests run on both stores check what is decided, not how fast:
		// a 2 s timeout rides out a CI machine busy with -race (the
		// default's 250 ms was once exceeded there, and a 503 is not a
		// decision).
		return fmt.Sprintf("store redis {\n address %s\n key_prefix t%d:\n timeout 2s\n }", srv.Addr(), testSeq.Add(1))
	}}
}

func TestRedisExample(t *testing.T) {
	srv := redistest.Start(t) // its own server: the example uses the default key prefix
	t.Setenv("REDIS_ADDR", srv.Addr())
	exerciseQuickstart(t, runExample(t, "examples/redis/Caddyfile"))
}
