package store

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrOverloaded is the error of a call this instance did not send to Redis
// because too many of its own were already waiting: a decision whose
// tenant's decisions in flight were at their cap
// (RedisOptions.TenantInFlight), or that came when the queue was full and
// its tenant had the most queued; a correction (Adjust) that found this
// instance's share of the connection pool taken by other corrections until
// its timeout. It wraps ErrUnavailable (the request's on_store_error
// applies), and it says nothing of Redis's health: the circuit breaker does
// not count it.
var ErrOverloaded = fmt.Errorf("%w: too many of this instance's calls are waiting for Redis", ErrUnavailable)

// queueMax bounds the decisions queued in one batcher, all tenants
// together. Each is a request waiting for its answer; past this, the
// tenant with the most queued gives way.
const queueMax = 4096

// fairQueue is a batcher's queue of decisions: first in, first out within
// a tenant, and round robin across tenants when a batch is assembled. A
// tenant flooding the store queues behind itself: another tenant's
// decision goes in the next batch whatever the flood's depth, so its wait
// is bounded by a batch or two on the wire, not by the flood.
//
// A tenant is the hash tag of a decision's last key (the deepest bucket's:
// its tenant subtree, see hierarchy.Tree.Resolve). Tiers above the tenant
// (a global ceiling) are shared by all and are still decided exactly: the
// order of two tenants' decisions on a shared bucket was never promised.
type fairQueue struct {
	mu        sync.Mutex
	tenants   map[string]*tenantCalls // tenants with calls queued or on the wire
	ring      []*tenantCalls          // tenants with calls queued, in turn order
	turn      int                     // the ring index whose turn is next
	queued    int
	perTenant int // calls queued or on the wire per tenant at most; 0: no cap
	closed    bool
	// wake holds a token while calls may be queued with no worker awake
	// to take them.
	wake chan struct{}
}

// tenantCalls are one tenant's calls.
type tenantCalls struct {
	name     string
	calls    []*call // queued, oldest first
	onWire   int     // taken into a batch, not yet finished
	assigned bool    // in the ring
}

func newFairQueue(perTenant int) *fairQueue {
	return &fairQueue{tenants: map[string]*tenantCalls{}, perTenant: perTenant, wake: make(chan struct{}, 1)}
}

// tenantOf names the tenant of a call from its keys: the hash tag of the
// last.
func tenantOf(keys []string) string { return hashTag(keys[len(keys)-1]) }

// push queues c, or fails with ErrOverloaded (its tenant at its cap, or the
// queue full with no bigger tenant to give way) or redis.ErrClosed.
func (q *fairQueue) push(c *call) error {
	name := c.name
	if name == "" {
		name = tenantOf(c.keys)
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return redis.ErrClosed
	}
	t := q.tenants[name]
	if t == nil {
		t = &tenantCalls{name: name}
		q.tenants[name] = t
	}
	if q.perTenant > 0 && len(t.calls)+t.onWire >= q.perTenant {
		q.forget(t)
		q.mu.Unlock()
		return fmt.Errorf("%w: tenant %s has %d decisions waiting (tenant_in_flight)", ErrOverloaded, name, q.perTenant)
	}
	if q.queued >= queueMax {
		// The tenant with the most queued gives way: its newest call
		// fails, unless that is this tenant, whose call then fails.
		var victim *tenantCalls
		for _, o := range q.ring {
			if victim == nil || len(o.calls) > len(victim.calls) {
				victim = o
			}
		}
		if victim == nil || len(victim.calls) <= len(t.calls)+1 {
			q.forget(t)
			q.mu.Unlock()
			return ErrOverloaded
		}
		last := victim.calls[len(victim.calls)-1]
		victim.calls = victim.calls[:len(victim.calls)-1]
		q.queued--
		last.err = ErrOverloaded
		close(last.done)
	}
	c.tenant = t
	t.calls = append(t.calls, c)
	q.queued++
	if !t.assigned {
		t.assigned = true
		// A tenant joining takes its turn last: before the tenant
		// whose turn is next.
		q.ring = slices.Insert(q.ring, q.turn, t)
		q.turn = (q.turn + 1) % len(q.ring)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// forget drops a tenant with nothing queued or on the wire. q.mu is held.
func (q *fairQueue) forget(t *tenantCalls) {
	if len(t.calls) == 0 && t.onWire == 0 && q.tenants[t.name] == t {
		delete(q.tenants, t.name)
	}
}

// take appends a batch to batch: a call of each tenant in turn, round after
// round, until the batch is full (maxCalls calls, or maxBuckets buckets
// reached) or nothing is queued. It takes at least one call if any is
// queued.
func (q *fairQueue) take(batch []*call, maxCalls, maxBuckets int) []*call {
	now := time.Now()
	q.mu.Lock()
	buckets := 0
	for q.queued > 0 && len(batch) < maxCalls && (len(batch) == 0 || buckets < maxBuckets) {
		t := q.ring[q.turn]
		c := t.calls[0]
		c.takenAt = now
		t.calls[0] = nil
		t.calls = t.calls[1:]
		t.onWire++
		q.queued--
		batch = append(batch, c)
		buckets += len(c.keys)
		if len(t.calls) == 0 {
			q.leave(q.turn)
		} else {
			q.turn = (q.turn + 1) % len(q.ring)
		}
	}
	more := q.queued > 0
	q.mu.Unlock()
	if more { // for another worker
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return batch
}

// leave takes the tenant at ring index i, with nothing left queued, out
// of the ring; the turn stays with the tenant whose turn it was (the next
// one, if it was this one's). q.mu is held.
func (q *fairQueue) leave(i int) {
	t := q.ring[i]
	t.calls, t.assigned = nil, false
	q.ring = slices.Delete(q.ring, i, i+1)
	if i < q.turn {
		q.turn--
	}
	if q.turn >= len(q.ring) {
		q.turn = 0
	}
}

// finished tells the queue a batch's calls are answered.
func (q *fairQueue) finished(batch []*call) {
	q.mu.Lock()
	for _, c := range batch {
		if c.tenant != nil {
			c.tenant.onWire--
			q.forget(c.tenant)
		}
	}
	q.mu.Unlock()
}

// close fails every call still queued with redis.ErrClosed, and every
// call pushed from now on.
func (q *fairQueue) close() {
	q.mu.Lock()
	q.closed = true
	for _, t := range q.ring {
		for _, c := range t.calls {
			c.err = redis.ErrClosed
			close(c.done)
		}
		t.calls = nil
	}
	q.ring, q.queued = nil, 0
	clear(q.tenants)
	q.mu.Unlock()
}

// ErrQueueTimeout is the error of a decision whose deadline passed while
// it still waited in this instance's queue: it never reached Redis, so
// it says nothing of Redis's health (the breaker does not count it).
var ErrQueueTimeout = fmt.Errorf("%w (its deadline passed in this instance's queue)", ErrOverloaded)

// abandon takes c out of the queue if no worker has taken it yet, and
// tells whether it did.
func (q *fairQueue) abandon(c *call) (bool, time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := c.tenant
	if t == nil || !c.takenAt.IsZero() || q.closed {
		return false, c.takenAt
	}
	i := slices.Index(t.calls, c)
	if i < 0 { // displaced: already answered
		return false, c.takenAt
	}
	t.calls = slices.Delete(t.calls, i, i+1)
	q.queued--
	if len(t.calls) == 0 {
		q.leave(slices.Index(q.ring, t))
		q.forget(t)
	}
	return true, time.Time{}
}

// overloaded tells whether err is a decision this instance shed itself.
func overloaded(err error) bool { return errors.Is(err, ErrOverloaded) }
