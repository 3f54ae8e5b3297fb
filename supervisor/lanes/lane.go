// Package lanes runs the model stages of a device lane, one worker process at a time: for each
// stage the lane spawns the stage's worker binary (its own process group, parent-death signal,
// go-plugin handshake; see internal/workerkit), loads the model, runs the stage, reads the
// worker's counters, then kills the process group and reaps it before the next stage starts.
// Killing the process is the unload: the driver takes back everything the worker held.
//
// Every stage is measured: spawn-to-ready, load, compute and teardown times, the worker
// allocator's peak (Stats) and the process's peak resident set size (sampled with gopsutil
// while the stage runs, also sent as telemetry). After teardown the lane checks that nothing is
// left of the worker's process group.
//
// Residency (Config.Residency, off by default) keeps a worker alive after its stage when the
// caller names the models that alternate with it (Stage.KeepWith, e.g. the transformer and the
// VAE of the section loop) and the footprints measured on this lane in such stages prove that
// all of them fit in Config.Budget together; its next stage then skips spawn and load. Without
// that proof the worker is killed as usual. A footprint is the larger of the allocator peak and
// the peak RSS (Report.Footprint).
package lanes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shirou/gopsutil/v3/process"
	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Model names a worker binary and the model it serves.
type Model string

// The model workers of a FramePack job.
const (
	// TextEnc is the LLaMA + CLIP-L text encoder worker.
	TextEnc Model = "textenc"
	// VAE is the HunyuanVideo causal 3-D VAE worker (encode and decode).
	VAE Model = "vae"
	// ClipVision is the SigLIP image encoder worker.
	ClipVision Model = "clipvision"
	// Transformer is the FramePack packed transformer worker (one section per Run).
	Transformer Model = "transformer"
)

// Defaults for Config.
const (
	DefaultLoadTimeout  = 30 * time.Minute
	DefaultStageTimeout = 24 * time.Hour
	DefaultSampleEvery  = 250 * time.Millisecond
	// statsTimeout bounds the Stats call after a stage.
	statsTimeout = 5 * time.Second
)

// ErrLeftover is returned (wrapped) when a worker's process group still has members after
// teardown.
var ErrLeftover = errors.New("lanes: worker process group not empty after teardown")

// ErrClosed is returned by a lane after Close.
var ErrClosed = errors.New("lanes: lane closed")

// Proc is what a lane needs of a running worker process (*workerkit.Process).
type Proc interface {
	Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error)
	Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error)
	Stats(ctx context.Context) (*workerkit.Stats, error)
	PID() int
	Close() error
}

// Config describes one lane.
type Config struct {
	// Name is the lane's name ("cpu", "cuda:0"); required.
	Name string
	// Backend is the workers' backend ("cpu", "cuda", "hip", "auto"); empty means "auto".
	Backend string
	// DeviceIndex is the GPU ordinal within the backend.
	DeviceIndex uint32
	// PCIBusID is the GPU's PCI bus id, as the probe reported it; when set the workers open
	// the device by it (not by DeviceIndex), so they run on the GPU the lane watches.
	PCIBusID string
	// WorkerPath returns the binary of a model's worker; required (see BinDir).
	WorkerPath func(Model) (string, error)
	// DeviceMemory is the memory of the lane's device that its workers share: a GPU's total
	// memory; on a cpu lane the host's RAM, or what the operator sets (framepackd
	// --cpu-device-memory-gb). 0 means unknown: workers run without a cap.
	DeviceMemory uint64
	// Reserve is kept back from every cap besides the job's preservation: the driver's, the
	// vendor libraries' and the worker's own allocations outside the runtime's allocator.
	// 0 means DefaultReserve.
	Reserve uint64
	// Residency lets a worker stay alive across stages when Budget proves it fits (see the
	// package doc). Off by default.
	Residency bool
	// Budget is the memory the lane's workers may hold together, for residency decisions.
	Budget uint64
	// StartTimeout bounds a worker's start and handshake; 0 means workerkit's default.
	StartTimeout time.Duration
	// LoadTimeout bounds Load; 0 means DefaultLoadTimeout.
	LoadTimeout time.Duration
	// StageTimeout bounds one Run when the caller's context has no earlier deadline; 0 means
	// DefaultStageTimeout.
	StageTimeout time.Duration
	// SampleEvery is the telemetry period while a stage runs; 0 means DefaultSampleEvery.
	SampleEvery time.Duration
	// SocketDir is where go-plugin puts the workers' sockets; empty means os.TempDir().
	SocketDir string
	// Env holds extra KEY=VALUE entries for every worker.
	Env []string
	// Log is the lane's logger; nil means the standard logger.
	Log *logrus.Entry

	// Start starts a worker; nil means workerkit.Start. Tests replace it.
	Start func(ctx context.Context, cfg workerkit.Config) (Proc, error)
	// RSS returns a process's resident set size; nil means gopsutil. Tests replace it.
	RSS func(pid int) (uint64, error)
}

