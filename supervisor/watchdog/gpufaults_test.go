package watchdog_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/convcache"
	gpudevices "github.com/framepackd/framepackd/internal/devices"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// The GPU fault run (scripts/gpufaults): one framepackd (lane, watchdog, pipeline, API) in this
// process on a GPU lane with full-size checkpoints, and one job per fault. Skipped unless
// -gpufaults.models is given; -gpufaults.lane cpu -gpufaults.tiny with testdata/parity/models
// is a dry run of the harness on the tiny models.
var (
	gfModels     = flag.String("gpufaults.models", "", "TestGPUFaults: the models folder (mkmodels' full-size random checkpoints; testdata/parity/models with -gpufaults.tiny); empty skips the test")
	gfWorkers    = flag.String("gpufaults.workers", "", "TestGPUFaults: folder of the textenc, vae, clipvision, transformer and probe binaries; empty builds them")
	gfLane       = flag.String("gpufaults.lane", "cuda:0", "TestGPUFaults: the lane, cuda:N (its memory read through NVML) or cpu (a dry run)")
	gfCapGiB     = flag.Float64("gpufaults.cap-gib", 16, "TestGPUFaults: the workers' memory cap in GiB (the lane's memory limit)")
	gfSteps      = flag.Int("gpufaults.steps", 8, "TestGPUFaults: sampling steps of the one-section job")
	gfTiny       = flag.Bool("gpufaults.tiny", false, "TestGPUFaults: a 96 px job for the tiny models (dry run)")
	gfOut        = flag.String("gpufaults.out", "", "TestGPUFaults: the JSON record to write")
	gfOnly       = flag.String("gpufaults.scenarios", "", "TestGPUFaults: comma-separated scenarios to run after the reference (default all)")
	gfOpDeadline = flag.Duration("gpufaults.op-deadline", 30*time.Second, "TestGPUFaults: the watchdog's op deadline and stall limit, how long a stopped worker goes unnoticed")
	gfSignalStep = flag.Int("gpufaults.signal-step", 0, "TestGPUFaults: the sampling step after which the transformer worker is signalled; 0: half the steps")
	gfMargin     = flag.Uint64("gpufaults.margin-mib", 256, "TestGPUFaults: device memory within this of the idle baseline counts as back")
)

// gfScenario is one fault and what the watchdog should make of it.
type gfScenario struct {
	Name, What string
	stage      framepackv1.Stage
	// signal is sent to the transformer's worker from outside, after sampling step atStep.
	signal syscall.Signal
	atStep int
	// plan is the injected fault of the stage's first attempt (FaultPlan); nil: none.
	plan      func(a watchdog.AttemptInfo) *workerkit.Fault
	wantClass framepackv1.AttemptClass
}

func gfScenarios(steps, signalStep int) []gfScenario {
	mid := max(steps/2, 1)
	if signalStep > 0 {
		mid = signalStep
	}
	tr, dec := framepackv1.Stage_STAGE_TRANSFORMER, framepackv1.Stage_STAGE_VAE_DECODE
	return []gfScenario{
		{Name: "transformer-sigkill", What: fmt.Sprintf("SIGKILL of the transformer worker after sampling step %d", mid),
			stage: tr, signal: syscall.SIGKILL, atStep: mid, wantClass: framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH},
		{Name: "transformer-sigstop", What: fmt.Sprintf("SIGSTOP of the transformer worker after sampling step %d (a hang: the watchdog kills it)", mid),
			stage: tr, signal: syscall.SIGSTOP, atStep: mid, wantClass: framepackv1.AttemptClass_ATTEMPT_CLASS_HANG},
		{Name: "transformer-oom-load", What: "out of memory at the transformer's Load (its allocator refuses the weights)",
			stage: tr, plan: func(watchdog.AttemptInfo) *workerkit.Fault { return &workerkit.Fault{OOMAtLoad: true} },
			wantClass: framepackv1.AttemptClass_ATTEMPT_CLASS_OOM},
		{Name: "transformer-oom-mid", What: "out of memory at the middle op of the transformer stage (by the reference run's op count)",
			stage: tr, plan: func(a watchdog.AttemptInfo) *workerkit.Fault { return &workerkit.Fault{OOMAtOp: max(a.OpsSeen/2, 1)} },
			wantClass: framepackv1.AttemptClass_ATTEMPT_CLASS_OOM},
		{Name: "vae-sigkill-decode", What: "SIGKILL of the VAE worker two thirds into its decode (raised by its fault injector at that op, by the reference run's op count)",
			stage: dec, plan: func(a watchdog.AttemptInfo) *workerkit.Fault {
				return &workerkit.Fault{ExitAtOp: max(a.OpsSeen*2/3, 1), ExitSignal: int32(syscall.SIGKILL)}
			}, wantClass: framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH},
	}
}

