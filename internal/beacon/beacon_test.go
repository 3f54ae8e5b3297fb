package beacon

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newPair(t *testing.T) (*Page, *Writer) {
	t.Helper()
	p, err := NewPage()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	w, err := Attach(p.File())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return p, w
}

func TestRoundTrip(t *testing.T) {
	p, w := newPair(t)

	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.Phase != PhaseStarting || s.OpSeq != 0 || s.InOp {
		t.Fatalf("fresh page: %+v", s)
	}

	before := time.Now()
	w.SetPhase(PhaseRunning)
	seq := w.BeginOpWithin("conv3d[1,128,9,68,88]", 2*time.Second)
	w.SetStep(3, 25)
	w.SetBytes(1 << 30)
	w.SetBytes(1 << 20)
	after := time.Now()

	s, err = p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if seq != 1 || s.OpSeq != 1 {
		t.Fatalf("op seq: returned %d, page %d, want 1", seq, s.OpSeq)
	}
	if s.Phase != PhaseRunning || s.Op != "conv3d[1,128,9,68,88]" || !s.InOp {
		t.Fatalf("op state: %+v", s)
	}
	if s.OpStart.Before(before) || s.OpStart.After(after) {
		t.Fatalf("op start %v not within [%v, %v]", s.OpStart, before, after)
	}
	if d := s.OpDeadline.Sub(s.OpStart); d != 2*time.Second {
		t.Fatalf("deadline - start = %v, want 2s", d)
	}
	if s.Step != 3 || s.Steps != 25 || s.Bytes != 1<<20 || s.PeakBytes != 1<<30 {
		t.Fatalf("progress: %+v", s)
	}
	if s.Overdue(s.OpStart.Add(time.Second)) || !s.Overdue(s.OpStart.Add(3*time.Second)) {
		t.Fatalf("overdue wrong around deadline %v", s.OpDeadline)
	}
	if age := s.OpAge(s.OpStart.Add(time.Second)); age != time.Second {
		t.Fatalf("op age %v, want 1s", age)
	}

	w.EndOp()
	w.BeginOp(strings.Repeat("x", 100))
	s, _ = p.Snapshot()
	if s.OpSeq != 2 || len(s.Op) != MaxOpName || !s.OpDeadline.IsZero() {
		t.Fatalf("second op: seq %d, name len %d, deadline %v", s.OpSeq, len(s.Op), s.OpDeadline)
	}
	w.EndOp()
	s, _ = p.Snapshot()
	if s.InOp || s.OpEnd.IsZero() || s.OpAge(time.Now()) != 0 || s.Overdue(time.Now().Add(time.Hour)) {
		t.Fatalf("after EndOp: %+v", s)
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ = p.Snapshot()
	if s.Phase != PhaseExiting {
		t.Fatalf("phase after close: %v", s.Phase)
	}
	w.BeginOp("after close") // must not panic or write
	if s2, _ := p.Snapshot(); s2.OpSeq != s.OpSeq {
		t.Fatalf("write after close changed the page")
	}
}

// TestConsistentUnderConcurrentWrites checks the seqlock: every snapshot must show one write's
// fields together, never a mix of two.
func TestConsistentUnderConcurrentWrites(t *testing.T) {
	p, w := newPair(t)
	const n = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= n; i++ {
			w.update(func(m words, _ uint64) {
				m.store(wStepI, uint64(i))
				m.store(wStepN, uint64(2*i))
				m.store(wBytes, uint64(3*i))
				storeString(m, wNameLen, wName, MaxOpName, fmt.Sprintf("op-%d", i))
			})
		}
	}()
	reads, torn := 0, 0
	for {
		s, err := p.Snapshot()
		if errors.Is(err, ErrTorn) {
			torn++ // the writer was descheduled mid-write; no data, not wrong data
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		reads++
		if s.Step != 0 {
			if s.Steps != 2*s.Step || s.Bytes != int64(3*s.Step) || s.Op != fmt.Sprintf("op-%d", s.Step) {
				t.Fatalf("inconsistent snapshot after %d reads: %+v", reads, s)
			}
		}
		if s.Step == n {
			break
		}
	}
	wg.Wait()
	t.Logf("%d consistent reads, %d torn", reads, torn)
}

func TestTornWriterReported(t *testing.T) {
	p, w := newPair(t)
	w.BeginOp("stuck")
	// A writer killed inside its write section leaves the sequence odd.
	p.m.store(wSeq, p.m.load(wSeq)+1)
	s, err := p.Snapshot()
	if !errors.Is(err, ErrTorn) {
		t.Fatalf("want ErrTorn, got %v", err)
	}
	if s.Op != "stuck" {
		t.Fatalf("best-effort snapshot lost the op: %+v", s)
	}
}

func TestAttachRejects(t *testing.T) {
	fd, err := unix.MemfdCreate("not-a-beacon", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "x")
	defer f.Close()
	if _, err := Attach(f); !errors.Is(err, ErrNotBeacon) {
		t.Fatalf("empty file: want ErrNotBeacon, got %v", err)
	}
	if err := f.Truncate(PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(f); !errors.Is(err, ErrNotBeacon) {
		t.Fatalf("zero page: want ErrNotBeacon, got %v", err)
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(EnvFD, "")
	w, err := FromEnv()
	if err != nil || w != nil {
		t.Fatalf("no env: got %v, %v", w, err)
	}
	// A nil writer accepts every call.
	w.SetPhase(PhaseIdle)
	w.BeginOp("x")
	w.SetStep(1, 2)
	w.SetBytes(1)
	w.EndOp()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"x", "1", "-4"} {
		t.Setenv(EnvFD, bad)
		if _, err := FromEnv(); err == nil {
			t.Fatalf("%s=%q accepted", EnvFD, bad)
		}
	}
}

func TestPhaseString(t *testing.T) {
	if PhaseRunning.String() != "running" || Phase(99).String() != "phase(99)" {
		t.Fatalf("got %q, %q", PhaseRunning, Phase(99))
	}
}

// BenchmarkOp measures the cost a worker pays per native op (BeginOp + EndOp).
func BenchmarkOp(b *testing.B) {
	p, err := NewPage()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	w, err := Attach(p.File())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	for b.Loop() {
		w.BeginOp("gemm")
		w.EndOp()
	}
}

// BenchmarkSnapshot measures one watchdog read.
func BenchmarkSnapshot(b *testing.B) {
	p, err := NewPage()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for b.Loop() {
		if _, err := p.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFilePage(t *testing.T) {
	path := t.TempDir() + "/worker.beacon"
	p, err := NewFilePage(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := NewFilePage(path); err == nil {
		t.Fatal("second page over an existing file")
	}
	w, err := AttachPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.BeginOp("decode")
	if s, err := p.Snapshot(); err != nil || s.Op != "decode" || s.PID != os.Getpid() {
		t.Fatalf("file page: %+v, %v", s, err)
	}
	if _, err := AttachPath(path + ".missing"); err == nil {
		t.Fatal("attached a missing file")
	}
}

// TestConvOp: a conv tier attempt carries its shape key and tier; a plain op after it clears
// them; a key longer than MaxConvKey is truncated, not spilled into the tier.
func TestConvOp(t *testing.T) {
	p, w := newPair(t)
	key := "conv3d x=1x128x9x68x88 w=128x128x3x3x3 s=1x1x1 p=0x0x0 g=1 f32/f32 cpu:0"
	w.BeginConvOp("conv3d", key, "vendor_tuned", 0)
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if s.Op != "conv3d" || s.ConvKey != key || s.ConvTier != "vendor_tuned" || !s.InOp {
		t.Fatalf("conv op: %+v", s)
	}
	w.EndOp()
	if s, _ = p.Snapshot(); s.ConvKey != key || s.InOp {
		t.Fatalf("after end, the last conv stays readable: %+v", s)
	}
	w.BeginOp("gemm")
	if s, _ = p.Snapshot(); s.Op != "gemm" || s.ConvKey != "" || s.ConvTier != "" {
		t.Fatalf("plain op after a conv: %+v", s)
	}
	long := strings.Repeat("k", MaxConvKey+40)
	w.BeginConvOp("conv3d", long, "own_kernel", time.Second)
	if s, _ = p.Snapshot(); s.ConvKey != long[:MaxConvKey] || s.ConvTier != "own_kernel" || s.OpDeadline.IsZero() {
		t.Fatalf("long key: len %d tier %q", len(s.ConvKey), s.ConvTier)
	}
}
