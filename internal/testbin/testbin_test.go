package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary a child that Serve runs (TestReexec); its value is a file
// the child's stop writes.
const childEnv = "FRAMEPACK_TESTBIN_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(Serve(func() (func() error, error) {
			return func() error { return os.WriteFile(path, []byte("stopped"), 0o600) }, nil
		}))
	}
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// TestReexec starts the test binary as a serving child, which is ready once Reexec returns, and
// stops it with SIGTERM: it runs its stop and exits 0.
func TestReexec(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stopped")
	cmd := Reexec(t, childEnv, path, 30*time.Second)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("stopped before SIGTERM: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child after SIGTERM: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "stopped" {
		t.Fatalf("stop not run: %q, %v", b, err)
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(b), "module github.com/framepackd/framepackd") {
		t.Fatalf("module root %s: %v", root, err)
	}
}

// TestBuildOnce builds a tiny main package from several goroutines: one build, one binary, and
// it runs.
func TestBuildOnce(t *testing.T) {
	const pkg = "./internal/testbin/testdata/hello"
	var wg sync.WaitGroup
	paths := make([]string, 4)
	for i := range paths {
		wg.Add(1)
		go func() { defer wg.Done(); paths[i] = Build(t, pkg) }()
	}
	wg.Wait()
	for _, p := range paths[1:] {
		if p != paths[0] {
			t.Fatalf("two builds: %s, %s", paths[0], p)
		}
	}
	out, err := exec.Command(paths[0]).Output()
	if err != nil || string(out) != "hello from testbin\n" {
		t.Fatalf("ran %s: %q, %v", paths[0], out, err)
	}
	if _, err := build("./internal/testbin/testdata/missing"); err == nil {
		t.Fatal("building a missing package succeeded")
	}
}
