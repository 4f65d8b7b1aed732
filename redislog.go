package cascade

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

func init() {
	// go-redis logs on its own (dial failures, Sentinel changes) to
	// stderr, as plain text, as often as they happen. Its logger is
	// process-wide: route it into Caddy's log.
	redis.SetLogger(new(redisLog))
}

// redisLog writes go-redis's log lines to Caddy's log (logger "redis") at
// WARN, at most one a second, with the number of lines dropped since the
// last one: a dead Redis under load must not turn every request into a
// log line.
type redisLog struct {
	last    atomic.Int64 // unix ns of the last line written
	dropped atomic.Int64
}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if now-last < int64(time.Second) || !l.last.CompareAndSwap(last, now) {
		l.dropped.Add(1)
		return
	}
	caddy.Log().Named("redis").Warn(strings.TrimSpace(fmt.Sprintf(format, v...)),
		zap.Int64("dropped", l.dropped.Swap(0)))
}
