package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

// Reasons of a decision, as metrics and logs name them.
const (
	ReasonOK         = "ok"
	ReasonLimited    = "limited"    // some limit has not enough left now
	ReasonImpossible = "impossible" // the cost exceeds some limit's capacity: waiting will not help
	ReasonPenalty    = "penalty"    // a tier's value is in its penalty box (hierarchy.Penalty)
	ReasonMissingKey = "missing_key"
	ReasonStoreError = "store_error"
	// ReasonReplayed: a retry of a request admitted before (the same
	// idempotency key and path), admitted again without a charge.
	ReasonReplayed = "replayed"
	// ReasonInFlight: a duplicate of a request still in flight (the same
	// idempotency key and path): refused, charged nothing.
	ReasonInFlight = "idempotency_in_flight"
)

// Request is what a front end says of a request besides its path (Add):
// what it costs and how it is to be decided. It goes into Decide whole.
type Request struct {
	// Estimates are its costs per Config.Dimensions; a bucket of any other
	// dimension (requests) costs 1.
	Estimates []int64
	// Costs, when set, are each bucket's cost instead, one per bucket of
	// the path: for a front end that says them itself (Envoy's
	// hits_addend). Decide may lower one (a penalty box is only looked
	// at; a concurrency limit takes one slot).
	Costs []int64
	// Refundable is true when the charge may be refunded later (a cost
	// reconciled with the response, charge_on): a store that leases
	// capacity decides it without a lease, since a refund cannot reach
	// beneath a lease taken after the charge (see rate's Leases).
	Refundable bool
	// Idempotency is the request's idempotency key (with
	// Config.Idempotency): the record of the request, kept with its
	// path's keys, is decided in the same store call as its charges. A
	// retry is then admitted without a charge (Decision.Replayed); a
	// duplicate of one still in flight is refused with Reason
	// ReasonInFlight. Local decisions keep no records.
	Idempotency string
	// Tentative, for a front end that may take the decision back and
	// decide again (Refund, Redecide), keeps a refusal from counting
	// towards a penalty box; Strike counts it if it stands.
	Tentative bool
	// Untracked, for a front end that never learns when a request ends
	// (Envoy's rate limit service, a decision endpoint), makes the path's
	// concurrency limits only looked at: a request refused when they are
	// full, never taking a slot it could not give back.
	Untracked bool
}

// Decision is what the engine decided about one request. A front end keeps
// it on its stack between Begin and Release: its slices point into pooled
// memory that Release recycles, so nothing may keep them beyond that.
type Decision struct {
	// Buckets are the path's buckets, of every tree that applies.
	Buckets []hierarchy.Bucket
	// Request is the request as given to Decide.
	Request Request
	// Costs are what the request costs each bucket, in its dimension.
	Costs []int64
	// Limits are the buckets as decided: their effective limits (scaled by
	// the adaptive factor) and costs.
	Limits []store.Bucket
	// Scaled is true when the adaptive factor scaled some limit.
	Scaled bool
	store.Decision

	// Mode applies to the answer: Enforce, Warn or Shadow.
	Mode string
	// Enforcing is true when some tree that applies enforces its limits.
	Enforcing bool
	// Reason is one of the Reason constants (a front end may set its own
	// for refusals before a decision).
	Reason string
	// Blocked names the tree/tier of the first denying bucket.
	Blocked string
	// Closest is the index of the bucket closest to exhaustion, or on a
	// denial the bucket that denied; -1 if none.
	Closest int
	// Retry is when to retry a denial, jitter included.
	Retry time.Duration
	// Wait, with Config.MaxWait, is how long an admitted request must be
	// held before it goes: its charge was reserved at the time it will
	// go, as if it had arrived then (GCRA's reservation, as
	// golang.org/x/time/rate's Reserve). Holding it is the caller's; one
	// that does not wait must give its charge back (Refund).
	Wait time.Duration
	// Local is true when the store could not decide and Config.Local did,
	// on each limit's local share.
	Local bool
	// Replayed says the request repeats one admitted before (the same
	// Request.Idempotency key and path), and was admitted without a
	// charge: nothing to refund, reconcile or give back.
	Replayed bool
	// Response, with Idempotency.Replay, is the response kept for the
	// first request of this one's idempotency key and path: the request
	// is to be answered with it when Allowed — Replayed (not charged), or
	// charged once its free replays are used up (see Replay). Its bytes
	// are the front end's, as it kept them.
	Response []byte
	// WouldBlock are the trees in warn or shadow mode whose limits denied
	// a request that trees enforcing their limits then decided alone
	// (its answer is theirs): what the lenient trees would have blocked.
	WouldBlock []*Tree
	// OnStoreError, when the store of the path's route failed, is that
	// route's failure policy ("deny" or "allow"; "" the front end's own).
	OnStoreError string

	e          *Engine            // the engine that began d
	single     bool               // the path is one bucket of the engine's single tree (see decideSingle)
	lenient    string             // the mode of the trees that apply and do not enforce (warn over shadow)
	localShare float64            // with Local, the share of each limit decided on
	unwidened  []rate.Limit       // with Config.MaxWait, the limits before reserve widened them
	slots      bool               // a concurrency slot may be held: Done gives it back
	full       []hierarchy.Bucket // with enforceOnly, the whole path (Buckets is then the enforcing trees')
	route      int                // the store of the path: 0 Config.Store, r Config.Routes[r−1]
	record     store.Bucket       // the idempotency record decided with the path (Key "" for none)
	recorded   bool               // the record was written by this decision: Done ends its flight
	forget     bool               // Done forgets the record rather than ending its flight (Forget)
	lookupErr  error              // with replay, the store's failure to look the kept response up
	scratch    *scratch           // nil until Begin takes one
	used       int                // buckets of scratch written to
}

