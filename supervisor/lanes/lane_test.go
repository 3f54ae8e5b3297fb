package lanes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/lanes"
)

// helperEnv turns the test binary into a fake model worker.
const helperEnv = "FRAMEPACK_LANES_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		workerkit.Main("fake", func(k *workerkit.Kit) (workerkit.Worker, error) { return &fakeWorker{k: k}, nil })
	}
	os.Exit(m.Run())
}

// fakeWorker is a model worker whose behaviour the prompt of a text-encode stage chooses:
// "ok", "sleep" (until cancelled, ignoring the cancellation), "alloc" (holds 64 MiB for a
// while), "grandchild" (starts a process in its group that outlives it unless killed).
type fakeWorker struct {
	k    *workerkit.Kit
	hold []byte
}

func (w *fakeWorker) Load(_ context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	if req.ModelDir == "bad" {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: no model in %s", req.ModelDir)
	}
	// The fake reports the cap it was given as its allocation, so tests see the LoadRequest.
	resp := &workerkit.LoadResponse{Backend: "cpu", DType: "fp32", WeightBytes: 1000, DeviceAllocatedBytes: req.MemoryCapBytes}
	if req.Workload != nil { // a transformer's residency, made from what the request carried
		resp.ResidentBlocks, resp.StreamedBlocks = req.MaxResidentBlocks, req.Workload.LatentWindowSize
	}
	return resp, nil
}

func (w *fakeWorker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	te, ok := req.Stage.(*workerkit.TextEncodeRequest)
	if !ok {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "fake worker runs text_encode only")
	}
	switch te.Prompt {
	case "sleep":
		<-ctx.Done()
		select {} // a stuck call: only the kill ends it
	case "alloc":
		w.hold = make([]byte, 64<<20)
		for i := range w.hold {
			w.hold[i] = byte(i)
		}
		w.k.Beacon.SetBytes(int64(len(w.hold)))
		time.Sleep(600 * time.Millisecond)
	case "grandchild":
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		if err := emit(&workerkit.LogLine{Message: "grandchild", Fields: map[string]string{"pid": strconv.Itoa(cmd.Process.Pid)}}); err != nil {
			return nil, err
		}
	}
	if err := emit(&workerkit.Progress{Phase: "encode", Step: 1, TotalSteps: 1}); err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: []workerkit.TensorRef{te.LlamaVec}}, nil
}

func (w *fakeWorker) Stats(context.Context) (*workerkit.Stats, error) {
	return &workerkit.Stats{AllocatorPeakBytes: 12345 + uint64(len(w.hold))}, nil
}

// Estimate answers from the model folder's name: "/models/<model>" needs 100 MiB at least and
// 200 MiB at its fastest; a folder ending in "-noest" has no estimate.
func (w *fakeWorker) Estimate(_ context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error) {
	if strings.HasSuffix(req.Load.ModelDir, "-noest") {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "no estimate for %s", req.Load.ModelDir)
	}
	return &workerkit.EstimateResponse{WeightBytes: 50 << 20, MinDeviceBytes: 100 << 20, FullDeviceBytes: 200<<20 + uint64(req.VAEDecodeLatentFrames)<<20}, nil
}

func (w *fakeWorker) Probe(context.Context, *workerkit.ProbeRequest) (*workerkit.ProbeResponse, error) {
	return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "no probe")
}

func quietLog() *logrus.Entry {
	l := logrus.New()
	l.SetLevel(logrus.FatalLevel) // go-plugin logs every killed worker as an error
	return logrus.NewEntry(l)
}

