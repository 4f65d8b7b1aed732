package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/store"
)

// Replay, with Idempotency.Replay, keeps the response of a request that
// carried an idempotency key beside its record, so that a retry is
// answered from the store and never reaches the upstream again:
//
//   - Decide first looks the path's kept response up (one store read). A
//     retry finds it in Decision.Response: Replayed, admitted without a
//     charge and without a decision; the front end answers with it. A
//     response is answered free Idempotency.Retries times; after that a
//     retry that finds it is decided and charged as any request (and may
//     be refused), and is answered with it when admitted: a replay is no
//     way around the limits.
//   - Found none, Decide decides the path with its record, as without
//     replay: a duplicate of a request in flight is refused
//     (ReasonInFlight); a request with no record is the first, charged and
//     recorded.
//   - The first's front end then either keeps its response (Keep; from
//     then on its retries find it) or, when the operation may not have
//     happened (a server error), forgets the record (Forget), so that a
//     retry is a new attempt, charged again.
//
// A record is never ended by Done under replay: a record whose request
// neither kept a response nor forgot it (its instance crashed, or the
// store failed to keep it) refuses duplicates as in flight until
// Idempotency.InFlight, after which a retry is a new attempt. That is why
// a replay record lets no retry through free (its Burst is 0): a retry
// either finds the response or is a new request.

// responseKey is the store key of the response kept with the record of
// key record: in
// the record's hash tag, so that on a Redis Cluster it lives in the
// record's slot.
func responseKey(record string) string { return record + store.ResponseKeySuffix }

// errNoResponses refuses replay on a store that keeps no responses.
var errNoResponses = errors.New("the store keeps no responses: idempotency replay needs the memory or the Redis store")

// CheckReplay reports whether every store of the engine's paths keeps
// responses, as Idempotency.Replay needs.
func (e *Engine) CheckReplay() error {
	if _, ok := e.cfg.Store.(store.Responses); !ok {
		return fmt.Errorf("store %s: %w", e.cfg.StoreName, errNoResponses)
	}
	for _, r := range e.cfg.Routes {
		if _, ok := r.Store.(store.Responses); !ok {
			return fmt.Errorf("store %s: %w", r.Name, errNoResponses)
		}
	}
	return nil
}

// kept looks up the response kept for d's record. It returns true when it
// answers d: a retry replayed from the store, free. A response found past
// its free replays is set in d, which is then decided as any request; a
// store error is left for settle to meet as a failure of the store (its
// policy applies: no decision is made without the lookup).
func (e *Engine) kept(ctx context.Context, d *Decision) bool {
	rs, ok := e.storeAt(d.route).(store.Responses)
	if !ok {
		d.lookupErr = errNoResponses
		return false
	}
	resp, reads, err := rs.Response(ctx, responseKey(d.record.Key))
	if err != nil {
		d.lookupErr = fmt.Errorf("looking up a kept response: %w", err)
		return false
	}
	if resp == nil {
		return false
	}
	d.Response = resp
	if reads > int64(e.cfg.Idempotency.Retries) {
		// Its free replays used up: charged as any request (and refused
		// when its limits are spent), answered from the store all the
		// same. Decided without the record, which stays as it is.
		d.record = store.Bucket{}
		return false
	}
	d.Replayed, d.Reason = true, ReasonReplayed
	d.Decision = store.Decision{Allowed: true}
	d.Closest, d.Wait, d.Retry = -1, 0, 0
	return true
}

// KeepsResponse reports whether d's request is the first of its
// idempotency key under replay (it wrote its record): its front end is to
// Keep its response, or Forget the record.
func (d *Decision) KeepsResponse() bool {
	return d.recorded && d.e.cfg.Idempotency.Replay
}

// Keep keeps response (the front end's encoding of it, see
// store.Responses for what its head must say) for d's record for
// Idempotency.TTL: its retries are answered with it from now on. It does
// nothing unless KeepsResponse. A response that cannot be kept (the store
// failed) leaves the record in flight until Idempotency.InFlight: its
// retries are refused as duplicates until then, and are new attempts
// after it.
func (d *Decision) Keep(ctx context.Context, response []byte) error {
	if !d.KeepsResponse() {
		return nil
	}
	d.recorded = false // never ended: the kept response answers its retries
	e := d.e
	rs, ok := e.storeFor(d.Local, d.route).(store.Responses)
	if !ok {
		return errNoResponses
	}
	err := rs.KeepResponse(ctx, responseKey(d.record.Key), response, e.cfg.Idempotency.TTL)
	if err == nil {
		return nil
	}
	if ok, held := e.keepLog.Allow(time.Now()); ok {
		e.cfg.Logger.Warn("rate limit: keeping a response for its retries failed; they are refused as duplicates until in_flight, then new attempts (logged at most once a second)",
			zap.Int64("not_logged", held), zap.Error(e.ShowError(err, d.Buckets)))
	}
	return err
}

// Forget makes Done forget d's record instead of ending its flight: the
// request's operation may not have happened (its upstream failed), so a
// retry is a new attempt, charged and recorded again. It does nothing
// unless KeepsResponse.
func (d *Decision) Forget() {
	if d.KeepsResponse() {
		d.forget = true
	}
}
