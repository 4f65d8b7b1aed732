package engine

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// Usage is the actual cost of a request in one dimension, as the upstream
// reported it, to reconcile with the estimate Decide charged.
type Usage struct {
	Dimension string
	Actual    int64
}

// Reconcile adjusts every bucket on d's path by actual − estimate for
// each usage given, in one store call, in the background: off the
// request's critical path. Each bucket's correction names when its
// estimate was charged (the decision's ChargedAt), so a refund goes back
// to the window, or the very charge, that held it (see
// store.Bucket.Charged). It does nothing for a decision that charged
// nothing. It returns the corrections it made (nil if none).
func (d *Decision) Reconcile(usage ...Usage) []store.Bucket {
	c := d.Charge()
	if c == nil {
		return nil
	}
	e := d.e
	adjust := c.corrections(usage)
	if len(adjust) > 0 {
		e.adjustIn(e.storeFor(c.local, c.route), adjust)
	}
	return adjust
}

// storeFor is the store that charged a decision: the local one when it
// was decided there (Decision.Local), else its route's.
func (e *Engine) storeFor(local bool, route int) store.Store {
	if local {
		return e.cfg.Local
	}
	return e.storeAt(route)
}

// storeAt is the store of a route: Config.Store for 0, Config.Routes[r−1]'s
// otherwise.
func (e *Engine) storeAt(route int) store.Store {
	if route == 0 {
		return e.cfg.Store
	}
	return e.cfg.Routes[route-1].Store
}

// routeOf is the route of a path: that of the first of its buckets whose
// hash tag (its tenant) a route lists, else 0 (Config.Store). Every store
// call for the path goes there: all of its buckets live in one store.
func (e *Engine) routeOf(buckets []hierarchy.Bucket) int {
	if len(e.cfg.Routes) == 0 {
		return 0
	}
	for _, b := range buckets {
		tag := b.Key
		if i := strings.IndexByte(tag, '}'); i >= 0 {
			tag = tag[:i+1]
		}
		for r, route := range e.cfg.Routes {
			if route.Tenants[tag] {
				return r + 1
			}
		}
	}
	return 0
}

// Route is the name of the store that decides d's path (Config.Routes),
// "" for Config.Store.
func (d *Decision) Route() string {
	if d.route == 0 {
		return ""
	}
	return d.e.cfg.Routes[d.route-1].Name
}

// Charge is what d charged that reconciling may correct, kept apart from
// the decision's pooled memory: for a front end that learns the usage
// after the decision is gone (a usage report from another proxy).
type Charge struct {
	e         *Engine
	buckets   []store.Bucket // each charged bucket, its Cost unset
	dims      []string       // each bucket's dimension
	estimates []int64        // per Config.Dimensions
	local     bool           // charged by Config.Local
	route     int            // else by this route's store
}

// Charge keeps what reconciling d needs, or returns nil when d has nothing
// that could be reconciled. A retry admitted without a charge
// (Decision.Replayed) still reaches the upstream: its actual usage is all
// debt, as if its estimate had been 0, so that retrying with one key buys
// no usage for free.
func (d *Decision) Charge() *Charge {
	e := d.e
	if !d.Allowed || len(d.Request.Estimates) != len(e.cfg.Dimensions) || len(e.cfg.Dimensions) == 0 {
		return nil // nothing was estimated, so nothing was charged
	}
	h := &Charge{e: e, estimates: slices.Clone(d.Request.Estimates), local: d.Local, route: d.route}
	if d.Replayed {
		clear(h.estimates)
	}
	for i, b := range d.Buckets {
		if slices.Contains(e.cfg.Dimensions, b.Limit.Dimension) && !holdsSlot(d.Limits[i]) {
			h.buckets = append(h.buckets, store.Bucket{Key: b.Key, Limit: d.Limits[i].Limit, Charged: d.ChargedAt(i)})
			h.dims = append(h.dims, b.Limit.Dimension)
		}
	}
	return h
}

// Reconcile corrects the charge like Decision.Reconcile, but at once:
// when it returns without an error, the store has applied the corrections
// it returns.
func (c *Charge) Reconcile(ctx context.Context, usage ...Usage) ([]store.Bucket, error) {
	adjust := c.corrections(usage)
	if len(adjust) == 0 {
		return nil, nil
	}
	e := c.e
	err := e.storeFor(c.local, c.route).Adjust(ctx, adjust)
	if e.cfg.Reconciled != nil {
		e.cfg.Reconciled(err)
	}
	if err != nil {
		return nil, err
	}
	return adjust, nil
}

// corrections are the adjustments of c's buckets for usage: actual −
// estimate, per dimension reported.
func (c *Charge) corrections(usage []Usage) []store.Bucket {
	var adjust []store.Bucket
	for _, u := range usage {
		j := slices.Index(c.e.cfg.Dimensions, u.Dimension)
		if j < 0 {
			continue
		}
		delta := u.Actual - c.estimates[j]
		if delta == 0 {
			continue
		}
		for i, b := range c.buckets {
			if c.dims[i] == u.Dimension {
				b.Cost = delta
				adjust = append(adjust, b)
			}
		}
	}
	return adjust
}