// BinDir returns a Config.WorkerPath that finds "<dir>/<model>".
func BinDir(dir string) func(Model) (string, error) {
	return func(m Model) (string, error) {
		p := filepath.Join(dir, string(m))
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("worker binary %s: %w", m, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("worker binary %s: %s is not an executable file", m, p)
		}
		return p, nil
	}
}

// Stage is one model stage to run on a lane.
type Stage struct {
	// Model is the worker to run; required.
	Model Model
	// ModelDir is the model folder handed to Load; required.
	ModelDir string
	// Env holds LoadRequest.Env entries (set in the worker before its backend starts).
	Env map[string]string
	// DType is the compute dtype; empty means the backend's default.
	DType string
	// JobID labels the worker's logs.
	JobID string
	// Loras are LoadRequest.Loras: LoRAs the transformer merges at load. A resident worker
	// serves only stages with the same list.
	Loras []workerkit.LoraSpec
	// Checkpoint, Weights and FP8Compute are the LoadRequest fields of the same names (the
	// transformer's weights file, quantization at load, fp8 compute mode); a resident worker
	// serves only stages with the same ones.
	Checkpoint, Weights, FP8Compute string
	// Workload is LoadRequest.Workload: the job's frame size and window, from which the
	// transformer estimates its activations and plans how many blocks stay resident.
	Workload *workerkit.Workload
	// Request is the stage's work; required.
	Request workerkit.Stage
	// KeepWith names the models that alternate with this one on the lane (this one included);
	// with residency on, the worker stays alive when all of their footprints are known and fit
	// in the budget together. Empty means the worker is always killed.
	KeepWith []Model
	// OnEvent receives the worker's progress, preview, fallback and log events; an error
	// stops the stage.
	OnEvent func(workerkit.Event) error
	// OnTelemetry receives a memory sample every Config.SampleEvery while the stage runs, and
	// one at its end.
	OnTelemetry func(Telemetry)

	// Watchdog hooks (supervisor/watchdog.Attempt); nil: not watched.
	//
	// Attach is called with the worker process as soon as the stage has it (spawned or
	// reused); the lane calls the detach it returns before it lets the worker go (teardown, or
	// keeping it resident).
	Attach func(p Proc) (detach func())
	// MemoryCap is the job's cap on this lane (Lane.MemoryCap), which the worker's runtime
	// enforces on every device allocation; 0 means no cap.
	MemoryCap uint64
	// Load is this attempt's departures from the lane's load settings, as the watchdog
	// decided them; the zero value loads with the lane's.
	Load LoadSettings
}

// LoadSettings are one attempt's departures from the lane's load settings (zero fields: the
// lane's). The lane turns them into the worker's LoadRequest.
type LoadSettings struct {
	// Backend overrides Config.Backend ("cpu" for the last rung of small stages); the device
	// index then is 0.
	Backend string
	// MemoryCap lowers Stage.MemoryCap; a cap above it is ignored.
	MemoryCap uint64
	// MaxResidentBlocks is LoadRequest.MaxResidentBlocks: how many transformer blocks (textenc:
	// Llama layers) stay on the device, the rest streaming from host memory (0: as many as the
	// cap allows).
	MaxResidentBlocks uint32
	// ConvFirstTier makes every convolution start at this tier.
	ConvFirstTier workerkit.ConvTier
	// ConvCachePath is the conv decision cache file.
	ConvCachePath string
	// Fault is a test fault (nil in production).
	Fault *workerkit.Fault
}

