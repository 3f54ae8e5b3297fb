package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
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
