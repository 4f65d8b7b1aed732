package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/lua"
)

// Backend is where the runtime state is kept: a set of fields, each
// holding one JSON document, and a version that every change increments.
// A Runtime reads and writes it; callers only choose one.
//
// Every change is atomic with its version increment, so a reader that
// saw version v and later sees v again has missed no change. A change
// that changes nothing (deleting a field that is not there) does not
// increment the version.
type Backend interface {
	// Version returns the current version. It is polled, so it must be
	// cheap: one GET in Redis.
	Version(ctx context.Context) (int64, error)
	// Load returns every field and the version they are at, read
	// atomically. The caller may keep the map but not modify it.
	Load(ctx context.Context) (version int64, fields map[string][]byte, err error)
	// Set sets field to value and returns the value it replaced (nil
	// when none).
	Set(ctx context.Context, field string, value []byte) (old []byte, err error)
	// Delete deletes field and returns its value (nil when there was
	// none, and then nothing changed).
	Delete(ctx context.Context, field string) (old []byte, err error)
	// DeleteIf deletes field only if it still holds value, and reports
	// whether it did: it removes an expired entry without ever removing
	// the newer entry that replaced it.
	DeleteIf(ctx context.Context, field string, value []byte) (deleted bool, err error)
}

// NewMemoryBackend returns a backend in the process's memory, for the
// memory store: the state survives configuration reloads for as long as
// the backend (or the Runtime holding it) is kept, and is lost when the
// process ends.
func NewMemoryBackend() Backend { return &memoryBackend{fields: map[string][]byte{}} }

type memoryBackend struct {
	mu      sync.Mutex
	version int64
	// fields is copied on write: Load hands out the map itself, which is
	// then never modified.
	fields map[string][]byte
}

func (m *memoryBackend) Version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, nil
}

func (m *memoryBackend) Load(context.Context) (int64, map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, m.fields, nil
}

// change replaces the fields with a copy changed by fn, and increments
// the version. The caller holds m.mu.
func (m *memoryBackend) change(fn func(map[string][]byte)) {
	fields := maps.Clone(m.fields)
	fn(fields)
	m.fields = fields
	m.version++
}

func (m *memoryBackend) Set(_ context.Context, field string, value []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.fields[field]
	value = bytes.Clone(value)
	m.change(func(f map[string][]byte) { f[field] = value })
	return old, nil
}

func (m *memoryBackend) Delete(_ context.Context, field string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.fields[field]
	if !ok {
		return nil, nil
	}
	m.change(func(f map[string][]byte) { delete(f, field) })
	return old, nil
}

func (m *memoryBackend) DeleteIf(_ context.Context, field string, value []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.fields[field]
	if !ok || !bytes.Equal(old, value) {
		return false, nil
	}
	m.change(func(f map[string][]byte) { delete(f, field) })
	return true, nil
}

// NewRedisBackend returns a backend in Redis, shared by every instance
// using that Redis with the same keyPrefix (the store's, such as
// "cascade:"; it must not contain braces). It keeps two keys:
//
//	<keyPrefix>{cascade-control}state    a hash: field -> JSON document
//	<keyPrefix>{cascade-control}version  an integer, incremented by every change
//
// Both carry the hash tag {cascade-control}, so they sit in one slot and
// one script changes both atomically, on a Cluster too. Neither has a TTL:
// they are configuration, not counters, and stay until deleted. Changes
// run lua/control.lua with EVALSHA, falling back to EVAL when Redis lost
// its script cache.
//
// client is any go-redis client: standalone, Sentinel (failover) or
// Cluster. The Runtime never closes it.
func NewRedisBackend(client redis.UniversalClient, keyPrefix string) Backend {
	return &redisBackend{
		client:  client,
		state:   keyPrefix + "{cascade-control}state",
		version: keyPrefix + "{cascade-control}version",
	}
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
	// MULTI/EXEC: the version and the hash of one moment (both keys are
	// in one slot, as a transaction on a Cluster requires).
	pipe := r.client.TxPipeline()
	v := pipe.Get(ctx, r.version)
	h := pipe.HGetAll(ctx, r.state)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, err
	}
	var version int64
	if s, err := v.Result(); err == nil {
		if version, err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("%s holds %q, not a version", r.version, s)
		}
	}
	fields := make(map[string][]byte, len(h.Val()))
	for f, val := range h.Val() {
		fields[f] = []byte(val)
	}
	return version, fields, nil
}

// run runs control.lua: op on field, with value for set and prune. It
// returns the field's old value, nil when it had none (or, for a prune,
// was not deleted).
func (r *redisBackend) run(ctx context.Context, field, op string, value []byte) ([]byte, error) {
	res, err := lua.Control.Run(ctx, r.client, []string{r.state, r.version}, field, op, value).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s, ok := res.(string)
	if !ok {
		return nil, fmt.Errorf("control.lua returned %T, not the old value", res)
	}
	return []byte(s), nil
}

func (r *redisBackend) Set(ctx context.Context, field string, value []byte) ([]byte, error) {
	return r.run(ctx, field, "set", value)
}

func (r *redisBackend) Delete(ctx context.Context, field string) ([]byte, error) {
	return r.run(ctx, field, "del", nil)
}

func (r *redisBackend) DeleteIf(ctx context.Context, field string, value []byte) (bool, error) {
	old, err := r.run(ctx, field, "prune", value)
	return old != nil, err
}
