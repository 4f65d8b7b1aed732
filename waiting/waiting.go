// Package waiting keeps the requests that rate_limit handlers hold for
// their turn (max_wait), so that batch traffic gives way to interactive
// traffic. Each held request is registered on the buckets it waits for
// (those it overdrew: it goes when they have refilled). A batch request may
// be held only while no interactive request waits on any bucket it is
// charged on; an interactive request preempts the batch requests that wait
// on a bucket it is charged on — they give their reservations back and are
// refused, and it is decided in their place. Batch requests held by their
// own limits (a user's) are left alone by other users' interactive
// requests; those held by a shared limit (an organisation's) are not.
//
// A Registry knows nothing of limits or stores: its keys are the bucket
// keys of one store (store.Bucket.Key), and its times are the callers'.
// Giving a reservation back is the holder's: a preempted entry's holder
// refunds it once and calls GaveBack, and whoever preempted it may Wait for
// that before deciding. Exactly one of a held request's release (Go) and
// its preemption happens.
//
// Processes sharing a store (Caddy instances on one Redis) Connect their
// Registries over a Link (store.Bus), so that this holds between them too
// (see remote.go).
//
// "Interactive" here is every class but batch: critical requests wait as
// interactive ones do (they neither preempt nor yield to each other).
package waiting

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Registry is the requests held by the handlers of one store, in one
// process, and — once Connected — those other processes sharing the store
// hold (see remote.go).
type Registry struct {
	mu      sync.Mutex
	keys    map[string]*waiters
	batches atomic.Int64 // batch entries held
	seq     uint64       // the last entry's id

	remoteState
}

// waiters are the entries held on one bucket, by class.
type waiters struct {
	high, batch map[*Entry]struct{}
}

// New returns an empty registry, not connected to other processes.
func New() *Registry {
	r := &Registry{keys: map[string]*waiters{}}
	r.remoteState.init()
	return r
}

// Destruct lets a Registry live in a caddy.UsagePool: it closes its Link,
// if it has one.
func (r *Registry) Destruct() error {
	r.mu.Lock()
	l := r.link
	r.link = nil
	r.mu.Unlock()
	if l != nil {
		return l.Close()
	}
	return nil
}

// state is where an entry's wait stands.
type state uint8

const (
	holding   state = iota
	ended           // released by its holder (it goes, or its client went away)
	preempted       // refused in favour of an interactive request
)

// Entry is one held request.
type Entry struct {
	r       *Registry
	id      uint64 // names it to other processes
	batch   bool
	keys    []string  // the buckets it waits on
	all     []string  // batch: all of its buckets
	until   time.Time // when it goes; for a pending entry, at the latest
	state   state     // guarded by r.mu
	preempt chan struct{}
	done    chan struct{}
	retry   time.Time // guarded by r.mu

	// An interactive entry registered by Preempt is pending until its
	// request is decided (Hold or Go): settled is closed then.
	settled   chan struct{}
	isSettled bool   // guarded by r.mu
	by        *Entry // a batch entry preempted by a pending entry: that entry
}

// BatchHeld reports whether any batch request is held, here or (as far as
// this process has heard) by another process sharing the store: the one
// check an interactive request makes before its decision, without a lock.
func (r *Registry) BatchHeld() bool { return r.batches.Load() > 0 || r.remoteBatches.Load() > 0 }

// Preempt preempts the batch requests held on any of keys (the buckets of
// an interactive request about to be decided), so that their reservations
// come back before it is: each must give its reservation back (see Wait).
// The interactive request is registered at once as waiting, until at the
// latest, on the buckets those batch requests waited on, so that no batch
// request takes their place meanwhile; pass the entry to Hold if the
// request is held, or Leave it. With no batch request held on keys, it
// returns nil, nil.
func (r *Registry) Preempt(keys []string, until time.Time) (*Entry, []*Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	victims := r.batchOn(keys, nil)
	peers, peerKeys := r.remoteBatchOn(keys)
	if len(victims) == 0 && len(peers) == 0 {
		return nil, nil
	}
	e := &Entry{r: r, until: until, settled: make(chan struct{})}
	for _, v := range victims {
		for _, k := range v.keys {
			if slices.Contains(keys, k) && !slices.Contains(e.keys, k) {
				e.keys = append(e.keys, k)
			}
		}
	}
	for _, k := range peerKeys {
		if !slices.Contains(e.keys, k) {
			e.keys = append(e.keys, k)
		}
	}
	r.add(e)
	r.preemptAll(victims, e, until)
	if len(peers) > 0 {
		victims = append(victims, r.preemptRemote(e, keys, peers, until))
	}
	return e, victims
}

