package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// worker serves vae_encode and vae_decode stages.
type worker struct {
	k   *workerkit.Kit
	log *logrus.Entry

	// runMu serialises Load and Run (one stage at a time); Stats does not take it.
	runMu sync.Mutex

	// mu protects the fields below it; they are set once by Load (and the times by Run).
	mu          sync.RWMutex
	rt          *runtime.Runtime
	model       *causalvae.Model
	env         envPlan
	loadTime    time.Duration
	computeTime time.Duration

	// obsMu protects ops, convEvents and lastFailed (written by the runtime's op observer).
	obsMu      sync.Mutex
	ops        map[string]uint64
	convEvents []workerkit.ConvFallback
	lastFailed string // shape key whose last tier attempt failed

	// inj keeps the beacon and fires the test faults of LoadRequest.Fault (set in Load).
	inj atomic.Pointer[faults.Injector]
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	log := k.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	w := &worker{k: k, log: log.WithField("worker", "vae"), ops: map[string]uint64{}}
	inj, _ := faults.New(nil, faults.Caps{}, k.Beacon, w.log) // no fault: never fails
	w.inj.Store(inj)
	return w
}

// errInvalid marks errors that are the request's fault.
var errInvalid = errors.New("invalid argument")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// classify maps an error to the worker error the supervisor acts on.
func classify(err error) error {
	var oom *runtime.OOMError
	var we *workerkit.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &we):
		return err
	case errors.As(err, &oom):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error(),
			RequestedBytes: oom.Requested, AvailableBytes: oom.Available}
	case errors.Is(err, runtime.ErrOutOfMemory):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error()}
	case errors.Is(err, runtime.ErrDeviceLost):
		return &workerkit.Error{Code: workerkit.CodeDeviceLost, Message: err.Error()}
	case errors.Is(err, errInvalid), errors.Is(err, causalvae.ErrBadInput), errors.Is(err, causalvae.ErrCheckpoint):
		return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &workerkit.Error{Code: workerkit.CodeCancelled, Message: err.Error()}
	}
	return &workerkit.Error{Code: workerkit.CodeInternal, Message: err.Error()}
}

// recovered turns a panic into an internal error, so a bug reports instead of killing the
// worker mid-call.
func (w *worker) recovered(what string, err *error) {
	if r := recover(); r != nil {
		w.log.WithFields(logrus.Fields{"call": what, "panic": fmt.Sprint(r)}).Error("panic\n" + string(debug.Stack()))
		*err = workerkit.Errorf(workerkit.CodeInternal, "%s: internal error: %v", what, r)
	}
}

// ---- runtime op observer ------------------------------------------------------------------

func toWorkerTier(t runtime.Tier) workerkit.ConvTier {
	switch t {
	case runtime.TierVendorTuned:
		return workerkit.ConvTierVendorTuned
	case runtime.TierVendorDefault:
		return workerkit.ConvTierVendorDefault
	case runtime.TierOwnKernel:
		return workerkit.ConvTierOwnKernel
	case runtime.TierCPU:
		return workerkit.ConvTierCPU
	}
	return workerkit.ConvTierUnspecified
}

func toRuntimeTier(t workerkit.ConvTier) (runtime.Tier, bool) {
	switch t {
	case workerkit.ConvTierVendorTuned:
		return runtime.TierVendorTuned, true
	case workerkit.ConvTierVendorDefault:
		return runtime.TierVendorDefault, true
	case workerkit.ConvTierOwnKernel:
		return runtime.TierOwnKernel, true
	case workerkit.ConvTierCPU:
		return runtime.TierCPU, true
	}
	return 0, false
}

// observe is the runtime's op observer: it keeps the beacon current, counts ops, queues conv
// fallback events and fires injected faults. It runs on the op's thread and must be quick.
func (w *worker) observe(e runtime.OpEvent) {
	w.k.Beacon.SetBytes(int64(e.Bytes)) // the allocator's bytes, per op (begin: output allocated; end: scratch freed)
	if e.Phase == runtime.OpEnd {
		w.k.Beacon.EndOp()
		if e.Key == "" {
			return
		}
		w.obsMu.Lock()
		switch {
		case e.Err != nil && !errors.Is(e.Err, runtime.ErrUnavailable):
			w.convEvents = append(w.convEvents, workerkit.ConvFallback{ShapeKey: e.Key, Tier: toWorkerTier(e.Tier),
				Outcome: workerkit.ConvOutcomeFailed, Detail: e.Err.Error()})
			w.lastFailed = e.Key
		case e.Err == nil && w.lastFailed == e.Key:
			w.convEvents = append(w.convEvents, workerkit.ConvFallback{ShapeKey: e.Key, Tier: toWorkerTier(e.Tier),
				Outcome: workerkit.ConvOutcomeSucceeded})
			w.lastFailed = ""
		}
		w.obsMu.Unlock()
		return
	}
	w.obsMu.Lock()
	w.ops[e.Op]++
	w.obsMu.Unlock()
	tier := ""
	if e.Key != "" {
		tier = e.Tier.String() // a conv tier attempt: the watchdog can name the shape and tier if it hangs
	}
	// The beacon's op number, which Fault counts in; faults fire here (package faults).
	w.inj.Load().BeginOp(e.Op, e.Key, tier, e.Seq)
}

