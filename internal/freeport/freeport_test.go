package freeport

import (
	"fmt"
	"net"
	"strconv"
	"testing"
)

func TestPickIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	first := ephemeralFirst()
	for range 50 {
		port := Get(t)
		if port < lowest || port >= first {
			t.Fatalf("port %d outside [%d, %d)", port, lowest, first)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		l.Close()
	}
}

func TestInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = net.Listen("tcp", l.Addr().String())
	if !InUse(err) {
		t.Fatalf("InUse(%v) = false for a taken port", err)
	}
	if InUse(nil) || InUse(fmt.Errorf("connection refused")) {
		t.Fatal("InUse is true for an error that is not a taken port")
	}
}

// Two servers given one port would both start under Caddy (SO_REUSEPORT)
// and share its connections: Pick never gives a port twice.
func TestPickNeverGivesAPortTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 1000 {
		port := Get(t)
		if seen[port] {
			t.Fatalf("port %d picked twice", port)
		}
		seen[port] = true
	}
	for port := range seen {
		if err := claim(port); err == nil {
			t.Fatalf("port %d, picked, claimed again", port)
		}
	}
}

// A port Pick probed and found taken is given back, not held for nothing.
func TestReleaseGivesAClaimBack(t *testing.T) {
	for port := lowest + 1000; port < lowest+2000; port++ {
		if claim(port) != nil {
			continue
		}
		release(port)
		if err := claim(port); err != nil {
			t.Fatalf("port %d, released, cannot be claimed again: %v", port, err)
		}
		return
	}
	t.Fatal("no port to claim")
}
