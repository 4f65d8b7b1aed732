package freeport

import (
	"fmt"
	"net"
	"sync"
)

// claims are the ports this process has picked, each with what holds its
// claim among processes (nil where there is none): kept until the process
// exits, as a port handed out may be bound at any time after (the map also
// keeps each listener from being closed as garbage).
var claims struct {
	sync.Mutex
	ports map[int]net.Listener
}

// claim takes port for this process, or says why it cannot: picked
// already, by this process or (on Linux) by another test binary that is
// still running. A port Pick returns stays claimed (the ports it draws
// from outnumber by far those a test binary picks); only one it found
// taken is given back, by release.
func claim(port int) error {
	claims.Lock()
	defer claims.Unlock()
	if _, ok := claims.ports[port]; ok {
		return fmt.Errorf("freeport: %d was picked already", port)
	}
	held, err := claimAmongProcesses(port)
	if err != nil {
		return err
	}
	if claims.ports == nil {
		claims.ports = map[int]net.Listener{}
	}
	claims.ports[port] = held
	return nil
}

// release gives back the claim of a port Pick did not return (something
// listens on it already).
func release(port int) {
	claims.Lock()
	defer claims.Unlock()
	if held := claims.ports[port]; held != nil {
		held.Close()
	}
	delete(claims.ports, port)
}
