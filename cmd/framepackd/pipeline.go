package main

// The pipeline's part of the daemon: flags, lanes and the FramePack Runner
// (supervisor/pipeline, supervisor/lanes).

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/timestamppb"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// pipelineOptions are the pipeline's flags.
type pipelineOptions struct {
	residency   bool
	keepAlive   keepAliveFlag
	laneMemory  laneMemoryFlag
	cpuMemGB    float64
	noPreviews  bool
	keepHistory bool
	siglip      string
	watchdog    func(lane string) *watchdog.Watchdog // the lanes' watchdogs, set by run (watchdog.go)
	recovery    func(lane string) lanes.Recovery     // their memory checks, set by run (watchdog.go)
	// checkVariant checks JobSpec.variant at submit (pipeline.Runner.CheckVariant); set by
	// newRunner when the models are found, nil otherwise (only i2v accepted).
	checkVariant func(name string) error
	onStage      func(pipeline.StageRecord) // the metrics' stage hook, set by run (http.go)
	lanes        map[string]*lanes.Lane     // the lanes, set by newRunner (UnloadModels, ListDevices)
}

// DefaultKeepAlive is --keep-alive's time on a lane whose budget held every worker of the job.
const DefaultKeepAlive = 5 * time.Minute

// addPipelineFlags registers the pipeline's flags on fs.
func addPipelineFlags(fs *flag.FlagSet) *pipelineOptions {
	p := &pipelineOptions{keepAlive: keepAliveFlag{auto: true}}
	fs.BoolVar(&p.residency, "residency", true, "keep model workers alive between stages and jobs where their memory caps prove they fit the lane's budget beside the next stage (false: every worker is killed after its stage)")
	fs.Var(&p.keepAlive, "keep-alive", fmt.Sprintf("how long a job's workers stay alive after it for the next job (a job's keep_alive overrides it): a duration, or auto: %v on a lane whose budget held every worker of the job, 0 where one had to be killed for another's memory", DefaultKeepAlive))
	fs.Var(&p.laneMemory, "lane-memory-gb", "the most memory (GiB) a lane's workers may hold together, whatever the device has: N for every lane, or LANE=N,… (e.g. cuda:0=16,cuda:1=24); 0 or unset: the device's memory less each job's gpu_memory_preservation_gb and a 1 GiB reserve")
	fs.Float64Var(&p.cpuMemGB, "cpu-device-memory-gb", 0, "the device memory of a cpu lane, from which each job's worker memory cap is taken (less the job's gpu_memory_preservation_gb and a 1 GiB reserve); 0: the host's RAM")
	fs.BoolVar(&p.noPreviews, "no-previews", false, "do not make a preview image per sampling step")
	fs.BoolVar(&p.keepHistory, "keep-section-history", false, "keep every section's history file, not only the newest")
	fs.StringVar(&p.siglip, "siglip-processor", "", "SigLIP preprocessing: torchvision (transformers 5, the default) or pil (transformers 4)")
	return p
}

// keepAliveFlag is --keep-alive: a duration, or auto (lanes.KeepAliveAuto).
type keepAliveFlag struct {
	auto bool
	d    time.Duration
}

func (k *keepAliveFlag) String() string {
	if k == nil || k.auto {
		return "auto"
	}
	return k.d.String()
}

func (k *keepAliveFlag) Set(v string) error {
	if v == "auto" {
		*k = keepAliveFlag{auto: true}
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("want auto or a duration of 0 or more (5m, 1h), got %q", v)
	}
	*k = keepAliveFlag{d: d}
	return nil
}

// value is the keep-alive the runner applies to a job without its own.
func (k keepAliveFlag) value() time.Duration {
	if k.auto {
		return lanes.KeepAliveAuto
	}
	return k.d
}

// laneMemoryFlag is --lane-memory-gb: one limit for every lane, or one per lane.
type laneMemoryFlag struct {
	all    float64
	byLane map[string]float64
}

