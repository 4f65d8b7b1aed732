package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// readResponse reads a kept response and counts the read, in one round
// trip: KEYS[1] is the response, KEYS[2] its count of reads (in its slot),
// which lives as long as it.
var readResponse = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
local n = redis.call('INCR', KEYS[2])
if n == 1 then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return {v, n}
`)

// readsKey is the key of the count of reads of the response kept under k,
// in k's Cluster slot: k's hash tag, or k whole as the tag when it has none.
func readsKey(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k + "#reads"
		}
	}
	return "{" + k + "}#reads"
}

// Response implements Responses: one script (GET, and INCR of its count
// of reads) on the master that serves the key (with the store's prefix) —
// on a Cluster, the master of the key's hash tag, so a response lives
// beside its idempotency record — through that master's circuit breaker
// and within the store's Timeout. The slice returned is the caller's.
func (r *Redis) Response(ctx context.Context, key string) ([]byte, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	k := r.prefix + key
	var out []byte
	var reads int64
	err := r.guarded(k, func() error {
		v, err := readResponse.Run(ctx, r.client, []string{k, readsKey(k)}).Slice()
		if errors.Is(err, redis.Nil) {
			return nil // none kept: Redis answered
		}
		if err != nil {
			return err
		}
		if len(v) != 2 {
			return fmt.Errorf("reading a response: the script answered %d values", len(v))
		}
		data, ok1 := v[0].(string)
		n, ok2 := v[1].(int64)
		if !ok1 || !ok2 {
			return fmt.Errorf("reading a response: the script answered %T, %T", v[0], v[1])
		}
		out, reads = []byte(data), n
		return nil
	})
	if err != nil {
		return nil, 0, responseErr("response", err)
	}
	return out, reads, nil
}

// KeepResponse implements Responses: one SET of the key with a PX of ttl
// rounded up to the millisecond (at least one), as Response reaches it.
// Redis keeps the whole response (its own maxmemory policy applies); it
// is never cut to ResponseHead.
func (r *Redis) KeepResponse(ctx context.Context, key string, response []byte, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	k := r.prefix + key
	ttl = max(ttl, minResponseTTL)
	if rest := ttl % time.Millisecond; rest != 0 {
		ttl += time.Millisecond - rest
	}
	// go-redis sends PX, or EX for a whole number of seconds: the same TTL.
	err := r.guarded(k, func() error {
		_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, k, response, ttl)
			p.Del(ctx, readsKey(k)) // read from 0 again
			return nil
		})
		return err
	})
	if err != nil {
		return responseErr("keep response", err)
	}
	return nil
}

// responseErr wraps a failed call of op in ErrUnavailable, as the store's
// other calls are; an open breaker's error already is.
func responseErr(op string, err error) error {
	if errors.Is(err, ErrBreakerOpen) {
		return err
	}
	return fmt.Errorf("redis store: %s: %w: %w", op, ErrUnavailable, err)
}

// Redis keeps responses.
var _ Responses = (*Redis)(nil)
