// Package beacon is the small shared page through which a worker tells the supervisor what it is
// doing right now, without being asked: pid, phase, the current op (sequence number, name, start
// time, deadline), step i/n and bytes allocated.
//
// The supervisor creates the page (an anonymous memfd, so nothing is ever left behind in
// /dev/shm), hands its descriptor to the worker through exec.Cmd.ExtraFiles and reads it with
// Page.Snapshot; the worker maps the same memory with Attach or FromEnv and updates it with the
// Writer methods, which are cheap enough to call once per native op. A seqlock (an odd sequence
// number while a write is in progress) keeps every snapshot consistent. All fields are accessed
// with atomic operations, so readers and writers in one process are also free of data races.
package beacon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/framepackd/framepackd/internal/envconfig"
)

// PageSize is the size of a beacon page in bytes.
const PageSize = 4096

// MaxOpName is the longest op name the page keeps; longer names are truncated.
const MaxOpName = 64

// MaxConvKey is the longest conv shape key the page keeps; longer keys are truncated (the
// watchdog then cannot name the shape, so keys should stay below it).
const MaxConvKey = 256

// MaxConvTier is the longest conv tier name the page keeps.
const MaxConvTier = 32

// EnvFD names the environment variable that carries the beacon's file descriptor number in a
// worker process.
var EnvFD = envconfig.BeaconFD.Name

// magic identifies a beacon page and its layout version ("FPKBCN01" little-endian).
const magic = 0x3130_4e43_424b_5046

// Word offsets (in uint64 units) of the fields in the page.
const (
	wMagic   = iota // layout marker
	wSeq            // seqlock: odd while a write is in progress
	wPID            // worker pid
	wPhase          // Phase
	wOpSeq          // number of ops begun so far
	wOpStart        // current/last op start, unix ns
	wOpDead         // current op deadline, unix ns (0: none)
	wOpEnd          // last op end, unix ns (0: op in progress or none yet)
	wInOp           // 1 while an op is in progress
	wStepI          // step i
	wStepN          // step n
	wBytes          // bytes allocated now
	wPeak           // peak bytes allocated
	wUpdated        // last write, unix ns
	wNameLen        // length of the op name
	wName           // op name, MaxOpName bytes
	// The conv fields were added after the first layout; a worker that never sets them leaves
	// them zero, which reads as "not a conv".
	wKeyLen  = wName + MaxOpName/8 // length of the conv shape key
	wKey     = wKeyLen + 1         // conv shape key, MaxConvKey bytes
	wTierLen = wKey + MaxConvKey/8 // length of the conv tier name
	wTier    = wTierLen + 1        // conv tier name, MaxConvTier bytes
	wEnd     = wTier + MaxConvTier/8
)

// Phase is the coarse state of a worker.
type Phase uint32

// Worker phases, in the order a worker normally goes through them.
const (
	PhaseUnknown  Phase = iota // the worker has not written the page yet
	PhaseStarting              // process started, serving not yet begun
	PhaseIdle                  // serving, no request in progress
	PhaseLoading               // loading a model
	PhaseRunning               // running a stage
	PhaseProbing               // answering a device probe
	PhaseExiting               // shutting down
)

var phaseNames = [...]string{"unknown", "starting", "idle", "loading", "running", "probing", "exiting"}

// String returns the lower-case name of the phase.
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// ErrTorn is returned by Snapshot when no consistent read was possible within a short time: the
// writer died in the middle of an update (then every later read says so too) or was descheduled
// inside one. The snapshot returned with it is a best effort; a watchdog simply reads again at
// its next tick.
var ErrTorn = errors.New("beacon: torn read (writer stopped mid-update)")

// ErrNotBeacon is returned when a mapped page does not carry the beacon layout marker.
var ErrNotBeacon = errors.New("beacon: not a beacon page")

// Snapshot is one consistent reading of a beacon page.
type Snapshot struct {
	PID        int
	Phase      Phase
	OpSeq      uint64    // number of ops begun; advancing means the worker makes progress
	Op         string    // name of the current op, or of the last one when InOp is false
	ConvKey    string    // conv shape key of the current (or last) op; empty if not a conv
	ConvTier   string    // conv fallback tier the op runs at ("vendor_tuned"); empty if not a conv
	InOp       bool      // an op is in progress
	OpStart    time.Time // start of the current (or last) op; zero if none yet
	OpDeadline time.Time // deadline of the current op; zero if it has none
	OpEnd      time.Time // end of the last op; zero while one is in progress
	Step       int       // current step (1-based), 0 if not stepping
	Steps      int       // number of steps, 0 if not stepping
	Bytes      int64     // bytes allocated now
	PeakBytes  int64     // highest Bytes seen
	Updated    time.Time // time of the last write; zero if never written
}

// OpAge returns how long the current op has been running at now, or 0 when no op is in progress.
func (s Snapshot) OpAge(now time.Time) time.Duration {
	if !s.InOp || s.OpStart.IsZero() {
		return 0
	}
	return now.Sub(s.OpStart)
}

// Overdue reports whether the current op has a deadline that has passed at now.
func (s Snapshot) Overdue(now time.Time) bool {
	return s.InOp && !s.OpDeadline.IsZero() && now.After(s.OpDeadline)
}

// words is a mapped page seen as uint64 words.
type words struct {
	mem []byte
	w   *[wEnd]uint64
}

