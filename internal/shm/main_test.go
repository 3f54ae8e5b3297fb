package shm_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
)

// helperEnv makes the test binary act as a second process: "<verb> <args...>".
const helperEnv = "FRAMEPACK_SHM_TEST_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		if err := helper(strings.Fields(v)); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if left, err := shmtest.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "shared-memory leftovers: %v %v\n", left, err)
		code = 1
	}
	os.Exit(code)
}

// helper runs in the child process.
func helper(args []string) error {
	switch {
	case len(args) == 3 && args[0] == "write":
		// write <path> <n>: a segment with pattern(n) as tensor "x".
		n := 0
		fmt.Sscan(args[2], &n)
		w, err := shm.Create(args[1], []shm.TensorSpec{{Name: "x", DType: "U8", Shape: []int64{int64(n)}}})
		if err != nil {
			return err
		}
		b, err := w.Bytes("x") // fill in place through the mapping
		if err != nil {
			return err
		}
		fillPattern(b, 7)
		_, err = w.Commit()
		return err
	case len(args) == 2 && args[0] == "read":
		// read <path>: print the sha256 of every tensor, in order.
		m, err := shm.Open(args[1])
		if err != nil {
			return err
		}
		defer m.Close()
		for _, name := range m.Names() {
			b, err := m.Bytes(name)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			fmt.Printf("%s %s\n", name, hex.EncodeToString(sum[:]))
		}
		return nil
	case len(args) == 3 && args[0] == "own":
		// own <root> <job>: create an arena, say so, then wait to be killed.
		r, err := shm.OpenRoot(args[1])
		if err != nil {
			return err
		}
		a, err := r.NewArena(args[2])
		if err != nil {
			return err
		}
		if _, err := shm.WriteSegment(must(a.NewSegment("s")), nil); err != nil {
			return err
		}
		fmt.Println("ready")
		time.Sleep(time.Minute)
		return nil
	}
	return fmt.Errorf("bad helper args %q", args)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// fillPattern fills b with a position-dependent byte pattern.
func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31+i>>11) ^ seed
	}
}

// helperCmd returns a command running this test binary as helper args.
func helperCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(args, " "))
	return cmd
}

// startHelper starts a helper and waits for its first line of output.
func startHelper(t *testing.T, want string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := helperCmd(t, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != want {
		t.Fatalf("helper said %q (%v), want %q", line, err, want)
	}
	return cmd
}