// gfRetry is one Retry event of a job.
type gfRetry struct {
	Stage   string  `json:"stage"`
	Attempt uint32  `json:"attempt"`
	Class   string  `json:"class"`
	Change  string  `json:"change"`
	Message string  `json:"message"`
	AtS     float64 `json:"at_s"`
}

// gfResult is one job of the run.
type gfResult struct {
	Name           string    `json:"name"`
	What           string    `json:"what,omitempty"`
	State          string    `json:"state"`
	JobS           float64   `json:"job_s"`
	FaultAtS       float64   `json:"fault_at_s,omitempty"` // the signal, or the failed attempt's Retry event
	WorkerPID      int       `json:"worker_pid,omitempty"`
	WorkerGoneS    *float64  `json:"worker_gone_s,omitempty"`   // signal to the process gone (a SIGSTOP: the watchdog's kill)
	MemoryBackS    *float64  `json:"memory_back_s,omitempty"`   // process gone to NVML within the margin of the idle baseline
	BaselineGiB    float64   `json:"baseline_gib,omitempty"`    // NVML used before the job
	PeakBeforeGiB  float64   `json:"peak_before_gib,omitempty"` // NVML used just before the fault
	Retries        []gfRetry `json:"retries"`
	CapGiB         float64   `json:"cap_gib"`
	LatentsSHA256  string    `json:"latents_sha256"`
	PixelsSHA256   string    `json:"pixels_sha256"`
	LatentsEqual   *bool     `json:"latents_equal,omitempty"`
	PixelsEqual    *bool     `json:"pixels_equal,omitempty"`
	ExpectBitEqual bool      `json:"expect_bit_equal,omitempty"`
	Problems       []string  `json:"problems,omitempty"`
}

// gfRecord is the run's JSON record (docs/bench/).
type gfRecord struct {
	Kind        string     `json:"kind"`
	Date        string     `json:"date"`
	GPU         string     `json:"gpu"`
	Lane        string     `json:"lane"`
	Models      string     `json:"models"`
	Job         string     `json:"job"`
	CapGiB      float64    `json:"cap_gib"`
	OpDeadlineS float64    `json:"op_deadline_s"`
	MarginMiB   uint64     `json:"margin_mib"`
	SampleMs    int        `json:"nvml_sample_ms"`
	Results     []gfResult `json:"results"`
	TotalS      float64    `json:"total_s"`
}

// memSampler reads the device's used memory every period, keeping every reading.
type memSampler struct {
	mem watchdog.Memory
	mu  sync.Mutex
	at  []time.Time
	val []uint64
}

func (s *memSampler) run(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if v, err := s.mem.Used(ctx); err == nil {
			s.mu.Lock()
			s.at, s.val = append(s.at, time.Now()), append(s.val, v)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// last is the newest reading at or before t.
func (s *memSampler) last(t time.Time) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.at, t, func(a, b time.Time) int { return a.Compare(b) })
	if i > 0 && (i == len(s.at) || !s.at[i].Equal(t)) {
		i--
	}
	if i >= len(s.val) {
		return 0
	}
	return s.val[i]
}

