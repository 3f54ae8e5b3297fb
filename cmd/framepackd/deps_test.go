package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProcessBoundaries checks what the two binaries link, from `go list -deps`: the daemon
// links no native runtime (no internal/runtime, no model package, no cgo package linking
// OpenBLAS: models run only in worker processes), and the CLI links no server (no bbolt, no
// job store, no API server, no pipeline runner, no lanes or watchdog).
func TestProcessBoundaries(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not on PATH")
	}
	const mod = "github.com/framepackd/framepackd/"
	tests := []struct {
		pkg       string
		forbidden []string // import paths; one ending in "/" forbids everything under it
		noLDFlag  string   // a cgo LDFLAGS word no dependency may have
	}{
		{pkg: mod + "cmd/framepackd",
			forbidden: []string{mod + "internal/runtime", mod + "workers/", mod + "internal/nn", mod + "internal/workerkit/modelrt"},
			noLDFlag:  "-lopenblas"},
		{pkg: mod + "cmd/framepack",
			forbidden: []string{"go.etcd.io/bbolt", mod + "supervisor/jobs", mod + "supervisor/api", mod + "supervisor/pipeline",
				mod + "supervisor/lanes", mod + "supervisor/watchdog", mod + "internal/runtime", mod + "workers/"}},
	}
	for _, tc := range tests {
		t.Run(tc.pkg[len(mod):], func(t *testing.T) {
			out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}|{{join .CgoLDFLAGS \" \"}}", tc.pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", tc.pkg, err)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) < 10 {
				t.Fatalf("go list gave %d packages: %q", len(lines), out)
			}
			for _, line := range lines {
				path, ldflags, _ := strings.Cut(line, "|")
				for _, f := range tc.forbidden {
					if path == f || strings.HasSuffix(f, "/") && strings.HasPrefix(path, f) {
						t.Errorf("%s links %s", tc.pkg, path)
					}
				}
				if tc.noLDFlag != "" && strings.Contains(" "+ldflags+" ", " "+tc.noLDFlag+" ") {
					t.Errorf("%s links %s, whose cgo LDFLAGS hold %s", tc.pkg, path, tc.noLDFlag)
				}
			}
		})
	}
}
