package envconfig

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryVariableDeclared: every FRAMEPACK_ variable named anywhere in the module's Go and
// native sources (tests included) is declared here, once, with a doc; and outside the registry
// the names appear only in test files, the client's usage text and the native backend's one
// settings file.
func TestEveryVariableDeclared(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	// A whole word: MAG_CACHE_CALIBRATION_FRAMEPACK_F1 (a proto enum value) names no variable.
	name := regexp.MustCompile(`\bFRAMEPACK_[A-Z0-9_]*[A-Z0-9]`)
	seen := map[string]bool{}
	for _, v := range all {
		if seen[v.Name] {
			t.Errorf("%s declared twice", v.Name)
		}
		seen[v.Name] = true
		if v.Doc == "" || v.Scope == "" {
			t.Errorf("%s has no doc or scope", v.Name)
		}
	}
	allowed := map[string]bool{"internal/envconfig/envconfig.go": true, "cmd/framepack/main.go": true,
		"native/gpu/fpk_gpu_settings.cu": true}
	var goFiles, nativeFiles []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case ".git", "testdata", "build", "bin", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		if ext != ".go" && ext != ".c" && ext != ".cu" && ext != ".h" || d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		found := name.FindAll(raw, -1)
		if len(found) == 0 {
			return nil
		}
		for _, n := range found {
			if _, ok := Lookup(string(n)); !ok {
				t.Errorf("%s names %s, which internal/envconfig does not declare", rel, n)
			}
		}
		switch {
		case strings.HasSuffix(rel, "_test.go") || allowed[rel]:
		case ext == ".go":
			goFiles = append(goFiles, rel)
		default:
			nativeFiles = append(nativeFiles, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(goFiles) > 0 || len(nativeFiles) > 0 {
		t.Errorf("variables named outside the registry: Go %v, native %v (read them through internal/envconfig, or fpk_gpu_cfg natively)", goFiles, nativeFiles)
	}
}

func TestUsage(t *testing.T) {
	var b bytes.Buffer
	Usage(&b, Client)
	out := b.String()
	if !strings.Contains(out, "environment (client):") || !strings.Contains(out, Addr.Name) || strings.Contains(out, Backend.Name) {
		t.Fatalf("client usage:\n%s", out)
	}
	b.Reset()
	Usage(&b)
	for _, v := range Vars() {
		if !strings.Contains(b.String(), v.Name) {
			t.Errorf("usage lacks %s", v.Name)
		}
	}
	t.Setenv(TLS.Name, "1")
	if !TLS.On() || TLS.Get() != "1" {
		t.Error("TLS not on")
	}
	if v, ok := Lookup(TLS.Name); !ok || v != TLS {
		t.Errorf("Lookup %v %v", v, ok)
	}
}
