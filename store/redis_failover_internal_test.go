package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replyError is an error reply from Redis, as go-redis gives it (a
// redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestStaleSlots: which failures of a Cluster master have the slot map
// reloaded.
func TestStaleSlots(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{replyError("MOVED 3999 127.0.0.1:7002"), true},
		{replyError("ASK 3999 127.0.0.1:7002"), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{io.EOF, true},
		{fmt.Errorf("redis store: decide: %w", context.DeadlineExceeded), true},
		{os.ErrDeadlineExceeded, true},
		// The node is there and serves the slot.
		{replyError("NOSCRIPT No matching script"), false},
		{replyError("ERR Error running script"), false},
		{replyError("OOM command not allowed"), false},
		// Nothing said of Redis.
		{context.Canceled, false},
		{redis.ErrClosed, false},
		{ErrQueueTimeout, false},
		{fmt.Errorf("shed: %w", ErrOverloaded), false},
	} {
		if got := staleSlots(tc.err); got != tc.want {
			t.Errorf("staleSlots(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestMasterRoute: dials follow the announced masters, through several
// failovers and back, for redirectFor after each announcement: a redirect
// that a missed announcement left stale ends by itself.
func TestMasterRoute(t *testing.T) {
	var dialed []string
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	m := &masterRoute{replaced: map[string]redirect{}, now: func() time.Time { return now },
		dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			dialed = append(dialed, addr)
			return nil, errors.New("not dialing in a test")
		}}
	dial := func(addr string) string {
		m.dialer(context.Background(), "tcp", addr)
		return dialed[len(dialed)-1]
	}
	if got := dial("a:1"); got != "a:1" {
		t.Fatalf("before any announcement: dialed %s, want a:1", got)
	}
	if !m.announce("a:1", "b:2") || m.announce("a:1", "b:2") {
		t.Fatal("the first announcement of a failover is news, a second Sentinel's word for it is not")
	}
	if got := dial("a:1"); got != "b:2" {
		t.Fatalf("a dial to the former master went to %s, want b:2", got)
	}
	m.announce("b:2", "c:3")
	if got := dial("a:1"); got != "c:3" {
		t.Fatalf("two failovers on: %s, want c:3", got)
	}
	// a:1 came back as a replica and is promoted again: it is the master.
	m.announce("c:3", "a:1")
	for _, from := range []string{"a:1", "b:2", "c:3"} {
		if got := dial(from); got != "a:1" {
			t.Fatalf("after the failback, a dial to %s went to %s, want a:1", from, got)
		}
	}
	// A failback whose announcement was missed: the redirect c:3 → a:1
	// ends redirectFor after it was made, and a dial to c:3 goes there.
	now = now.Add(redirectFor - time.Millisecond)
	if got := dial("c:3"); got != "a:1" {
		t.Fatalf("within redirectFor: %s, want a:1", got)
	}
	now = now.Add(2 * time.Millisecond)
	if got := dial("c:3"); got != "c:3" {
		t.Fatalf("after redirectFor: %s, want c:3 (the redirect expired)", got)
	}
	m.announce("x:9", "y:9")
	if len(m.replaced) != 1 {
		t.Fatalf("%d redirects kept, want only the live one (expired ones dropped)", len(m.replaced))
	}
}
