package cascade

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd's process when the test binary
// dies without its cleanups (a -timeout panic, a kill): no
// envoyproxy/ratelimit or Caddy left holding ports and Redis.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
