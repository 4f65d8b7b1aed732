package entitle

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis is a Source that reads each value's entry from a Redis hash: field
// plan is the plan, field limits a JSON array of limits, and every field
// but limits is one of the Fields. A missing (or empty) hash is a negative
// answer.
type Redis struct {
	client   redis.UniversalClient
	template string
}

// NewRedis returns a Source reading the hash whose key is keyTemplate with
// {value} replaced by the value, as is ("billing:org:{value}"). The
// client stays its maker's: Close does not close it.
func NewRedis(client redis.UniversalClient, keyTemplate string) (*Redis, error) {
	if client == nil {
		return nil, errors.New("entitle: redis source without a client")
	}
	if !strings.Contains(keyTemplate, valuePlaceholder) {
		return nil, fmt.Errorf("entitle: redis key template %q: say where the value goes with %s, as in \"billing:org:%s\"",
			keyTemplate, valuePlaceholder, valuePlaceholder)
	}
	return &Redis{client: client, template: keyTemplate}, nil
}

// Lookup reads value's hash with HGETALL.
func (r *Redis) Lookup(ctx context.Context, value string) (Entitlement, bool, error) {
	key := strings.ReplaceAll(r.template, valuePlaceholder, value)
	hash, err := r.client.HGetAll(ctx, key).Result()
	if err != nil {
		return Entitlement{}, false, fmt.Errorf("entitle: redis HGETALL %s: %w", r.template, err) // the template: a value may be a secret
	}
	if len(hash) == 0 {
		return Entitlement{}, false, nil
	}
	e := Entitlement{Plan: hash["plan"], Fields: hash}
	if raw, ok := hash["limits"]; ok {
		if e.Limits, err = parseLimits([]byte(raw)); err != nil {
			return Entitlement{}, false, fmt.Errorf("entitle: redis %s: field limits: %w", r.template, err)
		}
		delete(hash, "limits")
	}
	return e, true, nil
}

// Close does nothing: the client belongs to whoever made it.
func (r *Redis) Close() error { return nil }
