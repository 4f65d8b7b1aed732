package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerOptions configure the Redis store's circuit breaker. A Redis that
// stalls makes every call wait out the store's Timeout before it fails;
// once calls have failed Failures times in a row, the breaker opens: calls
// fail at once (ErrBreakerOpen) while the store pings Redis in the
// background, every Cooldown, and the first ping that succeeds closes the
// breaker again. The requests' failure policy (on_store_error) applies to
// them in microseconds instead of after the timeout.
type BreakerOptions struct {
	// Failures is how many calls in a row must fail for the breaker to
	// open; 0 disables the breaker.
	Failures int
	// Cooldown is the wait between the background pings while the breaker
	// is open. Zero means one second.
	Cooldown time.Duration
	// OnChange, when set, is told of each transition: open with the
	// failure that opened it, then closed (err nil). It must not block.
	OnChange func(open bool, err error)
}

// ErrBreakerOpen is the error of every call while the breaker is open. It
// wraps ErrUnavailable.
var ErrBreakerOpen = fmt.Errorf("%w: circuit breaker open after repeated failures; Redis is probed in the background", ErrUnavailable)

// breaker counts consecutive failures and, open, fails calls at once. A
// nil *breaker is disabled: its methods do nothing.
type breaker struct {
	opts     BreakerOptions
	ping     func(context.Context) error
	open     atomic.Bool
	failures atomic.Int64
	trips    atomic.Int64 // times opened
	stop     chan struct{}
	probing  sync.WaitGroup
	stopOnce sync.Once
}

func newBreaker(opts BreakerOptions, ping func(context.Context) error) *breaker {
	if opts.Failures <= 0 {
		return nil
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = time.Second
	}
	return &breaker{opts: opts, ping: ping, stop: make(chan struct{})}
}

// allow returns ErrBreakerOpen while the breaker is open.
func (b *breaker) allow() error {
	if b != nil && b.open.Load() {
		return ErrBreakerOpen
	}
	return nil
}

// record counts a call's outcome. Only the store's own failures count: a
// call whose caller gave up (its context canceled) says nothing of Redis.
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
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrBreakerOpen) || overloaded(err) {
		return
	}
	if b.failures.Add(1) < int64(b.opts.Failures) || !b.open.CompareAndSwap(false, true) {
		return
	}
	b.trips.Add(1)
	if b.opts.OnChange != nil {
		b.opts.OnChange(true, err)
	}
	b.probing.Add(1)
	go b.probe()
}

// probe pings the store every Cooldown until it answers, then closes the
// breaker.
func (b *breaker) probe() {
	defer b.probing.Done()
	t := time.NewTicker(b.opts.Cooldown)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		if b.ping(context.Background()) == nil {
			b.failures.Store(0)
			b.open.Store(false)
			if b.opts.OnChange != nil {
				b.opts.OnChange(false, nil)
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

// SetBreakerChange sets the breaker's OnChange (for a caller that names
// the store only once it exists). Call it before the store is used.
func (r *Redis) SetBreakerChange(fn func(open bool, err error)) {
	if r.breaker != nil {
		r.breaker.opts.OnChange = fn
	}
}

// BreakerOpen tells whether the store's circuit breaker is open (false
// when it has none).
func (r *Redis) BreakerOpen() bool { return r.breaker != nil && r.breaker.open.Load() }

// BreakerTrips is how many times the store's circuit breaker has opened.
func (r *Redis) BreakerTrips() int64 {
	if r.breaker == nil {
		return 0
	}
	return r.breaker.trips.Load()
}
