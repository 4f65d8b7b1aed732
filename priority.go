package cascade

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/waiting"
)

// waitlists holds the requests held (max_wait) by the handlers of each
// store, by the store's pool key: handlers that share a store share its
// buckets, so a batch route's held requests give way to an interactive
// route's, and across config reloads the new handlers see the requests the
// old ones still hold.
var waitlists = caddy.NewUsagePool()

// waitingChannel is the Redis Pub/Sub channel, after the key prefix, on
// which the instances sharing a Redis store tell each other what requests
// they hold.
const waitingChannel = "waiting"

// provisionWaiting joins the waitlist of the handler's store (max_wait).
// On a Redis store the waitlist is linked to those of the other instances
// sharing it (a store.Bus on the channel "waiting"), so that priority
// holds between instances too.
func (h *Handler) provisionWaiting(redis *store.Redis) error {
	if h.MaxWait <= 0 {
		return nil
	}
	key := "waiting/" + h.stores.poolKey
	v, _, err := waitlists.LoadOrNew(key, func() (caddy.Destructor, error) {
		reg := waiting.New()
		if redis != nil {
			reg.Connect(redis.OpenBus(waitingChannel, reg.Receive))
		}
		return reg, nil
	})
	if err != nil {
		return err
	}
	h.waiting.registry, h.waiting.key = v.(*waiting.Registry), key
	h.waiting.batch = h.priority == adaptive.PriorityBatch
	return nil
}

// decideWaiting is the engine's decision of a handler that may hold
// requests. An interactive (or critical) request decided while batch
// requests are held is decided first; only if it would then be held, or
// refused, by buckets on which batch requests are held does it preempt
// them: it waits until their reservations are given back, gives back its
// own, and is decided again — ahead of them. An interactive request that
// fits now, or is refused by buckets no batch request holds, makes no
// batch request give way.
func (h *Handler) decideWaiting(ctx context.Context, d *decision, req engine.Request) error {
	if h.waiting.registry == nil || h.waiting.batch || !h.waiting.registry.BatchHeld() || len(d.Buckets) == 0 {
		return h.engine.Decide(ctx, &d.Decision, req)
	}
	req.Tentative = true // a refusal counts as a strike only if it stands
	err := h.engine.Decide(ctx, &d.Decision, req)
	d.Request.Tentative = false // decided again, it is struck as any other
	held := d.Allowed && d.Wait > 0
	refused := !d.Allowed && !d.Impossible && d.Reason == engine.ReasonLimited
	if err != nil || d.Mode != engine.Enforce || !held && !refused {
		d.Strike(ctx)
		return err
	}
	// The buckets in its way: those it would wait for, or that refused it.
	var keys []string
	for i, r := range d.Results {
		if held && r.Remaining == 0 || refused && !r.Allowed {
			keys = append(keys, h.waitKey(d, d.Limits[i].Key))
		}
	}
	var victims []*waiting.Entry
	d.entry, victims = h.waiting.registry.Preempt(keys, time.Now().Add(time.Duration(h.MaxWait)))
	if len(victims) == 0 {
		d.entry.Leave() // it waits (or is refused) behind no batch request
		d.entry = nil
		d.Strike(ctx)
		return nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	werr := waiting.Wait(wctx, victims)
	cancel()
	h.logger.Debug("rate limit: an interactive request preempted held batch requests",
		zap.Int("preempted", len(victims)), zap.Error(werr))
	if held && h.giveBack(ctx, d) != nil {
		return nil // still charged: it waits as decided (deciding again would charge twice)
	}
	err = d.Redecide(ctx)
	if !(d.Allowed && d.Wait > 0 && d.Mode == engine.Enforce) {
		d.entry.Leave() // not held: batch requests may wait again
		d.entry = nil
	}
	return err
}

// line registers a request about to be held in its store's waitlist. A
// batch request is refused while interactive requests wait on any of its
// buckets: busy is then how long until the last of them goes. An
// interactive request preempts the batch requests still held on its
// buckets (decided while it was).
//
// victims are the batch requests an interactive one preempted: they were
// held on its buckets, decided before it, so it was decided behind them.
func (h *Handler) line(d *decision) (e *waiting.Entry, busy time.Duration, victims []*waiting.Entry) {
	if h.waiting.registry == nil {
		return nil, 0, nil
	}
	var keys, waits []string
	for i, b := range d.Limits {
		if b.Cost <= 0 {
			continue
		}
		key := h.waitKey(d, b.Key)
		keys = append(keys, key)
		if i < len(d.Results) && d.Results[i].Remaining == 0 { // a bucket it waits for
			waits = append(waits, key)
		}
	}
	now := time.Now()
	e, until, victims := h.waiting.registry.Hold(d.entry, h.waiting.batch, keys, waits, now.Add(d.Wait))
	if e == nil {
		return nil, max(until.Sub(now), time.Nanosecond), nil
	}
	if len(victims) > 0 {
		h.logger.Debug("rate limit: an interactive request preempted held batch requests", zap.Int("preempted", len(victims)))
	}
	return e, 0, victims
}

// waitKey names a bucket in the waitlist: by its key, and by its store
// when the path was routed to a store of its own. A limit above the
// tenants (a ceiling) has a bucket in each store, under one key: requests
// decided in different stores never wait for the same bucket.
func (h *Handler) waitKey(d *decision, key string) string {
	if len(h.Routes) == 0 {
		return key
	}
	if name := d.Route(); name != "" {
		return name + "\x00" + key
	}
	return key
}

// refuseBatch answers a batch request that gave way to interactive ones:
// refused while they wait ("yielded"), or preempted while held. Either way
// its reservation was given back; retry is when those interactive requests
// will have gone.
func (h *Handler) refuseBatch(w http.ResponseWriter, r *http.Request, outcome waitOutcome, retry time.Duration, d *decision) error {
	d.Retry = max(retry, time.Second)
	s := strconv.FormatInt(engine.CeilSeconds(d.Retry), 10)
	w.Header().Set("Retry-After", s)
	detail := "interactive requests are waiting for the same limits, and batch requests give way to them; retry in " + s + " s"
	if outcome == waitPreempted {
		detail = "an interactive request took this batch request's turn; retry in " + s + " s"
	}
	return h.problem(w, r, http.StatusTooManyRequests, "preempted", "Too Many Requests", detail, d)
}
