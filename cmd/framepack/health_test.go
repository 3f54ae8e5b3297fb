package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestHealth: `framepack health` is the containers' health check: 0 and SERVING against a
// serving daemon, 3 when nothing answers, 2 for a stray argument.
func TestHealth(t *testing.T) {
	f := setup(t)
	if r := f.cli(t, "health", "--timeout", "30s"); r.code != exitOK || strings.TrimSpace(r.stdout) != "SERVING" {
		t.Fatalf("serving daemon: %+v", r)
	}
	if r := f.cli(t, "health", "--addr", filepath.Join(f.dir, "none.sock"), "--timeout", "1s"); r.code != exitUnreachable {
		t.Fatalf("no daemon: %+v", r)
	}
	if r := f.cli(t, "health", "extra"); r.code != exitUsage {
		t.Fatalf("stray argument: %+v", r)
	}
}