// adjustIn applies corrections to st in the background.
func (e *Engine) adjustIn(st store.Store, adjust []store.Bucket) {
	e.closing.RLock()
	tracked := !e.closed // a request finishing while the engine closes: its correction still goes
	if tracked {
		e.adjusting.Add(1)
	}
	e.closing.RUnlock()
	go func() {
		if tracked {
			defer e.adjusting.Done()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := st.Adjust(ctx, adjust)
		if err != nil {
			e.cfg.Logger.Error("reconciling cost with the upstream's usage failed", zap.Error(e.ShowError(err, nil)))
		}
		if e.cfg.Reconciled != nil {
			e.cfg.Reconciled(err)
		}
	}()
}

// Refund gives back everything d charged, at once (one store call), to
// the store that charged it, each bucket to the window or the very charge
// that holds it, and forgets its idempotency record: for a request that
// should not count (one that will not go, held and given up). It does
// nothing for a decision that charged nothing.
func (d *Decision) Refund(ctx context.Context) error { return d.refund(ctx, true) }

// RefundServed is Refund for a request whose response is served all the
// same (charge_on: a response that does not count). Under
// Idempotency.Replay its record stays: its response is to be kept, and
// its retries answered with it.
func (d *Decision) RefundServed(ctx context.Context) error {
	return d.refund(ctx, !d.KeepsResponse())
}

func (d *Decision) refund(ctx context.Context, forget bool) error {
	if !d.Allowed || len(d.Limits) == 0 {
		return nil
	}
	adjust := make([]store.Bucket, 0, len(d.Limits))
	for i, b := range d.Limits {
		if b.Cost == 0 || holdsSlot(b) { // a slot is given back by Done
			continue
		}
		b.Cost, b.Charged = -b.Cost, d.ChargedAt(i)
		adjust = append(adjust, b)
	}
	if d.recorded && forget {
		// Charged nothing, it records nothing: a retry is a new request.
		r := d.record
		r.Cost = -1
		adjust = append(adjust, r)
		d.recorded = false
	}
	if len(adjust) == 0 {
		return nil
	}
	e := d.e
	err := e.storeFor(d.Local, d.route).Adjust(ctx, adjust)
	if e.cfg.Reconciled != nil {
		e.cfg.Reconciled(err)
	}
	return err
}

// Done ends what d's request holds while in flight, in one store call: it
// gives back the concurrency slots d took (limits of the concurrent
// algorithm) and ends the flight of its idempotency record (a duplicate is
// then a retry, admitted without a charge). Call it once the request's
// response has ended, or its client has gone. Calling it again, or for a
// decision that holds nothing, does nothing. A slot that cannot be given
// back (the store is unreachable) stays taken until the store drops it: a
// Redis store's after its slot TTL, when it is no longer renewed; a record
// whose flight cannot be ended ends after Idempotency.InFlight.
func (d *Decision) Done(ctx context.Context) error {
	if !d.NeedsDone() {
		return nil
	}
	var end []store.Bucket
	if d.slots {
		for i, b := range d.Limits {
			if holdsSlot(b) {
				// Charged: a counter reset since the slot was taken is
				// not given it back (rate.Limit.Adjust).
				b.Cost, b.Charged = -1, d.ChargedAt(i)
				end = append(end, b)
			}
		}
	}
	if d.recorded && (d.forget || !d.e.cfg.Idempotency.Replay) {
		r := d.record
		r.Cost = 1
		if d.forget {
			r.Cost = -1 // charged at its own time: a newer record is another request's
		}
		end = append(end, r)
	}
	d.slots, d.recorded, d.forget = false, false, false
	if len(end) == 0 {
		return nil
	}
	e := d.e
	err := e.storeFor(d.Local, d.route).Adjust(ctx, end)
	if err != nil {
		e.cfg.Logger.Warn("rate limit: ending a request in the store failed; its concurrency slots stay taken until the store drops them, its idempotency record in flight until its time is up", zap.Error(e.ShowError(err, d.Buckets)))
	}
	return err
}

// NeedsDone reports whether d holds something until its request ends
// (concurrency slots, an idempotency record in flight) that Done has not
// ended yet.
func (d *Decision) NeedsDone() bool { return d.slots || d.recorded }

// holdsSlot reports whether a decided bucket took a concurrency slot.
func holdsSlot(b store.Bucket) bool { return b.Limit.Algorithm == rate.Concurrent && b.Cost > 0 }

// Adjust corrects each bucket of d's path (built with Add, not decided)
// by costs[i] — negative gives back, positive adds debt — at once, in one
// store call, without deciding anything: for a front end that returns what
// an earlier call charged (Envoy's is_negative_hits). Buckets whose cost
// is 0 are left alone. The correction goes to the bucket's current window
// (the earlier charge's time is not known).
func (d *Decision) Adjust(ctx context.Context, costs []int64) error {
	e := d.e
	adjust := make([]store.Bucket, 0, len(d.Buckets))
	for i, b := range d.Buckets {
		if costs[i] == 0 || b.Limit.Rate().Algorithm == rate.Concurrent {
			continue
		}
		l, _ := e.effective(b)
		adjust = append(adjust, store.Bucket{Key: b.Key, Limit: l, Cost: costs[i]})
	}
	if len(adjust) == 0 {
		return nil
	}
	err := e.storeAt(e.routeOf(d.Buckets)).Adjust(ctx, adjust)
	if e.cfg.Reconciled != nil {
		e.cfg.Reconciled(err)
	}
	return err
}
