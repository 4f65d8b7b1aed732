package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/logsample"
)

// Bus carries short messages between the processes sharing a Redis store,
// over Redis Pub/Sub on one channel (under the store's key prefix): what
// one Caddy instance's held requests are, so that another's may give way
// to them (package waiting), and which buckets were reset under other
// instances' leases (package lease). Delivery is at most once and in order
// per sender; a message published while Redis is away, or while a
// receiver is reconnecting, is lost — which is why what travels on a Bus
// must expire by itself.
//
// On a Cluster the channel is a sharded one (SPUBLISH, SSUBSCRIBE; Redis
// 7): its messages all pass through the master of the channel's slot, so
// they keep their order (a plain PUBLISH goes to any node and reaches the
// others over the cluster bus, which reorders them). When that slot moves
// (resharding, a failover) the node ends the subscription on a connection
// it keeps open, which go-redis does not redo by itself: the Bus
// subscribes again, at the slot's new master.
//
// What a Bus hears is checked before it is delivered (see busauth.go): a
// message too long, or one that does not verify under the store's bus
// key, is dropped and counted (Stats).
type Bus struct {
	r       *Redis
	channel string
	out     chan []byte
	state   *busState        // the store's: its key, and its counters in all
	counts  busCounters      // this Bus's
	dropLog *logsample.Every // drops: one logged a minute
	// rejects samples the logging of messages heard and dropped: one line
	// per reason a minute.
	rejects *logsample.Sampler
	// unheard is when (unix ns) the oldest message published since the
	// Bus last heard one was published (0: none): every message published
	// is heard by its sender too.
	unheard atomic.Int64

	mu     sync.Mutex
	ps     *redis.PubSub // the subscription in use
	closed bool

	quiet atomic.Int64 // quietAfter (ns), but in tests

	closeOnce sync.Once
	stop      chan struct{}
	done      sync.WaitGroup
}

const (
	// busQueue is how many messages may wait to be published; beyond it
	// a message is dropped (counted by Dropped): a request never waits on
	// the Bus.
	busQueue = 1024
	// busCloseWait bounds Close: go-redis holds a subscription's lock
	// while it reconnects (up to its dial timeout, many seconds when Redis
	// hangs), and a Caddy reload must not wait for that.
	busCloseWait = time.Second
	// busRetry is the longest wait between two attempts to subscribe.
	busRetry = 2 * time.Second
)

// OpenBus subscribes to the channel name (after the key prefix) and
// delivers every message published on it — this process's own included —
// to deliver, one at a time, in the order received, until Close. It does
// not wait for Redis: the subscription is made (and made again when lost)
// in the background.
func (r *Redis) OpenBus(name string, deliver func([]byte)) *Bus {
	b := &Bus{r: r, channel: r.prefix + name, dropLog: &logsample.Every{Interval: time.Minute}, out: make(chan []byte, busQueue), stop: make(chan struct{}),
		state: r.bus(), rejects: logsample.New(time.Minute, 8)}
	b.quiet.Store(int64(quietAfter))
	b.done.Add(2)
	go b.receive(newOpener(b.state, b.channel), deliver)
	go b.send()
	return b
}

// PublishOnce publishes msg on the channel name (after the key prefix), as
// a Bus does (signed with the store's bus key, if any), without
// subscribing: for an instance that only tells.
func (r *Redis) PublishOnce(ctx context.Context, name string, msg []byte) error {
	st := r.bus()
	if len(msg) > MaxBusMessage {
		st.counts.dropped.Add(1)
		return fmt.Errorf("redis store: publishing on %s%s: %d bytes, more than %d", r.prefix, name, len(msg), MaxBusMessage)
	}
	publish := r.publisher()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := publish(ctx, r.prefix+name, st.seal(r.prefix+name, msg)).Err(); err != nil {
		st.counts.dropped.Add(1)
		return fmt.Errorf("redis store: publishing on %s%s: %w", r.prefix, name, err)
	}
	return nil
}

