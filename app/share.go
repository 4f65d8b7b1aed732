package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/lua"
)

// redisPublisher shares the adaptive factor of Caddy instances through
// Redis (adaptive.Publisher): each instance publishes its local factor,
// stamped with Redis TIME, into one hash, and reads back the minimum of the
// fresh ones, so instances that share limits also share one factor, set by
// the most stressed instance. Entries of instances that stopped publishing
// expire after maxAge.
type redisPublisher struct {
	client redis.UniversalClient
	key    string
	id     string
	maxAge time.Duration
}

func newRedisPublisher(client redis.UniversalClient, prefix string, maxAge time.Duration) *redisPublisher {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &redisPublisher{
		client: client,
		key:    prefix + "adaptive-factor",
		id:     fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		maxAge: maxAge,
	}
}

// Publish implements adaptive.Publisher.
func (p *redisPublisher) Publish(ctx context.Context, local float64) error {
	_, err := p.run(ctx, strconv.FormatFloat(local, 'g', -1, 64))
	return err
}

// Fetch implements adaptive.Publisher. With no fresh factor it returns 1:
// nobody asks for less.
func (p *redisPublisher) Fetch(ctx context.Context) (float64, error) {
	s, err := p.run(ctx, "")
	if err != nil || s == "" {
		return 1, err
	}
	return strconv.ParseFloat(s, 64)
}

func (p *redisPublisher) run(ctx context.Context, local string) (string, error) {
	res, err := lua.Factor.Run(ctx, p.client, []string{p.key}, p.id, local, p.maxAge.Microseconds()).Text()
	if err != nil && err != redis.Nil {
		return "", fmt.Errorf("sharing the adaptive factor through redis: %w", err)
	}
	return res, nil
}
