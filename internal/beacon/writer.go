package beacon

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Writer is the worker's side of a beacon. Its methods are safe for concurrent use and cheap
// enough to call around every native op. A nil *Writer is valid and does nothing, so code can
// report progress whether or not it runs under a supervisor.
type Writer struct {
	mu     sync.Mutex // mu serialises writes (the seqlock has one writer at a time)
	m      words
	closed bool // protected by mu
}

// Attach maps the beacon page in f for writing and records the calling process's pid and the
// starting phase. The caller may close f afterwards; the mapping stays valid until Close.
func Attach(f *os.File) (*Writer, error) {
	m, err := mapFile(f, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return nil, fmt.Errorf("attach beacon: %w", err)
	}
	if m.load(wMagic) != magic {
		_ = unix.Munmap(m.mem)
		return nil, fmt.Errorf("attach beacon: %w", ErrNotBeacon)
	}
	w := &Writer{m: m}
	w.update(func(m words, _ uint64) {
		m.store(wPID, uint64(os.Getpid()))
		m.store(wPhase, uint64(PhaseStarting))
	})
	return w, nil
}

// AttachPath attaches to a beacon page kept in a file (one the supervisor created with
// NewFilePage).
func AttachPath(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("attach beacon: %w", err)
	}
	defer f.Close()
	return Attach(f)
}

// FromEnv attaches to the beacon whose descriptor number is in EnvFD and closes that descriptor
// (so the worker's own children do not inherit it). Without EnvFD it returns a nil Writer and no
// error: the worker then runs without a beacon.
func FromEnv() (*Writer, error) {
	v := os.Getenv(EnvFD)
	if v == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("attach beacon: bad %s=%q", EnvFD, v)
	}
	f := os.NewFile(uintptr(fd), "framepackd-beacon")
	defer f.Close()
	return Attach(f)
}

// update runs fn inside the seqlock's write section with the current time in unix ns.
func (w *Writer) update(fn func(m words, now uint64)) {
	now := uint64(time.Now().UnixNano())
	w.mu.Lock()
	if !w.closed {
		seq := w.m.load(wSeq)
		w.m.store(wSeq, seq+1)
		fn(w.m, now)
		w.m.store(wUpdated, now)
		w.m.store(wSeq, seq+2)
	}
	w.mu.Unlock()
}

// SetPhase records the worker's phase.
func (w *Writer) SetPhase(p Phase) {
	if w == nil {
		return
	}
	w.update(func(m words, _ uint64) { m.store(wPhase, uint64(p)) })
}

// BeginOp records the start of an op without a deadline of its own (the watchdog applies its
// default) and returns the op's sequence number.
func (w *Writer) BeginOp(name string) uint64 {
	return w.BeginOpWithin(name, 0)
}

// BeginOpWithin records the start of an op that should finish within timeout (0: no deadline of
// its own) and returns the op's sequence number.
func (w *Writer) BeginOpWithin(name string, timeout time.Duration) uint64 {
	return w.BeginConvOp(name, "", "", timeout)
}

// BeginConvOp records the start of a convolution tier attempt: like BeginOpWithin, plus the
// conv's shape key and tier, so a watchdog that finds the op stuck can record "shape K hung at
// tier T" (keys longer than MaxConvKey are truncated). Empty key and tier record a plain op.
func (w *Writer) BeginConvOp(name, key, tier string, timeout time.Duration) uint64 {
	if w == nil {
		return 0
	}
	var seq uint64
	w.update(func(m words, now uint64) {
		seq = m.load(wOpSeq) + 1
		m.store(wOpSeq, seq)
		m.store(wOpStart, now)
		dead := uint64(0)
		if timeout > 0 {
			dead = now + uint64(timeout)
		}
		m.store(wOpDead, dead)
		m.store(wOpEnd, 0)
		m.store(wInOp, 1)
		storeString(m, wNameLen, wName, MaxOpName, name)
		storeString(m, wKeyLen, wKey, MaxConvKey, key)
		storeString(m, wTierLen, wTier, MaxConvTier, tier)
	})
	return seq
}

// storeString writes up to maxLen bytes of s at word off and its length at lenOff. Only the
// words s needs are written; readers stop at the length.
func storeString(m words, lenOff, off, maxLen int, s string) {
	n := min(len(s), maxLen)
	for i := 0; i*8 < n; i++ {
		var v uint64
		for b := 0; b < 8; b++ {
			if j := i*8 + b; j < n {
				v |= uint64(s[j]) << (8 * b)
			}
		}
		m.store(off+i, v)
	}
	m.store(lenOff, uint64(n))
}

// EndOp records that the current op finished. The op's name stays readable as the last op.
func (w *Writer) EndOp() {
	if w == nil {
		return
	}
	w.update(func(m words, now uint64) {
		m.store(wInOp, 0)
		m.store(wOpEnd, now)
		m.store(wOpDead, 0)
	})
}

// SetStep records progress through a loop of n steps (i counts from 1; 0, 0 clears it).
func (w *Writer) SetStep(i, n int) {
	if w == nil {
		return
	}
	w.update(func(m words, _ uint64) {
		m.store(wStepI, uint64(max(i, 0)))
		m.store(wStepN, uint64(max(n, 0)))
	})
}

// SetBytes records the bytes the worker has allocated now and raises the peak if needed.
func (w *Writer) SetBytes(n int64) {
	if w == nil {
		return
	}
	n = max(n, 0)
	w.update(func(m words, _ uint64) {
		m.store(wBytes, uint64(n))
		if uint64(n) > m.load(wPeak) {
			m.store(wPeak, uint64(n))
		}
	})
}

// Snapshot reads the page back, as the supervisor would see it.
func (w *Writer) Snapshot() (Snapshot, error) {
	if w == nil {
		return Snapshot{}, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return Snapshot{}, fmt.Errorf("beacon: writer closed")
	}
	return read(w.m)
}

// Close records PhaseExiting and unmaps the page. Later calls do nothing.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	w.SetPhase(PhaseExiting)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if err := unix.Munmap(w.m.mem); err != nil {
		return fmt.Errorf("close beacon: %w", err)
	}
	return nil
}