func (f *laneMemoryFlag) String() string {
	if f == nil || (f.all == 0 && len(f.byLane) == 0) {
		return ""
	}
	if len(f.byLane) == 0 {
		return strconv.FormatFloat(f.all, 'g', -1, 64)
	}
	parts := make([]string, 0, len(f.byLane))
	for l, gb := range f.byLane {
		parts = append(parts, l+"="+strconv.FormatFloat(gb, 'g', -1, 64))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (f *laneMemoryFlag) Set(v string) error {
	parse := func(s string) (float64, error) {
		gb, err := strconv.ParseFloat(s, 64)
		if err != nil || gb < 0 || gb > 1<<20 {
			return 0, fmt.Errorf("want a number of GiB from 0, got %q", s)
		}
		return gb, nil
	}
	if !strings.Contains(v, "=") {
		gb, err := parse(v)
		*f = laneMemoryFlag{all: gb}
		return err
	}
	m := map[string]float64{}
	for _, part := range strings.Split(v, ",") {
		lane, num, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || lane == "" {
			return fmt.Errorf("want LANE=GiB, got %q", part)
		}
		gb, err := parse(num)
		if err != nil {
			return fmt.Errorf("%s: %w", lane, err)
		}
		m[lane] = gb
	}
	*f = laneMemoryFlag{byLane: m}
	return nil
}

// bytes is the limit of lane (0: none).
func (f laneMemoryFlag) bytes(lane string) uint64 {
	gb := f.all
	if v, ok := f.byLane[lane]; ok {
		gb = v
	}
	return uint64(gb * (1 << 30))
}

// check fails when a per-lane limit names a lane the daemon does not run.
func (f laneMemoryFlag) check(laneNames []string) error {
	for l := range f.byLane {
		if !slices.Contains(laneNames, l) {
			return fmt.Errorf("--lane-memory-gb names lane %q; the lanes are %s", l, strings.Join(laneNames, ", "))
		}
	}
	return nil
}

// laneBackend splits a lane name ("cpu", "cpu:1", "cuda:0", "hip:1") into backend and device index.
func laneBackend(lane string) (string, uint32, error) {
	backend, _, _ := strings.Cut(lane, ":")
	idx, err := laneIndexOf(lane) // lanes.go: "cpu:N" lanes share the host CPU
	return backend, idx, err
}

// newRunner builds the lanes and the pipeline Runner. When the models cannot be found the
// daemon still starts, and jobs fail saying why.
func newRunner(o *options, devs *devices, laneNames []string, log *logrus.Logger) (run func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error), closeFn func(), err error) {
	p := o.pipeline
	root := o.shm.Root()
	byName := map[string]*lanes.Lane{}
	if err := p.laneMemory.check(laneNames); err != nil {
		return nil, nil, err
	}
	for _, name := range laneNames {
		backend, idx, err := laneBackend(name)
		if err != nil {
			return nil, nil, err
		}
		// The lane's device memory: the probed device's total (a GPU's memory; the host's RAM
		// for cpu, which --cpu-device-memory-gb replaces). Each job's worker cap is taken
		// from it (lanes.Lane.MemoryCap).
		devs.mu.Lock()
		devMem, bus := devs.last[name].GetTotalMemoryBytes(), devs.last[name].GetPciBusId()
		devs.mu.Unlock()
		if backend == "cpu" && p.cpuMemGB > 0 {
			devMem = uint64(p.cpuMemGB * (1 << 30))
		}
		if backend == "cpu" {
			bus = ""
		}
		var rec lanes.Recovery
		if p.recovery != nil {
			rec = p.recovery(name)
		}
		l, err := lanes.New(lanes.Config{Name: name, Backend: backend, DeviceIndex: idx, PCIBusID: bus, WorkerPath: lanes.BinDir(o.workersDir),
			DeviceMemory: devMem, MemoryLimit: p.laneMemory.bytes(name), Residency: p.residency, KeepAlive: DefaultKeepAlive,
			Recovery: rec, Log: logrus.NewEntry(log)})
		if err != nil {
			return nil, nil, err
		}
		byName[name] = l
	}
	p.lanes = byName
	closeAll := func() {
		for _, l := range byName {
			_ = l.Close()
		}
	}
	env := map[string]string{}
	if p.siglip != "" {
		env["FRAMEPACK_SIGLIP_PROCESSOR"] = p.siglip
	}
	build := func(models pipeline.Models) (*pipeline.Runner, error) {
		log.WithFields(logrus.Fields{"hunyuanvideo": models.HunyuanVideo, "flux_redux": models.FluxRedux, "transformer": models.Transformer,
			"transformer_f1": models.TransformerF1}).Info("models found")
		return pipeline.New(pipeline.Config{
			Models: models, Shm: root, Log: log, WorkerEnv: env, Watchdog: p.watchdog,
			NoPreviews: p.noPreviews, KeepSectionHistory: p.keepHistory, Residency: p.residency, KeepAlive: p.keepAlive.value(), OnStage: p.onStage,
			KeepSectionVideos: o.limits.keepVideos, FreeBytes: api.FreeBytes,
			Lane: func(name string) (*lanes.Lane, error) {
				if l, ok := byName[name]; ok {
					return l, nil
				}
				return nil, fmt.Errorf("no lane %q", name)
			},
		})
	}
	models, err := pipeline.ResolveModels(o.models)
	if err != nil {
		// The folder may appear later (a download still running): the readiness check sees it
		// within seconds, and the first job after it builds the runner.
		log.WithError(err).Warn("model folders not found; jobs are refused until they exist (checked every few seconds)")
		lazy := &lazyRunner{models: o.models, build: build}
		p.checkVariant = lazy.checkVariant
		return lazy.run, closeAll, nil
	}
	r, err := build(models)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	p.checkVariant = r.CheckVariant
	return r.Run, closeAll, nil
}

// lazyRunner is the pipeline of a daemon that started before its model folders existed: the
// first job (or variant check) after they appear builds the Runner.
type lazyRunner struct {
	models string // --models
	build  func(pipeline.Models) (*pipeline.Runner, error)

	mu sync.Mutex // mu protects r
	r  *pipeline.Runner
}

// runner returns the Runner, built on the first call that finds the model folders.
func (l *lazyRunner) runner() (*pipeline.Runner, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.r != nil {
		return l.r, nil
	}
	models, err := pipeline.ResolveModels(l.models)
	if err != nil {
		return nil, err
	}
	if l.r, err = l.build(models); err != nil {
		return nil, err
	}
	return l.r, nil
}

func (l *lazyRunner) run(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
	r, err := l.runner()
	if err != nil {
		return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: "no pipeline can run: " + err.Error()}}
	}
	return r.Run(ctx, job, emit)
}

