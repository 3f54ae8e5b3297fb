// Package lanes runs the model stages of a device lane, one stage at a time: for each stage the
// lane spawns the stage's worker binary (its own process group, parent-death signal, go-plugin
// handshake; see internal/workerkit), or reuses a worker it kept, loads the model, runs the
// stage and reads the worker's counters; then it keeps the worker or kills its process group
// and reaps it. Killing the process is the unload: the driver takes back everything the worker
// held.
//
// Every stage is measured: spawn-to-ready, load, compute and teardown times, the worker
// allocator's peak (Stats) and the process's peak resident set size (sampled with gopsutil
// while the stage runs, also sent as telemetry). After teardown the lane checks that nothing is
// left of the worker's process group.
//
// Memory. Every worker runs under a cap its runtime enforces on each device allocation. A job's
// budget on the lane is Lane.MemoryCap (the device's memory less the job's preservation and a
// reserve, at most Config.MemoryLimit). A stage that states what it needs (Stage.Need, from the
// worker's own estimate before anything loads: Lane.Estimate) gets a cap of its fastest
// configuration plus a margin; one with an explicit Stage.Cap (a residency plan) gets that; one
// with neither gets the whole budget. Workers kept alive between stages (residents) hold their
// caps; before a stage spawns, the lane makes room by killing residents, least recently used
// first, until the caps of the live workers (each beyond the first costing
// Config.WorkerOverhead for its device context) fit the budget together. So a worker is kept
// only where the lane proves, before it spawns anything, that it fits beside the next stage: the
// caps are the proof, and the runtime enforces each. Where memory is contested every worker is
// killed after use, as before.
//
// Residency (Config.Residency) lets a stage with Stage.Keep leave its worker alive after the
// stage; a later stage with the same model, model folder and load settings (LoadKey) and a cap
// the kept worker's cap fits reuses it: no spawn, no load. At a job's end Release gives the
// job's residents a keep-alive (Ollama's keep_alive): they serve the next job that wants the
// same model with the same LoRAs and dtype, and are killed when the time runs out, when a stage
// needs their memory, on Unload, or on Close.
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
	Estimate(ctx context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error)
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
	// MemoryLimit is the most the lane's workers may hold together (framepackd
	// --lane-memory-gb), whatever the device has and the job preserves: a service sharing its
	// GPU with other programs. 0 means no limit beyond the device's.
	MemoryLimit uint64
	// Reserve is kept back from every cap besides the job's preservation: the driver's, the
	// vendor libraries' and the worker's own allocations outside the runtime's allocator.
	// 0 means DefaultReserve.
	Reserve uint64
	// WorkerOverhead is what each live worker beyond the first holds outside its cap (its
	// device context and vendor libraries: the Reserve covers the first one's). 0 means
	// DefaultWorkerOverhead for a GPU backend and DefaultHostWorkerOverhead for the cpu.
	WorkerOverhead uint64
	// Residency lets a stage that asks (Stage.Keep) leave its worker alive after the stage,
	// where the caps prove it fits (see the package doc). Off: every worker is killed after
	// its stage.
	Residency bool
	// KeepAlive is how long a job's kept workers stay alive after the job for the next one,
	// when Release is given KeepAliveAuto and the job's workers never had to be killed for
	// memory (0: killed when the job ends).
	KeepAlive time.Duration
	// Recovery checks that the device gave back a worker's memory after the lane killed a kept
	// worker outside a stage (keep-alive expiry, Unload, Release, Close); nil: not checked
	// (the watchdog checks every stage's worker itself).
	Recovery Recovery
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

// Recovery is the device's used-memory check (supervisor/watchdog.Recovery) the lane runs when
// it kills kept workers outside a stage: Baseline is read while no worker of the lane lives,
// and Check waits, after a kill that leaves none alive, for the device's used memory to come
// back to it.
type Recovery interface {
	Baseline(ctx context.Context) (uint64, error)
	Check(ctx context.Context, baseline uint64, pgid int) (recovered bool, detail string)
}

// Defaults of Config.WorkerOverhead: a CUDA or HIP context with cuDNN/MIOpen and the BLAS
// handles holds about half a GiB of device memory outside the allocator; a worker on the cpu
// lane holds its binary, Go runtime and libraries.
const (
	DefaultWorkerOverhead     = 512 << 20
	DefaultHostWorkerOverhead = 64 << 20
)

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