func mapFile(f *os.File, prot int) (words, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return words{}, fmt.Errorf("stat beacon: %w", err)
	}
	if st.Size < PageSize {
		return words{}, fmt.Errorf("beacon file is %d bytes, want %d: %w", st.Size, PageSize, ErrNotBeacon)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, PageSize, prot, unix.MAP_SHARED)
	if err != nil {
		return words{}, fmt.Errorf("map beacon: %w", err)
	}
	return words{mem: mem, w: (*[wEnd]uint64)(unsafe.Pointer(&mem[0]))}, nil
}

func (m words) load(i int) uint64     { return atomic.LoadUint64(&m.w[i]) }
func (m words) store(i int, v uint64) { atomic.StoreUint64(&m.w[i], v) }

func timeOf(v uint64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(v))
}

// Page is the supervisor's side of a beacon: it creates the memory, hands it to a worker and
// reads it. Its methods are safe for concurrent use.
type Page struct {
	f *os.File
	m words

	mu     sync.Mutex // mu protects closed
	closed bool
}

// NewPage creates a zeroed beacon page backed by an anonymous memfd.
func NewPage() (*Page, error) {
	fd, err := unix.MemfdCreate("framepackd-beacon", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create beacon: memfd: %w", err)
	}
	return newPage(os.NewFile(uintptr(fd), "framepackd-beacon"))
}

// newPage sizes f, maps it and marks it as a beacon page.
func newPage(f *os.File) (*Page, error) {
	if err := f.Truncate(PageSize); err != nil {
		f.Close()
		return nil, fmt.Errorf("create beacon: size: %w", err)
	}
	m, err := mapFile(f, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("create beacon: %w", err)
	}
	m.store(wMagic, magic)
	return &Page{f: f, m: m}, nil
}

// NewFilePage creates a beacon page in a new file at path (mode 0600), for a worker that is told
// the path instead of inheriting the page. The caller removes the file.
func NewFilePage(path string) (*Page, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create beacon: %w", err)
	}
	return newPage(f)
}

// OpenPage maps an existing beacon page read-only: a worker's inherited page seen from outside
// (/proc/<pid>/fd/<n>), for tools and tests that watch a worker the way the watchdog does.
func OpenPage(path string) (*Page, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open beacon: %w", err)
	}
	m, err := mapFile(f, unix.PROT_READ)
	if err != nil {
		f.Close()
		return nil, err
	}
	if m.load(wMagic) != magic {
		unix.Munmap(m.mem)
		f.Close()
		return nil, fmt.Errorf("open beacon %s: %w", path, ErrNotBeacon)
	}
	return &Page{f: f, m: m}, nil
}

// File returns the page's file, to be passed to the worker (exec.Cmd.ExtraFiles). The Page keeps
// ownership: the caller must not close it.
func (p *Page) File() *os.File { return p.f }

// Snapshot reads the page consistently. When the writer stopped in the middle of an update (it
// was killed), Snapshot returns the best reading it got together with ErrTorn.
func (p *Page) Snapshot() (Snapshot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Snapshot{}, errors.New("beacon: page closed")
	}
	return read(p.m)
}

// Close unmaps the page and closes its file. The memory is freed once the worker is gone too.
func (p *Page) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	err := unix.Munmap(p.m.mem)
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close beacon: %w", err)
	}
	return nil
}

// A write holds the page for well under a microsecond, but the writer's thread can be descheduled
// inside it, so a snapshot keeps retrying for up to readBudget before it reports ErrTorn.
const readBudget = 100 * time.Millisecond

func read(m words) (Snapshot, error) {
	if m.load(wMagic) != magic {
		return Snapshot{}, ErrNotBeacon
	}
	var start time.Time
	for i := 0; ; i++ {
		if s1 := m.load(wSeq); s1&1 == 0 {
			s := readFields(m)
			if m.load(wSeq) == s1 {
				return s, nil
			}
		}
		switch {
		case i < 64:
		case i < 256:
			runtime.Gosched()
		default:
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > readBudget {
				return readFields(m), ErrTorn
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// loadString reads a string of at most maxLen bytes stored at word off, its length at lenOff.
func loadString(m words, lenOff, off, maxLen int) string {
	n := min(int(m.load(lenOff)), maxLen)
	buf := make([]byte, 0, n)
	for i := 0; len(buf) < n; i++ {
		v := m.load(off + i)
		for b := 0; b < 8 && len(buf) < n; b++ {
			buf = append(buf, byte(v>>(8*b)))
		}
	}
	return strings.ToValidUTF8(string(buf), "?")
}

func readFields(m words) Snapshot {
	return Snapshot{
		PID:        int(m.load(wPID)),
		Phase:      Phase(m.load(wPhase)),
		OpSeq:      m.load(wOpSeq),
		Op:         loadString(m, wNameLen, wName, MaxOpName),
		ConvKey:    loadString(m, wKeyLen, wKey, MaxConvKey),
		ConvTier:   loadString(m, wTierLen, wTier, MaxConvTier),
		InOp:       m.load(wInOp) != 0,
		OpStart:    timeOf(m.load(wOpStart)),
		OpDeadline: timeOf(m.load(wOpDead)),
		OpEnd:      timeOf(m.load(wOpEnd)),
		Step:       int(m.load(wStepI)),
		Steps:      int(m.load(wStepN)),
		Bytes:      int64(m.load(wBytes)),
		PeakBytes:  int64(m.load(wPeak)),
		Updated:    timeOf(m.load(wUpdated)),
	}
}
