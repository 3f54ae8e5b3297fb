package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/testbin"
)

// TestDaemonVersion: framepackd --version prints its build and exits 0 without starting.
func TestDaemonVersion(t *testing.T) {
	out, err := exec.Command(testbin.Build(t, "./cmd/framepackd"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "framepackd ") || !strings.Contains(string(out), "go1.") {
		t.Fatalf("--version: %v %q", err, out)
	}
}
