package freeport

import (
	"bufio"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// claimChildEnv makes the test binary a child that claims a port no
// process claims, says which on stdout, and holds the claim until it is
// killed (or its stdin closes, as it does if the parent dies first).
const claimChildEnv = "FREEPORT_CLAIM_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(claimChildEnv) != "" {
		for range 100 {
			port := lowest + rand.IntN(1000)
			if l, err := claimAmongProcesses(port); err == nil && l != nil {
				os.Stdout.WriteString("claimed " + strconv.Itoa(port) + "\n")
				io.Copy(io.Discard, os.Stdin)
				runtime.KeepAlive(l)
				os.Exit(0)
			}
		}
		os.Stdout.WriteString("no port claimed\n")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// A port another test binary picked is not picked here while that binary
// runs, and is free again once it has exited (killed, as a test binary
// that times out is).
func TestClaimAmongProcesses(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), claimChildEnv+"=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := child.StdinPipe() // open until the child is killed
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "claimed ")))
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("child: %q", line)
	}
	if l, err := claimAmongProcesses(port); err == nil {
		if l != nil {
			l.Close()
		}
		t.Fatalf("port %d claimed here while another process holds it", port)
	}
	child.Process.Kill()
	child.Wait()
	l, err := claimAmongProcesses(port)
	if err != nil || l == nil {
		t.Fatalf("port %d not claimed after its process exited: %v", port, err)
	}
	l.Close()
}