// Need is what a worker says its model needs for a job's workload before it loads
// (workerkit.EstimateResponse): the least cap it runs under and the cap of its fastest
// configuration, in bytes of the runtime's allocator.
type Need struct {
	Min, Full uint64
}

// Cap is the cap the lane gives a stage that needs n when memory allows: the fastest
// configuration's estimate with an eighth and 256 MiB more, for what the estimate does not see
// (allocator rounding, transient buffers). An estimate that is still short fails as an
// out-of-memory, which the watchdog retries one rung down (fewer resident blocks, smaller
// tiles).
func (n Need) Cap() uint64 { return withMargin(n.Full) }

// MinCap is Cap's rule for the least configuration: the smallest cap the stage may run under.
func (n Need) MinCap() uint64 { return withMargin(n.Min) }

func withMargin(b uint64) uint64 { return b + b/8 + 256<<20 }

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
	// JobID labels the worker's logs and owns the worker while it is kept.
	JobID string
	// Loras are LoadRequest.Loras: LoRAs the transformer merges at load. A kept worker serves
	// only stages with the same list.
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
	// Need is what the worker's estimate says the stage needs (Lane.Estimate); nil: unknown,
	// and the stage gets the job's whole budget (Cap aside).
	Need *Need
	// Cap is the cap the stage's worker gets, decided by the caller (a residency plan that
	// splits the budget between workers that alternate); 0: the lane decides from Need.
	Cap uint64
	// Keep asks the lane to keep the worker alive after the stage (with Config.Residency on);
	// the caps already prove it fits, so it stays until a stage needs its memory, its job is
	// released (see Release) or the lane closes.
	Keep bool
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
	// MemoryCap is the job's budget on this lane (Lane.MemoryCap): the most the job's live
	// workers hold together, and the cap of a stage that states no Need; 0 means no cap.
	MemoryCap uint64
	// Load is this attempt's departures from the lane's load settings, as the watchdog
	// decided them (its Attempt.Override); the zero value loads with the lane's. A lower
	// MemoryCap lowers the stage's cap; a higher one is ignored.
	Load workerkit.Override
}

// loadRequest is the LoadRequest of stage st on this lane, under cap (0: none).
func (l *Lane) loadRequest(st Stage, cap uint64) *workerkit.LoadRequest {
	req := &workerkit.LoadRequest{ModelDir: st.ModelDir, DType: st.DType, Backend: l.cfg.Backend,
		DeviceIndex: l.cfg.DeviceIndex, PCIBusID: l.cfg.PCIBusID, MemoryCapBytes: cap, Env: st.Env, Loras: st.Loras,
		Workload: st.Workload, Checkpoint: st.Checkpoint, Weights: st.Weights, FP8Compute: st.FP8Compute}
	st.Load.ApplyLoad(req)
	return req
}

// DefaultReserve is Config.Reserve's default.
const DefaultReserve = 1 << 30

// ErrNoMemoryLeft is returned by MemoryCap when the preservation and the reserve leave no
// memory for the workers.
var ErrNoMemoryLeft = errors.New("no device memory left for the workers")

// MemoryCap returns a job's budget on this lane, the most its workers hold together:
// DeviceMemory less the job's preservation (FramePack's gpu_memory_preservation_gb, in bytes)
// and Reserve, at most MemoryLimit. It is MemoryLimit (0: no cap) when the lane's device
// memory is unknown.
func (l *Lane) MemoryCap(preserve uint64) (uint64, error) {
	dev, limit := l.cfg.DeviceMemory, l.cfg.MemoryLimit
	if dev == 0 {
		return limit, nil
	}
	if preserve >= dev || dev-preserve <= l.cfg.Reserve {
		return 0, fmt.Errorf("lane %s: %w: %.1f GiB of device memory less %.1f GiB preserved and a %.1f GiB reserve",
			l.cfg.Name, ErrNoMemoryLeft, gib(dev), gib(preserve), gib(l.cfg.Reserve))
	}
	c := dev - preserve - l.cfg.Reserve
	if limit > 0 {
		c = min(c, limit)
	}
	return c, nil
}