// scratch is the memory of one decision's slices, reused across requests
// so that the common path (up to 8 buckets) allocates none of it.
type scratch struct {
	buckets [8]hierarchy.Bucket
	limits  [8]store.Bucket
	costs   [8]int64
	results [8]rate.Result
	values  [8]string
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Begin readies d for a decision.
func (e *Engine) Begin(d *Decision) {
	d.e, d.Closest = e, -1
	d.scratch = scratchPool.Get().(*scratch)
	d.Buckets = d.scratch.buckets[:0]
}

// Values is a buffer for a tree's values, from d's pooled memory, valid
// until the next Add.
func (d *Decision) Values() []string { return d.scratch.values[:0] }

// Release gives the decision's pooled memory back, cleared of the
// pointers it held (keys, limits) so the pool retains nothing.
func (d *Decision) Release() {
	sc := d.scratch
	if sc == nil {
		return
	}
	n := min(d.used, len(sc.buckets))
	clear(sc.buckets[:n])
	clear(sc.limits[:n])
	clear(sc.values[:]) // all: a front end may have written values it never gave Add
	d.scratch, d.Buckets, d.Limits, d.Costs, d.Results, d.full, d.WouldBlock = nil, nil, nil, nil, nil, nil, nil
	scratchPool.Put(sc)
}

// MissingKeyError refuses a request without the key of a tier that
// refuses requests without it (the tier's missing policy "deny").
type MissingKeyError struct {
	Tree *Tree
	Tier *hierarchy.Tier
}

func (err *MissingKeyError) Error() string {
	return fmt.Sprintf("this request has no %s: its %s/%s key (%s) is empty, and the tier refuses requests without it",
		err.Tier.Name, err.Tree.Name, err.Tier.Name, err.Tier.Key)
}

// Add adds the buckets of tree t to d's path. values are the tiers' key
// values from the top, as the request gives them ("" when missing); fewer
// values than tiers is the path of an upper tier. A tree that does not
// enforce never refuses: a missing key leaves it out of the path. In an
// enforcing tree, a missing key of a tier that refuses requests without it
// is a *MissingKeyError, and d is refused (its Reason is missing_key).
func (e *Engine) Add(d *Decision, t *Tree, values []string) error {
	return e.AddEntitled(d, t, values, nil)
}

// AddEntitled is Add for a request whose customer's entitlement in tree t
// is known (nil: none): its plan chooses the limits of the tiers that have
// plans, and its own limits those of its value of ent.Tier (see
// hierarchy.Tree's ResolveEntitled for which wins).
func (e *Engine) AddEntitled(d *Decision, t *Tree, values []string, ent *hierarchy.Entitlement) error {
	d.single = false
	if t.IPv4Prefix != 0 || t.IPv6Prefix != 0 {
		for i, v := range values {
			values[i] = t.value(v)
		}
	}
	mode := e.Mode(t)
	plan := hierarchy.Plan{Buckets: d.Buckets}
	before := len(plan.Buckets)
	t.ResolveEntitled(values, ent, &plan)
	d.Buckets = plan.Buckets
	d.used = max(d.used, len(d.Buckets))
	if plan.MissingTier != nil {
		if mode != Enforce {
			d.Buckets = d.Buckets[:before]
			return nil
		}
		d.Reason, d.Enforcing, d.Mode = ReasonMissingKey, true, Enforce
		d.Blocked = t.Name + "/" + plan.MissingTier.Name
		return &MissingKeyError{Tree: t, Tier: plan.MissingTier}
	}
	if mode == Enforce {
		d.Enforcing = true
	} else if d.lenient != Warn {
		d.lenient = mode
	}
	// An override (one set at runtime a moment ago included) makes a path
	// of other limits, or of none: only the configured one is single.
	d.single = t == e.single && before == 0 && len(d.Buckets) == 1 && d.Buckets[0].Limit == e.singleLimit && mode == Enforce
	return nil
}

// Decide charges req to every bucket of d's path, all or nothing, in one
// store call. A store error is returned (and d's Reason is store_error); a
// denial is not an error.
func (e *Engine) Decide(ctx context.Context, d *Decision, req Request) error {
	d.Request = req
	if req.Costs != nil {
		d.Costs = req.Costs
	} else {
		if d.single {
			return e.decideSingle(ctx, d)
		}
		d.Costs = sized(d.scratch.costs[:], len(d.Buckets))
		for i, b := range d.Buckets {
			d.Costs[i] = 1
			for j, dim := range e.cfg.Dimensions {
				if dim == b.Limit.Dimension && j < len(req.Estimates) {
					d.Costs[i] = req.Estimates[j]
				}
			}
		}
	}
	d.Mode = Enforce
	if !d.Enforcing && d.lenient != "" {
		d.Mode = d.lenient
	}
	if len(d.Buckets) == 0 {
		d.Allowed, d.Reason = true, ReasonOK
		return nil
	}
	sb := sized(d.scratch.limits[:], len(d.Buckets))
	for i, b := range d.Buckets {
		l, scaled := e.effective(b)
		if b.Limit.Penalty() != nil {
			d.Costs[i] = 0 // a penalty box is only looked at
		}
		sb[i] = store.Bucket{Key: b.Key, Limit: l, Cost: d.Costs[i]}
		if l.Algorithm == rate.Concurrent {
			// One slot per request, whatever its cost, held by this
			// request alone (see store.Bucket.Holder); only looked at
			// when nothing will say the request has ended.
			d.Costs[i], sb[i].Cost, sb[i].Holder = 1, 1, e.holders.Add(1)
			if d.Request.Untracked {
				d.Costs[i], sb[i].Cost = 0, 0
			}
		}
		d.Scaled = d.Scaled || scaled
	}
	d.Limits = sb
	d.route = e.routeOf(d.Buckets)
	d.record = store.Bucket{}
	d.lookupErr = nil
	if d.Request.Idempotency != "" && e.cfg.Idempotency.TTL > 0 {
		d.record = e.recordOf(d)
		if e.cfg.Idempotency.Replay && e.kept(ctx, d) {
			return nil
		}
	}
	if e.cfg.MaxWait > 0 {
		e.reserve(d)
	}
	if err := e.settle(ctx, d, d.scratch); err != nil {
		d.Reason = ReasonStoreError
		return err
	}
	if e.cfg.MaxWait > 0 {
		e.reserved(d)
	}
	if d.Replayed {
		d.Wait = 0 // charged nothing: nothing to wait for
	}
	switch {
	case d.Replayed, d.Reason == ReasonInFlight:
	case d.Allowed:
	case d.Mode == Enforce && d.lenient != "":
		if err := e.enforceOnly(ctx, d); err != nil {
			d.Reason = ReasonStoreError
			return err
		}
	case d.Mode != Enforce && d.Closest >= 0:
		// No tree enforces: the denying tree's mode says what the client
		// sees (a shadow tree's denial shows nothing, even beside a tree
		// in warn).
		d.Mode = e.Mode(e.treeOf(d.Buckets[d.Closest].Tree))
	}
	// Whatever decided last (the path, or its enforcing trees alone): the
	// slots an admitted path took are given back by Done.
	d.slots = d.Allowed && tookSlots(d.Limits)
	if !d.Request.Tentative {
		d.Strike(ctx)
	}
	return nil
}

// Strike counts d's refusal towards its tiers' penalty boxes, if it is an
// enforced refusal by the limits: Decide does, unless d's request is
// Tentative.
func (d *Decision) Strike(ctx context.Context) {
	if !d.Allowed && d.Reason == ReasonLimited && d.Mode == Enforce && !d.Local {
		d.e.strike(ctx, d)
	}
}

// Redecide decides d's path again, from scratch, for the same request: for
// a caller that gave back what d's decision charged (Refund) because the
// path's capacity changed meanwhile (held requests gave their reservations
// back).
func (d *Decision) Redecide(ctx context.Context) error {
	if d.full != nil { // the whole path again, not its enforcing trees alone
		d.Buckets, d.full = d.full, nil
	}
	d.Decision = store.Decision{}
	d.Wait, d.Retry, d.Reason, d.Blocked, d.Closest = 0, 0, "", "", -1
	d.Replayed, d.slots, d.recorded, d.Scaled, d.Local, d.unwidened = false, false, false, false, false, nil
	d.Response, d.forget, d.WouldBlock = nil, false, nil
	return d.e.Decide(ctx, d, d.Request)
}

// tookSlots reports whether an admitted path took a concurrency slot.
func tookSlots(limits []store.Bucket) bool {
	for _, b := range limits {
		if holdsSlot(b) {
			return true
		}
	}
	return false
}

// reserve widens the GCRA limits of d's enforcing trees (not penalty
// boxes) by what they refill in MaxWait: the store then admits a cost that
// fits within MaxWait, charging it now. One store call, as any decision.
// A cost above a limit's real capacity is not widened (it is impossible,
// waiting or not), nor is a path with a sliding window or calendar quota
// (they would count the request when decided, not when it goes: it must
// fit on arrival). The limits as decided without waiting are kept for
// reserved.
func (e *Engine) reserve(d *Decision) {
	for i, b := range d.Limits {
		if b.Cost > 0 && !waits(b.Limit) && d.Buckets[i].Limit.Penalty() == nil {
			return
		}
	}
	d.unwidened = make([]rate.Limit, len(d.Limits))
	for i := range d.Limits {
		d.unwidened[i] = d.Limits[i].Limit
		if b := d.Limits[i]; waits(b.Limit) && d.Buckets[i].Limit.Penalty() == nil && b.Cost <= b.Limit.Capacity() &&
			e.Mode(e.treeOf(d.Buckets[i].Tree)) == Enforce {
			d.Limits[i].Limit = e.widen(b.Limit)
		}
	}
}

// waits reports whether a limit can reserve a request's place ahead.
func waits(l rate.Limit) bool { return l.Algorithm == rate.GCRA || l.Algorithm == "" }

// widen is l with room for what it refills in MaxWait.
func (e *Engine) widen(l rate.Limit) rate.Limit {
	l.Burst = l.Capacity() + int64(float64(e.cfg.MaxWait.Microseconds())*float64(l.Count)/float64(l.Period.Microseconds()))
	return l
}

// reserved reads what reserve did: the wait of each bucket the request
// overdrew (the time until its level is back within capacity, from its
// Reset, never early), the longest of which is d.Wait; and puts back the
// limits as they are, their Remaining, and the bucket closest to
// exhaustion.
func (e *Engine) reserved(d *Decision) {
	if d.unwidened == nil {
		return
	}
	for i := range d.Limits {
		l := &d.Limits[i].Limit
		real := d.unwidened[i]
		if d.Local {
			real = scale(real, d.localShare)
		}
		wide := l.Capacity()
		*l = real
		extra := wide - real.Capacity()
		if extra <= 0 {
			continue
		}
		r := &d.Results[i]
		// What remains of the widened capacity is at least extra when the
		// cost fits the real one now: no wait.
		fits := r.Remaining >= extra
		r.Remaining, r.Before = max(0, r.Remaining-extra), max(0, r.Before-extra)
		if !d.Allowed || fits {
			continue
		}
		full := int64(float64(real.Capacity()) * float64(real.Period.Microseconds()) / float64(real.Count)) // µs to drain a full bucket
		if wait := time.Duration(r.Reset-full) * time.Microsecond; wait > d.Wait {
			d.Wait = wait
		}
	}
	if d.Allowed {
		d.Closest = closest(d)
	}
}

// rank orders the buckets that refused, for the one a denial names: a
// penalty box of an enforcing tree, then any bucket of one, then a box,
// then the others.
func (e *Engine) rank(b hierarchy.Bucket) int {
	r := 0
	if e.Mode(e.treeOf(b.Tree)) == Enforce {
		r = 2
	}
	if b.Limit.Penalty() != nil {
		r++
	}
	return r
}

// settle decides d's buckets (Limits) in the store and reads the verdict:
// the reason, the bucket that denied or is closest to exhaustion, the
// retry.
func (e *Engine) settle(ctx context.Context, d *Decision, sc *scratch) error {
	var res store.Decision
	var err error
	limits := d.Limits
	if d.record.Key != "" {
		// The record last: on a Cluster, in the slot of the path's last
		// bucket (its hash tag), which decides first.
		limits = append(d.Limits[:len(d.Limits):len(d.Limits)], d.record)
	}
	if d.lookupErr != nil {
		err = d.lookupErr // no decision without the lookup: the store's policy applies
	} else {
		res, err = e.decideIn(ctx, d, limits, sc)
	}
	if err == nil && d.record.Key != "" {
		res = e.readRecord(d, res)
		if d.Replayed && tookSlots(d.Limits) {
			res, err = e.replaySlots(ctx, d, res)
		}
	}
	if err != nil {
		if res, err = e.failed(ctx, d, err); err != nil {
			return err
		}
	}
	d.Decision = res
	if d.Reason == ReasonInFlight {
		d.Closest = -1
		d.Retry = d.RetryAfter
		return nil
	}
	if d.Replayed {
		d.Closest = closest(d)
		return nil
	}
	if res.Impossible && d.Scaled {
		e.reducedNotImpossible(d)
	}
	d.Closest = closest(d)
	switch {
	case d.Allowed:
		d.Reason = ReasonOK
	case d.Impossible:
		d.Reason = ReasonImpossible
	default:
		d.Reason = ReasonLimited
	}
	if !d.Allowed {
		e.refused(d)
	}
	return nil
}

// failed is settle's answer to a store error: the error, when the path's
// policy is not to decide locally (d.OnStoreError says which policy),
// else the local decision.
//
// It and refused are settle's rare paths, in functions of their own so
// that their temporaries do not enlarge the frame of every decision.
//
//go:noinline
func (e *Engine) failed(ctx context.Context, d *Decision, err error) (store.Decision, error) {
	policy := e.cfg.OnError
	if d.route > 0 && e.cfg.Routes[d.route-1].OnError != "" {
		policy = e.cfg.Routes[d.route-1].OnError
	}
	if policy == "" && e.cfg.Local != nil {
		policy = "local" // no policy given: Local is there to be used
	}
	if policy != "local" || e.cfg.Local == nil {
		d.OnStoreError = policy
		return store.Decision{}, err
	}
	d.record = store.Bucket{} // a local decision keeps no record
	return e.decideLocally(ctx, d, err)
}

// refused names the bucket that refused d (see settle), its reason and
// when to retry.
//
//go:noinline
func (e *Engine) refused(d *Decision) {
	// The first bucket that refused, of an enforcing tree if one did;
	// a penalty box first: the request is refused for the box,
	// whatever its limits say.
	best := -1
	for i, rr := range d.Results {
		if r := e.rank(d.Buckets[i]); !rr.Allowed && r > best {
			best, d.Closest = r, i
		}
	}
	b := &d.Buckets[d.Closest]
	if b.Limit.Penalty() != nil && d.Reason == ReasonLimited {
		d.Reason = ReasonPenalty
	}
	d.Blocked = b.Tree.Name + "/" + b.Tier.Name
	d.Retry = d.RetryAfter
	if e.cfg.Jitter > 0 && d.Retry > 0 {
		d.Retry += time.Duration(rand.Float64() * e.cfg.Jitter * float64(d.Retry))
	}
}

// replaySlots takes the concurrency slots of a retry let through without a
// charge (res, its decision), in a second store call of those buckets
// alone, and returns the path's decision: refused, as any request, when
// the slots are taken (the retry still counts as one of its record's).
func (e *Engine) replaySlots(ctx context.Context, d *Decision, res store.Decision) (store.Decision, error) {
	var idx []int
	var slots []store.Bucket
	for i, b := range d.Limits {
		if holdsSlot(b) {
			idx, slots = append(idx, i), append(slots, b)
		}
	}
	got, err := e.decideIn(ctx, d, slots, nil)
	if err != nil {
		return got, err
	}
	for k, i := range idx {
		res.Results[i] = got.Results[k]
	}
	// The slots' time: what giving them back names (their other buckets
	// were charged nothing).
	res.At, res.Times = got.At, nil
	if !got.Allowed {
		// Refused for want of a slot, as any request: not one of the
		// record's retries after all (the record's time is not known
		// here: the record under the key is corrected, whichever it is).
		r := d.record
		r.Cost, r.Charged = rate.UncountRetry, 0
		if err := e.storeFor(d.Local, d.route).Adjust(ctx, []store.Bucket{r}); err != nil {
			e.cfg.Logger.Warn("rate limit: a retry refused for want of a concurrency slot could not be uncounted; it counts as one of its record's retries", zap.Error(e.ShowError(err, d.Buckets)))
		}
		d.Replayed, d.Reason = false, "" // refused for want of a slot, as any request
		out := store.Combine(res.Results)
		out.At = got.At
		return out, nil
	}
	return res, nil
}

// decideIn decides limits in the store of d's route: without a lease when
// d must be (unleased), into sc's memory when the store can.
func (e *Engine) decideIn(ctx context.Context, d *Decision, limits []store.Bucket, sc *scratch) (store.Decision, error) {
	st, into, ul := e.cfg.Store, e.into, e.unleased
	if d.route > 0 {
		st = e.cfg.Routes[d.route-1].Store
		into, _ = st.(decideInto)
		ul, _ = st.(unleased)
	}
	switch {
	case (d.unleased() || sc == nil && d.Replayed) && ul != nil:
		return ul.DecideUnleased(ctx, limits)
	case into != nil && sc != nil && d.record.Key == "":
		return into.DecideInto(ctx, limits, sc.results[:])
	}
	return st.Decide(ctx, limits)
}

// unleased reports whether d must be decided without a lease: its charge
// may be refunded, or it carries an idempotency record.
func (d *Decision) unleased() bool { return d.Request.Refundable || d.record.Key != "" }

// recordOf is the idempotency record of d's path and key: in the hash tag
// of the path's last bucket, named by a hash of the path's values (its
// buckets' keys without their limits' parts: an override does not change
// it) and the idempotency key (so that two paths never share a record, and
// a key of any length makes a key of fixed length).
func (e *Engine) recordOf(d *Decision) store.Bucket {
	h := sha256.New()
	last := ""
	for _, b := range d.Buckets {
		path := b.Key
		if i := strings.LastIndexByte(path, '#'); i >= 0 {
			path = path[:i]
		}
		if path != last { // a tier's limits share its path
			h.Write([]byte(path))
			h.Write([]byte{0})
			last = path
		}
	}
	h.Write([]byte(d.Request.Idempotency))
	leaf := d.Buckets[len(d.Buckets)-1].Key
	tag := leaf
	if i := strings.IndexByte(leaf, '}'); i >= 0 {
		tag = leaf[:i+1]
	}
	inFlight := e.cfg.Idempotency.InFlight
	if inFlight <= 0 {
		inFlight = e.cfg.Idempotency.TTL
	}
	return store.Bucket{
		Key:   tag + "#idempotency=" + hex.EncodeToString(h.Sum(nil)[:16]),
		Limit: rate.Limit{Algorithm: rate.Idempotent, Count: inFlight.Microseconds(), Period: e.cfg.Idempotency.TTL, Burst: e.retries()},
		Cost:  1,
	}
}

// retries is the Burst of a record: under replay none, since a retry
// finds the kept response or is a new request (see Replay).
func (e *Engine) retries() int64 {
	if e.cfg.Idempotency.Replay {
		return 0
	}
	return int64(e.cfg.Idempotency.Retries)
}

// readRecord reads the verdict of d's record, decided last with d's path
// (res), and returns the path's decision: as decided when the record is
// new (then written with the charges, all or nothing); admitted without a
// charge for a retry of a request that has ended (the store charged
// nothing: the record refused); refused, charged nothing, for a duplicate
// of one in flight.
func (e *Engine) readRecord(d *Decision, res store.Decision) store.Decision {
	n := len(d.Limits)
	r := res.Results[n]
	at := res.ChargedAt(n)
	results := res.Results[:n]
	times := res.Times
	if times != nil {
		times = times[:n]
	}
	switch {
	case r.Allowed:
		d.recorded = res.Allowed
		d.record.Charged = at
		res.Results, res.Times = results, times
		return res
	case r.Remaining == rate.RecordInFlight:
		// Refused by the record: the store charged nothing. The first
		// may end any moment: retry in a second (or when it counts as
		// ended, if sooner).
		d.Reason = ReasonInFlight
		res.Results, res.Times, res.RetryAfter = results, times, min(microseconds(r.RetryAfter), time.Second)
		return res
	default: // rate.RecordDone: a retry let through
		d.Replayed, d.Reason = true, ReasonReplayed
		for i := range d.Limits {
			if !holdsSlot(d.Limits[i]) {
				d.Limits[i].Cost = 0 // charged nothing: nothing to give back
			}
		}
		for i := range results {
			results[i] = rate.Result{Allowed: true, Remaining: results[i].Before, Before: results[i].Before, Reset: results[i].Reset}
		}
		return store.Decision{Allowed: true, Results: results, At: res.At, Times: times}
	}
}

// decideLocally decides d on the local store, each limit scaled to its
// local share, after the store failed with cause. The limits the decision
// shows (headers, placeholders) are the shares.
func (e *Engine) decideLocally(ctx context.Context, d *Decision, cause error) (store.Decision, error) {
	share := e.cfg.LocalShare
	if count := e.cfg.LocalInstances; count != nil {
		share = 1 / float64(max(count(), 1))
	}
	local := make([]store.Bucket, len(d.Limits))
	for i, b := range d.Limits {
		local[i] = b
		if d.unwidened != nil && d.unwidened[i] != b.Limit {
			// Waiting: the local share widened for MaxWait at its own rate.
			local[i].Limit = e.widen(scale(d.unwidened[i], share))
			continue
		}
		local[i].Limit = scale(b.Limit, share)
	}
	res, err := e.cfg.Local.Decide(ctx, local)
	if err != nil {
		return res, err
	}
	if ok, held := e.localLog.Allow(time.Now()); ok {
		e.cfg.Logger.Warn("the store cannot decide: deciding on the local store, each limit at its local share (logged at most once a second)",
			zap.Float64("share", share), zap.Int64("not_logged", held), zap.Error(e.ShowError(cause, d.Buckets)))
	}
	d.Limits, d.Local, d.Scaled, d.localShare = local, true, true, share
	return res, nil
}

// enforceOnly handles a denial on a path where trees of different modes
// apply. A bucket of an enforcing tree that denies is a denial. But when
// only trees in warn or shadow mode denied, the request must still be
// charged to the enforcing trees, as it would be without the others (all
// or nothing charged it nowhere): it is decided again on the enforcing
// trees' buckets alone, a second store call on this rare path only.
func (e *Engine) enforceOnly(ctx context.Context, d *Decision) error {
	for i, rr := range d.Results {
		if !rr.Allowed && e.Mode(e.treeOf(d.Buckets[i].Tree)) == Enforce {
			return nil // an enforcing tree denied: that is the answer
		}
	}
	for i, rr := range d.Results { // the trees not enforcing that denied: they would have blocked
		if t := e.treeOf(d.Buckets[i].Tree); !rr.Allowed && !slices.Contains(d.WouldBlock, t) {
			d.WouldBlock = append(d.WouldBlock, t)
		}
	}
	var buckets []hierarchy.Bucket
	var limits []store.Bucket
	var costs []int64
	for i, b := range d.Buckets {
		if e.Mode(e.treeOf(b.Tree)) == Enforce {
			buckets = append(buckets, b)
			limits = append(limits, d.Limits[i])
			costs = append(costs, d.Costs[i])
		}
	}
	if ce := e.cfg.Logger.Check(zap.DebugLevel, "rate limited by a tree that does not enforce"); ce != nil {
		ce.Write(zap.String("blocked_by", d.Blocked), zap.String("reason", d.Reason))
	}
	if d.full == nil {
		d.full = d.Buckets // the whole path, for Redecide
	}
	d.Buckets, d.Limits, d.Costs, d.Blocked, d.Retry = buckets, limits, costs, "", 0
	d.Decision = store.Decision{}
	if len(buckets) == 0 {
		d.Allowed, d.Reason, d.Closest = true, ReasonOK, -1
		return nil
	}
	if e.cfg.MaxWait > 0 {
		e.reserve(d)
	}
	if err := e.settle(ctx, d, nil); err != nil {
		return err
	}
	if e.cfg.MaxWait > 0 {
		e.reserved(d)
	}
	return nil
}

// reducedNotImpossible turns an "impossible" decision back into a plain
// denial when only the adaptive factor makes the cost exceed a capacity: the
// limit is reduced for now, not too small for this request for ever, and a
// client told "impossible" would give up for good. It is retried no sooner
// than the controller's next sample, when the factor may rise.
func (e *Engine) reducedNotImpossible(d *Decision) {
	// The limit grows back at the controller's next sample, or when the
	// store answers again (a local share): retry no sooner than that.
	retry := int64(time.Second / time.Microsecond)
	if e.cfg.Controller != nil {
		retry = int64(e.cfg.Controller.Config().Interval / time.Microsecond)
	}
	for i := range d.Results {
		rr := &d.Results[i]
		if rr.Impossible {
			if d.Costs[i] > d.Buckets[i].Limit.Rate().Capacity() {
				return // impossible even at full capacity
			}
		}
		if !rr.Allowed && rr.RetryAfter > retry {
			retry = rr.RetryAfter
		}
	}
	for i := range d.Results {
		if d.Results[i].Impossible {
			d.Results[i].Impossible, d.Results[i].RetryAfter = false, retry
		}
	}
	d.Impossible, d.RetryAfter = false, time.Duration(retry)*time.Microsecond
}

// strike counts a refusal against the penalty box of each value whose
// tier's limits refused it (enforcing trees only, limits not reduced by
// the adaptive controller), once per box, and boxes a value on the refusal
// that fills its strikes: the request is then refused for the box. It
// runs on a context of its own, so a client that hangs up is counted
// too. A store error is logged: the refusal stands, uncounted.
func (e *Engine) strike(ctx context.Context, d *Decision) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var struck [4]int
	boxes := struck[:0]
	for i, rr := range d.Results {
		b := d.Buckets[i]
		// Not a refusal for want of a concurrency slot: a client that
		// waits as told while its other request runs is no abuser.
		if rr.Allowed || b.Tier.Penalty == nil || b.Limit.Penalty() != nil || d.Limits[i].Limit.Algorithm == rate.Concurrent ||
			d.Limits[i].Limit != b.Limit.Rate() || e.Mode(e.treeOf(b.Tree)) != Enforce {
			continue
		}
		box := slices.IndexFunc(d.Buckets, func(o hierarchy.Bucket) bool { return o.Limit.Penalty() != nil && o.SameValue(b) })
		if box < 0 || slices.Contains(boxes, box) {
			continue
		}
		boxes = append(boxes, box)
		if e.countStrike(ctx, d, box) {
			p := d.Buckets[box].Limit.Penalty()
			d.Closest, d.Reason, d.Retry = box, ReasonPenalty, p.Duration()
			d.Blocked = b.Tree.Name + "/" + b.Tier.Name
			e.cfg.Logger.Info("rate limit penalty: a value is refused outright for a while",
				zap.String("blocked_by", d.Blocked), zap.String("value", e.Show(b.Tier, b.Value)), zap.Duration("for", p.Duration()))
		}
	}
}