// opFault is the runtime's fault hook: the op oom_at_op names fails with the injected out of
// memory before it runs (the observer has just told the injector it began).
func (w *worker) opFault(e runtime.OpEvent) error {
	return w.inj.Load().OpErr(e.Seq, e.OutBytes, e.Bytes, e.Cap)
}

// injectedOOM returns the injected out-of-memory error once its op has started.
func (w *worker) injectedOOM() error { return w.inj.Load().Err() }

// drainConvEvents returns the queued conv fallback events.
func (w *worker) drainConvEvents() []workerkit.ConvFallback {
	w.obsMu.Lock()
	defer w.obsMu.Unlock()
	ev := w.convEvents
	w.convEvents = nil
	return ev
}

// ---- Load ----------------------------------------------------------------------------------

// Load opens the backend and loads the VAE from req.ModelDir (config.json and
// diffusion_pytorch_model.safetensors, or a sharded checkpoint).
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (resp *workerkit.LoadResponse, err error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	defer w.recovered("load", &err)
	resp, err = w.load(req)
	if err != nil {
		err = classify(fmt.Errorf("load: %w", err))
		w.log.WithError(err).Warn("load failed")
	}
	return resp, err
}

func (w *worker) load(req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	w.mu.RLock()
	loaded := w.model != nil
	w.mu.RUnlock()
	if loaded {
		return nil, invalidf("already loaded")
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, invalidf("model_dir is required")
	}
	backend := req.Backend
	switch backend {
	case "", "auto", "cpu":
		backend = "cpu" // the only backend of this build; auto falls back to it
	case "hip", "cuda":
	default:
		return nil, invalidf("backend %q (cpu, cuda, hip or auto)", req.Backend)
	}
	// The cpu backend computes in fp32; dtype says what the conv and linear weights are kept
	// in ("fp16"/"bf16", or "auto": the checkpoint's own dtype).
	wdt, err := runtime.ParseWeightDType(req.DType)
	if err != nil {
		return nil, invalidf("%v", err)
	}
	if req.MemoryCapBytes > math.MaxInt64 {
		return nil, invalidf("memory cap %d too large", req.MemoryCapBytes)
	}
	env, err := planEnv(backend, req.Env)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	if err := env.apply(); err != nil {
		return nil, err
	}
	inj, err := faults.New(req.Fault, faults.Caps{Conv: true}, w.k.Beacon, w.log)
	if err != nil {
		return nil, invalidf("%v", err)
	}
	w.inj.Store(inj) // read by the op observer from the first op on
	opts := runtime.Options{Backend: backend, Device: int(req.DeviceIndex), MemoryCap: int64(req.MemoryCapBytes),
		OpObserver: w.observe, OpFault: w.opFault}
	if f := req.Fault; f != nil {
		if f.HangConvTier != workerkit.ConvTierUnspecified {
			tier, ok := toRuntimeTier(f.HangConvTier)
			if !ok {
				return nil, invalidf("fault: hang_conv_tier %d", f.HangConvTier)
			}
			// A tier this backend lacks still hangs: the fault stands in for a vendor library.
			opts.ConvFaults = append(opts.ConvFaults, runtime.ConvFault{Key: f.HangConvShapeKey, Tier: tier, Mode: runtime.FaultHang})
		}
	}
	if p := req.ConvPolicy; p != nil {
		if p.ForcedTier != workerkit.ConvTierUnspecified {
			tier, ok := toRuntimeTier(p.ForcedTier)
			if !ok {
				return nil, invalidf("conv policy: forced tier %d", p.ForcedTier)
			}
			opts.ConvPolicy.FirstTier = tier
		}
		for _, o := range p.TierOverrides { // later entries for a shape win
			tier, ok := toRuntimeTier(o.Tier)
			if !ok || o.ShapeKey == "" {
				return nil, invalidf("conv policy: tier override %q: shape key and tier (%d) are required", o.ShapeKey, o.Tier)
			}
			if opts.ConvPolicy.TierOverrides == nil {
				opts.ConvPolicy.TierOverrides = map[string]runtime.Tier{}
			}
			opts.ConvPolicy.TierOverrides[o.ShapeKey] = tier
		}
		if n := len(opts.ConvPolicy.TierOverrides); n > 0 {
			w.log.WithField("overrides", n).Info("conv policy: per-shape first tiers")
		}
		if p.DecisionCachePath != "" {
			cache, err := convcache.Open(p.DecisionCachePath)
			if err != nil {
				return nil, fmt.Errorf("conv decision cache: %w", err)
			}
			if err := cache.LoadError(); err != nil {
				w.log.WithError(err).Warn("conv decision cache unreadable; starting without it")
			}
			opts.ConvCache = cache
		}
	}
	rt, err := runtime.New(opts)
	if err != nil {
		return nil, err
	}
	model, err := causalvae.Load(rt, req.ModelDir, causalvae.Options{DType: runtime.F32, WeightDType: wdt})
	if err != nil {
		rt.Close()
		return nil, err
	}
	w.mu.Lock()
	w.rt, w.model, w.env = rt, model, env
	w.loadTime = time.Since(start)
	w.mu.Unlock()
	w.logLoad(req, model, env)
	mem := rt.Memory()
	w.k.Beacon.SetBytes(int64(mem.Allocated))
	info := rt.Backend()
	return &workerkit.LoadResponse{
		Backend: info.Name, DType: "fp32",
		Device:               &workerkit.Device{Index: uint32(info.Device), Name: info.DeviceName, Arch: hostArch(info), TotalMemoryBytes: info.DeviceMemory},
		WeightBytes:          uint64(model.Info.WeightBytes),
		DeviceAllocatedBytes: mem.Allocated,
		LoadDuration:         w.loadTime,
		VAE:                  vaeInfo(model.Config),
	}, nil
}

