package proto_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// declRE matches the lines that declare something a reader of `grpcurl describe` sees: a
// message, enum, service, rpc, oneof, field or enum value.
var declRE = regexp.MustCompile(`^\s*(message|enum|service|rpc|oneof)\s+\w+|^\s*(optional\s+|repeated\s+)?[\w.]+(\s*<[^>]*>)?\s+\w+\s*=\s*\d+|^\s*[A-Z][A-Z0-9_]*\s*=\s*\d+`)

// TestEveryDeclarationCommented checks that every message, enum, service, rpc, oneof, field and
// enum value of the public and worker protocols has a comment on the line above it (buf lint's
// COMMENTS category, in buf.yaml, checks the same in CI's lint; this runs without buf).
func TestEveryDeclarationCommented(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("framepack", "*", "*.proto"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join("framepack", "*", "*", "*.proto"))
	files = append(files, more...)
	if len(files) < 4 {
		t.Fatalf("proto files %v", files)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i, l := range lines {
			if !declRE.MatchString(l) || strings.HasPrefix(strings.TrimSpace(l), "//") || strings.HasPrefix(strings.TrimSpace(l), "option") {
				continue
			}
			if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "//") {
				t.Errorf("%s:%d: %q has no comment above it", f, i+1, strings.TrimSpace(l))
			}
		}
	}
	buf, err := os.ReadFile(filepath.Join("..", "buf.yaml"))
	if err != nil || !strings.Contains(string(buf), "- COMMENTS") {
		t.Errorf("buf.yaml does not enforce COMMENTS: %v", err)
	}
}
