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
// failovers and back.
func TestMasterRoute(t *testing.T) {
	var dialed []string
	m := &masterRoute{replaced: map[string]string{}, dial: func(_ context.Context, _, addr string) (net.Conn, error) {
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
}
