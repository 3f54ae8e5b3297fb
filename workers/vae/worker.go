package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// worker serves vae_encode and vae_decode stages.
type worker struct {
	base *modelrt.Base
	log  *logrus.Entry

	// runMu serialises Load and Run (one stage at a time); Stats does not take it.
	runMu sync.Mutex

	// mu protects the fields below it; they are set once by Load.
	mu    sync.RWMutex
	rt    *runtime.Runtime
	model *causalvae.Model
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	base := modelrt.New(k, modelrt.Config{Name: "vae", Conv: true, Tiles: true})
	return &worker{base: base, log: base.Log}
}

// classify maps an error to the worker error the supervisor acts on.
func classify(err error) error {
	return modelrt.Classify(err, causalvae.ErrBadInput, causalvae.ErrCheckpoint, causalvae.ErrMemoryBudget)
}

// ---- Load ----------------------------------------------------------------------------------

// Traits declares the model's traits before a Load succeeds (workerkit.TraitsDeclarer).
func (w *worker) Traits() *workerkit.ModelTraits { return w.base.Traits() }

// Load opens the backend and loads the VAE from req.ModelDir (config.json and
// diffusion_pytorch_model.safetensors, or a sharded checkpoint).
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (resp *workerkit.LoadResponse, err error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
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
		return nil, workerkit.InvalidArgumentf("already loaded")
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, workerkit.InvalidArgumentf("model_dir is required")
	}
	rt, err := w.base.Open(req)
	if err != nil {
		return nil, err
	}
	// Activations in fp16 on a GPU (FramePack's vae dtype), fp32 on the cpu, unless the request
	// or the activation test knob says otherwise; dtype says what the conv and linear weights
	// are kept in ("fp16"/"bf16", or "auto": the checkpoint's own dtype).
	act, wdt, err := w.base.Activation(req, rt, causalvae.FramePackDType)
	if err != nil {
		rt.Close()
		return nil, err
	}
	model, err := causalvae.Load(rt, req.ModelDir, causalvae.Options{DType: act, WeightDType: wdt})
	if err != nil {
		rt.Close()
		return nil, err
	}
	w.mu.Lock()
	w.rt, w.model = rt, model
	w.mu.Unlock()
	resp := w.base.Loaded(rt, start, model.Info.WeightBytes)
	resp.VAE = vaeInfo(model.Config)
	w.logLoad(req, model)
	return resp, nil
}

// vaeInfo is the model's constants as LoadResponse reports them to the supervisor.
func vaeInfo(c causalvae.Config) *workerkit.VAEInfo {
	u := modelrt.Uint32
	return &workerkit.VAEInfo{
		ScalingFactor:            c.ScalingFactor,
		LatentChannels:           u(c.LatentChannels),
		SpatialCompressionRatio:  u(c.SpatialCompressionRatio),
		TemporalCompressionRatio: u(c.TemporalCompressionRatio),
		InChannels:               u(c.InChannels),
		OutChannels:              u(c.OutChannels),
	}
}

func (w *worker) logLoad(req *workerkit.LoadRequest, m *causalvae.Model) {
	c := m.Config
	w.log.WithFields(logrus.Fields{
		"model_dir": req.ModelDir, "block_out_channels": fmt.Sprint(c.BlockOutChannels),
		"latent_channels": c.LatentChannels, "layers_per_block": c.LayersPerBlock,
		"mid_block_attention": c.MidBlockAddAttention, "weight_bytes": m.Info.WeightBytes, "staged_bytes": m.Info.StagedBytes,
		"scaling_factor": c.ScalingFactor,
	}).Info("vae loaded")
	for _, n := range m.Info.Unexpected {
		w.log.WithField("tensor", n).Warn("unexpected tensor in checkpoint")
	}
	for _, k := range m.Info.UnknownConfigKeys {
		w.log.WithField("key", k).Debug("config key ignored")
	}
}

// ---- Run -----------------------------------------------------------------------------------

