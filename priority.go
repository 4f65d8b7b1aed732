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
	"github.com/caddy-cascade/cascade/waiting"
)

// waitlists holds the requests held (max_wait) by the handlers of each
// store, by the store's pool key: handlers that share a store share its
// buckets, so a batch route's held requests give way to an interactive
// route's, and across config reloads the new handlers see the requests the
// old ones still hold.
var waitlists = caddy.NewUsagePool()

// provisionWaiting joins the waitlist of the handler's store (max_wait).
func (h *Handler) provisionWaiting() error {
	if h.MaxWait <= 0 {
		return nil
	}
	key := "waiting/" + h.poolKey
	v, _, err := waitlists.LoadOrNew(key, func() (caddy.Destructor, error) { return waiting.New(), nil })
	if err != nil {
		return err
	}
	h.waits, h.waitsKey = v.(*waiting.Registry), key
	h.batch = h.priority == adaptive.PriorityBatch
	return nil
}

// decideWaiting is the engine's decision of a handler that may hold
// requests. An interactive (or critical) request first preempts the batch
// requests held on its buckets and waits until their reservations are
// given back, so that it is decided ahead of them: one decision, which
// finds their places free.
func (h *Handler) decideWaiting(ctx context.Context, d *decision, estimates []int64) error {
	if h.waits == nil || h.batch || !h.waits.BatchHeld() || len(d.Buckets) == 0 {
		return h.engine.Decide(ctx, &d.Decision, estimates)
	}
	keys := make([]string, len(d.Buckets))
	for i, b := range d.Buckets {
		keys[i] = b.Key
	}
	var victims []*waiting.Entry
	d.entry, victims = h.waits.Preempt(keys, time.Now().Add(time.Duration(h.MaxWait)))
	if len(victims) > 0 {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := waiting.Wait(wctx, victims)
		cancel()
		h.logger.Debug("rate limit: an interactive request preempted held batch requests",
			zap.Int("preempted", len(victims)), zap.Error(err))
	}
	err := h.engine.Decide(ctx, &d.Decision, estimates)
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
func (h *Handler) line(d *decision) (e *waiting.Entry, busy time.Duration) {
	if h.waits == nil {
		return nil, 0
	}
	var keys, waits []string
	for i, b := range d.Limits {
		if b.Cost <= 0 {
			continue
		}
		keys = append(keys, b.Key)
		if i < len(d.Results) && d.Results[i].Remaining == 0 { // a bucket it waits for
			waits = append(waits, b.Key)
		}
	}
	now := time.Now()
	e, until, victims := h.waits.Hold(d.entry, h.batch, keys, waits, now.Add(d.Wait))
	if e == nil {
		return nil, max(until.Sub(now), time.Nanosecond)
	}
	if len(victims) > 0 {
		h.logger.Debug("rate limit: an interactive request preempted held batch requests", zap.Int("preempted", len(victims)))
	}
	return e, 0
}

// refuseBatch answers a batch request that gave way to interactive ones:
// refused while they wait ("yielded"), or preempted while held. Either way
// its reservation was given back; retry is when those interactive requests
// will have gone.
func (h *Handler) refuseBatch(w http.ResponseWriter, outcome string, retry time.Duration, d *decision) error {
	d.Retry = max(retry, time.Second)
	s := strconv.FormatInt(engine.CeilSeconds(d.Retry), 10)
	w.Header().Set("Retry-After", s)
	detail := "interactive requests are waiting for the same limits, and batch requests give way to them; retry in " + s + " s"
	if outcome == "preempted" {
		detail = "an interactive request took this batch request's turn; retry in " + s + " s"
	}
	return h.problem(w, http.StatusTooManyRequests, "preempted", "Too Many Requests", detail, d)
}
