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
	outcome, retry := h.waitTurn(r, d)
	h.metrics.heldEnded(outcome)
	switch outcome {
	case waitGone:
		return true, nil // the client went away while held: nothing to answer
	case waitPreempted, waitYielded:
		return true, h.refuseBatch(w, r, outcome, retry, d)
	case waitRedecided: // decided again: answered as any decision
		if d.Reason == engine.ReasonStoreError {
			return true, h.storeFailed(w, r, next, d)
		}
	case waitQueueFull:
		retry := strconv.FormatInt(engine.CeilSeconds(d.Wait), 10)
		w.Header().Set("Retry-After", retry)
		return true, h.problem(w, r, http.StatusTooManyRequests, "queue_full", "Too Many Requests",
			"too many requests are waiting for their turn; retry in "+retry+" s", d)
	}
	return false, nil
}

// waitOutcome is how a held request's wait ended; it labels
// cascade_held_requests_total.
type waitOutcome string

const (
	waitReleased  waitOutcome = "released"   // its time came: it goes on
	waitQueueFull waitOutcome = "queue_full" // MaxQueued requests were already held
	waitGone      waitOutcome = "gone"       // its client went away
	// waitYielded: a batch request refused while interactive ones wait on
	// its buckets; waitPreempted: a held batch request whose place an
	// interactive one took.
	waitYielded   waitOutcome = "yielded"
	waitPreempted waitOutcome = "preempted"
	// waitRedecided: an interactive request decided again once the batch
	// reservations it preempted were given back, and not admitted to wait.
	waitRedecided waitOutcome = "redecided"
)

// waitTurn keeps an admitted request until its reserved time (d.Wait), and
// says how its wait ended (see waitOutcome). Unless released, its
// reservation is given back, exactly once; retry is when a batch request
// refused may come back.
func (h *Handler) waitTurn(r *http.Request, d *decision) (outcome waitOutcome, retry time.Duration) {
	if h.waiting.queued.Add(1) > int64(h.MaxQueued) {
		h.waiting.queued.Add(-1)
		d.entry.Leave()
		h.giveBack(r.Context(), d)
		return waitQueueFull, 0
	}
	defer h.waiting.queued.Add(-1)
	e, busy, victims := h.line(d)
	if busy > 0 {
		h.giveBack(r.Context(), d)
		return waitYielded, busy
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
			err = d.Redecide(r.Context())
		}
		if victims != nil && (err != nil || !(d.Allowed && d.Wait > 0)) {
			e.Leave()
			if err != nil {
				h.logStoreError(err)
			}
			return waitRedecided, 0
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
			return waitReleased, 0
		}
	case <-preempted:
	case <-r.Context().Done():
		if e.Go() {
			h.giveBack(r.Context(), d)
			return waitGone, 0
		}
	}
	// Preempted (perhaps just as its time came or its client left): its
	// place goes to the interactive request, which waits for it.
	h.giveBack(r.Context(), d)
	e.GaveBack()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	return waitPreempted, time.Until(e.Retry(ctx)) // when the interactive requests will have gone
}
