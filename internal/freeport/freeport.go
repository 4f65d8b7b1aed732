// Package freeport picks loopback TCP ports for tests' servers.
//
// A port taken from the kernel with a listen on port 0 comes from the
// ephemeral range, the same range the kernel draws the local ports of
// outgoing connections from: between the probe's close and the server's
// bind, any client connection of a busy test binary (to Redis, to another
// Caddy) may take it, and the server fails to start with "address already
// in use". A port restarted in place (a killed Redis brought back) is
// exposed for longer still. Ports below the ephemeral range are never given
// to outgoing connections, so Pick draws from there, at random (test
// binaries of several packages pick at once), and checks that the port is
// free on 127.0.0.1 before returning it.
//
// A port picked but not yet bound looks free to the next Pick, and Caddy
// binds with SO_REUSEPORT (its servers in one process share a listener of
// an address): two servers given the same port would both start and take
// each other's connections, silently. So Pick never gives a port twice:
// it claims each port it returns, for the life of the process, and on
// Linux among processes too (see claim).
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The range Pick draws from when the ephemeral range cannot be read, or
// leaves too little room below it: Linux's default ephemeral range starts
// at 32768.
const (
	lowest       = 20000
	defaultFirst = 32768
)

// Pick returns a port on 127.0.0.1 that nothing listens on now, that the
// kernel does not give to outgoing connections, and that no Pick has
// returned before, in this process or (on Linux) another that still runs.
func Pick() (int, error) {
	hi := ephemeralFirst()
	var lastErr error
	for range 100 {
		port := lowest + rand.IntN(hi-lowest)
		if err := claim(port); err != nil {
			lastErr = err
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			release(port)
			lastErr = err
			continue
		}
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("freeport: closing the probe on %d: %w", port, err)
		}
		return port, nil
	}
	return 0, fmt.Errorf("freeport: no free port in [%d, %d) after 100 tries: %w", lowest, hi, lastErr)
}

// Get is Pick for a test: it fails tb when no port can be found.
func Get(tb testing.TB) int {
	tb.Helper()
	port, err := Pick()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// ephemeralFirst is the first port of the kernel's ephemeral range, where
// Pick's range ends.
func ephemeralFirst() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultFirst
	}
	first, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil || first-lowest < 1000 {
		return defaultFirst
	}
	return first
}

// InUse tells whether err is a bind failing because the port is taken.
func InUse(err error) bool {
	return err != nil && (errors.Is(err, errAddrInUse) || strings.Contains(err.Error(), "address already in use"))
}
