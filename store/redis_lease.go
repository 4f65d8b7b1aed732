package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// Lease implements Leaser: one lua.Lease call, sent on its own (leases are
// rare: the point of one is that the requests it covers ask nothing).
func (r *Redis) Lease(ctx context.Context, g Grant) (Leased, error) {
	if err := checkGrant(g); err != nil {
		return Leased{}, err
	}
	if r.cluster != nil {
		// One script touches one slot: a path across slots is decided
		// slot by slot (Decide), and so is not leased.
		slot := RedisKeySlot(r.prefix + g.Buckets[0].Key)
		for _, b := range g.Buckets[1:] {
			if RedisKeySlot(r.prefix+b.Key) != slot {
				return Leased{}, ErrNotLeasable
			}
		}
		for _, rel := range g.Release {
			if RedisKeySlot(r.prefix+rel.Key) != slot {
				return Leased{}, fmt.Errorf("lease: a release in another slot than its grant: %w", ErrNotLeasable)
			}
		}
	}
	if err := r.breaker.allow(); err != nil {
		return Leased{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now, wall := r.now()
	keys, _, spec := r.encode(g.Buckets, now, wall, false)
	grant := make([]byte, 0, len(spec)+24)
	grant = append(grant, spec[:8]...)
	grant = appendFloat(grant, g.Want)
	grant = appendFloat64(grant, g.MaxShare)
	grant = appendFloat64(grant, g.MinRemaining)
	grant = appendFloat(grant, g.Hold.Microseconds())
	grant = append(grant, spec[8:]...)
	relKeys, rel := r.encodeReleases(g.Release, now, wall)
	reply, err := lua.Lease.Run(ctx, r.client, append(keys, relKeys...), grant, rel).Text()
	r.breaker.record(err)
	if err != nil {
		return Leased{}, fmt.Errorf("redis store: lease: %w: %w", ErrUnavailable, err)
	}
	n := len(g.Buckets)
	if len(reply) != 56*n+16 {
		return Leased{}, fmt.Errorf("redis store: lease script returned %d bytes for %d buckets: %w", len(reply), n, ErrUnavailable)
	}
	float := func(off int) float64 {
		return math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[off : off+8])))
	}
	results := make([]rate.Result, n)
	out := Leased{Levels: make([]float64, n)}
	for i := range results {
		o := 56 * i
		results[i] = rate.Result{
			Allowed:    float(o) == 1,
			Impossible: float(o+8) == 1,
			Remaining:  int64(float(o + 16)),
			Before:     int64(float(o + 24)),
			RetryAfter: int64(float(o + 32)),
			Reset:      int64(float(o + 40)),
		}
		out.Levels[i] = float(o + 48)
	}
	out.Decision = Combine(results)
	out.Extra = int64(float(56 * n))
	out.At = int64(float(56*n + 8))
	return out, nil
}

// Release implements Leaser: one lua.Lease call per Cluster slot.
func (r *Redis) Release(ctx context.Context, rels []Release) error {
	if len(rels) == 0 {
		return nil
	}
	if err := r.breaker.allow(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now, wall := r.now()
	run := func(part []Release) error {
		keys, rel := r.encodeReleases(part, now, wall)
		// A grant of no buckets: the clock and four unused numbers.
		grant := appendFloat(make([]byte, 0, 40), now)
		grant = append(grant, make([]byte, 32)...)
		return lua.Lease.Run(ctx, r.client, keys, grant, rel).Err()
	}
	var err error
	if r.cluster == nil {
		err = run(rels)
	} else {
		groups := groupBySlot(len(rels), func(i int) int { return RedisKeySlot(r.prefix + rels[i].Key) })
		for _, idx := range groups {
			part := make([]Release, len(idx))
			for i, j := range idx {
				part[i] = rels[j]
			}
			if e := run(part); e != nil {
				err = e
			}
		}
	}
	r.breaker.record(err)
	if err != nil {
		return fmt.Errorf("redis store: releasing leases: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// encodeReleases lays out releases as lua.Lease reads them: each bucket as
// encode lays out a correction, then when its lease was charged, the
// level under its unspent units and the units.
func (r *Redis) encodeReleases(rels []Release, now, wall int64) (keys []string, out []byte) {
	keys = make([]string, len(rels))
	for i, rel := range rels {
		k, _, spec := r.encode([]Bucket{rel.Bucket}, now, wall, true)
		keys[i] = k[0]
		out = append(out, spec[8:]...)
		out = appendFloat(out, rel.Charged)
		out = appendFloat64(out, rel.Offset)
		out = appendFloat64(out, rel.Units)
	}
	return keys, out
}

// appendFloat64 appends x as a little-endian float64.
func appendFloat64(dst []byte, x float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(x))
}

var _ Leaser = (*Redis)(nil)
