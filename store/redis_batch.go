package store

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the decisions that arrive while earlier ones are on the
// wire together, as one pipeline of EVALSHAs. Each decision is still ONE
// script call, atomic on its own; what the decisions share is a write and
// a read on one connection. On loopback those system calls, not the script,
// are most of a decision's cost, so under concurrency the Redis store does
// several times the work per CPU second. A lone request is sent at once:
// batching never waits for company, it only takes what is already queued.
type batcher struct {
	client  redis.UniversalClient
	script  *redis.Script
	timeout time.Duration
	queue   chan *call
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once
}

// call is one decision waiting for its reply.
type call struct {
	ctx   context.Context
	keys  []string
	args  []any
	reply string
	err   error
	done  chan struct{}
}

const (
	batchWorkers = 4  // pipelines in flight at once, each on its own connection
	batchMax     = 64 // decisions in one pipeline at most
)

func newBatcher(client redis.UniversalClient, script *redis.Script, timeout time.Duration) *batcher {
	b := &batcher{
		client:  client,
		script:  script,
		timeout: timeout,
		queue:   make(chan *call, 1024),
		stop:    make(chan struct{}),
	}
	for i := 0; i < batchWorkers; i++ {
		b.done.Add(1)
		go b.work()
	}
	return b
}

// do runs the script for one decision and waits for its reply, or for ctx.
func (b *batcher) do(ctx context.Context, keys []string, args []any) (string, error) {
	c := &call{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	select {
	case b.queue <- c:
	case <-b.stop:
		return "", redis.ErrClosed
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		// The script may still run: as with any timed-out call, the
		// request is then charged without being served.
		return "", ctx.Err()
	}
}

// close stops the workers; calls still queued fail.
func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	b.done.Wait()
}

func (b *batcher) work() {
	defer b.done.Done()
	batch := make([]*call, 0, batchMax)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < batchMax {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.send(batch)
	}
}

// send runs one batch as a pipeline and hands each call its reply.
func (b *batcher) send(batch []*call) {
	live := batch[:0]
	deadline := time.Now().Add(b.timeout)
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(live) == 1 { // nothing to share: the script's own EVALSHA-then-EVAL path
		c := live[0]
		c.reply, c.err = b.script.Run(ctx, b.client, c.keys, c.args...).Text()
		close(c.done)
		return
	}
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(live))
	for i, c := range live {
		cmds[i] = pipe.EvalSha(ctx, b.script.Hash(), c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command, below
	for i, c := range live {
		c.reply, c.err = cmds[i].Text()
		if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
			// The script cache was flushed: this call loads it again.
			c.reply, c.err = b.script.Run(ctx, b.client, c.keys, c.args...).Text()
		}
		close(c.done)
	}
}