// WorkerOverhead is what each live worker beyond the first holds outside its cap.
func (l *Lane) WorkerOverhead() uint64 { return l.cfg.WorkerOverhead }

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
	// Reused says the stage ran in a kept worker (no spawn, no load).
	Reused bool
	// Kept says the worker stays alive after the stage.
	Kept bool
	// CapBytes is the cap the lane gave the worker (a reused worker's: the one it was loaded
	// under); 0: none.
	CapBytes uint64
	// Evicted are the kept workers the lane killed to make room for this stage.
	Evicted []Model
	// Decision says, in words, why the worker got its cap and was kept or killed (for the
	// stage record and the log).
	Decision string
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
	// Loaded is the worker's LoadResponse (a kept worker's, when Reused): the model facts
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

// resident is a worker kept alive between stages (and, with a keep-alive, between jobs).
type resident struct {
	model   Model
	proc    Proc
	key     string // LoadKey of the stage that loaded it
	cap     uint64 // the cap it was loaded under: what it may hold
	rssPeak uint64
	loaded  *workerkit.LoadResponse // its LoadResponse, which a reusing stage reports
	job     string                  // the job whose stage last ran in it
	used    time.Time               // when that stage ended
	expires time.Time               // zero while its job runs; set by Release
	timer   *time.Timer             // the keep-alive's
}

// Resident describes a worker kept alive between stages.
type Resident struct {
	Model Model
	PID   int
	// CapBytes is the cap it was loaded under.
	CapBytes uint64
	// Job is the job whose stage last ran in it.
	Job string
	// Expires is when its keep-alive ends (zero while its job runs).
	Expires time.Time
}