// backAfter is the time from t to the first reading after t within margin of baseline.
func (s *memSampler) backAfter(t time.Time, baseline, margin uint64) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, at := range s.at {
		if !at.Before(t) && s.val[i] <= baseline+margin {
			return at.Sub(t), true
		}
	}
	return 0, false
}

// childWorker returns the pid of this process's child running binary bin (the stage's worker).
func childWorker(bin string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || exe != bin {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state ppid ...
		if len(f) > 1 && f[1] == strconv.Itoa(self) && f[0] != "Z" {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no live child running %s", bin)
}

// historyHashes hashes the final section file's history latents and pixels (f32, as the
// pipeline keeps them, before any video encoding).
func historyHashes(state, id string) (latents, pixels string, err error) {
	f, err := safetensors.Open(filepath.Join(state, "jobs", id, "history", pipeline.SectionFile(0)))
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sum := func(name string) (string, error) {
		v, _, err := f.Float32(name)
		if err != nil {
			return "", err
		}
		h := sha256.New()
		var b [4]byte
		for _, x := range v {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
			h.Write(b[:])
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	if latents, err = sum("history_latents"); err != nil {
		return "", "", err
	}
	pixels, err = sum("history_pixels")
	return latents, pixels, err
}

// TestGPUFaults runs a one-section job undisturbed, then once per fault (gfScenarios), on one
// daemon whose workers run under a memory cap: the transformer worker SIGKILLed and SIGSTOPped
// mid-sampling, an out of memory at the transformer's Load and in the middle of its stage, the
// VAE worker SIGKILLed mid-decode. For each it records when the worker was gone and when NVML
// showed the device memory back at the idle baseline, the retries (class and the ladder's
// change), and the hashes of the job's latents and pixels against the undisturbed run's; it
// fails when a job does not succeed, a retry's class is not the expected one, the memory does
// not come back, or an output differs where the retry changes nothing that affects values.
// The record goes to -gpufaults.out (docs/bench/).
func TestGPUFaults(t *testing.T) {
	if *gfModels == "" {
		t.Skip("the GPU fault run: give -gpufaults.models (scripts/gpufaults/gpu-faults.sh runs it)")
	}
	t0 := time.Now()
	log := quietLog()
	backend, idxStr, _ := strings.Cut(*gfLane, ":")
	idx, _ := strconv.Atoi(idxStr)
	bins := map[lanes.Model]string{}
	if *gfWorkers != "" {
		for _, m := range []lanes.Model{lanes.TextEnc, lanes.VAE, lanes.ClipVision, lanes.Transformer, "probe"} {
			p, err := filepath.Abs(filepath.Join(*gfWorkers, string(m)))
			if err != nil {
				t.Fatal(err)
			}
			bins[m] = p
		}
	} else {
		bins = workerBins(t)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	shmDir, err := os.MkdirTemp("/dev/shm", "fpgf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	root, err := shm.OpenRoot(shmDir)
	if err != nil {
		t.Fatal(err)
	}
	rec := gfRecord{Kind: "gpu-faults", Date: time.Now().UTC().Format("2006-01-02"), Lane: *gfLane, Models: *gfModels,
		CapGiB: *gfCapGiB, OpDeadlineS: gfOpDeadline.Seconds(), MarginMiB: *gfMargin, SampleMs: 20, GPU: "cpu"}

	// The device: its bus id, memory and used-memory reader (NVML), as framepackd's probe and
	// recovery check see them.
	var devMem uint64 = 64 << 30
	var bus string
	var mem watchdog.Memory
	if backend != "cpu" {
		devs, err := gpudevices.List(t.Context(), backend, gpudevices.Options{})
		if err != nil || idx >= len(devs) {
			t.Fatalf("%s devices: %v (%d found)", backend, err, len(devs))
		}
		d := devs[idx]
		devMem, bus, rec.GPU = d.TotalBytes, d.PCIBusID, d.Name
		r, err := gpudevices.NewReader(gpudevices.Device{Backend: backend, PCIBusID: bus}, gpudevices.Options{})
		if err != nil {
			t.Fatal(err)
		}
		mem = r
	}
	// The workers' cap is the lane's memory limit (framepackd --lane-memory-gb).
	lane, err := lanes.New(lanes.Config{Name: *gfLane, Backend: backend, DeviceIndex: uint32(idx), PCIBusID: bus,
		DeviceMemory: devMem, MemoryLimit: uint64(*gfCapGiB * (1 << 30)), Log: logrus.NewEntry(log), WorkerPath: func(m lanes.Model) (string, error) {
			if p, ok := bins[m]; ok {
				return p, nil
			}
			return "", fmt.Errorf("no %s worker", m)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer lane.Close()
	cache, err := convcache.Open(filepath.Join(state, "conv-decisions.json"))
	if err != nil {
		t.Fatal(err)
	}

	scenarios := gfScenarios(*gfSteps, *gfSignalStep)
	if *gfOnly != "" {
		keep := strings.Split(*gfOnly, ",")
		scenarios = slices.DeleteFunc(scenarios, func(s gfScenario) bool { return !slices.Contains(keep, s.Name) })
	}
	var mu sync.Mutex
	plans := map[string]*gfScenario{} // job id -> its scenario
	dl := watchdog.DefaultDeadlines()
	// A stopped worker is seen by the age of its op in flight, or between ops (a GPU worker
	// mostly waits on the device outside an op) by no beacon update at all: both limits are
	// the op deadline.
	dl.OpMin, dl.OpFraction, dl.Stall = *gfOpDeadline, 1e-9, *gfOpDeadline
	wd, err := watchdog.New(watchdog.Config{Lane: *gfLane, LaneBackend: backend, Deadlines: dl, ConvCache: cache,
		Recovery: &watchdog.Recovery{Memory: mem, Timeout: 20 * time.Second},
		Probe:    watchdog.ProbeWorker(workerkit.Config{Path: bins["probe"], Log: logrus.NewEntry(log)}, backend, uint32(idx), watchdog.DefaultProbeAllocate),
		Log:      logrus.NewEntry(log),
		FaultPlan: func(a watchdog.AttemptInfo) *workerkit.Fault {
			mu.Lock()
			sc := plans[a.JobID]
			mu.Unlock()
			if sc == nil || sc.plan == nil || a.Attempt != 1 || a.Stage.Kind != sc.stage {
				return nil
			}
			return sc.plan(a)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer wd.Close()
	runner, err := pipeline.New(pipeline.Config{Models: mustModels(t, *gfModels), Shm: root, Log: log, KeepSectionHistory: true, NoPreviews: true,
		Lane: func(name string) (*lanes.Lane, error) {
			if name != *gfLane {
				return nil, fmt.Errorf("no lane %q", name)
			}
			return lane, nil
		},
		Watchdog: func(string) *watchdog.Watchdog { return wd }})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "d.sock")
	d, err := api.StartDaemon(api.DaemonConfig{StateDir: state, Listen: []api.Addr{{Network: "unix", Address: socket}},
		Lanes: []string{*gfLane}, Run: runner.Run, Grace: 5 * time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	}()
	var sampler *memSampler
	if mem != nil {
		sampler = &memSampler{mem: mem}
		sctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go sampler.run(sctx, 20*time.Millisecond)
	}
	jobs := framepackv1.NewJobServiceClient(conn(t, socket))
	img := demoImage(t)
	spec := &framepackv1.JobSpec{Prompt: "The girl dances gracefully, with clear movements, full of charm.", Seed: proto.Int64(31337),
		TotalSecondLength: 1, LatentWindowSize: 9, Steps: uint32(*gfSteps), Cfg: 1, Gs: 10, UseTeacache: proto.Bool(false),
		Resolution: 640, ImageFilename: "start.png"}
	rec.Job = fmt.Sprintf("640 bucket, window 9, %d steps, 1 s (one section), TeaCache off", *gfSteps)
	if *gfTiny {
		spec.Resolution, spec.LatentWindowSize, spec.TotalSecondLength = 96, 3, 0.5
		spec.Buckets = []*framepackv1.Bucket{{Height: 64, Width: 96}}
		rec.Job = fmt.Sprintf("96x64 (tiny models), window 3, %d steps, 0.5 s (one section)", *gfSteps)
	}

	// run runs one job with scenario sc (nil: undisturbed) and measures it.
	run := func(sc *gfScenario) gfResult {
		res := gfResult{Name: "reference", Retries: []gfRetry{}}
		if sc != nil {
			res.Name, res.What, res.ExpectBitEqual = sc.Name, sc.What, true
		}
		start := time.Now()
		if sampler != nil {
			time.Sleep(200 * time.Millisecond)
			res.BaselineGiB = float64(sampler.last(time.Now())) / (1 << 30)
		}
		baseline := uint64(res.BaselineGiB * (1 << 30))
		id := submit(t, jobs, spec, img)
		mu.Lock()
		plans[id] = sc
		mu.Unlock()
		var faultAt, goneAt time.Time
		signalled := false
		attempt := map[framepackv1.Stage]uint32{}
		fired := false
		gone := make(chan time.Time, 1)
		watchPid := func(pid int) {
			res.WorkerPID = pid
			go func() {
				if _, ok := waitGone(pid, 10*time.Minute); ok {
					gone <- time.Now()
				}
			}()
		}
		fire := func(bin string) {
			fired = true
			pid, err := childWorker(bin)
			if err != nil {
				res.Problems = append(res.Problems, "find the worker: "+err.Error())
				return
			}
			faultAt, signalled = time.Now(), true
			if sampler != nil {
				res.PeakBeforeGiB = float64(sampler.last(faultAt)) / (1 << 30)
			}
			watchPid(pid)
			if err := syscall.Kill(pid, sc.signal); err != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("signal %v to %d: %v", sc.signal, pid, err))
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
		defer cancel()
		final, err := watch(ctx, jobs, id, func(ev *framepackv1.JobEvent) bool {
			switch e := ev.GetEvent().(type) {
			case *framepackv1.JobEvent_StageStarted:
				attempt[e.StageStarted.GetStage()] = e.StageStarted.GetAttempt()
				if sc != nil && sc.plan != nil && !fired && e.StageStarted.GetStage() == sc.stage && e.StageStarted.GetAttempt() == 1 {
					// An injected fault: the worker fails by itself; watch it go.
					fired = true
					time.Sleep(50 * time.Millisecond)
					if pid, err := childWorker(bins[stageModel(sc.stage)]); err == nil {
						watchPid(pid)
					}
				}
			case *framepackv1.JobEvent_SamplingStep:
				if sc != nil && sc.signal != 0 && !fired && sc.stage == framepackv1.Stage_STAGE_TRANSFORMER &&
					attempt[sc.stage] == 1 && int(e.SamplingStep.GetStep()) >= sc.atStep {
					fire(bins[lanes.Transformer])
				}
			case *framepackv1.JobEvent_Retry:
				a := e.Retry.GetAttempt()
				if faultAt.IsZero() {
					faultAt = ev.GetTime().AsTime() // an injected fault: the failed attempt's report
				}
				res.Retries = append(res.Retries, gfRetry{Stage: a.GetStage().String(), Attempt: a.GetAttempt(), Class: a.GetClass().String(),
					Change: a.GetChange(), Message: a.GetMessage(), AtS: ev.GetTime().AsTime().Sub(start).Seconds()})
			}
			return true
		})
		res.JobS = time.Since(start).Seconds()
		switch {
		case err != nil:
			res.State = "watch failed: " + err.Error()
		case final.GetJobFinished() != nil:
			res.State = "succeeded"
		case final.GetJobFailed() != nil:
			res.State = "failed: " + final.GetJobFailed().GetFailure().GetMessage()
		default:
			res.State = fmt.Sprintf("ended with %T", final.GetEvent())
		}
		if !faultAt.IsZero() {
			res.FaultAtS = faultAt.Sub(start).Seconds()
		}
		select {
		case goneAt = <-gone:
		case <-time.After(time.Second):
		}
		if !goneAt.IsZero() {
			if signalled {
				g := goneAt.Sub(faultAt).Seconds()
				res.WorkerGoneS = &g
			}
			if sampler != nil {
				if back, ok := sampler.backAfter(goneAt, baseline, *gfMargin<<20); ok {
					s := back.Seconds()
					res.MemoryBackS = &s
				} else {
					res.Problems = append(res.Problems, "nvml never showed the memory back at the baseline")
				}
			}
		}
		res.LatentsSHA256, res.PixelsSHA256, err = historyHashes(state, id)
		if err != nil {
			res.Problems = append(res.Problems, "hash: "+err.Error())
		}
		for _, r := range stageRecords(t, state, id) {
			if r.MemoryCapBytes > 0 {
				res.CapGiB = max(res.CapGiB, float64(r.MemoryCapBytes)/(1<<30))
			}
		}
		return res
	}

	ref := run(nil)
	rec.Results = append(rec.Results, ref)
	if ref.State != "succeeded" || len(ref.Retries) > 0 {
		t.Fatalf("reference job: %s, retries %+v", ref.State, ref.Retries)
	}
	for i := range scenarios {
		sc := &scenarios[i]
		r := run(sc)
		eqL, eqP := r.LatentsSHA256 == ref.LatentsSHA256, r.PixelsSHA256 == ref.PixelsSHA256
		r.LatentsEqual, r.PixelsEqual = &eqL, &eqP
		if r.State != "succeeded" {
			r.Problems = append(r.Problems, "job "+r.State)
		}
		var classes []string
		for _, rt := range r.Retries {
			if rt.Stage == sc.stage.String() {
				classes = append(classes, rt.Class)
			}
		}
		switch {
		case len(classes) == 0 && sc.signal != 0:
			r.Problems = append(r.Problems, fmt.Sprintf("no %s retry: the %v came after the stage's work was done "+
				"(its steps outran the events that trigger the signal: a smaller -gpufaults.signal-step or more -gpufaults.steps)", sc.stage, sc.signal))
		case len(classes) == 0 || classes[0] != sc.wantClass.String():
			r.Problems = append(r.Problems, fmt.Sprintf("%s retries %v, want the first %s", sc.stage, classes, sc.wantClass))
		}
		if r.ExpectBitEqual && (!eqL || !eqP) {
			r.Problems = append(r.Problems, "the output differs from the undisturbed run's")
		}
		rec.Results = append(rec.Results, r)
		for _, p := range r.Problems {
			t.Errorf("%s: %s", sc.Name, p)
		}
		t.Logf("%s: %s in %.1f s, worker gone %s s after the signal, memory back %s s after that, retries %d, latents/pixels equal %v/%v",
			sc.Name, r.State, r.JobS, fmtOpt(r.WorkerGoneS), fmtOpt(r.MemoryBackS), len(r.Retries), eqL, eqP)
	}
	rec.TotalS = time.Since(t0).Seconds()
	if *gfOut != "" {
		raw, err := json.MarshalIndent(rec, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*gfOut, append(raw, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// stageModel is the worker of a stage.
func stageModel(s framepackv1.Stage) lanes.Model {
	switch s {
	case framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_VAE_ENCODE:
		return lanes.VAE
	case framepackv1.Stage_STAGE_TEXT_ENCODE:
		return lanes.TextEnc
	case framepackv1.Stage_STAGE_IMAGE_ENCODE:
		return lanes.ClipVision
	}
	return lanes.Transformer
}

// stageRecords reads a job's stage records (history/stages.jsonl).
func stageRecords(t *testing.T, state, id string) []pipeline.StageRecord {
	raw, err := os.ReadFile(filepath.Join(state, "jobs", id, "history", pipeline.StagesFile))
	if err != nil {
		t.Logf("stage records of %s: %v", id, err)
		return nil
	}
	var out []pipeline.StageRecord
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r pipeline.StageRecord
		if json.Unmarshal([]byte(line), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

func mustModels(t *testing.T, dir string) pipeline.Models {
	m, err := pipeline.ResolveModels(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func fmtOpt(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *v)
}