// publisher is how the store publishes on a channel: PUBLISH, or on a
// Cluster SPUBLISH (a sharded channel: in order, see Bus).
func (r *Redis) publisher() func(ctx context.Context, channel string, message any) *redis.IntCmd {
	if r.cluster != nil {
		return r.cluster.SPublish
	}
	return r.client.Publish
}

// SetOnReset makes the store tell fn of each of its resets, once the reset
// has returned (failed too): its keys, or the glob of a reset by pattern.
// Set it before the store is shared.
func (r *Redis) SetOnReset(fn func(keys []string, glob string)) { r.onReset = fn }

// receive delivers what the subscription hears, subscribing again when
// it is lost (see Bus), until Close.
func (b *Bus) receive(o *opener, deliver func([]byte)) {
	defer b.done.Done()
	wait := 50 * time.Millisecond
	failing := false
	for {
		ps, err := b.subscribe()
		if ps == nil {
			return // closed
		}
		if err == nil {
			wait, failing = 50*time.Millisecond, false
			b.unheard.Store(0)
			if !b.listen(ps, o, deliver) {
				return
			}
		} else {
			// Redis away, or (Cluster) a node that no longer owns the
			// channel's slot, or a user without the channel (ACL): said
			// once per streak.
			if !failing && b.r.logger != nil {
				b.r.logger.Warn("redis: cannot subscribe to the channel the instances tell each other on; retrying (an ACL user needs the channel: &<key_prefix>*)",
					zap.String("channel", b.channel), zap.Error(err))
			}
			failing = true
		}
		// Lost or refused: subscribe again, at the master the client's
		// refreshed view names.
		go ps.Close() // may wait on a reconnection; the next subscription need not
		if b.r.cluster != nil {
			b.r.cluster.ReloadState(context.Background())
		}
		if !b.pause(wait) {
			return
		}
		if failing {
			wait = min(2*wait, busRetry)
		}
	}
}

// deafAfter is how long after publishing a message the Bus may hear
// nothing — not even its own message — before it subscribes again: the
// backstop for a subscription lost without a word (a Cluster node that
// took the subscription back on reconnection refused it, MOVED). A Bus
// that heard nothing for quietAfter publishes busPing (never delivered)
// to find out.
const (
	deafAfter  = 5 * time.Second
	quietAfter = 30 * time.Second
)

// busPing is the message a quiet Bus sends itself.
const busPing = "\x00cascade-bus-ping"

// listen delivers what ps hears, once o let it through, until the Bus
// closes (false) or the subscription is lost (true).
func (b *Bus) listen(ps *redis.PubSub, o *opener, deliver func([]byte)) bool {
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(busQueue)) // closed by Close
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	heard := time.Now()
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				return false
			}
			switch m := m.(type) {
			case *redis.Message:
				b.unheard.Store(0) // any message heard says the subscription works
				heard = time.Now()
				msg, err := o.open([]byte(m.Payload))
				if err != nil {
					b.reject(err, len(m.Payload))
				} else if string(msg) != busPing {
					deliver(msg)
				}
			case *redis.Subscription:
				if m.Kind == "sunsubscribe" && m.Count == 0 {
					return true // the slot moved
				}
			}
		case <-tick.C:
			if sent := b.unheard.Load(); sent > 0 && time.Now().UnixNano()-sent > int64(deafAfter) {
				return true
			}
			if time.Since(heard) > time.Duration(b.quiet.Load()) {
				heard = time.Now()
				b.Publish([]byte(busPing))
			}
		case <-b.stop:
			return false
		}
	}
}

// subscribe makes a new subscription, and says whether Redis took it; nil
// when the Bus is closed.
func (b *Bus) subscribe() (*redis.PubSub, error) {
	ctx, cancel := b.callContext()
	defer cancel()
	var ps *redis.PubSub
	var err error
	if b.r.cluster != nil {
		ps = b.r.cluster.SSubscribe(ctx)
		err = ps.SSubscribe(ctx, b.channel)
	} else {
		ps = b.r.client.Subscribe(ctx)
		err = ps.Subscribe(ctx, b.channel)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		go ps.Close()
		return nil, nil
	}
	b.ps = ps
	return ps, err
}

