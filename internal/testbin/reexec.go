package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ready is the line a re-executed test binary writes on stdout once it serves (Serve).
const Ready = "ready"

// Reexec starts this test binary again as a child process, with env=value added to its
// environment and no test to run: its TestMain sees env and serves (Serve) instead of testing.
// The child's stderr is passed through. Reexec waits up to wait for its Ready line, failing tb
// otherwise, and kills the child when tb ends; the test may kill it earlier (a supervisor that
// dies).
func Reexec(tb testing.TB, env, value string, wait time.Duration) *exec.Cmd {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+value)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		n, _ := out.Read(b)
		line <- strings.TrimSpace(string(b[:n]))
	}()
	select {
	case l := <-line:
		if l != Ready {
			tb.Fatalf("re-executed test binary said %q", l)
		}
	case <-time.After(wait):
		tb.Fatalf("re-executed test binary not ready after %v", wait)
	}
	return cmd
}

// Serve is the main of a test binary Reexec started: it calls start, writes Ready on stdout
// and serves until SIGTERM or SIGINT, then calls the stop that start returned. It returns the
// process's exit code (1 when start or stop fails, with the error on stderr).
func Serve(start func() (stop func() error, err error)) int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT) // before Ready: the parent may signal at once
	defer signal.Stop(sig)
	stop, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 1
	}
	fmt.Println(Ready)
	<-sig
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	return 0
}
