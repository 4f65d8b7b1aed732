package freeport

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// claimAmongProcesses claims port among the processes of this machine
// with a Unix socket in the abstract namespace named after it: a name one
// socket at a time can bind, which the kernel frees when its process
// exits, however it exits (no file is left behind). Where no such socket
// can be made (a sandbox without Unix sockets, no file descriptor left),
// the claim holds within this process only, and nil is returned.
func claimAmongProcesses(port int) (net.Listener, error) {
	l, err := net.Listen("unix", "@cascade-freeport-"+strconv.Itoa(port))
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("freeport: %d is claimed by another process: %w", port, err)
	}
	if err != nil {
		return nil, nil
	}
	return l, nil
}
