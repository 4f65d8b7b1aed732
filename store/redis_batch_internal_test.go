package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// waitHook holds every command until wait returns (nil, or the error the
// command then fails with).
type waitHook func(ctx context.Context) error

func (h waitHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// until holds commands until ch is ready (a timer, or a closed channel),
// giving up when the command's context does, as a socket deadline would.
func until[T any](ch <-chan T) waitHook {
	return func(ctx context.Context) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// latency delays every command by d (a slow link or a loaded Redis).
func latency(d time.Duration) waitHook {
	return func(ctx context.Context) error { return until(time.After(d))(ctx) }
}

// TestBatchWaitsForItsLatestDeadline: a decision that shares a batch with
// an older one about to expire is not failed with it. The old call has
// 500 ms left, the fresh one 30 s; Redis answers once the old call's
// deadline has passed, and the batch waits for Redis until the fresh
// call's.
func TestBatchWaitsForItsLatestDeadline(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	var oldDeadline, batchDeadline time.Time
	client.AddHook(waitHook(func(ctx context.Context) error {
		batchDeadline, _ = ctx.Deadline()
		return until(time.After(time.Until(oldDeadline) + 50*time.Millisecond))(ctx)
	}))
	r := &Redis{prefix: "batch-deadline:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	mk := func(key string, deadline time.Time) *call {
		keys, logs, spec := r.encode([]Bucket{{Key: "{b}" + key, Limit: lim, Cost: 1}}, 0, WallClock(), false)
		return &call{ctx: context.Background(), deadline: deadline, keys: keys, logs: logs, spec: spec, done: make(chan struct{})}
	}
	b := &batcher{client: client, script: lua.Decide, timeout: time.Minute}
	for attempt := 1; ; attempt++ {
		now := time.Now()
		oldDeadline = now.Add(500 * time.Millisecond)
		old := mk("old", oldDeadline)
		fresh := mk("fresh", now.Add(30*time.Second))
		b.send([]*call{old, fresh}, &merger{index: map[string]uint16{}})
		<-fresh.done
		if errors.Is(old.err, ErrQueueTimeout) && attempt < 5 {
			// The machine took 500 ms to send it: the old call expired
			// unsent, and the batch was not the one this test is about.
			t.Logf("attempt %d: the old call expired before it was sent; again", attempt)
			continue
		}
		if fresh.err != nil || len(fresh.reply) != replySize(1) {
			t.Fatalf("a call with 30 s left, batched with one with 500 ms left: %v after %v", fresh.err, time.Since(now))
		}
		if old.err != nil {
			t.Fatalf("the old call was not sent with the fresh one: %v", old.err)
		}
		if !batchDeadline.Equal(fresh.deadline) {
			t.Fatalf("the batch waited for Redis until %v, want the fresh call's deadline %v", batchDeadline, fresh.deadline)
		}
		return
	}
}

// waitQueue polls q until cond, given the calls queued and on the wire
// (taken by a worker, not yet answered), holds; it fails t after 10 s,
// saying what it waited for.
func waitQueue(t *testing.T, q *fairQueue, what string, cond func(queued, onWire int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q.mu.Lock()
		queued, onWire := q.queued, 0
		for _, tc := range q.tenants {
			onWire += tc.onWire
		}
		q.mu.Unlock()
		if cond(queued, onWire) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s: %d calls queued, %d on the wire", what, queued, onWire)
		}
		time.Sleep(time.Millisecond) // polling a condition, not timing behaviour
	}
}

// TestClosedBatcherFailsQueuedCalls: closing a batcher (the store closing,
// or a Cluster master's batcher replaced) fails the calls still queued at
// once, rather than leaving them to their deadline (a minute away); the
// calls on the wire get their replies.
func TestClosedBatcherFailsQueuedCalls(t *testing.T) {
	r := &Redis{prefix: "batch-closed:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	for run := 0; run < 5; run++ {
		client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		defer client.Close()
		release := make(chan struct{})
		client.AddHook(until(release))
		b := newBatcher(client, lua.Decide, time.Minute, false, 0)
		deadline := time.Now().Add(time.Minute)
		errs := make(chan error, 12)
		decide := func(i int) {
			keys, logs, spec := r.encode([]Bucket{{Key: fmt.Sprintf("{b%d}k%d", run, i), Limit: lim, Cost: 1}}, 0, WallClock(), false)
			go func() {
				_, err := b.do(context.Background(), deadline, "", keys, logs, spec)
				errs <- err
			}()
		}
		// Each worker takes one call, held on the wire by the hook; the
		// other ten are queued.
		for i := range batchWorkers {
			decide(i)
			waitQueue(t, b.queue, fmt.Sprintf("run %d: worker %d to take a call", run, i+1), func(queued, onWire int) bool { return onWire == i+1 })
		}
		for i := batchWorkers; i < 12; i++ {
			decide(i)
		}
		waitQueue(t, b.queue, fmt.Sprintf("run %d: the other calls to queue", run), func(queued, _ int) bool { return queued == 12-batchWorkers })
		go b.close()
		select { // closing: the workers take nothing more
		case <-b.stop:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: close did not begin within 10 s", run)
		}
		close(release) // the calls on the wire finish
		replied, closed := 0, 0
		timeout := time.After(20 * time.Second)
		for i := 0; i < 12; i++ {
			select {
			case err := <-errs:
				switch {
				case err == nil:
					replied++
				case errors.Is(err, redis.ErrClosed):
					closed++
				default:
					t.Fatalf("run %d: %v", run, err)
				}
			case <-timeout:
				t.Fatalf("run %d: a queued call was left to its deadline after close (%d replied, %d failed so far)", run, replied, closed)
			}
		}
		if replied != batchWorkers || closed != 12-batchWorkers {
			t.Fatalf("run %d: %d calls replied, %d failed closed; want the %d on the wire replied, the others failed",
				run, replied, closed, batchWorkers)
		}
	}
}

// TestRunCallsAfterScriptFlush: calls sent together after the server lost
// its scripts (a restart, SCRIPT FLUSH) are each refused NOSCRIPT, having
// run nothing, and sent again: every call runs exactly once, alone or
// pipelined.
func TestRunCallsAfterScriptFlush(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr(), MaxRetries: -1})
	defer client.Close()
	ctx := context.Background()
	incr := redis.NewScript(`return tostring(redis.call('INCR', KEYS[1]))`)
	for _, n := range []int{1, 3} {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		keys, args := make([][]string, n), make([][]any, n)
		for i := range n {
			keys[i] = []string{fmt.Sprintf("runcalls:%d:%d", n, i)}
		}
		replies, errs := runCalls(ctx, client, incr, keys, args)
		for i := range n {
			if errs[i] != nil || replies[i] != "1" {
				t.Fatalf("%d calls: call %d replied %q, %v; want 1 (run once)", n, i, replies[i], errs[i])
			}
			if v, err := client.Get(ctx, keys[i][0]).Int(); err != nil || v != 1 {
				t.Fatalf("%d calls: key of call %d is %d (%v), want 1", n, i, v, err)
			}
		}
	}
}
