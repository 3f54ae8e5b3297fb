package lanes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// procStat is the part of /proc/<pid>/stat the lane reads.
type procStat struct {
	pid, ppid, pgrp int
	state           byte
}

// readStats reads /proc/*/stat of every process it may read.
func readStats() ([]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ESRCH) {
				continue // gone meanwhile, or not ours to read
			}
			return nil, fmt.Errorf("read /proc/%d/stat: %w", pid, err)
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || len(f[0]) != 1 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, procStat{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0][0]})
	}
	return out, nil
}

// groupMembers returns the live (not zombie) members of process group pgid.
func groupMembers(pgid int) ([]int, error) {
	all, err := readStats()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range all {
		if p.pgrp == pgid && p.state != 'Z' && p.state != 'X' {
			out = append(out, p.pid)
		}
	}
	return out, nil
}

// Children returns the pids of the live (not yet reaped zombies included) child processes of
// pid, read from /proc. Tests use it to check that no worker outlives its stage.
func Children(pid int) ([]int, error) {
	all, err := readStats()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range all {
		if p.ppid == pid {
			out = append(out, p.pid)
		}
	}
	return out, nil
}
