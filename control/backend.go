package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

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

// maxVersion is the largest valid version: far below where INCR
// overflows, far above what changes reach.
const maxVersion = 1 << 62

// BadVersionError is the error of a backend whose version is not a
// version (not an integer from 0 to 2^62): written by something other
// than Cascade. The Runtime repairs it (see versionRepairer) and loads
// the state regardless.
type BadVersionError struct {
	Key   string // the version's key
	Value string // what it holds, clipped
}

func (e *BadVersionError) Error() string {
	return fmt.Sprintf("%s holds %q, not a version (an integer from 0 to 2^62)", e.Key, e.Value)
}

// versionRepairer is a Backend whose version can be found not valid
// (*BadVersionError), and repaired.
type versionRepairer interface {
	// RepairVersion replaces a version that is not valid with a fresh one
	// that no instance has seen, so that every instance reloads the
	// state, and returns it. A version found valid is returned unchanged.
	RepairVersion(ctx context.Context) (int64, error)
}

// freshVersion is the version a repair sets: the time in microseconds,
// above any count of changes (so no instance has seen it, and each
// instance reloads the state), below maxVersion for millennia.
func freshVersion() int64 { return max(time.Now().UnixMicro(), 1) }

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
	s, err := r.client.Get(ctx, r.version).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return r.parseVersion(s)
}

// parseVersion reads the version key's value: an integer from 0 to
// maxVersion, else a *BadVersionError.
func (r *redisBackend) parseVersion(s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > maxVersion {
		return 0, &BadVersionError{Key: r.version, Value: clip(s)}
	}
	return v, nil
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
	fields := make(map[string][]byte, len(h.Val()))
	for f, val := range h.Val() {
		fields[f] = []byte(val)
	}
	var version int64
	if s, err := v.Result(); err == nil {
		if version, err = r.parseVersion(s); err != nil {
			return 0, fields, err
		}
	}
	return version, fields, nil
}

// RepairVersion replaces a version key that is not a valid version with
// a fresh one and returns it; a valid version, found meanwhile, is left
// as it is and returned. See versionRepairer.
func (r *redisBackend) RepairVersion(ctx context.Context) (int64, error) {
	var version int64
	// WATCH/MULTI: of two instances repairing at once, one sets the
	// version and the other finds it valid, so the version is set once.
	err := r.client.Watch(ctx, func(tx *redis.Tx) error {
		s, err := tx.Get(ctx, r.version).Result()
		if errors.Is(err, redis.Nil) {
			return nil // deleted meanwhile: version 0, as Version says
		}
		if err != nil {
			return err
		}
		if version, err = r.parseVersion(s); err == nil {
			return nil
		}
		version = freshVersion()
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, r.version, version, 0)
			return nil
		})
		return err
	}, r.version)
	if err != nil {
		return 0, fmt.Errorf("resetting %s: %w", r.version, err)
	}
	return version, nil
}

// run runs control.lua: op on field, with value for set and prune. It
// returns the field's old value, nil when it had none (or, for a prune,
// was not deleted).
func (r *redisBackend) run(ctx context.Context, field, op string, value []byte) ([]byte, error) {
	res, err := lua.Control.Run(ctx, r.client, []string{r.state, r.version}, field, op, value).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil && (strings.Contains(err.Error(), "value is not an integer") || strings.Contains(err.Error(), "would overflow")) {
		// control.lua's INCR of a version that is not one, or at the top
		// of int64 (the field may be written already). Another instance
		// may have repaired it by the time this one looks.
		return nil, &BadVersionError{Key: r.version, Value: "(not a version INCR can increment)"}
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