func newLane(t *testing.T, mod func(*lanes.Config)) *lanes.Lane {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := lanes.Config{
		Name:        "cpu",
		Backend:     "cpu",
		WorkerPath:  func(lanes.Model) (string, error) { return exe, nil },
		Env:         []string{helperEnv + "=1"},
		SampleEvery: 50 * time.Millisecond,
		Log:         quietLog(),
	}
	if mod != nil {
		mod(&cfg)
	}
	l, err := lanes.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func stage(m lanes.Model, prompt string) lanes.Stage {
	return lanes.Stage{Model: m, ModelDir: "/models/" + string(m), JobID: "job",
		Request: &workerkit.TextEncodeRequest{Prompt: prompt, LlamaVec: workerkit.TensorRef{Path: "/x", Name: "v"}}}
}

// noChildren fails the test if this process has a child process.
func noChildren(t *testing.T) {
	t.Helper()
	kids, err := lanes.Children(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) > 0 {
		t.Fatalf("child processes left: %v", kids)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestRunCarriesResidency: the stage's workload and the attempt's max_resident_blocks reach
// the worker's LoadRequest, and the residency its LoadResponse reports reaches the Report.
func TestRunCarriesResidency(t *testing.T) {
	l := newLane(t, nil)
	st := stage(lanes.TextEnc, "ok")
	st.Workload = &workerkit.Workload{Height: 544, Width: 704, LatentWindowSize: 9}
	st.Load.MaxResidentBlocks = 7
	rep, err := l.Run(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ResidentBlocks != 7 || rep.StreamedBlocks != 9 {
		t.Fatalf("report residency %d resident, %d streamed; want 7 and 9", rep.ResidentBlocks, rep.StreamedBlocks)
	}
	if rep.Loaded == nil || rep.Loaded.ResidentBlocks != 7 {
		t.Fatalf("report's LoadResponse %+v; want the worker's, 7 resident blocks", rep.Loaded)
	}
}

func TestRunKillsWorkerAfterStage(t *testing.T) {
	l := newLane(t, nil)
	var events int
	st := stage(lanes.TextEnc, "ok")
	st.OnEvent = func(workerkit.Event) error { events++; return nil }
	rep, err := l.Run(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	if rep.PID <= 0 || rep.Reused || rep.Kept || rep.Result == nil || events != 1 {
		t.Fatalf("report %+v, events %d", rep, events)
	}
	if rep.SpawnToReady <= 0 || rep.Load <= 0 || rep.Compute <= 0 || rep.Teardown <= 0 {
		t.Fatalf("timings not recorded: %+v", rep)
	}
	if rep.AllocPeakBytes != 12345 || rep.RSSPeakBytes == 0 || rep.WeightBytes != 1000 || rep.Backend != "cpu" {
		t.Fatalf("memory not recorded: %+v", rep)
	}
	if alive(rep.PID) {
		t.Fatalf("worker %d alive after its stage", rep.PID)
	}
	if err := lanes.GroupAlive(rep.PID); err != nil {
		t.Fatal(err)
	}
	noChildren(t)
}

func TestGrandchildKilledWithGroup(t *testing.T) {
	l := newLane(t, nil)
	gc := 0
	st := stage(lanes.VAE, "grandchild")
	st.OnEvent = func(e workerkit.Event) error {
		if ll, ok := e.(*workerkit.LogLine); ok && ll.Message == "grandchild" {
			gc, _ = strconv.Atoi(ll.Fields["pid"])
		}
		return nil
	}
	if _, err := l.Run(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if gc == 0 {
		t.Fatal("no grandchild reported")
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(gc) && time.Now().Before(deadline) {
		// The grandchild is the init process's to reap once its parent is gone; until then it
		// may show as a zombie, which kill(0) still sees.
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", gc)); err == nil && strings.Contains(string(st), ") Z ") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", gc)); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Fatalf("grandchild %d still running: %s", gc, st)
	}
	noChildren(t)
}

func TestLoadFailureKillsWorker(t *testing.T) {
	l := newLane(t, nil)
	st := stage(lanes.ClipVision, "ok")
	st.ModelDir = "bad"
	rep, err := l.Run(t.Context(), st)
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument {
		t.Fatalf("err %v, want the worker's invalid-argument error", err)
	}
	if rep.PID == 0 || alive(rep.PID) {
		t.Fatalf("worker %d not killed after a failed load", rep.PID)
	}
	noChildren(t)
}

func TestCancelKillsStuckWorker(t *testing.T) {
	l := newLane(t, nil)
	ctx, cancel := context.WithCancelCause(t.Context())
	errStop := errors.New("job cancelled by test")
	st := stage(lanes.Transformer, "sleep")
	started := make(chan struct{})
	var once sync.Once
	st.OnTelemetry = func(lanes.Telemetry) { once.Do(func() { close(started) }) }
	go func() {
		<-started
		cancel(errStop)
	}()
	t0 := time.Now()
	rep, err := l.Run(ctx, st)
	if !errors.Is(err, errStop) {
		t.Fatalf("err %v, want the cancellation cause", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	if alive(rep.PID) {
		t.Fatalf("worker %d alive after cancel", rep.PID)
	}
	noChildren(t)
}

func TestTelemetrySamplesRSS(t *testing.T) {
	l := newLane(t, nil)
	var mu sync.Mutex
	var samples []lanes.Telemetry
	st := stage(lanes.VAE, "alloc")
	st.OnTelemetry = func(tel lanes.Telemetry) {
		mu.Lock()
		samples = append(samples, tel)
		mu.Unlock()
	}
	rep, err := l.Run(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(samples) < 3 {
		t.Fatalf("%d telemetry samples", len(samples))
	}
	if rep.RSSPeakBytes < 64<<20 {
		t.Fatalf("rss peak %d, the worker held 64 MiB", rep.RSSPeakBytes)
	}
	sawBeacon := slices.ContainsFunc(samples, func(s lanes.Telemetry) bool { return s.AllocatorBytes == 64<<20 })
	if !sawBeacon {
		t.Fatalf("no sample read the beacon's 64 MiB: %+v", samples)
	}
	if f := samples[len(samples)-1]; !f.Final || f.AllocatorPeakBytes != rep.AllocPeakBytes || slices.ContainsFunc(samples[:len(samples)-1], func(s lanes.Telemetry) bool { return s.Final }) {
		t.Fatalf("the last sample (and only it) must be final with the stage's peak: %+v", samples)
	}
	if rep.AllocPeakBytes != 12345+64<<20 {
		t.Fatalf("alloc peak %d", rep.AllocPeakBytes)
	}
}
