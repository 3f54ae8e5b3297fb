package safetensors_test

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// mappedRSS is the resident size of this process's mappings of path (/proc/self/smaps).
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 6 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = fields[len(fields)-1] == path
			continue
		}
		if in && len(fields) >= 2 && fields[0] == "Rss:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}

// TestReleaseDropsMappedPages reads a 16 MiB tensor through the mapping (its pages become
// resident in the process), releases it (they leave the process's resident size) and reads it
// again: the same bytes, faulted back in from the page cache.
func TestReleaseDropsMappedPages(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "big.safetensors")
	n := 4 << 20
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i%977) * 0.5
	}
	if err := safetensors.WriteFile(p, []safetensors.Tensor{safetensors.FromFloat32("w", []int64{int64(n)}, v)}, safetensors.WriteOptions{Align: 4096}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	raw, err := ck.Bytes("w")
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(raw) // touches every page
	before := mappedRSS(t, p)
	if before < int64(len(raw))*3/4 {
		t.Skipf("the mapping is %d bytes resident after reading %d: no way to see a release here", before, len(raw))
	}
	ck.Release("w")
	ck.Release("no such tensor") // a no-op
	after := mappedRSS(t, p)
	t.Logf("resident %d bytes of the mapping before Release, %d after", before, after)
	if after > before/8 {
		t.Errorf("resident %d bytes after Release (before %d): the pages stayed", after, before)
	}
	again, err := ck.Bytes("w")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, want) {
		t.Fatal("the tensor reads differently after Release")
	}
}
