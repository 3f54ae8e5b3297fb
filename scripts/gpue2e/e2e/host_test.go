package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The sampler follows a real process tree: a shell whose child writes 24 MB to a file and
// exits (its writes join the shell's counters when the shell reaps it), then a second child
// that sleeps: the tree has two processes, RSS, and the writes between two readings.
func TestHostSamplerTree(t *testing.T) {
	dir := t.TempDir()
	sh := exec.Command("sh", "-c", `dd if=/dev/zero of="$1/f" bs=1M count=24 status=none && sleep 2`, "sh", dir)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sh.Process.Kill(); _ = sh.Wait() }()
	h := startHostSampler(sh.Process.Pid, 50*time.Millisecond)
	start := h.samples[0]
	// wait for the file to be written and dd reaped (the shell then runs sleep)
	deadline := time.Now().Add(20 * time.Second)
	var s hostSample
	for time.Now().Before(deadline) {
		s = h.sample()
		if st, err := os.Stat(filepath.Join(dir, "f")); err == nil && st.Size() == 24<<20 && s.tree.procs == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.stop()
	p := h.peaks(start.at, s.at)
	if s.tree.procs != 2 || p.procs < 2 || p.rss == 0 || p.used == 0 || s.tree.wchar == 0 {
		t.Fatalf("tree %+v, peaks %+v", s.tree, p)
	}
	if fs := fsType(dir); fs != "tmpfs" {
		if w := h.writesIn(start.at, s.at); w < 24<<20 {
			t.Errorf("writes between the readings %d bytes, want at least 24 MiB (%s)", w, fs)
		}
	}
	if n := treeBytes(dir); n != 24<<20 {
		t.Errorf("tree bytes %d", n)
	}
}

// /proc/PID/stat's command may hold spaces and parentheses: the parent id follows the last ')'.
func TestParentOf(t *testing.T) {
	for _, tc := range []struct {
		stat string
		ppid int
		ok   bool
	}{
		{"123 (sh) S 45 123 123 0", 45, true},
		{"123 (a b) c)) R 7 1 1", 7, true},
		{"123 (trunc", 0, false},
	} {
		if got, ok := parentOf([]byte(tc.stat)); got != tc.ppid || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.stat, got, ok, tc.ppid, tc.ok)
		}
	}
	m := kbFields([]byte("MemTotal:  100 kB\nMemAvailable: 40 kB\nHugePages_Total: 3\n"), "MemTotal:", "MemAvailable:", "HugePages_Total:", "Absent:")
	if m[0] != 100<<10 || m[1] != 40<<10 || m[2] != 3 || m[3] != 0 {
		t.Errorf("kbFields %v", m)
	}
	if io := ioFields([]byte("rchar: 1\nwchar: 9\nwrite_bytes: 4096\ncancelled_write_bytes: 512\n")); io != [3]uint64{4096, 512, 9} {
		t.Errorf("ioFields %v", io)
	}
}