// Lane runs stages one at a time. Its methods are safe for concurrent use: stages queue on the
// lane's stage lock, while Residents, Release, Unload and Close only take the lock of its state
// (a kept worker is never the one a running stage uses).
type Lane struct {
	cfg Config
	log *logrus.Entry

	// stage serialises stages (a channel, so a waiting stage can give up with its context).
	stage chan struct{}

	// mu protects the fields below.
	mu        sync.Mutex
	residents map[Model]*resident
	// running is the worker of the stage running now (nil between stages).
	running Proc
	// contested holds the jobs for which the lane killed a kept worker to make room.
	contested map[string]bool
	// baseline is the device's used memory read the last time no worker of the lane lived.
	baseline     uint64
	haveBaseline bool
	// estimates caches Estimate's answers by request.
	estimates map[string]Need
	closed    bool
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
	if cfg.WorkerOverhead == 0 {
		cfg.WorkerOverhead = DefaultWorkerOverhead
		if cfg.Backend == "cpu" {
			cfg.WorkerOverhead = DefaultHostWorkerOverhead
		}
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
	return &Lane{cfg: cfg, log: log.WithField("lane", cfg.Name), stage: make(chan struct{}, 1), residents: map[Model]*resident{},
		contested: map[string]bool{}, estimates: map[string]Need{}}, nil
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

// LoadKey is what a kept worker must have been loaded with to serve st: the model folder, dtype,
// environment, LoRAs (in order: they stack), workload and the attempt's load settings (a
// retry's other backend, cap, tier or residency needs a fresh worker). The cap is not in it: a
// kept worker serves a stage whose cap its own fits in.
func LoadKey(st Stage) string {
	keys := make([]string, 0, len(st.Env)+4)
	for k, v := range st.Env {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	s := st.Load
	keys = append(keys, fmt.Sprintf("load=%s/%d/%d/%s/%s/%d/%s/%v", s.Backend, s.MemoryCap, s.MaxResidentBlocks, s.ActivationDType, s.SiglipProcessor, s.ConvFirstTier, s.ConvCachePath, s.Fault != nil))
	if w := st.Workload; w != nil {
		keys = append(keys, fmt.Sprintf("workload=%dx%d/%d/%d", w.Width, w.Height, w.LatentWindowSize, w.ReserveBytes))
	}
	for _, l := range st.Loras {
		keys = append(keys, fmt.Sprintf("lora=%s@%v", l.Path, l.Strength))
	}
	if st.Checkpoint != "" || st.Weights != "" || st.FP8Compute != "" {
		keys = append(keys, "weights="+st.Checkpoint+"/"+st.Weights+"/"+st.FP8Compute)
	}
	return string(st.Model) + "\x00" + st.ModelDir + "\x00" + st.DType + "\x00" + strings.Join(keys, "\x00")
}

// lock takes the stage lock, or fails when ctx ends first.
func (l *Lane) lock(ctx context.Context) error {
	select {
	case l.stage <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for lane %s: %w", l.cfg.Name, context.Cause(ctx))
	}
}

func (l *Lane) unlock() { <-l.stage }

// want is the cap stage st asks for under budget (0: none, for no cap): its explicit Cap, else
// its Need's Cap, else the whole budget; never above the budget nor the attempt's lower cap.
func want(st Stage, budget uint64) uint64 {
	c := budget
	switch {
	case budget == 0: // unknown memory: no cap but an attempt's
	case st.Cap > 0:
		c = min(st.Cap, budget)
	case st.Need != nil:
		c = min(st.Need.Cap(), budget)
	}
	if lc := st.Load.MemoryCap; lc > 0 && (c == 0 || lc < c) {
		c = lc
	}
	return c
}

// admission is the lane's decision for one stage, made under mu.
type admission struct {
	reuse   *resident
	cap     uint64
	evicted []*resident
	why     string
}

// admit decides stage st's worker and cap: a kept worker with st's LoadKey whose cap fits what
// st may have, else a new worker with want's cap; kept workers of other models, least recently
// used first, are taken out (to be killed) until the live workers' caps and overheads fit the
// job's budget. With no budget (unknown memory) nothing can be proven: every other kept worker
// goes. Caller holds mu.
func (l *Lane) admit(st Stage) admission {
	budget := st.MemoryCap
	c := want(st, budget)
	var a admission
	key := LoadKey(st)
	if r := l.residents[st.Model]; r != nil {
		if r.key == key && (c == 0 || r.cap <= c) && (r.cap == 0) == (c == 0) {
			a.reuse = r
			c = r.cap
		} else {
			a.evicted = append(a.evicted, r) // another folder, settings or a larger cap than st may have
		}
		delete(l.residents, st.Model)
	}
	others := make([]*resident, 0, len(l.residents))
	for _, r := range l.residents {
		others = append(others, r)
	}
	slices.SortFunc(others, func(x, y *resident) int { return x.used.Compare(y.used) })
	fits := func() bool {
		if budget == 0 {
			return len(others) == 0
		}
		total := c
		for _, r := range others {
			total += r.cap + l.cfg.WorkerOverhead
		}
		return total <= budget
	}
	for !fits() && len(others) > 0 {
		r := others[0]
		others = others[1:]
		delete(l.residents, r.model)
		a.evicted = append(a.evicted, r)
		if r.job == st.JobID || r.expires.IsZero() {
			l.contested[st.JobID] = true
		}
	}
	a.cap = c
	switch {
	case a.reuse != nil:
		a.why = fmt.Sprintf("reused the kept worker (cap %.2f GiB)", gib(c))
	case st.Cap > 0:
		a.why = fmt.Sprintf("cap %.2f GiB from the residency plan", gib(c))
	case st.Need != nil && c >= st.Need.Full:
		a.why = fmt.Sprintf("cap %.2f GiB: the estimate of its fastest configuration (%.2f GiB) with a margin", gib(c), gib(st.Need.Full))
	case st.Need != nil:
		a.why = fmt.Sprintf("cap %.2f GiB: the budget, below its fastest configuration's estimate (%.2f GiB; least %.2f GiB)", gib(c), gib(st.Need.Full), gib(st.Need.Min))
	case c > 0:
		a.why = fmt.Sprintf("cap %.2f GiB: the job's budget (no estimate)", gib(c))
	default:
		a.why = "no cap (the lane's memory is unknown)"
	}
	if len(a.evicted) > 0 {
		names := make([]string, len(a.evicted))
		for i, r := range a.evicted {
			names[i] = string(r.model)
		}
		a.why += "; killed kept " + strings.Join(names, ", ") + " to make room"
	}
	return a
}

// Run runs one stage: reuse a kept worker or spawn one, load, run, stats, then keep the worker
// (Stage.Keep with residency on) or kill and reap it. Cancelling ctx kills the worker at once.
func (l *Lane) Run(ctx context.Context, st Stage) (rep Report, err error) {
	if st.Model == "" || st.ModelDir == "" || st.Request == nil {
		return Report{}, errors.New("run stage: Model, ModelDir and Request are required")
	}
	if err := l.lock(ctx); err != nil {
		return Report{}, err
	}
	defer l.unlock()
	rep.Model = st.Model
	log := l.log.WithFields(logrus.Fields{"worker": string(st.Model), "job": st.JobID})

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Report{}, ErrClosed
	}
	a := l.admit(st)
	l.mu.Unlock()
	rep.CapBytes, rep.Decision = a.cap, a.why
	for _, r := range a.evicted {
		rep.Evicted = append(rep.Evicted, r.model)
		l.kill(r, log)
	}
	l.readBaseline(ctx, a.reuse == nil)

	var proc Proc
	var peak peakRSS
	if a.reuse != nil {
		a.reuse.stopTimer()
		proc, rep.Reused = a.reuse.proc, true
		rep.Loaded = a.reuse.loaded
		peak.observe(a.reuse.rssPeak)
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
	l.setRunning(proc)
	rep.PID = proc.PID()
	kept := false
	defer func() {
		l.setRunning(nil)
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
		resp, err := proc.Load(lctx, l.loadRequest(st, a.cap))
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
	if st.OnTelemetry != nil {
		st.OnTelemetry(Telemetry{Model: st.Model, PID: rep.PID, RSSBytes: peak.last(), AllocatorPeakBytes: rep.AllocPeakBytes, Final: true})
	}

	l.mu.Lock()
	switch {
	case !l.cfg.Residency || !st.Keep:
		rep.Decision += "; killed after its stage"
	case l.closed:
		rep.Decision += "; killed: the lane is closing"
	case st.MemoryCap == 0:
		rep.Decision += "; killed after its stage: without a budget nothing proves it fits beside the next"
	default:
		kept = true
		rep.Kept = true
		rep.Decision += "; kept"
		l.residents[st.Model] = &resident{model: st.Model, proc: proc, key: LoadKey(st), cap: a.cap, rssPeak: rep.RSSPeakBytes,
			loaded: rep.Loaded, job: st.JobID, used: time.Now()}
	}
	l.mu.Unlock()
	log.WithFields(logrus.Fields{"pid": rep.PID, "reused": rep.Reused, "kept": rep.Kept, "cap": rep.CapBytes, "decision": rep.Decision,
		"spawn_to_ready": rep.SpawnToReady.Round(time.Microsecond).String(), "load": rep.Load.Round(time.Microsecond).String(),
		"compute": rep.Compute.Round(time.Microsecond).String(), "alloc_peak": rep.AllocPeakBytes, "rss_peak": rep.RSSPeakBytes}).
		Debug("stage done")
	return rep, nil
}

func (l *Lane) setRunning(p Proc) {
	l.mu.Lock()
	l.running = p
	l.mu.Unlock()
}

// readBaseline reads the device's used memory for Recovery when no worker of the lane lives
// and one is about to spawn (spawning).
func (l *Lane) readBaseline(ctx context.Context, spawning bool) {
	if l.cfg.Recovery == nil || !spawning {
		return
	}
	l.mu.Lock()
	idle := len(l.residents) == 0 && l.running == nil
	l.mu.Unlock()
	if !idle {
		return
	}
	b, err := l.cfg.Recovery.Baseline(ctx)
	if err != nil {
		l.log.WithError(err).Debug("no memory baseline before the worker")
		return
	}
	l.mu.Lock()
	l.baseline, l.haveBaseline = b, true
	l.mu.Unlock()
}

// stageErr prefers the caller's cancellation over the transport error it caused.
func stageErr(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

func (r *resident) stopTimer() {
	if r.timer != nil {
		r.timer.Stop()
	}
}

// kill tears a kept worker down (its caller has taken it out of residents) and, when that
// leaves the lane without a live worker outside a stage, checks that the device's memory came
// back (Recovery).
func (l *Lane) kill(r *resident, log *logrus.Entry) {
	r.stopTimer()
	pid := r.proc.PID()
	if err := l.teardown(r.proc); err != nil {
		log.WithError(err).WithField("resident", string(r.model)).Error("kept worker teardown")
	}
	log.WithFields(logrus.Fields{"resident": string(r.model), "pid": pid, "job": r.job}).Info("kept worker killed")
	l.mu.Lock()
	check := l.cfg.Recovery != nil && l.haveBaseline && len(l.residents) == 0 && l.running == nil
	baseline := l.baseline
	l.mu.Unlock()
	if !check {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ok, detail := l.cfg.Recovery.Check(ctx, baseline, pid); !ok {
		log.WithFields(logrus.Fields{"resident": string(r.model), "pid": pid, "detail": detail}).Error("device memory not back after killing a kept worker")
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

// groupAlive returns ErrLeftover (wrapped) when process group pgid still has a live member
// (zombies waiting for their reaper do not count: they hold no memory).
func groupAlive(pgid int) error {
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
		err := groupAlive(pgid)
		if err == nil || !errors.Is(err, ErrLeftover) || time.Now().After(deadline) {
			return err
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(10 * time.Millisecond)
	}
}

// Residents describes the workers kept alive between stages, by model.
func (l *Lane) Residents() []Resident {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Resident, 0, len(l.residents))
	for _, r := range l.residents {
		out = append(out, Resident{Model: r.model, PID: r.proc.PID(), CapBytes: r.cap, Job: r.job, Expires: r.expires})
	}
	slices.SortFunc(out, func(a, b Resident) int { return strings.Compare(string(a.Model), string(b.Model)) })
	return out
}

// KeepAliveAuto, as Release's keepAlive, is the lane's default: Config.KeepAlive when the job's
// workers all fitted the budget together, 0 when the lane had to kill a kept worker of the job
// to make room (its budget is contested: keeping workers after the job would only hold memory
// the next job's stages take back).
const KeepAliveAuto time.Duration = -1

// Release ends job's hold on its kept workers: with a keep-alive they stay for the next job
// that wants them and are killed when it runs out (KeepAliveAuto: see there); with 0 they are
// killed now. It returns the keep-alive applied.
func (l *Lane) Release(job string, keepAlive time.Duration) time.Duration {
	l.mu.Lock()
	if keepAlive == KeepAliveAuto {
		keepAlive = l.cfg.KeepAlive
		if l.contested[job] {
			keepAlive = 0
		}
	}
	delete(l.contested, job)
	var gone []*resident
	for m, r := range l.residents {
		if r.job != job {
			continue
		}
		if keepAlive <= 0 {
			delete(l.residents, m)
			gone = append(gone, r)
			continue
		}
		r.expires = time.Now().Add(keepAlive)
		r.stopTimer()
		res := r
		r.timer = time.AfterFunc(keepAlive, func() { l.expire(res) })
	}
	l.mu.Unlock()
	for _, r := range gone {
		l.kill(r, l.log.WithField("job", job))
	}
	if keepAlive > 0 {
		l.log.WithFields(logrus.Fields{"job": job, "keep_alive": keepAlive.String()}).Info("job's workers kept for the next job")
	}
	return max(keepAlive, 0)
}

// expire kills r when its keep-alive ran out and it is still kept (not reused meanwhile).
func (l *Lane) expire(r *resident) {
	l.mu.Lock()
	if l.residents[r.model] != r || r.expires.IsZero() || time.Now().Before(r.expires) {
		l.mu.Unlock()
		return
	}
	delete(l.residents, r.model)
	l.mu.Unlock()
	l.kill(r, l.log.WithField("reason", "keep-alive expired"))
}

// Unload kills the kept workers of the named models (every kept worker when none is named)
// and returns the models killed.
func (l *Lane) Unload(models ...Model) []Model {
	l.mu.Lock()
	var gone []*resident
	for m, r := range l.residents {
		if len(models) == 0 || slices.Contains(models, m) {
			delete(l.residents, m)
			gone = append(gone, r)
		}
	}
	l.mu.Unlock()
	out := make([]Model, 0, len(gone))
	for _, r := range gone {
		l.kill(r, l.log.WithField("reason", "unload"))
		out = append(out, r.model)
	}
	slices.Sort(out)
	return out
}

// Close kills every kept worker; later stages fail with ErrClosed. A stage running now ends
// as its context says (the daemon cancels its jobs first) and its worker is killed after it.
func (l *Lane) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.Unload()
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