// countStrike counts one strike against the box of d's buckets at index
// box, and reports whether it boxed the value.
func (e *Engine) countStrike(ctx context.Context, d *Decision, box int) bool {
	key, strikes := d.Buckets[box].Strikes()
	count := []store.Bucket{{Key: key, Limit: strikes.Rate(), Cost: 1}}
	var res store.Decision
	var err error
	st := e.storeAt(d.route)
	if ul, ok := st.(unleased); ok {
		res, err = ul.DecideUnleased(ctx, count) // a count no lease may hold
	} else {
		res, err = st.Decide(ctx, count)
	}
	boxed := err == nil && res.Allowed && res.Results[0].Remaining == 0
	if boxed {
		debt := d.Buckets[box].Limit.Penalty().Debt(d.Results[box].Remaining)
		err = st.Adjust(ctx, []store.Bucket{{Key: d.Buckets[box].Key, Limit: d.Limits[box].Limit, Cost: debt}})
	}
	if err != nil {
		e.cfg.Logger.Warn("rate limit penalty: counting a refusal failed", zap.String("key", e.ShowKey(key)), zap.Error(e.ShowError(err, d.Buckets)))
		return false
	}
	return boxed
}

// closest picks the bucket nearest to exhaustion: the lowest fraction of
// its capacity remaining, the longest reset on a tie, never a penalty box
// (its one unit says nothing of the limits).
func closest(d *Decision) int {
	best, bestFrac := -1, 2.0
	for i, r := range d.Results {
		if d.Buckets[i].Limit.Penalty() != nil {
			continue
		}
		frac := float64(r.Remaining) / float64(d.Limits[i].Limit.Capacity())
		if frac < bestFrac || (frac == bestFrac && r.Reset > d.Results[best].Reset) {
			best, bestFrac = i, frac
		}
	}
	return best
}

