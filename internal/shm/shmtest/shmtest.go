// Package shmtest gives tests a private shared-memory root under /dev/shm that is removed when
// the test ends, and a check that a test process left nothing behind.
package shmtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/shm"
)

// Prefix starts the name of every test root, /dev/shm/framepackd-test-<pid>-<random>.
const Prefix = "framepackd-test-"

// EnvParent names an environment variable that moves test roots from /dev/shm to another
// directory (a tmpfs mounted with other options, to compare them in benchmarks).
var EnvParent = envconfig.ShmTestParent.Name

func parent() string {
	if p := envconfig.ShmTestParent.Get(); p != "" {
		return p
	}
	return "/dev/shm"
}

// Dir returns a fresh, not yet created root path for this process under /dev/shm.
func Dir() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(parent(), Prefix+strconv.Itoa(os.Getpid())+"-"+hex.EncodeToString(b[:]))
}

// Root opens a fresh private root for tb and removes it, with everything in it, when tb ends.
func Root(tb testing.TB) *shm.Root {
	tb.Helper()
	dir := Dir()
	tb.Cleanup(func() { os.RemoveAll(dir) })
	r, err := shm.OpenRoot(dir)
	if err != nil {
		tb.Fatalf("shm test root: %v", err)
	}
	return r
}

// Arena opens a fresh root and one arena in it for tb; both go when tb ends.
func Arena(tb testing.TB, job string) *shm.Arena {
	tb.Helper()
	a, err := Root(tb).NewArena(job)
	if err != nil {
		tb.Fatalf("shm test arena: %v", err)
	}
	tb.Cleanup(func() { a.Close() })
	return a
}

// Leftovers returns the test roots of this process that still exist; a TestMain calls it after
// m.Run and fails the run if it returns any.
func Leftovers() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(parent(), Prefix+strconv.Itoa(os.Getpid())+"-*"))
	if err != nil {
		return nil, fmt.Errorf("glob shm test roots: %w", err)
	}
	return m, nil
}
