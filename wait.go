package cascade

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/waiting"
)

// wait holds an admitted request until its reserved time; answered tells
// whether its wait ended with an answer (err), or it goes on as decided.
//
//go:noinline
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision) (answered bool, err error) {
	outcome, retry := h.holdUntil(r, d)
	h.metrics.heldEnded(outcome)
	switch outcome {
	case heldGone:
		return true, nil // the client went away while held: nothing to answer
	case heldPreempted, heldYielded:
		return true, h.refuseBatch(w, outcome, retry, d)
	case heldRedecided: // decided again: answered as any decision
		if d.Reason == engine.ReasonStoreError {
			return true, h.storeFailed(w, r, next, d)
		}
	case heldQueueFull:
		retry := strconv.FormatInt(engine.CeilSeconds(d.Wait), 10)
		w.Header().Set("Retry-After", retry)
		return true, h.problem(w, http.StatusTooManyRequests, "queue_full", "Too Many Requests",
			"too many requests are waiting for their turn; retry in "+retry+" s", d)
	}
	return false, nil
}

// heldOutcome is how a held request's wait ended; it labels
// cascade_held_requests_total.
type heldOutcome string

const (
	heldReleased  heldOutcome = "released"   // its time came: it goes on
	heldQueueFull heldOutcome = "queue_full" // MaxQueued requests were already held
	heldGone      heldOutcome = "gone"       // its client went away
	// heldYielded: a batch request refused while interactive ones wait on
	// its buckets; heldPreempted: a held batch request whose place an
	// interactive one took.
	heldYielded   heldOutcome = "yielded"
	heldPreempted heldOutcome = "preempted"
	// heldRedecided: an interactive request decided again once the batch
	// reservations it preempted were given back, and not admitted to wait.
	heldRedecided heldOutcome = "redecided"
)

// holdUntil keeps an admitted request until its reserved time (d.Wait), and
// says how its wait ended (see heldOutcome). Unless released, its
// reservation is given back, exactly once; retry is when a batch request
// refused may come back.
func (h *Handler) holdUntil(r *http.Request, d *decision) (outcome heldOutcome, retry time.Duration) {
	if h.queued.Add(1) > int64(h.MaxQueued) {
		h.queued.Add(-1)
		d.entry.Leave()
		h.giveBack(r.Context(), d)
		return heldQueueFull, 0
	}
	defer h.queued.Add(-1)
	e, busy, victims := h.line(d)
	if busy > 0 {
		h.giveBack(r.Context(), d)
		return heldYielded, busy
	}
	defer h.metrics.holdingNow()()
	if len(victims) > 0 {
		// An interactive request decided behind batch reservations (made
		// while it was decided), which it has preempted: once they are
		// given back, it takes its place again, ahead of them.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		_ = waiting.Wait(wctx, victims)
		cancel()
		if h.giveBack(r.Context(), d) != nil {
			// Still charged: not decided again (that would charge twice);
			// it waits as decided.
			victims = nil
		}
		var err error
		if victims != nil {
			err = h.engine.Redecide(r.Context(), &d.Decision, d.Estimates)
		}
		if victims != nil && (err != nil || !(d.Allowed && d.Wait > 0)) {
			e.Leave()
			if err != nil {
				h.logStoreError(err)
			}
			return heldRedecided, 0
		}
	}
	var preempted <-chan struct{}
	if e != nil {
		preempted = e.Preempted()
	}
	t := time.NewTimer(d.Wait)
	defer t.Stop()
	select {
	case <-t.C:
		if e.Go() {
			return heldReleased, 0
		}
	case <-preempted:
	case <-r.Context().Done():
		if e.Go() {
			h.giveBack(r.Context(), d)
			return heldGone, 0
		}
	}
	// Preempted (perhaps just as its time came or its client left): its
	// place goes to the interactive request, which waits for it.
	h.giveBack(r.Context(), d)
	e.GaveBack()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	return heldPreempted, time.Until(e.Retry(ctx)) // when the interactive requests will have gone
}
