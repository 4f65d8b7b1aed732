package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// DefaultSlotTTL is how long a concurrency slot lasts in Redis without its
// holder renewing it, unless RedisOptions.SlotTTL says otherwise.
const DefaultSlotTTL = 30 * time.Second

// renewChunk is the most keys one renewal script is given.
const renewChunk = 512

// renewWorkers is how many renewal scripts run at once (one per Cluster
// slot and chunk): thousands of tenants' slots are renewed in a few round
// trips' time, not thousands.
const renewWorkers = 8

// slots are the concurrency slots (rate.Concurrent) this instance holds in
// Redis. Each is a member of its key's sorted set with a time by which it
// must be renewed (see package lua); while its request is in flight, the
// instance renews it every third of the TTL, so only the slots of an
// instance that died (or lost Redis for longer than the TTL) expire.
//
// Every renewal is exact whatever it races with: it only gives a new time
// to a slot still in the set (a slot given back or expired stays gone), and
// a slot the instance never learnt it took (a decision whose reply was
// lost) is never renewed, so it expires.
type slots struct {
	r   *Redis
	ttl time.Duration

	mu      sync.Mutex
	held    map[slot]struct{}
	started bool
	stop    chan struct{}
	done    chan struct{}
}

// slot is one slot taken: its key (with the store's prefix) and holder.
type slot struct {
	key    string
	holder int64
}

func newSlots(r *Redis, ttl time.Duration) *slots {
	if ttl <= 0 {
		ttl = DefaultSlotTTL
	}
	return &slots{r: r, ttl: ttl, held: map[slot]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// took notes the slots an admitted decision took, and starts renewing.
func (s *slots) took(buckets []Bucket) {
	for _, b := range buckets {
		if b.Limit.Algorithm != rate.Concurrent || b.Cost <= 0 {
			continue
		}
		s.mu.Lock()
		s.held[slot{s.r.prefix + b.Key, b.Holder}] = struct{}{}
		if !s.started {
			s.started = true
			go s.renewEvery(s.ttl / 3)
		}
		s.mu.Unlock()
	}
}

// gone forgets the slots buckets give back (Cost < 0): they are no longer
// renewed, whether or not the give-back reaches Redis (if it does not, the
// slot expires).
func (s *slots) gone(buckets []Bucket) {
	for _, b := range buckets {
		if b.Limit.Algorithm == rate.Concurrent && b.Cost < 0 {
			s.mu.Lock()
			delete(s.held, slot{s.r.prefix + b.Key, b.Holder})
			s.mu.Unlock()
		}
	}
}

// Held is the number of concurrency slots this instance holds.
func (s *slots) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

func (s *slots) renewEvery(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), every)
			sent := s.count()
			renewed, err := s.renew(ctx)
			cancel()
			if s.r.logger == nil {
				continue
			}
			if err != nil {
				s.r.logger.Warn("renewing concurrency slots failed; they expire unless a later renewal reaches Redis in time",
					zap.Duration("slot_ttl", s.ttl), zap.Error(err))
			} else if renewed < sent {
				// Given back meanwhile, or gone: past their time (Redis
				// unreachable for longer than slot_ttl), or reset.
				s.r.logger.Debug("some concurrency slots held were no longer in Redis when renewed",
					zap.Int("held", sent), zap.Int("renewed", renewed))
			}
		}
	}
}

// renew gives every slot held a new expiry, one script per Cluster slot
// and renewChunk keys, and returns how many Redis still had.
func (s *slots) renew(ctx context.Context) (int, error) {
	s.mu.Lock()
	byKey := map[string][]byte{}
	for h := range s.held {
		byKey[h.key] = binary.LittleEndian.AppendUint64(byKey[h.key], math.Float64bits(float64(h.holder)))
	}
	s.mu.Unlock()
	if len(byKey) == 0 {
		return 0, nil
	}
	groups := map[int][]string{}
	for k := range byKey {
		g := 0
		if s.r.cluster != nil {
			g = RedisKeySlot(k)
		}
		groups[g] = append(groups[g], k)
	}
	now, _ := s.r.now()
	var calls [][]string
	for _, keys := range groups {
		for len(keys) > 0 {
			part := keys[:min(len(keys), renewChunk)]
			keys = keys[len(part):]
			calls = append(calls, part)
		}
	}
	var mu sync.Mutex
	var renewed int
	var errs []error
	var wg sync.WaitGroup
	work := make(chan []string)
	for range min(renewWorkers, len(calls)) {
		wg.Go(func() {
			for part := range work {
				args := make([]any, 0, len(part)+2)
				args = append(args, now, s.ttl.Microseconds())
				for _, k := range part {
					args = append(args, byKey[k])
				}
				n, err := lua.Renew.Run(ctx, s.r.client, part, args...).Int()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				renewed += n
				mu.Unlock()
			}
		})
	}
	for _, part := range calls {
		work <- part
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return renewed, fmt.Errorf("redis store: renewing concurrency slots: %w: %w", ErrUnavailable, err)
	}
	return renewed, nil
}

// close stops renewing (the slots still held then expire).
func (s *slots) close() {
	s.mu.Lock()
	started := s.started
	s.started = true // no renewer starts after close
	s.mu.Unlock()
	close(s.stop)
	if started {
		<-s.done
	}
}

// RenewSlots renews at once the concurrency slots this instance holds (a
// background loop does it every third of the slot TTL) and returns how
// many were still taken in Redis (given a new time): for tests and
// operators.
func (r *Redis) RenewSlots(ctx context.Context) (int, error) { return r.slots.renew(ctx) }

// HeldSlots is the number of concurrency slots this instance holds.
func (r *Redis) HeldSlots() int { return r.slots.count() }