// Hold registers a request held until until on the buckets it waits on
// (waits; when empty, all of its buckets, keys).
//
// A batch request is refused (nil) while an interactive request waits on
// any of its buckets: it must give its reservation back, and busy is when
// the last of those interactive requests goes.
//
// An interactive request is registered (e, from Preempt, is updated), and
// the batch requests still held on its buckets are preempted (returned):
// they were decided while it was, and must not go ahead of it.
func (r *Registry) Hold(e *Entry, batch bool, keys, waits []string, until time.Time) (held *Entry, busy time.Time, victims []*Entry) {
	if len(waits) == 0 {
		waits = keys
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if batch {
		if busy, ok := r.busy(keys); ok {
			return nil, busy, nil
		}
		e = &Entry{r: r, batch: true, all: slices.Clone(keys), preempt: make(chan struct{}), done: make(chan struct{})}
	} else if e == nil || e.state != holding {
		e = &Entry{r: r}
	} else {
		r.unindex(e) // re-added below: announced again, not left
	}
	e.keys, e.until = slices.Clone(waits), until
	r.add(e)
	if !batch {
		e.settle()
		victims = r.batchOn(keys, nil)
		r.preemptAll(victims, nil, until)
		if peers, _ := r.remoteBatchOn(keys); len(peers) > 0 {
			victims = append(victims, r.preemptRemote(e, keys, peers, until))
		}
	}
	return e, time.Time{}, victims
}

// batchOn appends to out the batch entries held on any of keys.
func (r *Registry) batchOn(keys []string, out []*Entry) []*Entry {
	for _, k := range keys {
		if w := r.keys[k]; w != nil {
			for v := range w.batch {
				if !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// busy is when the last interactive request waiting on any of keys goes,
// and whether there is one, here or in another process.
func (r *Registry) busy(keys []string) (time.Time, bool) {
	last, found := r.remoteBusy(keys)
	for _, k := range keys {
		if w := r.keys[k]; w != nil {
			for e := range w.high {
				found = true
				if e.until.After(last) {
					last = e.until
				}
			}
		}
	}
	return last, found
}

// preemptAll preempts held batch entries for an interactive request (by,
// when it is still to be decided) that goes at until at the latest; each
// is told when the interactive requests on its buckets, that one
// included, will have gone, at the latest.
func (r *Registry) preemptAll(victims []*Entry, by *Entry, until time.Time) {
	for _, v := range victims {
		r.remove(v)
		v.state, v.by = preempted, by
		v.retry, _ = r.busy(v.all)
		if until.After(v.retry) {
			v.retry = until
		}
		close(v.preempt)
	}
}

// settle says that a pending entry's request was decided (r.mu held).
func (e *Entry) settle() {
	if e.settled != nil && !e.isSettled {
		e.isSettled = true
		close(e.settled)
	}
}

func (r *Registry) add(e *Entry) {
	if e.id == 0 {
		r.seq++
		e.id = r.seq
	}
	r.announce(e)
	if e.batch {
		r.batches.Add(1)
	}
	for _, k := range e.keys {
		w := r.keys[k]
		if w == nil {
			w = &waiters{}
			r.keys[k] = w
		}
		m := &w.high
		if e.batch {
			m = &w.batch
		}
		if *m == nil {
			*m = map[*Entry]struct{}{}
		}
		(*m)[e] = struct{}{}
	}
}

func (r *Registry) remove(e *Entry) {
	r.denounce(e)
	r.unindex(e)
}

// unindex removes e from r's keys (r.mu held).
func (r *Registry) unindex(e *Entry) {
	if e.batch {
		r.batches.Add(-1)
	}
	for _, k := range e.keys {
		w := r.keys[k]
		if w == nil {
			continue
		}
		delete(w.high, e)
		delete(w.batch, e)
		if len(w.high) == 0 && len(w.batch) == 0 {
			delete(r.keys, k)
		}
	}
}

// Go ends the wait of a held request whose time has come (or whose client
// went away), and reports whether it may go: false when it was preempted
// first. Exactly one of Go and a preemption wins. A nil entry (a request
// held outside any registry) always goes.
func (e *Entry) Go() bool {
	if e == nil {
		return true
	}
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	e.settle()
	switch e.state {
	case holding:
		e.r.remove(e)
		e.state = ended
		return true
	case ended:
		return true
	}
	return false
}

// Leave ends e's wait, if it has not ended (nil is no entry).
func (e *Entry) Leave() { e.Go() }

// Preempted is closed when a batch entry is preempted: its holder must
// give its reservation back, then call GaveBack. It is nil (never ready)
// for an interactive entry.
func (e *Entry) Preempted() <-chan struct{} { return e.preempt }

// Retry is, for a preempted entry (after GaveBack), when the interactive
// requests waiting on its buckets will have gone: once the request that
// preempted it is decided (Retry waits for that, until ctx is done), the
// time of the last of them; zero if none waits. Without that decision,
// the latest time that request said it could go.
func (e *Entry) Retry(ctx context.Context) time.Time {
	if e.by != nil {
		select {
		case <-e.by.settled:
		case <-ctx.Done():
			e.r.mu.Lock()
			defer e.r.mu.Unlock()
			return e.retry
		}
	}
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	busy, _ := e.r.busy(e.all)
	return busy
}

// GaveBack says that a preempted entry's reservation was given back.
func (e *Entry) GaveBack() { close(e.done) }

// Wait waits until the preempted entries gave their reservations back, or
// ctx is done. An entry standing for another process's batch requests
// (preemptRemote) is done when every such process said its requests gave
// theirs back, or after remoteAckTimeout.
func Wait(ctx context.Context, victims []*Entry) error {
	for _, v := range victims {
		select {
		case <-v.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