// loadRequest is the LoadRequest of stage st on this lane.
func (l *Lane) loadRequest(st Stage) *workerkit.LoadRequest {
	req := &workerkit.LoadRequest{ModelDir: st.ModelDir, DType: st.DType, Backend: l.cfg.Backend,
		DeviceIndex: l.cfg.DeviceIndex, PCIBusID: l.cfg.PCIBusID, MemoryCapBytes: st.MemoryCap, Env: st.Env, Loras: st.Loras,
		Workload: st.Workload, Checkpoint: st.Checkpoint, Weights: st.Weights, FP8Compute: st.FP8Compute}
	s := st.Load
	req.MaxResidentBlocks = s.MaxResidentBlocks
	if s.Backend != "" && s.Backend != req.Backend {
		req.Backend, req.DeviceIndex, req.PCIBusID = s.Backend, 0, ""
	}
	if s.MemoryCap != 0 && (req.MemoryCapBytes == 0 || s.MemoryCap < req.MemoryCapBytes) {
		req.MemoryCapBytes = s.MemoryCap
	}
	if s.ConvCachePath != "" || s.ConvFirstTier != workerkit.ConvTierUnspecified {
		req.ConvPolicy = &workerkit.ConvPolicy{DecisionCachePath: s.ConvCachePath, ForcedTier: s.ConvFirstTier}
	}
	if s.Fault != nil {
		f := *s.Fault
		req.Fault = &f
	}
	return req
}

// DefaultReserve is Config.Reserve's default.
const DefaultReserve = 1 << 30

// ErrNoMemoryLeft is returned by MemoryCap when the preservation and the reserve leave no
// memory for the workers.
var ErrNoMemoryLeft = errors.New("no device memory left for the workers")

