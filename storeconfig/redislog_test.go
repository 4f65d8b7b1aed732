package storeconfig

import (
	"context"
	"testing"
	"time"
)

// TestRedisLogIsRateLimited: go-redis's log lines are written at most once
// a second, the others counted.
func TestRedisLogIsRateLimited(t *testing.T) {
	var l redisLog
	for i := 0; i < 100; i++ {
		l.Printf(context.Background(), "redis: dial %d failed", i)
	}
	// The next line let through reports the 99 held back.
	if ok, held := l.every.Allow(time.Now().Add(time.Second)); !ok || held != 99 {
		t.Fatalf("a second after a burst of 100 lines: %v, %d dropped; want 99 (one written)", ok, held)
	}
}
