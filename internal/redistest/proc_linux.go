package redistest

import "syscall"

// sysProcAttr asks the kernel to kill a server when the test binary dies
// (even by SIGKILL or a panic that skips Cleanup), so no run leaves stray
// redis-server processes behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