// MemoryCap returns the cap every worker of a job runs under on this lane: DeviceMemory less
// the job's preservation (FramePack's gpu_memory_preservation_gb, in bytes) and Reserve. It is
// 0 (no cap) when the lane's device memory is unknown.
func (l *Lane) MemoryCap(preserve uint64) (uint64, error) {
	dev := l.cfg.DeviceMemory
	if dev == 0 {
		return 0, nil
	}
	if preserve >= dev || dev-preserve <= l.cfg.Reserve {
		return 0, fmt.Errorf("lane %s: %w: %.1f GiB of device memory less %.1f GiB preserved and a %.1f GiB reserve",
			l.cfg.Name, ErrNoMemoryLeft, gib(dev), gib(preserve), gib(l.cfg.Reserve))
	}
	return dev - preserve - l.cfg.Reserve, nil
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

// Telemetry is one memory sample of a running worker.
type Telemetry struct {
	Model Model
	PID   int
	// RSSBytes is the process's resident set size.
	RSSBytes uint64
	// AllocatorBytes and AllocatorPeakBytes are the worker allocator's current and peak use,
	// as its beacon reports them (the final sample: the peak from Stats).
	AllocatorBytes, AllocatorPeakBytes uint64
	// Final marks the sample sent when the stage has ended.
	Final bool
}

// Report is what one stage did and cost.
type Report struct {
	Model Model
	PID   int
	// Reused says the stage ran in a resident worker (no spawn, no load).
	Reused bool
	// Kept says the worker stays resident after the stage.
	Kept bool
	// SpawnToReady is the start and handshake; Load the model load; Compute the Run call;
	// Teardown the kill and reap (zero when Kept).
	SpawnToReady, Load, Compute, Teardown time.Duration
	// AllocPeakBytes is the worker allocator's peak (Stats after the stage).
	AllocPeakBytes uint64
	// MemoryCapBytes is the cap the worker ran under, as its Stats report it (0: none).
	MemoryCapBytes uint64
	// RSSPeakBytes is the highest resident set size sampled during load and stage.
	RSSPeakBytes uint64
	// WeightBytes is the size of the loaded weights.
	WeightBytes uint64
	// Backend is the backend the worker loaded on.
	Backend string
	// ConvTiers are the worker's convolution tier counts (Stats after the stage).
	ConvTiers []workerkit.ConvTierStats
	// Loaded is the worker's LoadResponse (a resident worker's, when Reused): the model facts
	// (VAE scaling factor, latent channels, patch sizes) the supervisor takes from the worker
	// instead of reading the model's config.json.
	Loaded *workerkit.LoadResponse
	// Result is the stage's result.
	Result *workerkit.Result
	// ResidentBlocks and StreamedBlocks are the transformer blocks (textenc: Llama layers)
	// the worker kept on the device and streams from host memory (Loaded's; zero for other
	// models).
	ResidentBlocks, StreamedBlocks uint32
}

// Footprint is the memory a report shows the worker needs: the larger of its allocator peak
// and its peak resident set size.
func (r Report) Footprint() uint64 { return max(r.AllocPeakBytes, r.RSSPeakBytes) }

// resident is a worker kept alive between stages.
type resident struct {
	proc    Proc
	dir     string
	env     string // canonical Env + DType, to match the next stage's load
	rssPeak uint64
	loaded  *workerkit.LoadResponse // its LoadResponse, which a reusing stage reports
}

// Lane runs stages one at a time. Its methods are safe for concurrent use; stages queue on
// the lane's mutex.
type Lane struct {
	cfg Config
	log *logrus.Entry

	// mu serialises stages and protects residents, footprints and closed.
	mu        sync.Mutex
	residents map[Model]*resident
	// footprints is the largest footprint measured per model in stages with a KeepWith group.
	footprints map[Model]uint64
	closed     bool
}

// New returns a lane.
func New(cfg Config) (*Lane, error) {
	if cfg.Name == "" || cfg.WorkerPath == nil {
		return nil, errors.New("new lane: Name and WorkerPath are required")
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = DefaultLoadTimeout
	}
	if cfg.StageTimeout <= 0 {
		cfg.StageTimeout = DefaultStageTimeout
	}
	if cfg.Reserve == 0 {
		cfg.Reserve = DefaultReserve
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.Start == nil {
		cfg.Start = func(ctx context.Context, c workerkit.Config) (Proc, error) { return workerkit.Start(ctx, c) }
	}
	if cfg.RSS == nil {
		cfg.RSS = processRSS
	}
	log := cfg.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Lane{cfg: cfg, log: log.WithField("lane", cfg.Name), residents: map[Model]*resident{}, footprints: map[Model]uint64{}}, nil
}

// Name returns the lane's name.
func (l *Lane) Name() string { return l.cfg.Name }

// processRSS reads a process's resident set size with gopsutil.
func processRSS(pid int) (uint64, error) {
	p, err := process.NewProcess(int32(pid))
	if err != nil {
		return 0, err
	}
	m, err := p.MemoryInfo()
	if err != nil {
		return 0, err
	}
	return m.RSS, nil
}

func loadKey(st Stage) string {
	keys := make([]string, 0, len(st.Env))
	for k, v := range st.Env {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	// A retry's load settings (another cap, backend or tier) need a fresh worker.
	s := st.Load
	keys = append(keys, fmt.Sprintf("load=%d/%s/%d/%d/%s/%v", st.MemoryCap, s.Backend, s.MemoryCap, s.ConvFirstTier, s.ConvCachePath, s.Fault != nil))
	for _, l := range st.Loras {
		keys = append(keys, fmt.Sprintf("lora=%s@%v", l.Path, l.Strength)) // in order: they stack
	}
	if st.Checkpoint != "" || st.Weights != "" || st.FP8Compute != "" {
		keys = append(keys, "weights="+st.Checkpoint+"\x00"+st.Weights+"\x00"+st.FP8Compute)
	}
	return st.DType + "\x00" + strings.Join(keys, "\x00")
}

// Run runs one stage: spawn (or reuse a resident worker), load, run, stats, then kill and
// reap unless residency keeps the worker. Cancelling ctx kills the worker at once.
func (l *Lane) Run(ctx context.Context, st Stage) (rep Report, err error) {
	if st.Model == "" || st.ModelDir == "" || st.Request == nil {
		return Report{}, errors.New("run stage: Model, ModelDir and Request are required")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Report{}, ErrClosed
	}
	rep.Model = st.Model
	log := l.log.WithFields(logrus.Fields{"worker": string(st.Model), "job": st.JobID})

	// Residents that will not run with this stage go first, so they do not hold memory it
	// needs (and one with another model dir or settings cannot serve it).
	for m, r := range l.residents {
		if m == st.Model && r.dir == st.ModelDir && r.env == loadKey(st) {
			continue
		}
		if m != st.Model && slices.Contains(st.KeepWith, m) {
			continue
		}
		l.kill(m, r, log)
	}

	var proc Proc
	var peak peakRSS
	res := l.residents[st.Model]
	if res != nil {
		delete(l.residents, st.Model)
		proc, rep.Reused = res.proc, true
		rep.Loaded = res.loaded
		peak.observe(res.rssPeak)
	} else {
		path, err := l.cfg.WorkerPath(st.Model)
		if err != nil {
			return rep, fmt.Errorf("run %s: %w", st.Model, err)
		}
		t0 := time.Now()
		proc, err = l.cfg.Start(ctx, workerkit.Config{Name: string(st.Model), Path: path, StartTimeout: l.cfg.StartTimeout,
			SocketDir: l.cfg.SocketDir, Env: l.cfg.Env, Log: l.log})
		if err != nil {
			return rep, fmt.Errorf("run %s: %w", st.Model, err)
		}
		rep.SpawnToReady = time.Since(t0)
	}
	rep.PID = proc.PID()
	kept := false
	defer func() {
		if kept {
			return
		}
		t0 := time.Now()
		if cerr := l.teardown(proc); cerr != nil {
			log.WithError(cerr).Error("worker teardown")
			if err == nil {
				err = fmt.Errorf("run %s: %w", st.Model, cerr)
			}
		}
		rep.Teardown = time.Since(t0)
	}()
	if st.Attach != nil { // the watchdog watches the worker until the lane lets it go
		if detach := st.Attach(proc); detach != nil {
			defer detach()
		}
	}

	stop := l.sample(st, proc, &peak)
	defer stop()

	if !rep.Reused {
		lctx, cancel := context.WithTimeout(ctx, l.cfg.LoadTimeout)
		t0 := time.Now()
		resp, err := proc.Load(lctx, l.loadRequest(st))
		cancel()
		rep.Load = time.Since(t0)
		if err != nil {
			return rep, fmt.Errorf("run %s: load %s: %w", st.Model, st.ModelDir, stageErr(ctx, err))
		}
		rep.Loaded = resp
	}
	rep.WeightBytes, rep.Backend = rep.Loaded.WeightBytes, rep.Loaded.Backend
	rep.ResidentBlocks, rep.StreamedBlocks = rep.Loaded.ResidentBlocks, rep.Loaded.StreamedBlocks

	rctx, cancel := context.WithTimeout(ctx, l.cfg.StageTimeout)
	t0 := time.Now()
	res2, err := proc.Run(rctx, &workerkit.RunRequest{JobID: st.JobID, Stage: st.Request}, st.OnEvent)
	cancel()
	rep.Compute = time.Since(t0)
	if err != nil {
		return rep, fmt.Errorf("run %s: %w", st.Model, stageErr(ctx, err))
	}
	rep.Result = res2

	sctx, cancel := context.WithTimeout(ctx, statsTimeout)
	stats, serr := proc.Stats(sctx)
	cancel()
	if serr != nil {
		log.WithError(serr).Warn("worker stats after stage")
	} else if stats != nil {
		rep.AllocPeakBytes, rep.MemoryCapBytes = stats.AllocatorPeakBytes, stats.MemoryCapBytes
		rep.ConvTiers = stats.ConvTiers
		peak.observe(stats.HostRSSBytes)
	}
	if rss, err := l.cfg.RSS(rep.PID); err == nil {
		peak.observe(rss)
	}
	stop()
	rep.RSSPeakBytes = peak.get()
	if len(st.KeepWith) > 0 {
		// Only stages of a residency group count: what the same model needs elsewhere (the
		// VAE's encode of one frame against its decode of a section) proves nothing about
		// the group.
		l.footprints[st.Model] = max(l.footprints[st.Model], rep.Footprint())
	}
	if st.OnTelemetry != nil {
		st.OnTelemetry(Telemetry{Model: st.Model, PID: rep.PID, RSSBytes: peak.last(), AllocatorPeakBytes: rep.AllocPeakBytes, Final: true})
	}

	if l.mayKeep(st) {
		kept = true
		rep.Kept = true
		l.residents[st.Model] = &resident{proc: proc, dir: st.ModelDir, env: loadKey(st), rssPeak: rep.RSSPeakBytes,
			loaded: rep.Loaded}
	}
	log.WithFields(logrus.Fields{"pid": rep.PID, "reused": rep.Reused, "kept": rep.Kept,
		"spawn_to_ready": rep.SpawnToReady.Round(time.Microsecond).String(), "load": rep.Load.Round(time.Microsecond).String(),
		"compute": rep.Compute.Round(time.Microsecond).String(), "alloc_peak": rep.AllocPeakBytes, "rss_peak": rep.RSSPeakBytes}).
		Debug("stage done")
	return rep, nil
}

// stageErr prefers the caller's cancellation over the transport error it caused.
func stageErr(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

// mayKeep reports whether residency keeps the stage's worker. Caller holds mu.
func (l *Lane) mayKeep(st Stage) bool {
	if !l.cfg.Residency || len(st.KeepWith) == 0 || !slices.Contains(st.KeepWith, st.Model) {
		return false
	}
	var sum uint64
	for _, m := range st.KeepWith {
		f, ok := l.footprints[m]
		if !ok || f == 0 {
			return false // not measured yet: nothing is proven
		}
		sum += f
	}
	return sum <= l.cfg.Budget
}

// kill tears a resident worker down. Caller holds mu.
func (l *Lane) kill(m Model, r *resident, log *logrus.Entry) {
	delete(l.residents, m)
	if err := l.teardown(r.proc); err != nil {
		log.WithError(err).WithField("resident", string(m)).Error("resident worker teardown")
	}
}

// teardown kills the worker's process group, reaps it and checks that the group is empty.
func (l *Lane) teardown(p Proc) error {
	pid := p.PID()
	err := p.Close()
	if pid > 0 {
		if gerr := waitGroupGone(pid); gerr != nil {
			err = errors.Join(err, gerr)
		}
	}
	return err
}

// GroupAlive returns ErrLeftover (wrapped) when process group pgid still has a live member
// (zombies waiting for their reaper do not count: they hold no memory).
func GroupAlive(pgid int) error {
	members, err := groupMembers(pgid)
	if err != nil {
		return err
	}
	if len(members) > 0 {
		return fmt.Errorf("%w: group %d: pids %v", ErrLeftover, pgid, members)
	}
	return nil
}

// groupGrace is how long teardown waits for the members of a killed group to die.
const groupGrace = 2 * time.Second

// waitGroupGone waits up to groupGrace for process group pgid to have no live member.
func waitGroupGone(pgid int) error {
	deadline := time.Now().Add(groupGrace)
	for {
		err := GroupAlive(pgid)
		if err == nil || !errors.Is(err, ErrLeftover) || time.Now().After(deadline) {
			return err
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(10 * time.Millisecond)
	}
}

// Residents returns the models whose workers are alive between stages.
func (l *Lane) Residents() []Model {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Model, 0, len(l.residents))
	for m := range l.residents {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Release kills every resident worker (a job ended); the lane stays usable.
func (l *Lane) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for m, r := range l.residents {
		l.kill(m, r, l.log)
	}
}

// Close kills every resident worker; later stages fail with ErrClosed.
func (l *Lane) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for m, r := range l.residents {
		l.kill(m, r, l.log)
	}
	l.closed = true
	return nil
}

// peakRSS tracks the highest and the latest RSS sample; safe for concurrent use.
type peakRSS struct {
	mu         sync.Mutex
	peak, prev uint64
}

func (p *peakRSS) observe(v uint64) {
	p.mu.Lock()
	p.peak = max(p.peak, v)
	if v > 0 {
		p.prev = v
	}
	p.mu.Unlock()
}

func (p *peakRSS) get() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak
}

func (p *peakRSS) last() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prev
}

// beaconReader is implemented by *workerkit.Process: the worker's beacon page, read without
// a call.
type beaconReader interface {
	Beacon() (beacon.Snapshot, error)
}

// sample samples the worker's RSS (and beacon allocator figures) every SampleEvery until the
// returned stop is called (idempotent), feeding peak and st.OnTelemetry.
func (l *Lane) sample(st Stage, p Proc, peak *peakRSS) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	pid := p.PID()
	go func() {
		defer close(finished)
		t := time.NewTicker(l.cfg.SampleEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			rss, err := l.cfg.RSS(pid)
			if err != nil {
				continue
			}
			peak.observe(rss)
			if st.OnTelemetry == nil {
				continue
			}
			tel := Telemetry{Model: st.Model, PID: pid, RSSBytes: rss}
			if b, ok := p.(beaconReader); ok {
				if snap, err := b.Beacon(); err == nil {
					tel.AllocatorBytes, tel.AllocatorPeakBytes = uint64(max(snap.Bytes, 0)), uint64(max(snap.PeakBytes, 0))
				}
			}
			st.OnTelemetry(tel)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
		})
	}
}
