package faults

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/framepackd/framepackd/internal/envconfig"
)

// EnvFakeVRAMDir names the environment variable that gives a worker the directory of the fake
// device-memory ledger. The supervisor sets it (workerkit.Config.Env) only in tests.
var EnvFakeVRAMDir = envconfig.FakeVRAMDir.Name

// holdSuffix ends the name of a ledger entry.
const holdSuffix = ".hold"

// hold is one ledger entry: fake device memory a process holds while it lives and for
// HoldAfterExit after it is gone.
type hold struct {
	PID           int           `json:"pid"`
	StartTicks    uint64        `json:"start_ticks"` // /proc/<pid>/stat starttime, against pid reuse
	Bytes         uint64        `json:"bytes"`
	HoldAfterExit time.Duration `json:"hold_after_exit"`
}

// HoldFakeVRAM records in the ledger dir that process pid holds n bytes of fake device memory,
// and keeps them held for after once the process is gone: the stand-in for a driver that is
// slow to reclaim a dead process's memory.
func HoldFakeVRAM(dir string, pid int, n uint64, after time.Duration) error {
	ticks, err := startTicks(pid)
	if err != nil {
		return fmt.Errorf("hold fake vram: %w", err)
	}
	raw, err := json.Marshal(hold{PID: pid, StartTicks: ticks, Bytes: n, HoldAfterExit: after})
	if err != nil {
		return fmt.Errorf("hold fake vram: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("hold fake vram: %w", err)
	}
	name := filepath.Join(dir, strconv.Itoa(pid)+"-"+strconv.FormatUint(ticks, 10)+holdSuffix)
	tmp := name + ".partial"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("hold fake vram: %w", err)
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hold fake vram: %w", err)
	}
	return nil
}

// Ledger reads the fake device memory of a test device: the sum of what living holders hold,
// plus what dead holders keep held until their hold-after-exit time has passed since the
// ledger first saw them gone. Entries that ran out are removed. It is safe for concurrent use.
type Ledger struct {
	dir string
	now func() time.Time

	mu   sync.Mutex           // mu protects gone
	gone map[string]time.Time // entry name → when this ledger first saw its holder gone
}

// NewLedger returns the ledger kept in dir (created when missing).
func NewLedger(dir string) (*Ledger, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake vram ledger: %w", err)
	}
	return &Ledger{dir: dir, now: time.Now, gone: map[string]time.Time{}}, nil
}

// Dir returns the ledger's directory (the value of EnvFakeVRAMDir for workers).
func (l *Ledger) Dir() string { return l.dir }

// Used returns the fake device memory held now.
func (l *Ledger) Used() (uint64, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return 0, fmt.Errorf("fake vram ledger: %w", err)
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var used uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, holdSuffix) {
			continue
		}
		path := filepath.Join(l.dir, name)
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("fake vram ledger: %w", err)
		}
		var h hold
		if err := json.Unmarshal(raw, &h); err != nil {
			return 0, fmt.Errorf("fake vram ledger: %s: %w", name, err)
		}
		if ticks, err := startTicks(h.PID); err == nil && ticks == h.StartTicks {
			used += h.Bytes // the holder lives
			continue
		}
		since, ok := l.gone[name]
		if !ok {
			since = now
			l.gone[name] = now
		}
		if now.Sub(since) < h.HoldAfterExit {
			used += h.Bytes
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("fake vram ledger: %w", err)
		}
		delete(l.gone, name)
	}
	return used, nil
}

// startTicks returns the start time of process pid in clock ticks after boot (field 22 of
// /proc/<pid>/stat); an error when there is no such process or it is a zombie.
func startTicks(pid int) (uint64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces and parentheses
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d is gone (state %s)", pid, f[0])
	}
	return strconv.ParseUint(f[19], 10, 64)
}
