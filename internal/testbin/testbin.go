// Package testbin builds main packages of this module for tests that need real processes (the
// workers). Each package is built at most once per test process, into a temporary directory that
// Cleanup removes.
package testbin

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex // mu protects dir and built
	dir   string
	built = map[string]*result{}

	rootOnce sync.Once
	root     string
	rootErr  error
)

type result struct {
	once sync.Once
	path string
	err  error
}

// ModuleRoot returns the directory of this module's go.mod (from `go env GOMOD`).
func ModuleRoot() (string, error) {
	rootOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			rootErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		mod := strings.TrimSpace(string(out))
		if mod == "" || mod == os.DevNull {
			rootErr = fmt.Errorf("go env GOMOD: not inside a module")
			return
		}
		root = filepath.Dir(mod)
	})
	return root, rootErr
}

// Build builds the main package pkg (a path relative to the module root, "./workers/probe") and
// returns the binary's path, failing tb if the build fails. Concurrent and repeated calls for
// one package share one build.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	path, err := build(pkg)
	if err != nil {
		tb.Fatalf("testbin: %v", err)
	}
	return path
}

func build(pkg string) (string, error) {
	mu.Lock()
	r, ok := built[pkg]
	if !ok {
		r = &result{}
		built[pkg] = r
	}
	mu.Unlock()
	r.once.Do(func() { r.path, r.err = buildOnce(pkg) })
	return r.path, r.err
}

func buildOnce(pkg string) (string, error) {
	modRoot, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	mu.Lock()
	if dir == "" {
		dir, err = os.MkdirTemp("", "framepackd-testbin-")
	}
	d := dir
	mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	out := filepath.Join(d, strings.NewReplacer("/", "_", ".", "_").Replace(strings.Trim(pkg, "./")))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = modRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return out, nil
}

// Cleanup removes every binary built so far. Call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
		dir = ""
		built = map[string]*result{}
	}
}

// Output is a bytes.Buffer safe to read while a started process writes it (as its Stdout or
// Stderr).
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns what was written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
