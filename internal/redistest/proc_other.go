//go:build !linux

package redistest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: Cleanup and
// t.Cleanup are the only ways servers are stopped there.
func sysProcAttr() *syscall.SysProcAttr { return nil }
