package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNativeSourcesLinked: every C source and header of native/ that the cpu build needs has a
// symbolic link in this package, so cgo compiles it and the Go build cache sees its changes.
func TestNativeSourcesLinked(t *testing.T) {
	var want []string
	for _, pat := range []string{"../../native/include/*.h", "../../native/src/*.[ch]", "../../native/cpu/*.[ch]"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, m...)
	}
	if len(want) == 0 {
		t.Fatal("no native sources found")
	}
	for _, src := range want {
		name := filepath.Base(src)
		target, err := os.Readlink(name)
		if err != nil {
			t.Errorf("%s has no link here (ln -s %s %s): %v", src, src, name, err)
			continue
		}
		if filepath.Clean(target) != filepath.Clean(src) {
			t.Errorf("%s links to %s, want %s", name, target, src)
		}
	}
}
