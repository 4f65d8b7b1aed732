//go:build !linux

package freeport

import "net"

// claimAmongProcesses claims nothing beyond this process: without Linux's
// abstract sockets, two test binaries may still pick one port at once.
func claimAmongProcesses(port int) (net.Listener, error) { return nil, nil }