// vaeInfo is the model's constants as LoadResponse reports them to the supervisor.
func vaeInfo(c causalvae.Config) *workerkit.VAEInfo {
	u := func(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
	return &workerkit.VAEInfo{
		ScalingFactor:            c.ScalingFactor,
		LatentChannels:           u(c.LatentChannels),
		SpatialCompressionRatio:  u(c.SpatialCompressionRatio),
		TemporalCompressionRatio: u(c.TemporalCompressionRatio),
		InChannels:               u(c.InChannels),
		OutChannels:              u(c.OutChannels),
	}
}

func hostArch(info runtime.BackendInfo) string {
	if info.IsHost {
		return "x86_64"
	}
	return ""
}

func (w *worker) logLoad(req *workerkit.LoadRequest, m *causalvae.Model, env envPlan) {
	c := m.Config
	w.log.WithFields(logrus.Fields{
		"model_dir": req.ModelDir, "block_out_channels": fmt.Sprint(c.BlockOutChannels),
		"latent_channels": c.LatentChannels, "layers_per_block": c.LayersPerBlock,
		"mid_block_attention": c.MidBlockAddAttention, "weight_bytes": m.Info.WeightBytes,
		"scaling_factor": c.ScalingFactor,
	}).Info("vae loaded")
	for _, n := range m.Info.Unexpected {
		w.log.WithField("tensor", n).Warn("unexpected tensor in checkpoint")
	}
	for _, k := range m.Info.UnknownConfigKeys {
		w.log.WithField("key", k).Debug("config key ignored")
	}
	for k, v := range env.Ignored {
		w.log.WithFields(logrus.Fields{"env": k, "value": v}).Info("miopen setting recorded, not applied on this backend")
	}
	for k, why := range env.Dropped {
		w.log.WithFields(logrus.Fields{"env": k, "reason": why}).Warn("env setting dropped")
	}
	for k, v := range env.Apply {
		w.log.WithFields(logrus.Fields{"env": k, "value": v}).Debug("env applied")
	}
}

// ---- Run -----------------------------------------------------------------------------------

// Run serves one vae_encode or vae_decode stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (res *workerkit.Result, err error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	defer w.recovered("run", &err)
	w.mu.RLock()
	m := w.model
	w.mu.RUnlock()
	if m == nil {
		return nil, classify(invalidf("run: not loaded"))
	}
	start := time.Now()
	defer func() {
		w.mu.Lock()
		w.computeTime += time.Since(start)
		w.mu.Unlock()
	}()
	log := w.log.WithField("job", req.JobID)
	var stage string
	switch s := req.Stage.(type) {
	case *workerkit.VAEEncodeRequest:
		stage = "vae_encode"
		res, err = w.encode(ctx, m, s, emit, start)
	case *workerkit.VAEDecodeRequest:
		stage = "vae_decode"
		res, err = w.decode(ctx, m, s, emit, start)
	default:
		return nil, classify(invalidf("run: the vae worker runs vae_encode and vae_decode stages, not %T", req.Stage))
	}
	log = log.WithField("stage", stage)
	w.k.Beacon.SetStep(0, 0)
	cs := w.rt.ConvStats()
	log.WithFields(logrus.Fields{"convs": cs.Convs, "served": cs.Served, "failed": cs.Failed,
		"shapes": len(cs.Decisions), "peak_bytes": w.rt.Memory().Peak}).Info(strings.TrimRight(cs.String(), "\n"))
	if err != nil {
		err = classify(fmt.Errorf("%s: %w", stage, err))
		log.WithError(err).Warn("stage failed")
		return nil, err
	}
	res.Stats = w.stats()
	log.WithField("elapsed", time.Since(start)).Info("stage done")
	return res, nil
}