// callContext bounds one call to Redis: the store's timeout, at least
// 100 ms.
func (b *Bus) callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), max(b.r.timeout, 100*time.Millisecond))
}

// pause waits d, and reports false if the Bus was closed meanwhile.
func (b *Bus) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.stop:
		return false
	case <-t.C:
		return true
	}
}

// send publishes the queued messages, in order, until Close.
func (b *Bus) send() {
	defer b.done.Done()
	publish := b.r.publisher()
	for {
		select {
		case <-b.stop:
			return
		case msg := <-b.out:
			ctx, cancel := b.callContext()
			if err := publish(ctx, b.channel, b.state.seal(b.channel, msg)).Err(); err != nil {
				b.drop(err)
			} else {
				b.unheard.CompareAndSwap(0, time.Now().UnixNano())
			}
			cancel()
		}
	}
}

// drop counts a message not published, and logs it at most once a minute.
func (b *Bus) drop(err error) {
	n := b.counts.dropped.Add(1)
	b.state.counts.dropped.Add(1)
	if ok, _ := b.dropLog.Allow(time.Now()); ok && b.r.logger != nil {
		b.r.logger.Warn("redis: a message to the other instances was dropped (they may briefly not know what this one holds)",
			zap.String("channel", b.channel), zap.Int64("dropped_total", n), zap.Error(err))
	}
}

// errBusFull is the reason of a message dropped because the queue was full.
type errBusFull struct{}

func (errBusFull) Error() string { return "the queue of messages to publish is full" }

// reject counts a message heard and not delivered (err says why), and
// logs the first of each reason a minute — never the message, which
// anyone who may publish on the channel writes.
func (b *Bus) reject(err error, size int) {
	b.counts.count(err)
	b.state.counts.count(err)
	if b.r.logger == nil {
		return
	}
	if ok, _ := b.rejects.Allow(err.Error(), time.Now()); ok {
		st := b.counts.stats()
		b.r.logger.Warn("redis: a message heard from the other instances was dropped: "+err.Error()+
			" (another process publishes on the channel, or the instances do not share one bus_secret)",
			zap.String("channel", b.channel), zap.Int("bytes", size),
			zap.Int64("oversized_total", st.Oversized), zap.Int64("unauthenticated_total", st.Unauthenticated),
			zap.Int64("replayed_total", st.Replayed))
	}
}

// Publish queues msg for the other processes, and reports whether it was
// queued (false: the queue is full, the Bus closed, or msg is longer
// than MaxBusMessage).
func (b *Bus) Publish(msg []byte) bool {
	select {
	case <-b.stop:
		return false
	default:
	}
	if len(msg) > MaxBusMessage {
		b.drop(errBusTooLong{len(msg)})
		return false
	}
	select {
	case b.out <- msg:
		return true
	default:
		b.drop(errBusFull{})
		return false
	}
}

// errBusTooLong is the reason of a message dropped for its length.
type errBusTooLong struct{ n int }

func (e errBusTooLong) Error() string {
	return fmt.Sprintf("a message of %d bytes, more than %d", e.n, MaxBusMessage)
}

// Dropped is how many messages were not published: the queue was full,
// Redis did not take them, or they were too long.
func (b *Bus) Dropped() int64 { return b.counts.dropped.Load() }

// Stats is what this Bus dropped: messages not published, and messages
// heard and not delivered (see Redis.BusStats for all of a store's).
func (b *Bus) Stats() BusStats { return b.counts.stats() }

// Close unsubscribes and stops publishing; messages still queued are
// dropped. It waits for the message being delivered, if any, and for the
// subscription to close — at most busCloseWait each, so that a hung Redis
// does not hold up a reload; a message may then still be delivered a
// moment after Close returns.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		close(b.stop)
		b.mu.Lock()
		b.closed = true
		ps := b.ps
		b.mu.Unlock()
		ended := make(chan struct{})
		go func() {
			if ps != nil {
				_ = ps.Close()
			}
			b.done.Wait()
			close(ended)
		}()
		t := time.NewTimer(busCloseWait)
		defer t.Stop()
		select {
		case <-ended:
		case <-t.C:
		}
	})
	return nil
}
