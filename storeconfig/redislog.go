package storeconfig

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/logsample"
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
	every logsample.Every
}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	ok, dropped := l.every.Allow(time.Now())
	if !ok {
		return
	}
	caddy.Log().Named("redis").Warn(strings.TrimSpace(fmt.Sprintf(format, v...)),
		zap.Int64("dropped", dropped))
}
