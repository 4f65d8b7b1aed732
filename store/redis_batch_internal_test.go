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
// an older one about to expire is not failed with it. Redis answers after
// 100 ms; the old call has 50 ms left, the fresh one 5 s.
func TestBatchWaitsForItsLatestDeadline(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	client.AddHook(latency(100 * time.Millisecond))
	r := &Redis{prefix: "batch-deadline:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	mk := func(key string, deadline time.Time) *call {
		keys, logs, spec := r.encode([]Bucket{{Key: "{b}" + key, Limit: lim, Cost: 1}}, 0, WallClock(), false)
		return &call{ctx: context.Background(), deadline: deadline, keys: keys, logs: logs, spec: spec, done: make(chan struct{})}
	}
	b := &batcher{client: client, script: lua.Decide, timeout: 5 * time.Second}
	now := time.Now()
	old := mk("old", now.Add(50*time.Millisecond))
	fresh := mk("fresh", now.Add(5*time.Second))
	b.send([]*call{old, fresh}, &merger{index: map[string]uint16{}})
	<-fresh.done
	if fresh.err != nil || len(fresh.reply) != replySize(1) {
		t.Fatalf("a call with 5 s left, batched with one with 50 ms left: %v after %v", fresh.err, time.Since(now))
	}
}

// TestClosedBatcherFailsQueuedCalls: closing a batcher (the store closing,
// or a Cluster master's batcher replaced) fails the calls still queued at
// once, rather than leaving them to their deadline; the calls on the wire
// get their replies.
func TestClosedBatcherFailsQueuedCalls(t *testing.T) {
	r := &Redis{prefix: "batch-closed:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	for run := 0; run < 5; run++ {
		client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		defer client.Close()
		release := make(chan struct{})
		client.AddHook(until(release))
		b := newBatcher(client, lua.Decide, 5*time.Second, false, 0)
		deadline := time.Now().Add(5 * time.Second)
		errs := make(chan error, 12)
		for i := 0; i < 12; i++ {
			keys, logs, spec := r.encode([]Bucket{{Key: fmt.Sprintf("{b%d}k%d", run, i), Limit: lim, Cost: 1}}, 0, WallClock(), false)
			go func() {
				_, err := b.do(context.Background(), deadline, "", keys, logs, spec)
				errs <- err
			}()
			if i < 2 {
				time.Sleep(20 * time.Millisecond) // each worker takes one call (setting up, not timing)
			}
		}
		time.Sleep(50 * time.Millisecond) // the other ten are queued
		go b.close()
		time.Sleep(20 * time.Millisecond)
		close(release) // the two on the wire finish
		replied, closed := 0, 0
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
			case <-time.After(3 * time.Second):
				t.Fatalf("run %d: a queued call was left to its deadline after close (%d replied, %d failed so far)", run, replied, closed)
			}
		}
		if replied < 2 {
			t.Fatalf("run %d: %d calls replied, want at least the two on the wire", run, replied)
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
