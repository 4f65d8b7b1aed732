package freeport

import (
	"fmt"
	"net"
	"strconv"
)

// claimAmongProcesses claims port among the processes of this machine
// with a Unix socket in the abstract namespace named after it: a name one
// socket at a time can bind, which the kernel frees when its process
// exits, however it exits (no file is left behind).
func claimAmongProcesses(port int) (net.Listener, error) {
	l, err := net.Listen("unix", "@cascade-freeport-"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("freeport: %d is claimed by another process: %w", port, err)
	}
	return l, nil
}
