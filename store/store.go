// Package store decides whether one request's cost fits every limit on its
// path, in one atomic step, and corrects a decision afterwards. It has two
// implementations with one contract: Memory (embedded, the default) and
// Redis (shared by many Caddy instances). The conformance suite in
// store/storetest runs the same scenarios against both.
//
// A store knows nothing of HTTP, Caddy or trees: it sees buckets (a key, a
// rate.Limit and a cost) and answers with a Decision.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// Bucket is one limit applied to one key, charged Cost by one request.
type Bucket struct {
	// Key identifies the bucket's state. Keys are built by package hierarchy:
	// client values are escaped or hashed, and the part in braces ("{...}")
	// is the hash tag that keeps one tenant's subtree in one Redis Cluster
	// slot.
	Key   string
	Limit rate.Limit
	// Cost is what this request costs in the limit's dimension. In Adjust it
	// is the correction: negative refunds, positive adds debt.
	Cost int64
	// Charged is used by Adjust only: when (µs since the Unix epoch) the
	// cost being corrected was charged, as the decision's ChargedAt says;
	// 0 means unknown. A refund goes back to the window that cost
	// was counted in, and nowhere once that window is over (see
	// rate.Limit.Adjust).
	Charged int64
	// Holder names the request that takes a slot of a concurrency limit
	// (rate.Concurrent), whose Cost is then 1 (0: only looked at); the
	// slot is given back by Adjust with Cost −1 and the same Holder. A
	// number below 2^53, distinct among the requests in flight on the key
	// (package engine draws them). The memory store counts slots and
	// ignores it; Redis keeps each slot as its holder's, renewed while the
	// instance that took it lives.
	Holder int64
}

// Decision is the outcome of Decide.
type Decision struct {
	// Allowed is true only when every bucket admitted the cost; then every
	// bucket was charged. Otherwise no bucket was charged (all or nothing).
	Allowed bool
	// Impossible is true when some bucket can never admit this cost (the
	// cost exceeds its capacity): waiting will not help.
	Impossible bool
	// Results holds each bucket's verdict, in the order of the buckets.
	Results []rate.Result
	// RetryAfter is, on denial, the earliest wait after which every bucket
	// could admit the cost: the maximum over buckets. Zero when Allowed or
	// Impossible.
	RetryAfter time.Duration
	// At is when the decision was made (µs since the Unix epoch), on the
	// clock of the store's state: the memory store's own, Redis's TIME (or
	// the test clock) as the script saw it. A correction of a bucket's cost
	// gives its ChargedAt as Bucket.Charged, so that a refund finds the
	// window, or the very charge, it corrects.
	At int64
	// Times, when not nil, is each bucket's own time of decision: a
	// Cluster path across slots is decided by several masters, each on
	// its clock (At is then the last bucket's).
	Times []int64
}

// ChargedAt is when bucket i of the decision was decided: what a
// correction of its cost gives as Bucket.Charged.
func (d *Decision) ChargedAt(i int) int64 {
	if d.Times != nil {
		return d.Times[i]
	}
	return d.At
}

// Store is the contract both stores fulfil.
type Store interface {
	// Decide charges every bucket its cost if every bucket admits it, and
	// none otherwise, atomically with respect to every other Decide and
	// Adjust on the same keys. The store must not use the buckets slice
	// once Decide has returned (even on a timeout): the handler reuses
	// its memory for the next request. The keys (strings) may be kept.
	Decide(ctx context.Context, buckets []Bucket) (Decision, error)
	// Adjust applies each bucket's Cost as a correction (refund or debt)
	// without deciding anything, in one atomic step.
	Adjust(ctx context.Context, buckets []Bucket) error
	// Close releases the store's resources.
	Close() error
}

// Responses is implemented by stores that keep the responses of requests
// that carried idempotency keys, so that a retry is answered from the
// store without reaching the upstream (both stores do, and a store of
// package lease passes them through).
//
// A response is opaque bytes to the store. Its first ResponseHead bytes
// must say what a retry needs when the rest is gone: under pressure of its
// bounds a store may keep only that head (the memory store truncates the
// oldest responses before it drops any); a caller tells a
// truncated response by its length.
type Responses interface {
	// Response returns the response kept under key, or nil and no error
	// when none is (never kept, expired or dropped), and how many times
	// it has been read since it was kept, this read included (so that a
	// caller can bound what one response is read for free).
	Response(ctx context.Context, key string) (response []byte, reads int64, err error)
	// KeepResponse keeps response under key for ttl, replacing any kept
	// before (its reads count from 0 again). The store does not keep the
	// slice: it copies it.
	KeepResponse(ctx context.Context, key string, response []byte, ttl time.Duration) error
}

// ResponseKeySuffix ends the key of every kept response: a store's
// resets of limit state (ResetMatching) leave kept responses alone, so a
// reset never makes an operation run twice.
const ResponseKeySuffix = "#response"

// ResponseHead is the length of the part of a kept response that a store
// keeps when it cannot keep the whole (see Responses).
const ResponseHead = 64

// ErrUnavailable wraps every error that means the store could not decide
// (Redis unreachable, timed out, …), so the handler can apply its declared
// failure policy.
var ErrUnavailable = errors.New("rate limit store unavailable")

// Combine folds per-bucket results into a Decision. Both stores use it, so
// the rules for Allowed, Impossible and RetryAfter live in one place.
func Combine(results []rate.Result) Decision {
	d := Decision{Allowed: true, Results: results}
	var retry int64
	for _, r := range results {
		if r.Allowed {
			continue
		}
		d.Allowed = false
		if r.Impossible {
			d.Impossible = true
		}
		if r.RetryAfter > retry {
			retry = r.RetryAfter
		}
	}
	if !d.Allowed {
		// Nothing was charged: every bucket stands as it was before.
		for i := range results {
			results[i].Remaining = results[i].Before
		}
		if !d.Impossible {
			d.RetryAfter = time.Duration(retry) * time.Microsecond
		}
	}
	return d
}

// Clock returns the current time in µs since the Unix epoch. Stores take one
// so tests can drive time; production uses the wall clock (memory) or Redis
// TIME (redis).
type Clock func() int64

// WallClock is the production clock of the memory store.
func WallClock() int64 { return time.Now().UnixMicro() }
