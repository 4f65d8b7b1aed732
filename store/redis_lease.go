package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// Lease implements Leaser: one lua.Lease call, sent on its own (leases are
// rare: the point of one is that the requests it covers ask nothing). On
// a Cluster, a path across slots is leased slot by slot, as Decide decides
// it (see leaseSlots).
func (r *Redis) Lease(ctx context.Context, g Grant) (Leased, error) {
	if err := checkGrant(g); err != nil {
		return Leased{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now, wall := r.now()
	var l Leased
	var err error
	if groups := r.leaseGroups(g.Buckets); groups != nil {
		if g.Renew {
			// leaseSlots sizes and gives back as for a request's grant.
			return Leased{}, fmt.Errorf("redis store: lease: a path across %d slots: %w", len(groups), ErrNotRenewable)
		}
		l, err = r.leaseSlots(ctx, g, groups, now, wall)
	} else {
		l, err = r.lease(ctx, g.Buckets, g, g.Release, now, wall)
	}
	if err != nil {
		if errors.Is(err, ErrBreakerOpen) {
			return Leased{}, err
		}
		return Leased{}, fmt.Errorf("redis store: lease: %w: %w", ErrUnavailable, err)
	}
	return l, nil
}

// LeaseAll implements Leaser: the grants are sent together, one lua.Lease
// call for all those of a slot (all of them on a single Redis), a call per
// slot in one pipeline: one round trip, and the script's fixed cost (more
// than two buckets' worth, see docs/performance.md) shared. Each grant is its own step in the call, in order, as
// if sent on its own. A renewal of a path across Cluster slots is refused
// (ErrNotRenewable); any other grant across slots is leased on its own, as
// Lease does.
func (r *Redis) LeaseAll(ctx context.Context, gs []Grant) ([]Leased, []error) {
	out, errs := make([]Leased, len(gs)), make([]error, len(gs))
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("redis store: lease: %w: %w", ErrUnavailable, err)
	}
	for i, g := range gs {
		errs[i] = checkGrant(g)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now, wall := r.now()
	// A grant across Cluster slots is leased on its own (Lease refuses a
	// renewal); the others go in one call per slot (one call but on a
	// Cluster), the calls in one pipeline.
	var batched []int
	for i, g := range gs {
		if errs[i] != nil {
			continue
		}
		if len(r.leaseGroups(g.Buckets)) > 1 {
			out[i], errs[i] = r.Lease(ctx, g)
			continue
		}
		batched = append(batched, i)
	}
	if len(batched) == 0 {
		return out, errs
	}
	slots := [][]int{batched}
	if r.cluster != nil {
		slots = groupBySlot(len(batched), func(k int) int { return RedisKeySlot(r.prefix + gs[batched[k]].Buckets[0].Key) })
		for _, slot := range slots {
			for k, at := range slot {
				slot[k] = batched[at]
			}
		}
	}
	// The slots whose master's breaker is open are not sent.
	breakers := make([]*breaker, 0, len(slots))
	open := make([]error, len(slots))
	var keys [][]string
	var args [][]any
	var sent []int // the slots sent, in the order of keys and args
	for c, slot := range slots {
		br := r.breakerFor(r.prefix + gs[slot[0]].Buckets[0].Key)
		if open[c] = br.allow(); open[c] != nil {
			r.batch.reload()
			continue
		}
		var k []string
		var a []any
		for _, i := range slot {
			ks, grant, rel := r.leaseArgs(gs[i].Buckets, gs[i], gs[i].Release, now, wall)
			k = append(k, ks...)
			a = append(a, grant, rel)
		}
		keys, args, sent = append(keys, k), append(args, a), append(sent, c)
		breakers = append(breakers, br)
	}
	replies, rerrs := make([]string, len(slots)), make([]error, len(slots))
	if len(sent) > 0 {
		rs, es := runCalls(ctx, r.client, lua.Lease, keys, args)
		// One outcome per master: its calls went in one pipeline.
		outcomes := map[*breaker]error{}
		for k, c := range sent {
			replies[c], rerrs[c] = rs[k], es[k]
			outcomes[breakers[k]] = errors.Join(outcomes[breakers[k]], es[k])
			if r.cluster != nil && staleSlots(es[k]) {
				r.batch.reload()
			}
		}
		for br, err := range outcomes {
			br.record(err)
		}
	}
	for c, slot := range slots {
		reply, err := replies[c], rerrs[c]
		for _, i := range slot {
			if open[c] != nil {
				errs[i] = open[c]
				continue
			}
			if err != nil {
				fail(i, err)
				continue
			}
			size := 64*len(gs[i].Buckets) + 16
			if len(reply) < size {
				err = fmt.Errorf("lease script returned %d bytes for the rest of a call", len(reply))
				fail(i, err)
				continue
			}
			var perr error
			if out[i], perr = parseLeased(reply[:size], len(gs[i].Buckets)); perr != nil {
				fail(i, perr)
			}
			reply = reply[size:]
		}
	}
	return out, errs
}

// leaseGroups is slotGroups on a Cluster, nil elsewhere.
func (r *Redis) leaseGroups(buckets []Bucket) [][]int {
	if r.cluster == nil {
		return nil
	}
	return slotGroups(r.prefix, buckets)
}

// lease runs lua.Lease once: buckets (one slot on a Cluster) decided and
// leased as g asks, rels given back first.
func (r *Redis) lease(ctx context.Context, buckets []Bucket, g Grant, rels []Release, now, wall int64) (Leased, error) {
	keys, grant, rel := r.leaseArgs(buckets, g, rels, now, wall)
	var reply string
	err := r.guarded(keys[0], func() (err error) {
		reply, err = lua.Lease.Run(ctx, r.client, keys, grant, rel).Text()
		return err
	})
	if err != nil {
		return Leased{}, err
	}
	return parseLeased(reply, len(buckets))
}

// leaseArgs are lua.Lease's keys and arguments for buckets leased as g asks,
// rels given back first.
func (r *Redis) leaseArgs(buckets []Bucket, g Grant, rels []Release, now, wall int64) (keys []string, grant, rel []byte) {
	keys, _, spec := r.encode(buckets, now, wall, false)
	grant = make([]byte, 0, len(spec)+40)
	grant = append(grant, spec[:8]...)
	grant = appendFloat(grant, g.Want)
	grant = appendFloat64(grant, g.MaxShare)
	grant = appendFloat64(grant, g.MinRemaining)
	grant = appendFloat(grant, g.Hold.Microseconds())
	renew := int64(0)
	if g.Renew {
		renew = 1
	}
	grant = appendFloat(grant, renew)
	grant = append(grant, spec[8:]...)
	relKeys, rel := r.encodeReleases(rels, now, wall)
	return append(keys, relKeys...), grant, rel
}

// parseLeased reads lua.Lease's reply for a grant of n buckets.
func parseLeased(reply string, n int) (Leased, error) {
	if len(reply) != 64*n+16 {
		return Leased{}, fmt.Errorf("lease script returned %d bytes for %d buckets", len(reply), n)
	}
	float := func(off int) float64 {
		return math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[off : off+8])))
	}
	results := make([]rate.Result, n)
	out := Leased{Levels: make([]float64, n), Pads: make([]int64, n)}
	for i := range results {
		o := 64 * i
		results[i] = rate.Result{
			Allowed:    float(o) == 1,
			Impossible: float(o+8) == 1,
			Remaining:  int64(float(o + 16)),
			Before:     int64(float(o + 24)),
			RetryAfter: int64(float(o + 32)),
			Reset:      int64(float(o + 40)),
		}
		out.Levels[i] = float(o + 48)
		out.Pads[i] = int64(float(o + 56))
	}
	out.Decision = Combine(results)
	out.Extra = int64(float(64 * n))
	out.At = int64(float(64*n + 8))
	return out, nil
}

