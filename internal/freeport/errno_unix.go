//go:build unix

package freeport

import "syscall"

const errAddrInUse = syscall.EADDRINUSE
