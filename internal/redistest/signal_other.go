//go:build !unix

package redistest

import "os"

// Without SIGSTOP there is no pausing a process: Pause kills it instead,
// which a client sees as an unreachable server rather than a hanging one.
var (
	sigStop = os.Kill
	sigCont = os.Signal(nil)
)