// sized returns buf cut to n, or a new slice when buf is too short.
func sized[T any](buf []T, n int) []T {
	if n <= len(buf) {
		return buf[:n]
	}
	return make([]T, n)
}

// scale returns a limit with its count and burst multiplied by factor
// (at least 1). GCRA keeps its period, so the refill rate scales too.
func scale(l rate.Limit, factor float64) rate.Limit {
	if factor >= 1 {
		return l
	}
	mul := func(n int64) int64 {
		if n == 0 {
			return 0
		}
		return max(1, int64(float64(n)*factor))
	}
	l.Count, l.Burst = mul(l.Count), mul(l.Burst)
	return l
}

// effective is the limit of bucket b as the engine decides it now: scaled
// when its tier is adaptive. scaled says whether the factor changed it.
func (e *Engine) effective(b hierarchy.Bucket) (l rate.Limit, scaled bool) {
	l = b.Limit.Rate()
	if b.Tier.Adaptive && e.cfg.Controller != nil {
		l = scale(l, e.cfg.Controller.FactorFor(e.cfg.Priority))
		scaled = l.Count != b.Limit.Rate().Count || l.Burst != b.Limit.Rate().Burst
	}
	return l, scaled
}

// NetworkOf is key's network when key is an IP address of a family with a
// prefix set (an IPv4-mapped IPv6 address counts as IPv4), else key: what
// mholt/caddy-ratelimit does with ipv4_prefix and ipv6_prefix.
func NetworkOf(key string, ipv4Prefix, ipv6Prefix int) string {
	ip, err := netip.ParseAddr(key)
	if err != nil || ip.Zone() != "" {
		return key
	}
	bits := ipv6Prefix
	if ip.Is4() || ip.Is4In6() {
		ip, bits = ip.Unmap(), ipv4Prefix
	}
	if bits == 0 {
		return key
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}

// CeilSeconds is d in whole seconds, rounded up: what headers say.
func CeilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func microseconds(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
