package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-cascade/cascade/lua"
)

// Presence counts the Caddy instances sharing a Redis store: each sends a
// heartbeat every interval (one lua.Presence call, which also counts the
// instances heard from within three intervals). When Redis cannot be
// reached the last count stands: it is what on_store_error local divides
// the limits by while Redis is away, so that the instances together admit
// about one limit's worth.
type Presence struct {
	r        *Redis
	key, id  string
	interval time.Duration
	count    atomic.Int64

	once    sync.Once
	started atomic.Bool
	stop    chan struct{}
	done    chan struct{}
}

// PresenceKey is the hash, after the key prefix, where instances stamp
// their heartbeats.
const PresenceKey = "instances"

// NewPresence returns the presence of this instance on r, not yet
// started: Start sends heartbeats in the background; tests call Beat.
func (r *Redis) NewPresence(interval time.Duration) *Presence {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	p := &Presence{r: r, key: r.prefix + PresenceKey, interval: interval,
		id:   fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		stop: make(chan struct{}), done: make(chan struct{})}
	p.count.Store(1)
	return p
}

// Start sends a heartbeat now and every interval until Close.
func (p *Presence) Start() {
	p.once.Do(func() {
		p.started.Store(true)
		go func() {
			defer close(p.done)
			t := time.NewTicker(p.interval)
			defer t.Stop()
			for {
				_ = p.Beat(context.Background())
				select {
				case <-p.stop:
					return
				case <-t.C:
				}
			}
		}()
	})
}

// Beat stamps this instance and updates the count of live instances; on
// an error the count is left as it was.
func (p *Presence) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.r.timeout)
	defer cancel()
	now, _ := p.r.now()
	n, err := lua.Presence.Run(ctx, p.r.client, []string{p.key}, p.id, (3 * p.interval).Microseconds(), now).Int64()
	if err != nil {
		return fmt.Errorf("redis store: counting instances: %w: %w", ErrUnavailable, err)
	}
	p.count.Store(max(n, 1))
	return nil
}

// Started reports whether Start was called.
func (p *Presence) Started() bool { return p.started.Load() }

// Count is the number of live instances, this one included, as last
// heard (at least 1).
func (p *Presence) Count() int64 { return p.count.Load() }

// Close stops the heartbeats; the instance drops out of the others'
// counts within three intervals.
func (p *Presence) Close() {
	p.once.Do(func() { close(p.done) }) // never started
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}
