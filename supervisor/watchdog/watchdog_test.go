package watchdog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// quietLog discards the watchdog's log lines.
func quietLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

func TestClassify(t *testing.T) {
	alive := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	hang := &Verdict{Kind: VerdictOpOverdue}
	exited := &Verdict{Kind: VerdictExited, Exit: workerkit.ExitStatus{Code: -1, Signal: syscall.SIGSEGV}}
	died := &workerkit.ExitError{Worker: "vae", Status: workerkit.ExitStatus{Code: -1, Signal: syscall.SIGKILL}, Err: errors.New("run: eof")}
	lost := &workerkit.ExitError{Worker: "vae", Status: workerkit.ExitStatus{Code: 2}, Stderr: []string{"hipErrorLaunchFailure at conv"}, Err: errors.New("eof")}
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		v    *Verdict
		want Class
	}{
		{"success", alive, nil, nil, ClassOK},
		{"success even after a late verdict", alive, nil, hang, ClassOK},
		{"oom", alive, fmt.Errorf("run vae: %w", &workerkit.Error{Code: workerkit.CodeOutOfMemory}), nil, ClassOOM},
		{"device lost", alive, &workerkit.Error{Code: workerkit.CodeDeviceLost}, nil, ClassDeviceLost},
		{"bad input", alive, &workerkit.Error{Code: workerkit.CodeInvalidArgument}, nil, ClassBadInput},
		{"internal error", alive, &workerkit.Error{Code: workerkit.CodeInternal}, nil, ClassCrash},
		{"killed by the watchdog", alive, died, hang, ClassHang},
		{"died", alive, died, nil, ClassCrash},
		{"died with device-lost last words", alive, lost, nil, ClassDeviceLost},
		{"exit verdict", alive, errors.New("transport closed"), exited, ClassCrash},
		{"call deadline", alive, fmt.Errorf("run: %w", context.DeadlineExceeded), nil, ClassHang},
		{"cancelled job", cancelled, died, nil, ClassCancelled},
		{"hang beats cancel", cancelled, died, hang, ClassHang},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := Classify(tc.ctx, tc.err, tc.v)
			if got != tc.want {
				t.Fatalf("class %s (%s), want %s", got, why, tc.want)
			}
			if got != ClassOK && why == "" {
				t.Fatal("no reason")
			}
		})
	}
	for _, c := range Classes() {
		if c.String() == "" || (c != ClassCancelled && c.Proto() == framepackv1.AttemptClass_ATTEMPT_CLASS_UNSPECIFIED) {
			t.Errorf("class %d: name %q proto %v", c, c, c.Proto())
		}
	}
}

func TestJudge(t *testing.T) {
	start := time.Unix(1000, 0)
	lim := Limits{Stage: time.Minute, Op: 2 * time.Second, Stall: 3 * time.Second}
	running := beacon.Snapshot{Phase: beacon.PhaseRunning, OpSeq: 7, Updated: start}
	inOp := func(age time.Duration, own time.Duration) beacon.Snapshot {
		s := running
		s.InOp, s.OpStart = true, start.Add(10*time.Second)
		if own > 0 {
			s.OpDeadline = s.OpStart.Add(own)
		}
		return s
	}
	at := func(d time.Duration) time.Time { return start.Add(d) }
	tests := []struct {
		name string
		s    beacon.Snapshot
		now  time.Time
		want VerdictKind
	}{
		{"op within default", inOp(0, 0), at(11900 * time.Millisecond), 0},
		{"op past default", inOp(0, 0), at(12100 * time.Millisecond), VerdictOpOverdue},
		{"op within its own", inOp(0, 5*time.Second), at(14 * time.Second), 0},
		{"op past its own", inOp(0, 5*time.Second), at(15100 * time.Millisecond), VerdictOpOverdue},
		{"between ops, fresh", running, at(2 * time.Second), 0},
		{"between ops, stalled", running, at(3100 * time.Millisecond), VerdictStalled},
		{"idle never stalls", beacon.Snapshot{Phase: beacon.PhaseIdle}, at(50 * time.Second), 0},
		{"stage deadline", running, at(61 * time.Second), VerdictStageDeadline},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.s, start, tc.now, lim)
			switch {
			case tc.want == 0 && v != nil:
				t.Fatalf("verdict %s", v)
			case tc.want != 0 && (v == nil || v.Kind != tc.want):
				t.Fatalf("verdict %v, want %s", v, tc.want)
			case v != nil && v.String() == "":
				t.Fatal("empty description")
			}
		})
	}
}