// Run serves one vae_encode or vae_decode stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (res *workerkit.Result, err error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	w.mu.RLock()
	m := w.model
	w.mu.RUnlock()
	if m == nil {
		return nil, classify(workerkit.InvalidArgumentf("run: not loaded"))
	}
	start := time.Now()
	defer w.base.AddCompute(start)
	log := w.log.WithField("job", req.JobID)
	var stage string
	switch s := req.Stage.(type) {
	case *workerkit.VAEEncodeRequest:
		stage = "vae_encode"
		log = log.WithField("stage", stage)
		res, err = w.encode(ctx, m, s, emit, start, log)
	case *workerkit.VAEDecodeRequest:
		stage = "vae_decode"
		log = log.WithField("stage", stage)
		res, err = w.decode(ctx, m, s, emit, start, log)
	default:
		return nil, classify(workerkit.InvalidArgumentf("run: the vae worker runs vae_encode and vae_decode stages, not %T", req.Stage))
	}
	w.base.Beacon.SetStep(0, 0)
	cs := w.rt.ConvStats()
	log.WithFields(logrus.Fields{"convs": cs.Convs, "served": cs.Served, "failed": cs.Failed,
		"shapes": len(cs.Decisions), "peak_bytes": w.rt.Memory().Peak}).Info(strings.TrimRight(cs.String(), "\n"))
	if err != nil {
		err = classify(fmt.Errorf("%s: %w", stage, err))
		log.WithError(err).Warn("stage failed")
		return nil, err
	}
	res.Stats = w.base.Stats()
	log.WithField("elapsed", time.Since(start)).Info("stage done")
	return res, nil
}

