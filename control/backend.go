package control

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/lua"
)

// op is a change of one field.
type op string

const (
	opSet    op = "set"
	opDelete op = "del"
	// opPrune deletes the field only if it still holds the given value.
	opPrune op = "prune"
)

// Backend is where the runtime state is kept: fields (JSON values) and a
// version that every change increments.
type Backend interface {
	// Version returns the current version: cheap, polled.
	Version(ctx context.Context) (int64, error)
	// Load returns every field, and the version they are at.
	Load(ctx context.Context) (version int64, fields map[string][]byte, err error)
	// Change applies one operation to a field and increments the version,
	// atomically, and returns the field's old value (nil: none, or for a
	// prune, not deleted).
	Change(ctx context.Context, field string, op op, value []byte) (old []byte, err error)
}

// NewMemoryBackend returns a backend in this process: the memory store's.
func NewMemoryBackend() Backend { return &memoryBackend{fields: map[string][]byte{}} }

type memoryBackend struct {
	mu      sync.Mutex
	version int64
	fields  map[string][]byte
}

func (m *memoryBackend) Version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, nil
}

func (m *memoryBackend) Load(context.Context) (int64, map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, maps.Clone(m.fields), nil
}

func (m *memoryBackend) Change(_ context.Context, field string, o op, value []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, had := m.fields[field]
	switch o {
	case opSet:
		m.fields[field] = append([]byte(nil), value...)
	case opDelete:
		if !had {
			return nil, nil
		}
		delete(m.fields, field)
	case opPrune:
		if !had || string(old) != string(value) {
			return nil, nil
		}
		delete(m.fields, field)
	default:
		return nil, fmt.Errorf("unknown operation %q", o)
	}
	m.version++
	return old, nil
}

// NewRedisBackend returns a backend in Redis: the hash
// <keyPrefix>{cascade-control}state and the counter
// <keyPrefix>{cascade-control}version (one hash tag: one Cluster slot).
// keyPrefix is the store's ("cascade:"), without braces.
func NewRedisBackend(client redis.UniversalClient, keyPrefix string) Backend {
	return &redisBackend{client: client, state: keyPrefix + "{cascade-control}state", version: keyPrefix + "{cascade-control}version"}
}

type redisBackend struct {
	client         redis.UniversalClient
	state, version string
}

func (r *redisBackend) Version(ctx context.Context) (int64, error) {
	v, err := r.client.Get(ctx, r.version).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

func (r *redisBackend) Load(ctx context.Context) (int64, map[string][]byte, error) {
	pipe := r.client.TxPipeline()
	v := pipe.Get(ctx, r.version)
	h := pipe.HGetAll(ctx, r.state)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, err
	}
	var version int64
	if s, err := v.Result(); err == nil {
		if version, err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("version %q: %w", s, err)
		}
	}
	fields := map[string][]byte{}
	for f, val := range h.Val() {
		fields[f] = []byte(val)
	}
	return version, fields, nil
}

func (r *redisBackend) Change(ctx context.Context, field string, o op, value []byte) ([]byte, error) {
	res, err := lua.Control.Run(ctx, r.client, []string{r.state, r.version}, field, string(o), value).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s, ok := res.(string)
	if !ok {
		return nil, nil
	}
	return []byte(s), nil
}