func TestDeadlines(t *testing.T) {
	d := DefaultDeadlines()
	small := d.Limits(framepackv1.Stage_STAGE_VAE_DECODE, Size{Frames: 1, Height: 64, Width: 64})
	big := d.Limits(framepackv1.Stage_STAGE_VAE_DECODE, Size{Frames: 37, Height: 544, Width: 704})
	if small.Stage <= 0 || big.Stage <= small.Stage || small.Op < d.OpMin || small.Op > small.Stage {
		t.Fatalf("small %+v big %+v", small, big)
	}
	tr := d.Limits(framepackv1.Stage_STAGE_TRANSFORMER, Size{Frames: 33, Height: 544, Width: 704, Steps: 25})
	if tr.Stage < 2*time.Hour {
		t.Fatalf("a full section on a slow lane needs hours: %v", tr.Stage)
	}
	d.Scale = 0.01
	if s := d.Limits(framepackv1.Stage_STAGE_VAE_DECODE, Size{Frames: 1, Height: 64, Width: 64}); s.Stage != small.Stage/100 {
		t.Fatalf("scaled %v, want %v", s.Stage, small.Stage/100)
	}
	if u := (Size{Frames: 2, Height: 1000, Width: 500, Steps: 3}).Units(); u != 3 {
		t.Fatalf("units %v", u)
	}
}

func TestLadder(t *testing.T) {
	l := DefaultLadder(20 << 30)
	vae := StageInfo{Kind: framepackv1.Stage_STAGE_VAE_DECODE, Small: true, LaneBackend: "hip", Traits: vaeTraits}
	var k workerkit.Override
	var changes []string
	for i := 1; ; i++ {
		s, ok := l.Next(vae, ClassOOM, i, k, nil)
		if !ok || strings.HasPrefix(s.Change, "retry as is") {
			break
		}
		changes = append(changes, s.Change)
		k = s.Knobs
		if i > 10 {
			t.Fatal("the ladder never ends")
		}
	}
	// cap → smaller tiles → conv tier down → cpu, in that order.
	want := []string{"memory cap", "memory cap", "vae tile untiled -> 256 px", "vae tile 256 px -> 128 px", "vae tile 128 px -> 64 px",
		"convolutions from tier 1 -> 2", "convolutions from tier 2 -> 3", "convolutions from tier 3 -> 4", "backend -> cpu"}
	checkRungs(t, "vae", changes, want)
	first := uint64(float64(20<<30) * 0.85)
	if k.VAETilePx != 64 || k.Backend != "cpu" || k.MemoryCap != uint64(float64(first)*0.85) {
		t.Errorf("vae ladder end: %+v", k)
	}

	// The transformer: fewer resident blocks before a lower cap (issue 17), then the stage's
	// own cap (the lane's for the job) is lowered; no cpu rung for a big stage (the text
	// encoder's Llama layers: TestResidentBlockRung).
	tr := StageInfo{Kind: framepackv1.Stage_STAGE_TRANSFORMER, LaneBackend: "cuda", MemoryCap: 10 << 30, Traits: transformerTraits}
	var tk workerkit.Override
	var trChanges []string
	for i := 1; i <= 12; i++ {
		s, ok := l.Next(tr, ClassOOM, i, tk, nil)
		if !ok || strings.HasPrefix(s.Change, "retry as is") || strings.HasPrefix(s.Change, "convolutions") {
			break
		}
		trChanges = append(trChanges, s.Change)
		tk = s.Knobs
	}
	trWant := []string{"resident transformer blocks all -> 30", "resident transformer blocks 30 -> 15", "resident transformer blocks 15 -> 7",
		"resident transformer blocks 7 -> 3", "resident transformer blocks 3 -> 1", "memory cap", "memory cap"}
	checkRungs(t, "transformer", trChanges, trWant)
	s, _ := l.Next(tr, ClassOOM, 1, workerkit.Override{MaxResidentBlocks: 1}, nil)
	if s.Knobs.MemoryCap != uint64(float64(10<<30)*0.85) || s.Knobs.MaxResidentBlocks != 1 {
		t.Errorf("transformer's rung after one resident block %+v, want its own cap lowered", s)
	}
	capFloor := float64(10<<30) * 0.85 * 0.85
	if s, ok := l.Next(tr, ClassOOM, 9, workerkit.Override{MaxResidentBlocks: 1, ConvFirstTier: workerkit.ConvTierCPU, MemoryCap: uint64(capFloor)}, nil); !ok || s.Knobs.Backend == "cpu" ||
		!strings.HasPrefix(s.Change, "retry as is") {
		t.Errorf("a big stage at the bottom of the ladder: %+v", s)
	}
	cpuVAE := vae
	cpuVAE.LaneBackend = "cpu"
	if s, _ := l.Next(cpuVAE, ClassOOM, 9, workerkit.Override{VAETilePx: 64, MemoryCap: 1}, nil); s.Knobs.ConvFirstTier != 0 {
		t.Errorf("a cpu lane stepped conv tiers: %+v", s)
	}

	hung := &Verdict{Kind: VerdictOpOverdue, Beacon: beacon.Snapshot{InOp: true, Op: "conv3d", ConvKey: "K", ConvTier: "vendor_tuned"}}
	s, ok := l.Next(vae, ClassHang, 1, workerkit.Override{}, hung)
	if !ok || s.MarkHung == nil || *s.MarkHung != (ConvMark{Key: "K", Tier: "vendor_tuned"}) {
		t.Errorf("conv hang: %+v %v", s, ok)
	}
	if s, ok := l.Next(vae, ClassHang, 1, workerkit.Override{}, &Verdict{Kind: VerdictStalled}); !ok || s.MarkHung != nil || s.Knobs != (workerkit.Override{}) {
		t.Errorf("plain hang: %+v", s)
	}
	inCPU := &Verdict{Kind: VerdictOpOverdue, Beacon: beacon.Snapshot{InOp: true, Op: "conv3d", ConvKey: "K", ConvTier: LastConvTier}}
	if s, ok := l.Next(vae, ClassHang, 1, workerkit.Override{}, inCPU); !ok || s.MarkHung != nil {
		t.Errorf("hang in the last conv tier marked: %+v", s)
	}
	if s, ok := l.Next(vae, ClassCrash, 1, workerkit.Override{}, nil); !ok || s.Knobs != (workerkit.Override{}) {
		t.Errorf("first crash: %+v", s)
	}
	if s, _ := l.Next(vae, ClassDeviceLost, 2, workerkit.Override{}, nil); s.Knobs.Backend != "cpu" {
		t.Errorf("second device loss of a small stage: %+v", s)
	}
	cpuLane := vae
	cpuLane.LaneBackend = "cpu"
	if s, _ := l.Next(cpuLane, ClassCrash, 3, workerkit.Override{}, nil); s.Knobs.Backend != "" {
		t.Errorf("cpu lane has no cpu rung: %+v", s)
	}
	if _, ok := l.Next(vae, ClassBadInput, 1, workerkit.Override{}, nil); ok {
		t.Error("bad input retried")
	}
}

