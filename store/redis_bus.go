package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Bus carries short messages between the processes sharing a Redis store,
// over Redis Pub/Sub on one channel (under the store's key prefix): what
// one Caddy instance's held requests are, so that another's may give way
// to them (package waiting). Delivery is at most once and in order per
// sender; a message published while Redis is away, or while a receiver is
// reconnecting, is lost — which is why what travels on a Bus must expire
// by itself (a held request says how long it may be held).
//
// On a Cluster the channel is a sharded one (SPUBLISH, SSUBSCRIBE; Redis
// 7): its messages all pass through the master of the channel's slot, so
// they keep their order (a plain PUBLISH goes to any node and reaches the
// others over the cluster bus, which reorders them).
type Bus struct {
	r       *Redis
	channel string
	ps      *redis.PubSub
	out     chan []byte
	dropped atomic.Int64

	closeOnce sync.Once
	stop      chan struct{}
	done      sync.WaitGroup
}

// busQueue is how many messages may wait to be published; beyond it a
// message is dropped (counted by Dropped): a request never waits on the
// Bus.
const busQueue = 1024

// OpenBus subscribes to the channel name (after the key prefix) and
// delivers every message published on it — this process's own included —
// to deliver, one at a time, in the order received, until Close.
func (r *Redis) OpenBus(name string, deliver func([]byte)) *Bus {
	b := &Bus{r: r, channel: r.prefix + name, out: make(chan []byte, busQueue), stop: make(chan struct{})}
	if r.cluster != nil {
		b.ps = r.cluster.SSubscribe(context.Background(), b.channel)
	} else {
		b.ps = r.client.Subscribe(context.Background(), b.channel)
	}
	in := b.ps.Channel(redis.WithChannelSize(busQueue))
	b.done.Add(2)
	go func() {
		defer b.done.Done()
		for m := range in { // closed by ps.Close
			deliver([]byte(m.Payload))
		}
	}()
	go func() {
		defer b.done.Done()
		for {
			select {
			case <-b.stop:
				return
			case msg := <-b.out:
				ctx, cancel := context.WithTimeout(context.Background(), max(r.timeout, 100*time.Millisecond))
				publish := r.client.Publish
				if r.cluster != nil {
					publish = r.cluster.SPublish
				}
				if err := publish(ctx, b.channel, msg).Err(); err != nil {
					b.dropped.Add(1)
				}
				cancel()
			}
		}
	}()
	return b
}

// Publish queues msg for the other processes, and reports whether it was
// queued (false: the queue is full, or the Bus closed).
func (b *Bus) Publish(msg []byte) bool {
	select {
	case <-b.stop:
		return false
	default:
	}
	select {
	case b.out <- msg:
		return true
	default:
		b.dropped.Add(1)
		return false
	}
}

// Dropped is how many messages were not published: the queue was full or
// Redis did not take them.
func (b *Bus) Dropped() int64 { return b.dropped.Load() }

// Close unsubscribes and stops publishing; messages still queued are
// dropped. It waits for the delivery in progress, if any.
func (b *Bus) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.stop)
		err = b.ps.Close()
		b.done.Wait()
	})
	return err
}