// progress returns the model's per-tile callback: beacon step, progress and conv events, the
// injected OOM, and cancellation.
func (w *worker) progress(ctx context.Context, phase string, emit workerkit.Emit, start time.Time) func(done, total int) error {
	return func(done, total int) error {
		w.k.Beacon.SetStep(done, total)
		w.k.Beacon.SetBytes(int64(w.rt.Memory().Allocated))
		if err := w.injectedOOM(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if emit == nil {
			return nil
		}
		for _, ev := range w.drainConvEvents() {
			if err := emit(&ev); err != nil {
				return err
			}
		}
		return emit(&workerkit.Progress{Phase: phase, Step: uint32(done), TotalSteps: uint32(total), Elapsed: time.Since(start)})
	}
}

// tilingFrom maps the request's tiling to diffusers' settings. Unset means diffusers' defaults
// (framewise on, no spatial tiling); zero sizes keep the defaults (256/192 px, 16/12 frames).
// Framewise chunking is diffusers' default and stays on either way, so enable_temporal_tiling
// (deprecated in worker.proto) changes nothing; a long enough tile_sample_min_num_frames runs
// all frames in one piece.
func tilingFrom(t *workerkit.VAETiling) causalvae.Tiling {
	out := causalvae.DefaultTiling()
	if t == nil {
		return out
	}
	out.Spatial = t.EnableSpatialTiling
	set := func(dst *int, v uint32) {
		if v != 0 {
			*dst = int(min(v, math.MaxInt32))
		}
	}
	set(&out.TileSampleMinHeight, t.TileSampleMinHeight)
	set(&out.TileSampleMinWidth, t.TileSampleMinWidth)
	set(&out.TileSampleMinNumFrames, t.TileSampleMinNumFrames)
	set(&out.TileSampleStrideHeight, t.TileSampleStrideHeight)
	set(&out.TileSampleStrideWidth, t.TileSampleStrideWidth)
	set(&out.TileSampleStrideNumFrames, t.TileSampleStrideNumFrames)
	return out
}

// LogvarSuffix is appended to the latents tensor's name for the posterior log-variance,
// written into the same file, when the request leaves logvar unset (the fallback).
const LogvarSuffix = ".logvar"

// logvarRef returns where the posterior log-variance goes: the request's logvar ref, or, when
// it names neither a file nor a tensor, "<latents.name>.logvar" in latents' file (with latents'
// dtype and shape unless logvar states its own).
func logvarRef(req *workerkit.VAEEncodeRequest) workerkit.TensorRef {
	r := req.Logvar
	if r.Path != "" || r.Name != "" {
		return r
	}
	fb := req.Latents
	fb.Name += LogvarSuffix
	if r.DType != "" {
		fb.DType = r.DType
	}
	if len(r.Shape) > 0 {
		fb.Shape = r.Shape
	}
	return fb
}

// encode writes the posterior's unscaled mean (not × scaling_factor: the supervisor scales with
// LoadResponse.VAE) and its log-variance (logvarRef).
func (w *worker) encode(ctx context.Context, m *causalvae.Model, req *workerkit.VAEEncodeRequest, emit workerkit.Emit, start time.Time) (*workerkit.Result, error) {
	if err := checkOutputRef("latents", req.Latents); err != nil {
		return nil, err
	}
	x, err := readVolume("pixels", req.Pixels)
	if err != nil {
		return nil, err
	}
	tiling := tilingFrom(req.Tiling)
	shape, err := m.EncodedShape(x.Shape, tiling)
	if err != nil {
		return nil, fmt.Errorf("pixels: %w", err)
	}
	mean, logvar := req.Latents, logvarRef(req)
	outs, err := newOutputs([]outputRef{{field: "latents", ref: mean, shape: shape}, {field: "logvar", ref: logvar, shape: shape}})
	if err != nil {
		return nil, err
	}
	defer outs.abort()
	mv, lv, err := m.Encode(ctx, x, causalvae.RunOptions{Tiling: tiling, Progress: w.progress(ctx, "encode", emit, start)})
	if err != nil {
		return nil, err
	}
	if err := w.injectedOOM(); err != nil {
		return nil, err
	}
	if err := outs.put(0, mv); err != nil {
		return nil, err
	}
	if err := outs.put(1, lv); err != nil {
		return nil, err
	}
	written, err := outs.commit()
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written}, nil
}

