package cascade

import (
	"context"
	"testing"
)

// TestRedisLogIsRateLimited: go-redis's log lines are written at most once
// a second, the others counted.
func TestRedisLogIsRateLimited(t *testing.T) {
	var l redisLog
	for i := 0; i < 100; i++ {
		l.Printf(context.Background(), "redis: dial %d failed", i)
	}
	if got := l.dropped.Load(); got != 99 {
		t.Fatalf("%d of 100 lines in a burst dropped, want 99 (one written)", got)
	}
}
