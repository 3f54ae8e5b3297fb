package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Host memory and disk writes of a daemon and every process under it, read from /proc:
// the system's used memory (MemTotal − MemAvailable: page cache the kernel can drop counts as
// free, shared memory as used), the summed RSS of the process tree (and its anonymous + shmem
// part: without the file pages of the checkpoints the workers map, which the page cache holds
// once for all of them), and the tree's disk writes (/proc/PID/io write_bytes: bytes the
// processes dirtied in files on block devices; a parent's counters take in each child it reaps,
// so a daemon's include its finished workers' and ffmpeg's; writes to tmpfs and shared memory
// are not counted).

// procTree is one reading of a process tree.
type procTree struct {
	procs                  int
	rss, anon, file, shmem uint64
	// write_bytes, cancelled_write_bytes and wchar summed over the tree
	writeBytes, cancelled, wchar uint64
}

// hostSample is one reading of the host and the tree.
type hostSample struct {
	at   time.Time
	used uint64 // MemTotal − MemAvailable
	tree procTree
}

// hostSampler reads the host and a process tree every interval until stopped.
type hostSampler struct {
	root    int
	mu      sync.Mutex
	samples []hostSample
	quit    chan struct{}
	done    chan struct{}
}

func startHostSampler(root int, every time.Duration) *hostSampler {
	h := &hostSampler{root: root, quit: make(chan struct{}), done: make(chan struct{})}
	h.sample()
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-h.quit:
				return
			case <-t.C:
				h.sample()
			}
		}
	}()
	return h
}

// sample takes one reading now (also called at a job's boundaries, so a window always has one).
func (h *hostSampler) sample() hostSample {
	s := hostSample{at: time.Now()}
	s.used, _ = usedMemory()
	s.tree = readTree(h.root)
	h.mu.Lock()
	h.samples = append(h.samples, s)
	h.mu.Unlock()
	return s
}

func (h *hostSampler) stop() {
	select {
	case <-h.quit:
	default:
		close(h.quit)
		<-h.done
	}
}

// hostPeaks are the highest readings in a window.
type hostPeaks struct {
	used, rss, private uint64
	procs              int
}

// peaks returns the highest readings in [from, to].
func (h *hostSampler) peaks(from, to time.Time) hostPeaks {
	h.mu.Lock()
	defer h.mu.Unlock()
	var p hostPeaks
	for _, s := range h.samples {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		p.used = max(p.used, s.used)
		p.rss = max(p.rss, s.tree.rss)
		p.private = max(p.private, s.tree.anon+s.tree.shmem)
		p.procs = max(p.procs, s.tree.procs)
	}
	return p
}

// writesIn is the tree's write_bytes between the last reading at or before from and the first
// at or after to (0 when the window has no readings on both sides).
func (h *hostSampler) writesIn(from, to time.Time) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var a, b *hostSample
	for i := range h.samples {
		s := &h.samples[i]
		if !s.at.After(from) {
			a = s
		}
		if b == nil && !s.at.Before(to) {
			b = s
		}
	}
	if a == nil || b == nil || b.tree.writeBytes < a.tree.writeBytes {
		return 0
	}
	return b.tree.writeBytes - a.tree.writeBytes
}

// usedMemory is MemTotal − MemAvailable from /proc/meminfo.
func usedMemory() (uint64, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	f := kbFields(raw, "MemTotal:", "MemAvailable:")
	if f[0] == 0 || f[1] > f[0] {
		return 0, errors.New("/proc/meminfo: no MemTotal or MemAvailable")
	}
	return f[0] - f[1], nil
}

// kbFields reads "Name:   N kB" lines: the values of names, in bytes (0 when absent).
func kbFields(raw []byte, names ...string) []uint64 {
	out := make([]uint64, len(names))
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		for i, n := range names {
			if fields[0] == n {
				v, _ := strconv.ParseUint(fields[1], 10, 64)
				if len(fields) > 2 && fields[2] == "kB" {
					v <<= 10
				}
				out[i] = v
			}
		}
	}
	return out
}

// readTree reads root and every process under it (a process gone while it is read is skipped).
func readTree(root int) procTree {
	var t procTree
	for _, pid := range descendants(root) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		m := kbFields(st, "VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")
		t.procs++
		t.rss += m[0]
		t.anon += m[1]
		t.file += m[2]
		t.shmem += m[3]
		if io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid)); err == nil {
			w := ioFields(io)
			t.writeBytes += w[0]
			t.cancelled += w[1]
			t.wchar += w[2]
		}
	}
	return t
}

// ioFields reads write_bytes, cancelled_write_bytes and wchar from /proc/PID/io.
func ioFields(raw []byte) [3]uint64 {
	var out [3]uint64
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		switch k {
		case "write_bytes":
			out[0] = n
		case "cancelled_write_bytes":
			out[1] = n
		case "wchar":
			out[2] = n
		}
	}
	return out
}

// descendants returns root and every process under it, from /proc/*/stat's parent ids.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root}
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(raw); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// parentOf reads the parent pid from /proc/PID/stat: "pid (comm) state ppid …", where comm may
// hold spaces and parentheses.
func parentOf(stat []byte) (int, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// fsType names the file system holding path (tmpfs writes are not disk writes).
func fsType(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlay"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// treeBytes is the size of the files under path (a file: its size).
func treeBytes(path string) int64 {
	var n int64
	_ = filepath.WalkDir(path, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