// decode takes unscaled latents (already divided by scaling_factor) and writes pixels.
func (w *worker) decode(ctx context.Context, m *causalvae.Model, req *workerkit.VAEDecodeRequest, emit workerkit.Emit, start time.Time) (*workerkit.Result, error) {
	if err := checkOutputRef("pixels", req.Pixels); err != nil {
		return nil, err
	}
	z, err := readVolume("latents", req.Latents)
	if err != nil {
		return nil, err
	}
	tiling := tilingFrom(req.Tiling)
	shape, err := m.DecodedShape(z.Shape, tiling)
	if err != nil {
		return nil, fmt.Errorf("latents: %w", err)
	}
	outs, err := newOutputs([]outputRef{{field: "pixels", ref: req.Pixels, shape: shape}})
	if err != nil {
		return nil, err
	}
	defer outs.abort()
	dst, direct, err := outs.target(0)
	if err != nil {
		return nil, err
	}
	opts := causalvae.RunOptions{Tiling: tiling, Progress: w.progress(ctx, "decode", emit, start)}
	if err := m.DecodeInto(ctx, z, opts, dst); err != nil {
		return nil, err
	}
	if err := w.injectedOOM(); err != nil {
		return nil, err
	}
	if !direct {
		if err := outs.put(0, dst); err != nil {
			return nil, err
		}
	}
	written, err := outs.commit()
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written}, nil
}

// ---- Stats and Probe ----------------------------------------------------------------------------

// Stats reports the runtime's memory, the conv chain's counters, op counts and timings.
func (w *worker) Stats(context.Context) (*workerkit.Stats, error) {
	return w.stats(), nil
}

func (w *worker) stats() *workerkit.Stats {
	w.mu.RLock()
	st := &workerkit.Stats{LoadTime: w.loadTime, ComputeTime: w.computeTime, OpCounts: map[string]uint64{}}
	rt := w.rt
	w.mu.RUnlock()
	if rt != nil {
		m := rt.Memory()
		st.AllocatorCurrentBytes, st.AllocatorPeakBytes, st.MemoryCapBytes = m.Allocated, m.Peak, m.Cap
		cs := rt.ConvStats()
		for t := runtime.Tier(0); t < runtime.NumTiers; t++ {
			ts := cs.Tiers[t]
			if ts.Attempts == 0 && ts.SkippedHung == 0 {
				continue
			}
			st.ConvTiers = append(st.ConvTiers, workerkit.ConvTierStats{Tier: toWorkerTier(t),
				Attempts: uint64(ts.Attempts), Successes: uint64(ts.Successes), Failures: uint64(ts.Failures),
				SkippedAsHung: uint64(ts.SkippedHung), Time: ts.Time})
		}
	}
	st.HostRSSBytes = hostRSS()
	w.obsMu.Lock()
	for k, v := range w.ops {
		st.OpCounts[k] = v
	}
	w.obsMu.Unlock()
	return st
}

// hostRSS reads the process's resident set size from /proc (0 when unavailable).
func hostRSS() uint64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

// Probe is refused: device probing is the probe worker's job.
func (w *worker) Probe(context.Context, *workerkit.ProbeRequest) (*workerkit.ProbeResponse, error) {
	return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "probe: the vae worker does not probe devices")
}
