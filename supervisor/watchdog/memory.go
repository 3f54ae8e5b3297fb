package watchdog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/framepackd/framepackd/internal/faults"
)

// Memory reads a device's used memory as its driver reports it. The daemon's only
// implementation is an internal/devices reader (NVML by PCI bus id, amdgpu sysfs) in the
// daemon's own process; tests use FakeVRAM.
type Memory interface {
	// Used returns the bytes in use on the device now.
	Used(ctx context.Context) (uint64, error)
	// Name says where the figure comes from, for logs ("cuda 0000:65:00.0").
	Name() string
}

// FakeVRAM is the used memory of a test device: the fake device-memory ledger that workers
// write when a test injects Fault.HoldVRAMBytes (package faults).
type FakeVRAM struct{ L *faults.Ledger }

// Used returns the ledger's sum.
func (f FakeVRAM) Used(context.Context) (uint64, error) { return f.L.Used() }

// Name says where the figure comes from.
func (f FakeVRAM) Name() string { return "fake vram ledger " + f.L.Dir() }

// Defaults of Recovery.
const (
	DefaultRecoveryTimeout = 5 * time.Second
	DefaultRecoveryPoll    = 250 * time.Millisecond
	DefaultRecoveryMargin  = 64 << 20
)

// Recovery is the VRAM recovery check that follows every worker exit: the worker's process
// group must be gone (on a CPU lane that is the whole check: its memory went with it) and the
// driver's used-memory figure must come back within Margin of the figure read before the worker
// was spawned.
type Recovery struct {
	// Memory is the device's used-memory figure; nil checks the process group only.
	Memory Memory
	// Margin is how far above the baseline counts as recovered; 0 means DefaultRecoveryMargin.
	Margin uint64
	// Timeout bounds the check; 0 means DefaultRecoveryTimeout.
	Timeout time.Duration
	// Poll is the period of readings; 0 means DefaultRecoveryPoll.
	Poll time.Duration

	// groupLive lists the live members of a process group; tests replace it.
	groupLive func(pgid int) ([]int, error)
}

// RecoveryResult is the outcome of one check.
type RecoveryResult struct {
	Recovered bool
	// Baseline and Used are the figures compared (Used: the last reading).
	Baseline, Used uint64
	// Waited is how long the check took.
	Waited time.Duration
	// Reason says what did not come back, when not Recovered.
	Reason string
}

// String describes the result in one lower-case line.
func (r RecoveryResult) String() string {
	if r.Recovered {
		return fmt.Sprintf("device memory back to %d bytes (baseline %d) after %v", r.Used, r.Baseline, r.Waited.Round(time.Millisecond))
	}
	return "device memory not recovered: " + r.Reason
}

func (r *Recovery) opts() (margin uint64, timeout, poll time.Duration) {
	margin, timeout, poll = r.Margin, r.Timeout, r.Poll
	if margin == 0 {
		margin = DefaultRecoveryMargin
	}
	if timeout <= 0 {
		timeout = DefaultRecoveryTimeout
	}
	if poll <= 0 {
		poll = DefaultRecoveryPoll
	}
	return margin, timeout, poll
}

// Baseline reads the used-memory figure before a worker is spawned (0 without Memory).
func (r *Recovery) Baseline(ctx context.Context) (uint64, error) {
	if r == nil || r.Memory == nil {
		return 0, nil
	}
	n, err := r.Memory.Used(ctx)
	if err != nil {
		return 0, fmt.Errorf("memory baseline (%s): %w", r.Memory.Name(), err)
	}
	return n, nil
}

// Check polls until process group pgid (0: none to check) has no live member and the
// used-memory figure is within the margin of baseline, at most Timeout.
func (r *Recovery) Check(ctx context.Context, baseline uint64, pgid int) RecoveryResult {
	margin, timeout, poll := r.opts()
	start := time.Now()
	res := RecoveryResult{Baseline: baseline}
	live := r.groupLive
	if live == nil {
		live = GroupMembers
	}
	for {
		res.Reason = ""
		if pgid > 0 {
			members, err := live(pgid)
			switch {
			case err != nil:
				res.Reason = fmt.Sprintf("process group %d: %v", pgid, err)
			case len(members) > 0:
				res.Reason = fmt.Sprintf("process group %d still has pids %v", pgid, members)
			}
		}
		if res.Reason == "" && r.Memory != nil {
			used, err := r.Memory.Used(ctx)
			res.Used = used
			switch {
			case err != nil:
				res.Reason = fmt.Sprintf("%s: %v", r.Memory.Name(), err)
			case used > baseline+margin:
				res.Reason = fmt.Sprintf("%s: %d bytes used, baseline %d (margin %d)", r.Memory.Name(), used, baseline, margin)
			}
		}
		res.Waited = time.Since(start)
		if res.Reason == "" {
			res.Recovered = true
			return res
		}
		if res.Waited >= timeout {
			res.Reason += fmt.Sprintf(" after %v", res.Waited.Round(time.Millisecond))
			return res
		}
		select {
		case <-ctx.Done():
			res.Reason += ": " + context.Cause(ctx).Error()
			return res
		case <-time.After(min(poll, timeout-res.Waited)):
		}
	}
}

// GroupMembers lists the live processes of process group pgid (zombies hold no memory and do
// not count), scanning /proc.
func GroupMembers(pgid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		state, pg, err := parseStat(raw)
		if err != nil || pg != pgid || state == "Z" || state == "X" {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// parseStat returns the state and process group of a /proc/<pid>/stat line.
func parseStat(raw []byte) (state string, pgrp int, err error) {
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, errors.New("no command field")
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp ...
	if len(f) < 3 {
		return "", 0, errors.New("short stat")
	}
	pgrp, err = strconv.Atoi(f[2])
	return f[0], pgrp, err
}