// checkVariant is Runner.CheckVariant once the models are there; before, only i2v (the
// readiness check refuses every job until then anyway).
func (l *lazyRunner) checkVariant(name string) error {
	r, err := l.runner()
	if err != nil {
		if name == "" || name == pipeline.VariantI2V {
			return nil
		}
		return fmt.Errorf("the model folders are not there yet, so variant %q cannot be checked: %v", name, err)
	}
	return r.CheckVariant(name)
}

// devices adds each lane's kept workers and memory limit to the device list.
func (p *pipelineOptions) devices(list func(context.Context) ([]*framepackv1.Device, error)) func(context.Context) ([]*framepackv1.Device, error) {
	return func(ctx context.Context) ([]*framepackv1.Device, error) {
		devs, err := list(ctx)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			l := p.lanes[d.GetLane()]
			if l == nil {
				continue
			}
			d.MemoryLimitBytes = p.laneMemory.bytes(d.GetLane())
			for _, r := range l.Residents() {
				k := &framepackv1.KeptWorker{Model: string(r.Model), Pid: int32(r.PID), CapBytes: r.CapBytes, JobId: r.Job}
				if !r.Expires.IsZero() {
					k.ExpireTime = timestamppb.New(r.Expires)
				}
				d.KeptWorkers = append(d.KeptWorkers, k)
			}
		}
		return devs, nil
	}
}

// unload serves UnloadModels: the kept workers of lane ("": every lane) whose model is in
// models (empty: all).
func (p *pipelineOptions) unload(lane string, models []string) ([]*framepackv1.UnloadedWorker, error) {
	names := make([]lanes.Model, len(models))
	for i, m := range models {
		names[i] = lanes.Model(m)
	}
	var out []*framepackv1.UnloadedWorker
	for _, name := range slices.Sorted(maps.Keys(p.lanes)) {
		if lane != "" && name != lane {
			continue
		}
		for _, m := range p.lanes[name].Unload(names...) {
			out = append(out, &framepackv1.UnloadedWorker{Lane: name, Model: string(m)})
		}
	}
	return out, nil
}

// placement makes p count the memory a lane's kept workers hold as free: the lane gives it back
// to the job's stages that need it.
func (po *pipelineOptions) placement(p *placement) *placement {
	p.kept = func(lane string) uint64 {
		l := po.lanes[lane]
		if l == nil {
			return 0
		}
		var n uint64
		for _, r := range l.Residents() {
			n += r.CapBytes + l.WorkerOverhead()
		}
		return n
	}
	return p
}
