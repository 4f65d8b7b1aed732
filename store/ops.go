package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/rate"
)

// The operations of an operator on a store in use: reading buckets without
// charging them, and resetting them. They are not on the request path.

// Peek returns what Decide would answer for buckets now, and charges
// nothing: every bucket's verdict on its cost, with Remaining the bucket's
// level before the charge (as on a denial), Reset the time until it is
// full, or would be after the charge if it admits it, and RetryAfter the
// wait its cost needs (0 when it admits it now).
//
// It decides with a bucket added that can never admit (dryRun): all or
// nothing then guarantees that no bucket is written, on either store, with
// the very arithmetic of a decision. Buckets of different hash tags are
// peeked one tag at a time, so that on a Redis Cluster every slot reports
// (a path across slots is decided slot after slot, and a denial stops it).
// The returned Decision is Combine's of the real buckets' results.
func Peek(ctx context.Context, s Store, buckets []Bucket) (Decision, error) {
	results := make([]rate.Result, len(buckets))
	var at int64
	done := make([]bool, len(buckets))
	for i := range buckets {
		if done[i] {
			continue
		}
		tag := hashTag(buckets[i].Key)
		var group []Bucket
		var idx []int
		for j := i; j < len(buckets); j++ {
			if !done[j] && hashTag(buckets[j].Key) == tag {
				group = append(group, buckets[j])
				idx = append(idx, j)
				done[j] = true
			}
		}
		group = append(group, dryRun(buckets[i]))
		d, err := s.Decide(ctx, group)
		if err != nil {
			return Decision{}, fmt.Errorf("peeking: %w", err)
		}
		if d.Allowed || len(d.Results) != len(group) {
			return Decision{}, fmt.Errorf("peeking: the dry-run bucket of %q was admitted: the store charged this path", tag)
		}
		for k, j := range idx {
			results[j] = d.Results[k]
		}
		at = d.At
	}
	d := Combine(results)
	d.At = at
	return d, nil
}

// hashTag is the part of key up to its first '}' (the "{tree|tenant}" of
// package hierarchy's keys), or the whole key when it has none.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '}'); i >= 0 {
		return key[:i+1]
	}
	return key
}

// KeyMatch selects the stored buckets of a subtree, for ResetMatching.
// Glob is a Redis SCAN pattern over the keys as package hierarchy writes
// them (without the Redis store's prefix), and Match the same selection as
// a function, for the memory store. The two must agree.
type KeyMatch struct {
	Glob  string
	Match func(key string) bool
}

// Resetter is implemented by both stores: it deletes buckets' state, so
// that they are full again.
type Resetter interface {
	// Reset deletes the state of the buckets with the given keys and
	// returns how many had state (a full bucket has none).
	Reset(ctx context.Context, keys []string) (int, error)
	// ResetMatching deletes the state of every bucket that m selects and
	// returns how many there were. It enumerates the store: the memory
	// store's every entry, Redis's keyspace with SCAN (every master of a
	// Cluster).
	ResetMatching(ctx context.Context, m KeyMatch) (int, error)
}

var (
	_ Resetter = (*Memory)(nil)
	_ Resetter = (*Redis)(nil)
)

// Reset implements Resetter.
func (m *Memory) Reset(_ context.Context, keys []string) (int, error) {
	now := m.clock()
	n := 0
	for _, key := range keys {
		h := maphash.String(m.seed, key)
		sh := &m.shards[shardOf(h)]
		sh.mu.Lock()
		if _, live := m.remove(sh, h, func(k string) bool { return k == key }, now); live {
			n++
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// ResetMatching implements Resetter.
func (m *Memory) ResetMatching(_ context.Context, match KeyMatch) (int, error) {
	now := m.clock()
	n := 0
	// The stored keys are the arena's memory, reused once their bucket
	// goes: Match, the caller's, sees copies it may keep (an operator's
	// reset, not a request's path).
	selected := func(k string) bool { return match.Match(strings.Clone(k)) }
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for h := range sh.index.all() {
			for {
				removed, live := m.remove(sh, h, selected, now)
				if !removed {
					break
				}
				if live {
					n++
				}
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// remove deletes the first bucket chained at hash whose key is selected,
// and reports whether it found one and whether that was live (an expired
// bucket is deleted too, but was as good as full). The caller holds the
// shard's lock.
func (m *Memory) remove(sh *memoryShard, hash uint64, selected func(string) bool, now int64) (removed, live bool) {
	prev := noBlock
	at, _ := sh.index.get(hash) // noBlock if none
	for ; at != noBlock; prev, at = at, sh.at(at).next {
		if !selected(sh.at(at).key()) {
			continue
		}
		live = sh.at(at).expires > now
		sh.unlink(at, prev)
		m.count.Add(-1)
		return true, live
	}
	return false, false
}

// Reset implements Resetter: it deletes each key and its exact sliding
// window's log, one DEL each (on a Cluster, keys of one call may live in
// different slots).
func (r *Redis) Reset(ctx context.Context, keys []string) (int, error) {
	if r.onReset != nil {
		defer r.onReset(keys, "")
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	pipe := r.client.Pipeline()
	dels := make([]*redis.IntCmd, len(keys))
	for i, key := range keys {
		k := r.prefix + key
		dels[i] = pipe.Del(ctx, k)
		pipe.Del(ctx, logKey(k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("redis store: reset: %w: %w", ErrUnavailable, err)
	}
	n := 0
	for _, c := range dels {
		n += int(c.Val())
	}
	return n, nil
}

// ResetMatching implements Resetter: SCAN with m.Glob on the server (every
// master of a Cluster), deleting what it finds, logs included.
func (r *Redis) ResetMatching(ctx context.Context, m KeyMatch) (int, error) {
	if r.onReset != nil {
		defer r.onReset(nil, m.Glob)
	}
	pattern := globEscape(r.prefix) + m.Glob
	var total atomic.Int64
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				if strings.Contains(k, ResponseKeySuffix) {
					continue // a kept response (or its count of reads), not limit state
				}
				// One DEL per key: on a Cluster, SCAN's keys span slots.
				n, err := c.Del(ctx, k).Result()
				if err != nil {
					return err
				}
				if !strings.HasSuffix(k, logKeySuffix) {
					total.Add(n)
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if r.cluster != nil {
		err = r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, r.client)
	}
	if err != nil {
		return int(total.Load()), fmt.Errorf("redis store: reset: %w: %w", ErrUnavailable, err)
	}
	return int(total.Load()), nil
}

// globEscape escapes the characters special to Redis glob patterns.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		switch c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}