func TestHealthWait(t *testing.T) {
	h := NewHealth("cpu")
	if err := h.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.Hold("vram")
	done := make(chan error, 1)
	go func() { done <- h.Wait(t.Context()) }()
	select {
	case err := <-done:
		t.Fatalf("wait returned on a held lane: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	h.Degrade("probe", time.Now().Add(time.Second))
	h.MarkHealthy()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := h.Status()
	if st.Holds != 1 || st.Degrades != 1 || st.State != LaneHealthy || st.State.Proto() != framepackv1.LaneState_LANE_STATE_HEALTHY {
		t.Fatalf("status %+v", st)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	h.Hold("again")
	if err := h.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on a held lane: %v", err)
	}
}

// fakeMemory returns the figures of a script, the last one repeated.
type fakeMemory struct {
	mu   sync.Mutex
	vals []uint64
	err  error
}

func (f *fakeMemory) Used(context.Context) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	v := f.vals[0]
	if len(f.vals) > 1 {
		f.vals = f.vals[1:]
	}
	return v, nil
}

func (f *fakeMemory) Name() string { return "fake" }

func (f *fakeMemory) set(v ...uint64) {
	f.mu.Lock()
	f.vals = v
	f.mu.Unlock()
}

func TestRecoveryCheck(t *testing.T) {
	mem := &fakeMemory{vals: []uint64{900 << 20, 500 << 20, 101 << 20}}
	r := &Recovery{Memory: mem, Margin: 1 << 20, Poll: time.Millisecond, Timeout: time.Second}
	res := r.Check(t.Context(), 100<<20, 0)
	if !res.Recovered || res.Used != 101<<20 {
		t.Fatalf("recovering memory: %+v", res)
	}
	mem.set(200 << 20)
	r.Timeout = 30 * time.Millisecond
	res = r.Check(t.Context(), 100<<20, 0)
	if res.Recovered || !strings.Contains(res.Reason, "baseline") || res.Waited < 30*time.Millisecond {
		t.Fatalf("memory that stays: %+v", res)
	}
	members := [][]int{{42, 43}, {43}, nil}
	r.Memory, r.Timeout = nil, time.Second
	r.groupLive = func(int) ([]int, error) { m := members[0]; members = members[1:]; return m, nil }
	if res := r.Check(t.Context(), 0, 42); !res.Recovered {
		t.Fatalf("group that empties: %+v", res)
	}
	mem.err = errors.New("no driver")
	r.Memory, r.groupLive = mem, func(int) ([]int, error) { return nil, nil }
	r.Timeout = 10 * time.Millisecond
	if res := r.Check(t.Context(), 0, 42); res.Recovered || !strings.Contains(res.Reason, "no driver") {
		t.Fatalf("unreadable memory: %+v", res)
	}
}

func TestRecoverDeviceBackoff(t *testing.T) {
	fails := 3
	var waits []time.Duration
	w, err := New(Config{Lane: "cpu", Log: quietLog(), Backoff: Backoff{Initial: 5 * time.Millisecond, Max: 12 * time.Millisecond},
		Probe: func(context.Context) error {
			if fails > 0 {
				fails--
				return errors.New("no device")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var states []LaneState
	err = w.RecoverDevice(t.Context(), func(reason string, wait time.Duration) {
		waits = append(waits, wait)
		states = append(states, w.Health().Status().State)
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(waits) != "[5ms 10ms 12ms]" {
		t.Fatalf("backoff %v", waits)
	}
	for _, s := range states {
		if s != LaneDegraded {
			t.Fatalf("lane %s while probes fail", s)
		}
	}
	if st := w.Health().Status(); st.State != LaneHealthy || st.Degrades != 1 {
		t.Fatalf("after a passing probe: %+v", st)
	}
	if s := w.Stats(); s.Probes != 4 || s.ProbeFailures != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// fakeTarget is a worker process made of an in-process beacon page.
type fakeTarget struct {
	page   *beacon.Page
	bw     *beacon.Writer
	done   chan struct{}
	killed chan struct{}
	once   sync.Once
}

func newFakeTarget(t *testing.T) *fakeTarget {
	p, err := beacon.NewPage()
	if err != nil {
		t.Fatal(err)
	}
	bw, err := beacon.Attach(p.File())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bw.Close(); p.Close() })
	return &fakeTarget{page: p, bw: bw, done: make(chan struct{}), killed: make(chan struct{})}
}

func (f *fakeTarget) PID() int                         { return 0 }
func (f *fakeTarget) Beacon() (beacon.Snapshot, error) { return f.page.Snapshot() }
func (f *fakeTarget) Done() <-chan struct{}            { return f.done }
func (f *fakeTarget) Exited() (workerkit.ExitStatus, bool) {
	select {
	case <-f.done:
		return workerkit.ExitStatus{Code: -1, Signal: syscall.SIGKILL, Killed: true}, true
	default:
		return workerkit.ExitStatus{}, false
	}
}
func (f *fakeTarget) Kill() error {
	f.once.Do(func() { close(f.killed); close(f.done) })
	return nil
}

func TestGuardKillsHung(t *testing.T) {
	f := newFakeTarget(t)
	g := NewGuard(Limits{Op: 100 * time.Millisecond, Poll: 10 * time.Millisecond}, quietLog())
	stop := g.Attach(f)
	defer stop()
	f.bw.SetPhase(beacon.PhaseRunning)
	for range 5 {
		f.bw.BeginOp("gemm")
		time.Sleep(30 * time.Millisecond)
		f.bw.EndOp()
	}
	if g.Verdict() != nil {
		t.Fatalf("verdict on a progressing worker: %v", g.Verdict())
	}
	start := time.Now()
	f.bw.BeginConvOp("conv3d", "K", "own_kernel", 0)
	select {
	case <-f.killed:
	case <-time.After(5 * time.Second):
		t.Fatal("hung worker not killed")
	}
	stop()
	v := g.Verdict()
	if v == nil || v.Kind != VerdictOpOverdue {
		t.Fatalf("verdict %v", v)
	}
	if key, tier, ok := v.Conv(); !ok || key != "K" || tier != "own_kernel" {
		t.Fatalf("conv %q %q %v", key, tier, ok)
	}
	if d := time.Since(start); d > 100*time.Millisecond+2*time.Second {
		t.Fatalf("detected after %v", d)
	}
}

// TestJobRun: retries go down the ladder, the story and events tell every attempt, a budget
// ends it, bad input is never retried.
func TestJobRun(t *testing.T) {
	oom := &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: "oom"}
	mk := func(t *testing.T) (*Watchdog, *[]Retry) {
		w, err := New(Config{Lane: "cpu", LaneBackend: "cpu", Budget: Budget{PerStage: 3, PerJob: 4}, Log: quietLog(),
			Recovery: &Recovery{Timeout: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		var evs []Retry
		return w, &evs
	}
	vae := StageInfo{Kind: framepackv1.Stage_STAGE_VAE_DECODE, Section: 1, Model: "vae"}

	t.Run("recovers", func(t *testing.T) {
		w, evs := mk(t)
		j := w.Job("j1", func(r Retry) { *evs = append(*evs, r) })
		var tiles []uint32
		err := j.Run(t.Context(), vae, func(ctx context.Context, a *Attempt) error {
			tiles = append(tiles, a.Knobs.VAETilePx)
			a.Traits = &vaeTraits // the worker loaded, then ran out of memory
			if a.Number < 3 {
				return oom
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(tiles) != "[0 256 128]" {
			t.Fatalf("tiles %v", tiles)
		}
		story := j.Story()
		if len(story) != 3 || story[2].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OK || story[0].GetChange() != "vae tile untiled -> 256 px" {
			t.Fatalf("story %v", story)
		}
		if len(*evs) != 2 || (*evs)[1].Attempt.GetAttempt() != 2 {
			t.Fatalf("events %v", *evs)
		}
		if c := w.Stats().Classes[ClassOOM]; c.Detected != 2 || c.Retried != 2 || c.Recovered != 2 {
			t.Fatalf("counts %+v", c)
		}
	})
	for _, tc := range []struct {
		kind   framepackv1.Stage
		blocks string
		total  uint32
		traits workerkit.ModelTraits
	}{{framepackv1.Stage_STAGE_TRANSFORMER, "transformer blocks", 60, transformerTraits},
		{framepackv1.Stage_STAGE_TEXT_ENCODE, "llama layers", 30, textencTraits}} {
		t.Run(tc.blocks+": oom halves what ran", func(t *testing.T) {
			w, _ := mk(t)
			j := w.Job("jt", nil)
			st := StageInfo{Kind: tc.kind, Model: tc.blocks}
			var asked []uint32
			err := j.Run(t.Context(), st, func(ctx context.Context, a *Attempt) error {
				asked = append(asked, a.Knobs.MaxResidentBlocks)
				if o := a.Override(); o.MaxResidentBlocks != a.Knobs.MaxResidentBlocks {
					t.Errorf("attempt %d: override's max resident blocks %d, knobs %d", a.Number, o.MaxResidentBlocks, a.Knobs.MaxResidentBlocks)
				}
				a.Traits = &tc.traits
				switch a.Number {
				case 1: // the worker planned 12 resident under its cap, then ran out
					a.ResidentBlocks, a.StreamedBlocks = 12, tc.total-12
					return oom
				case 2: // it honoured max_resident_blocks 6, and ran out again with every block streamed
					a.ResidentBlocks, a.StreamedBlocks = 0, tc.total
					return oom
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			story := j.Story()
			if fmt.Sprint(asked) != "[0 6 1]" || len(story) != 3 || story[0].GetChange() != "resident "+tc.blocks+" 12 -> 6" {
				t.Fatalf("max resident blocks asked %v, story %v", asked, story)
			}
			if strings.Contains(story[1].GetChange(), "resident "+tc.blocks) {
				t.Fatalf("with every block streamed the ladder still lowers resident blocks: %v", story[1])
			}
		})
	}
	t.Run("traits learned on the lane", func(t *testing.T) {
		// A model's first Load on a lane fails: nothing is known of it, so only the cap rungs
		// apply. Once one of its workers declared its traits, a later job's failed Load gets
		// the model's rungs (half its stack resident first).
		w, _ := mk(t)
		st := StageInfo{Kind: framepackv1.Stage_STAGE_TRANSFORMER, Model: "transformer", MemoryCap: 10 << 30}
		var first []string
		err := w.Job("j-first", nil).Run(t.Context(), st, func(ctx context.Context, a *Attempt) error {
			first = append(first, a.Knobs.String())
			if a.Number == 1 {
				return oom // in Load: no traits
			}
			a.Traits = &transformerTraits
			a.ResidentBlocks, a.StreamedBlocks = 60, 0
			return nil
		})
		if err != nil || len(first) != 2 || !strings.HasPrefix(first[1], "memory cap") {
			t.Fatalf("first job: %v, attempts ran with %q; want the cap lowered (no traits known)", err, first)
		}
		var later []uint32
		err = w.Job("j-later", nil).Run(t.Context(), st, func(ctx context.Context, a *Attempt) error {
			later = append(later, a.Knobs.MaxResidentBlocks)
			if a.Number == 1 {
				return oom // in Load again
			}
			return nil
		})
		if err != nil || fmt.Sprint(later) != "[0 30]" {
			t.Fatalf("later job: %v, max resident blocks %v; want [0 30] from the traits declared before", err, later)
		}
	})
	t.Run("stage budget", func(t *testing.T) {
		w, _ := mk(t)
		j := w.Job("j2", nil)
		err := j.Run(t.Context(), vae, func(context.Context, *Attempt) error { return oom })
		var ge *GiveUpError
		if !errors.As(err, &ge) || len(ge.Attempts) != 3 || !strings.Contains(ge.Reason, "stage retry budget") {
			t.Fatalf("err %v", err)
		}
		f := ge.Failure()
		if f.GetStage() != vae.Kind || f.GetSectionIndex() != 1 || len(f.GetAttempts()) != 3 {
			t.Fatalf("failure %v", f)
		}
		t.Log(err)
	})
	t.Run("job budget", func(t *testing.T) {
		w, _ := mk(t)
		j := w.Job("j3", nil)
		for range 1 {
			if err := j.Run(t.Context(), vae, func(ctx context.Context, a *Attempt) error {
				if a.Number < 3 {
					return oom
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		err := j.Run(t.Context(), vae, func(context.Context, *Attempt) error { return oom })
		var ge *GiveUpError
		if !errors.As(err, &ge) || !strings.Contains(ge.Reason, "job retry budget") || ge.Tries != 2 || len(ge.Attempts) != 5 {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		w, _ := mk(t)
		n := 0
		err := w.Job("j4", nil).Run(t.Context(), vae, func(context.Context, *Attempt) error {
			n++
			return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: "bad latents"}
		})
		var ge *GiveUpError
		if !errors.As(err, &ge) || ge.Class != ClassBadInput || n != 1 {
			t.Fatalf("err %v after %d attempts", err, n)
		}
	})
	t.Run("held lane", func(t *testing.T) {
		mem := &fakeMemory{vals: []uint64{0, 1 << 30}}
		w, err := New(Config{Lane: "gpu", HeldPoll: 5 * time.Millisecond, Log: quietLog(),
			Recovery: &Recovery{Memory: mem, Timeout: 20 * time.Millisecond, Poll: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		j := w.Job("j5", nil)
		if err := j.Run(t.Context(), vae, func(context.Context, *Attempt) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if st := w.Health().Status(); st.State != LaneHeld {
			t.Fatalf("lane %+v after memory stayed", st)
		}
		next := make(chan error, 1)
		go func() { next <- j.Run(t.Context(), vae, func(context.Context, *Attempt) error { return nil }) }()
		select {
		case err := <-next:
			t.Fatalf("a stage ran on a held lane: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		mem.set(0)
		if err := <-next; err != nil {
			t.Fatal(err)
		}
		if s := w.Stats(); s.Holds != 1 || s.Releases != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// checkRungs checks a stage's oom ladder: as many rungs as want, each change starting with its
// want.
func checkRungs(t *testing.T, stage string, changes, want []string) {
	t.Helper()
	if len(changes) != len(want) {
		t.Fatalf("%s oom ladder %q, want %q", stage, changes, want)
	}
	for i := range want {
		if !strings.HasPrefix(changes[i], want[i]) {
			t.Errorf("%s oom rung %d is %q, want %q", stage, i, changes[i], want[i])
		}
	}
}
