package freeport

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// claimChildEnv makes the test binary a child that claims the port it
// names, says so on stdout, and holds the claim until it is killed (or its
// stdin closes, as it does if the parent dies first).
const claimChildEnv = "FREEPORT_CLAIM_CHILD"

func TestMain(m *testing.M) {
	if s := os.Getenv(claimChildEnv); s != "" {
		port, _ := strconv.Atoi(s)
		if _, err := claimAmongProcesses(port); err != nil {
			os.Stdout.WriteString("error: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("claimed\n")
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A port another test binary picked is not picked here while that binary
// runs, and is free again once it has exited (killed, as a test binary
// that times out is).
func TestClaimAmongProcesses(t *testing.T) {
	port := unclaimedHere(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), claimChildEnv+"="+strconv.Itoa(port))
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
	if line != "claimed\n" {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("child claiming %d: %q", port, line)
	}
	if l, err := claimAmongProcesses(port); err == nil {
		l.Close()
		t.Fatalf("port %d claimed here while another process holds it", port)
	}
	child.Process.Kill()
	child.Wait()
	l, err := claimAmongProcesses(port)
	if err != nil {
		t.Fatalf("port %d still claimed after its process exited: %v", port, err)
	}
	l.Close()
}

// unclaimedHere is a port no process claims now (this one has not, and
// its claim, tried, is given back).
func unclaimedHere(t *testing.T) int {
	claims.Lock()
	defer claims.Unlock()
	for port := lowest; port < lowest+1000; port++ {
		if _, ok := claims.ports[port]; ok {
			continue
		}
		if l, err := claimAmongProcesses(port); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no unclaimed port")
	return 0
}
