package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// BreakerOptions configure the Redis store's circuit breakers: one for a
// single server or a Sentinel's master, one per master on a Cluster. A
// master that stalls makes every call to it wait out the store's Timeout
// before it fails; once calls to it have failed Failures times in a row,
// its breaker opens: its calls fail at once (ErrBreakerOpen) while the
// store pings it in the background, every Cooldown, and the first ping
// that succeeds closes the breaker again. The requests' failure policy
// (on_store_error) applies to them in microseconds instead of after the
// timeout, and on a Cluster to them only: the other masters' calls go on.
type BreakerOptions struct {
	// Failures is how many calls in a row must fail for the breaker to
	// open; 0 disables the breaker.
	Failures int
	// Cooldown is the wait between the background pings while the breaker
	// is open. Zero means one second.
	Cooldown time.Duration
	// OnChange, when set, is told of each transition of the breaker of
	// node (a Cluster master's address; the store's address, or its
	// Sentinel master's name, elsewhere): open with the failure that
	// opened it, then closed (err nil). It must not block.
	OnChange func(node string, open bool, err error)
}

// ErrBreakerOpen is the error of every call while the breaker is open. It
// wraps ErrUnavailable.
var ErrBreakerOpen = fmt.Errorf("%w: circuit breaker open after repeated failures; Redis is probed in the background", ErrUnavailable)

// breaker counts consecutive failures and, open, fails calls at once. A
// nil *breaker is disabled: its methods do nothing.
type breaker struct {
	node string // what OnChange and metrics name it
	err  error  // what a call gets while it is open: ErrBreakerOpen, naming node
	opts *BreakerOptions
	// ping tells whether the node answers again. On a Cluster it answers
	// nil too when the node no longer serves any slot: its slots' calls
	// go to their new master, which has a breaker of its own.
	ping     func(context.Context) error
	open     atomic.Bool
	failures atomic.Int64
	trips    atomic.Int64  // times opened
	wake     chan struct{} // probe at once (a new master was announced)
	stop     chan struct{}
	probing  sync.WaitGroup
	stopOnce sync.Once
}

func newBreaker(node string, opts *BreakerOptions, ping func(context.Context) error) *breaker {
	if opts.Failures <= 0 {
		return nil
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = time.Second
	}
	return &breaker{node: node, opts: opts, ping: ping, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		err: fmt.Errorf("redis store: %s: %w", node, ErrBreakerOpen)}
}

// allow returns an error wrapping ErrBreakerOpen, naming the node, while
// the breaker is open.
func (b *breaker) allow() error {
	if b != nil && b.open.Load() {
		return b.err
	}
	return nil
}

// record counts a call's outcome. Only Redis's failures count: a call
// whose caller gave up (its context canceled), that this instance shed, or
// that met a closed store says nothing of Redis.
func (b *breaker) record(err error) {
	if b == nil {
		return
	}
	if err == nil {
		if b.failures.Load() != 0 { // no write on the common path
			b.failures.Store(0)
		}
		return
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrBreakerOpen) || errors.Is(err, redis.ErrClosed) || overloaded(err) {
		return
	}
	if b.failures.Add(1) < int64(b.opts.Failures) || !b.open.CompareAndSwap(false, true) {
		return
	}
	b.trips.Add(1)
	if b.opts.OnChange != nil {
		b.opts.OnChange(b.node, true, err)
	}
	select {
	case <-b.wake: // a wake-up from before it opened says nothing now
	default:
	}
	b.probing.Add(1)
	go b.probe()
}

// probeNow has an open breaker ping at once rather than at its next tick.
func (b *breaker) probeNow() {
	if b == nil {
		return
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// probe pings the node every Cooldown (or when woken) until it answers,
// then closes the breaker.
func (b *breaker) probe() {
	defer b.probing.Done()
	t := time.NewTicker(b.opts.Cooldown)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.wake:
		}
		if b.ping(context.Background()) == nil {
			b.failures.Store(0)
			b.open.Store(false)
			if b.opts.OnChange != nil {
				b.opts.OnChange(b.node, false, nil)
			}
			return
		}
	}
}

// close stops the background pings.
func (b *breaker) close() {
	if b == nil {
		return
	}
	b.stopOnce.Do(func() { close(b.stop) })
	b.probing.Wait()
}

// SetBreakerChange sets the breakers' OnChange (for a caller that names
// the store only once it exists). Call it before the store is used.
func (r *Redis) SetBreakerChange(fn func(node string, open bool, err error)) {
	r.breakerOpts.OnChange = fn
}

// BreakerState is the state of one master's circuit breaker.
type BreakerState struct {
	// Node is the master's address on a Cluster; elsewhere the store's
	// address, or its Sentinel master's name.
	Node  string
	Open  bool
	Trips int64 // times opened
}

// Breakers are the states of the store's circuit breakers (none when it
// has no breaker): one, or one per master a Cluster decision has gone to.
func (r *Redis) Breakers() []BreakerState {
	var out []BreakerState
	for _, b := range r.batch.allBreakers() {
		out = append(out, BreakerState{Node: b.node, Open: b.open.Load(), Trips: b.trips.Load()})
	}
	return out
}

// BreakerOpen tells whether one of the store's circuit breakers is open
// (false when it has none).
func (r *Redis) BreakerOpen() bool {
	for _, b := range r.batch.allBreakers() {
		if b.open.Load() {
			return true
		}
	}
	return false
}

// BreakerTrips is how many times the store's circuit breakers have opened.
func (r *Redis) BreakerTrips() int64 {
	var n int64
	for _, b := range r.batch.allBreakers() {
		n += b.trips.Load()
	}
	return n
}