// progress returns the model's per-tile callback: beacon step, progress and conv events, the
// injected OOM, and cancellation.
func (w *worker) progress(ctx context.Context, phase string, emit workerkit.Emit, start time.Time) func(done, total int) error {
	return func(done, total int) error {
		w.base.Beacon.SetStep(done, total)
		w.base.Beacon.SetBytes(int64(w.rt.Memory().Allocated))
		if err := w.base.InjectedOOM(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if emit == nil {
			return nil
		}
		for _, ev := range w.base.DrainConvEvents() {
			if err := emit(&ev); err != nil {
				return err
			}
		}
		return emit(&workerkit.Progress{Phase: phase, Step: uint32(done), TotalSteps: uint32(total), Elapsed: time.Since(start)})
	}
}

// tilingFrom maps a request's tiling to diffusers' settings (the worker chooses one itself when
// the request has none: tiling); zero sizes keep the defaults (256/192 px, 16/12 frames).
// Framewise chunking is diffusers' default and always on; a long enough
// tile_sample_min_num_frames runs all frames in one piece.
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

// wireTiling is t as a request states it, every size filled in.
func wireTiling(t causalvae.Tiling) workerkit.VAETiling {
	u := modelrt.Uint32
	return workerkit.VAETiling{
		EnableSpatialTiling:       t.Spatial,
		TileSampleMinHeight:       u(t.TileSampleMinHeight),
		TileSampleMinWidth:        u(t.TileSampleMinWidth),
		TileSampleMinNumFrames:    u(t.TileSampleMinNumFrames),
		TileSampleStrideHeight:    u(t.TileSampleStrideHeight),
		TileSampleStrideWidth:     u(t.TileSampleStrideWidth),
		TileSampleStrideNumFrames: u(t.TileSampleStrideNumFrames),
	}
}

// tiling returns the tiling of a stage on an input of shape in: the request's when it states
// one (forced, whatever the cap), else the one the model chooses from what the memory cap
// leaves beside the weights (causalvae.AutoTiling; a cap too small for the smallest tile fails
// here, before any work). The choice is logged and reported in the result.
func (w *worker) tiling(m *causalvae.Model, req *workerkit.VAETiling, in [5]int, encode bool, log *logrus.Entry) (causalvae.Tiling, *workerkit.VAETilingUsed, error) {
	var (
		ch     causalvae.TilingChoice
		budget int64
		err    error
	)
	if req != nil {
		var capped bool
		if budget, capped, err = m.Budget(); err != nil || !capped {
			budget = math.MaxInt64
		}
		if ch, err = m.Estimate(in, tilingFrom(req), encode, m.Footprint()); err != nil {
			return causalvae.Tiling{}, nil, err
		}
	} else if ch, budget, err = m.AutoTiling(in, encode); err != nil {
		return causalvae.Tiling{}, nil, err
	}
	used := &workerkit.VAETilingUsed{Tiling: wireTiling(ch.Tiling), Chosen: req == nil,
		PeakEstimateBytes: uint64(max(ch.PeakBytes, 0)), Runs: modelrt.Uint32(ch.Runs)}
	if budget != math.MaxInt64 {
		used.BudgetBytes = uint64(max(budget, 0))
	}
	f := log.WithFields(logrus.Fields{"tiling": ch.String(), "chosen": used.Chosen, "tile_px": ch.TilePx,
		"peak_estimate_bytes": ch.PeakBytes, "budget_bytes": used.BudgetBytes})
	if req != nil && used.BudgetBytes > 0 && ch.PeakBytes > budget {
		f.Warn("the requested tiling's estimated peak is over what the memory cap leaves")
	} else {
		f.Info("vae tiling")
	}
	return ch.Tiling, used, nil
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
func (w *worker) encode(ctx context.Context, m *causalvae.Model, req *workerkit.VAEEncodeRequest, emit workerkit.Emit, start time.Time, log *logrus.Entry) (*workerkit.Result, error) {
	if err := tensorio.CheckFloatOutput("latents", req.Latents); err != nil {
		return nil, err
	}
	x, err := readVolume("pixels", req.Pixels)
	if err != nil {
		return nil, err
	}
	// With independent runs the tiling is chosen for one run's frames.
	n := int(req.IndependentFrames)
	runShape := x.Shape
	if n > 0 {
		runShape[2] = min(runShape[2], n)
	}
	tiling, used, err := w.tiling(m, req.Tiling, runShape, true, log)
	if err != nil {
		return nil, fmt.Errorf("pixels: %w", err)
	}
	shape, err := m.ChunkedShape(x.Shape, n, tiling)
	if err != nil {
		return nil, fmt.Errorf("pixels: %w", err)
	}
	outs, err := tensorio.Create([]tensorio.Output{volumeOutput("latents", req.Latents, shape), volumeOutput("logvar", logvarRef(req), shape)})
	if err != nil {
		return nil, err
	}
	defer outs.Abort()
	mv, lv, err := m.EncodeChunks(ctx, x, n, causalvae.RunOptions{Tiling: tiling, Progress: w.progress(ctx, "encode", emit, start)})
	if err != nil {
		return nil, err
	}
	if err := w.base.InjectedOOM(); err != nil {
		return nil, err
	}
	if err := put(outs, 0, mv, shape); err != nil {
		return nil, err
	}
	if err := put(outs, 1, lv, shape); err != nil {
		return nil, err
	}
	written, err := outs.Commit()
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written, VAETiling: used}, nil
}

// decode takes unscaled latents (already divided by scaling_factor) and writes pixels.
func (w *worker) decode(ctx context.Context, m *causalvae.Model, req *workerkit.VAEDecodeRequest, emit workerkit.Emit, start time.Time, log *logrus.Entry) (*workerkit.Result, error) {
	if err := tensorio.CheckFloatOutput("pixels", req.Pixels); err != nil {
		return nil, err
	}
	z, err := readVolume("latents", req.Latents)
	if err != nil {
		return nil, err
	}
	tiling, used, err := w.tiling(m, req.Tiling, z.Shape, false, log)
	if err != nil {
		return nil, fmt.Errorf("latents: %w", err)
	}
	shape, err := m.DecodedShape(z.Shape, tiling)
	if err != nil {
		return nil, fmt.Errorf("latents: %w", err)
	}
	outs, err := tensorio.Create([]tensorio.Output{volumeOutput("pixels", req.Pixels, shape)})
	if err != nil {
		return nil, err
	}
	defer outs.Abort()
	dst, direct, err := target(outs, 0, shape)
	if err != nil {
		return nil, err
	}
	opts := causalvae.RunOptions{Tiling: tiling, Progress: w.progress(ctx, "decode", emit, start)}
	if err := m.DecodeInto(ctx, z, opts, dst); err != nil {
		return nil, err
	}
	if err := w.base.InjectedOOM(); err != nil {
		return nil, err
	}
	if !direct {
		if err := put(outs, 0, dst, shape); err != nil {
			return nil, err
		}
	}
	written, err := outs.Commit()
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written, VAETiling: used}, nil
}

// ---- Stats ----------------------------------------------------------------------------

// Stats reports the runtime's memory, the conv chain's counters, op counts and timings.
func (w *worker) Stats(context.Context) (*workerkit.Stats, error) {
	return w.base.Stats(), nil
}