// leaseSlots leases a path whose buckets live in several Cluster slots, as
// decideSlots decides one: the slot of the path's last bucket (the
// tenant's) first; only if it admits are the other slots (global
// ceilings) asked, in parallel, each for no more than the tenant's slot
// leased; if one of them refuses or fails, everything the others charged
// (request, padding and lease) is given back at once — nothing was spent —
// and the request is refused. The lease is then as long as the shortest:
// Extra is the least any slot leased, and Units what each bucket holds
// (a slot that leased more holds the surplus until the lease ends). If the
// tenant's slot refuses, the other slots are asked without being charged,
// for the Retry-After. Each release goes with the call of its key's slot.
func (r *Redis) leaseSlots(ctx context.Context, g Grant, groups [][]int, now, wall int64) (Leased, error) {
	n := len(g.Buckets)
	leaf := 0
	for gi, idx := range groups {
		if idx[len(idx)-1] == n-1 {
			leaf = gi
		}
	}
	// Releases by the group of their slot; any in a slot the path does not
	// touch (none: a path's lease releases its own keys) go on their own.
	rels := make([][]Release, len(groups))
	var stray []Release
	for _, rel := range g.Release {
		slot, placed := RedisKeySlot(r.prefix+rel.Key), false
		for gi, idx := range groups {
			if RedisKeySlot(r.prefix+g.Buckets[idx[0]].Key) == slot {
				rels[gi] = append(rels[gi], rel)
				placed = true
				break
			}
		}
		if !placed {
			stray = append(stray, rel)
		}
	}
	if len(stray) > 0 {
		if err := r.Release(ctx, stray); err != nil {
			return Leased{}, err
		}
	}

	parts := make([]Leased, len(groups))
	errs := make([]error, len(groups))
	parts[leaf], errs[leaf] = r.lease(ctx, pick(g.Buckets, groups[leaf]), g, rels[leaf], now, wall)
	if errs[leaf] != nil {
		// The other slots' releases are not sent: the caller takes a
		// failed lease as releases that may or may not have applied.
		return Leased{}, errs[leaf]
	}
	var wg sync.WaitGroup
	for gi := range groups {
		if gi == leaf {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := pick(g.Buckets, groups[gi])
			if !parts[leaf].Allowed {
				// Refused by the tenant's slot: ask the others without
				// charging them (a bucket that can never admit makes the
				// script write nothing), giving back their releases.
				part = append(part, dryRun(part[0]))
				parts[gi], errs[gi] = r.lease(ctx, part, Grant{Want: 1}, rels[gi], now, wall)
				return
			}
			sub := g
			sub.Want = parts[leaf].Extra + 1
			parts[gi], errs[gi] = r.lease(ctx, part, sub, rels[gi], now, wall)
		}()
	}
	wg.Wait()

	results := make([]rate.Result, n)
	times := make([]int64, n)
	out := Leased{Levels: make([]float64, n), Pads: make([]int64, n), Units: make([]int64, n)}
	allowed := parts[leaf].Allowed
	extra := parts[leaf].Extra
	for gi, idx := range groups {
		if errs[gi] != nil {
			allowed = false
			continue
		}
		allowed = allowed && parts[gi].Allowed
		extra = min(extra, parts[gi].Extra)
		for k, j := range idx {
			results[j], times[j] = parts[gi].Results[k], parts[gi].At
			out.Levels[j], out.Pads[j] = parts[gi].Levels[k], parts[gi].Pads[k]
			out.Units[j] = parts[gi].Extra * g.Buckets[j].Cost
		}
	}
	if parts[leaf].Allowed && !allowed {
		// A ceiling refused (or failed): give back what the slots that
		// admitted charged, request and lease, before answering. A slot
		// that leased gives it back as a lease (the topmost: its lease top
		// drops back under the request, see rate's Leases); one that did
		// not refunds the request, charged above every lease top.
		var refunds []Bucket
		var rel []Release
		for gi, idx := range groups {
			if errs[gi] != nil || !parts[gi].Allowed {
				continue
			}
			for k, j := range idx {
				b := g.Buckets[j]
				p := parts[gi]
				if p.Extra > 0 && b.Cost > 0 {
					units := b.Cost + p.Pads[k] + p.Extra*b.Cost
					rel = append(rel, Release{Bucket: Bucket{Key: b.Key, Limit: b.Limit, Charged: p.At},
						Offset: p.Levels[k] - float64(p.Pads[k]+b.Cost), Units: float64(units)})
					continue
				}
				b.Cost = -b.Cost
				b.Charged = p.At
				refunds = append(refunds, b)
			}
		}
		var err error
		if len(rel) > 0 {
			err = r.Release(ctx, rel)
		}
		if len(refunds) > 0 {
			bySlot := groupBySlot(len(refunds), func(i int) int { return RedisKeySlot(r.prefix + refunds[i].Key) })
			err = errors.Join(err, r.adjustSlots(ctx, refunds, bySlot, now, wall))
		}
		if err != nil && r.logger != nil {
			r.logger.Warn("giving back a lease refused by another slot failed; it stays charged until it drains",
				zap.Error(err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Leased{}, fmt.Errorf("lease across %d slots: %w", len(groups), err)
	}
	out.Decision = Combine(results)
	out.At, out.Times = times[n-1], times
	if !out.Allowed {
		extra = 0
	}
	if extra == 0 {
		// Refused, or no lease on some slot: nothing is held. A slot that
		// leased all the same keeps its units charged until the caller's
		// lease layer gives them back: it cannot, holding none, so they are
		// given back here.
		var rel []Release
		if out.Allowed {
			for j, b := range g.Buckets {
				if out.Units[j] > 0 {
					rel = append(rel, Release{Bucket: Bucket{Key: b.Key, Limit: b.Limit, Charged: times[j]},
						Offset: out.Levels[j], Units: float64(out.Units[j])})
				}
			}
		}
		if len(rel) > 0 {
			if err := r.Release(ctx, rel); err != nil && r.logger != nil {
				r.logger.Warn("giving back a lease too short to use failed; it stays charged until it drains",
					zap.Error(err))
			}
		}
		clear(out.Levels)
		clear(out.Pads)
		out.Units = nil
	}
	out.Extra = extra
	return out, nil
}

// Release implements Leaser: one lua.Lease call per Cluster slot.
func (r *Redis) Release(ctx context.Context, rels []Release) error {
	if len(rels) == 0 {
		return nil
	}
	if err := checkReleases(rels); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now, wall := r.now()
	run := func(part []Release) error {
		keys, rel := r.encodeReleases(part, now, wall)
		// A grant of no buckets: the clock and five unused numbers.
		grant := appendFloat(make([]byte, 0, 48), now)
		grant = append(grant, make([]byte, 40)...)
		return r.guarded(keys[0], func() error { return lua.Lease.Run(ctx, r.client, keys, grant, rel).Err() })
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
	if err != nil {
		if errors.Is(err, ErrBreakerOpen) {
			return err
		}
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
