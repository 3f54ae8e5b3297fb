package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/lora"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// worker serves transformer_section and transformer_forward stages.
type worker struct {
	base *modelrt.Base
	log  *logrus.Entry

	// mu protects rt, model and dtype; Run holds it for the whole stage (Stats does not take it).
	mu    sync.Mutex
	rt    *runtime.Runtime
	model *dit.Model
	dtype sampler.DType
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	base := modelrt.New(k, modelrt.Config{Name: "transformer", Conv: true, Loras: true, BlockStack: "transformer blocks"}) // x_embedder is a Conv3d
	return &worker{base: base, log: base.Log}
}

// classify maps an error to the worker error the supervisor acts on.
func classify(err error) error {
	return modelrt.Classify(err, dit.ErrMemoryBudget, lora.ErrInvalid, dit.ErrInvalidInput, dit.ErrUnsupportedConfig, dit.ErrBadCheckpoint, sampler.ErrBadRequest)
}

// Traits declares the model's traits before a Load succeeds (workerkit.TraitsDeclarer).
func (w *worker) Traits() *workerkit.ModelTraits { return w.base.Traits() }

// Load opens the runtime of req.Backend and loads the transformer from req.ModelDir.
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.model != nil {
		return nil, classify(workerkit.InvalidArgumentf("load: already loaded"))
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, classify(workerkit.InvalidArgumentf("load: model_dir is required"))
	}
	rt, err := w.base.Open(req)
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	// Activations in bf16 on a GPU (FramePack's transformer dtype), fp32 on the cpu, unless the
	// request or the activation test knob says otherwise; dtype says what the weight matrices
	// are kept in ("fp16"/"bf16", or "auto": the checkpoint's own dtype). fm_wrapper rounds the
	// model's inputs (x, timestep, guidance) to the activation dtype, as the reference does to
	// its model dtype; in fp32 there is nothing to round. The sampler's state stays float32.
	act, wdt, err := w.base.Activation(req, rt, dit.FramePackDType)
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	switch act {
	case runtime.BF16:
		w.dtype = sampler.BF16
	case runtime.F16:
		w.dtype = sampler.F16
	default:
		w.dtype = sampler.F32
	}
	lopts, err := residencyOptions(rt, req, wdt, act)
	if err == nil {
		err = weightOptions(rt, req, &lopts)
	}
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	m, applied, err := loadModel(rt, req, lopts)
	if err != nil {
		rt.Close()
		return nil, modelrt.ClassifyLoad(fmt.Errorf("load %s: %w", req.ModelDir, err))
	}
	w.rt, w.model = rt, m
	resp := w.base.Loaded(rt, start, m.WeightBytes())
	resp.Transformer = transformerInfo(m)
	resp.Loras = applied
	modelrt.SetResidency(resp, m.ResidentBlocks(), m.StreamedBlocks())
	if m.FP8Format != fp8.None {
		resp.WeightsFormat, resp.FP8Compute = string(m.FP8Format), req.FP8Compute
		if resp.FP8Compute == "" {
			resp.FP8Compute = runtime.FP8WeightOnly.String()
		}
	}
	for _, a := range applied {
		w.log.WithFields(logrus.Fields{"lora": a.Path, "strength": a.Strength, "format": a.Format,
			"weights_changed": a.WeightsChanged}).Info("lora merged")
	}
	cfg := m.Config
	w.log.WithFields(logrus.Fields{"params": m.NumParams(), "bytes": m.WeightBytes(), "staged_bytes": m.StagedBytes(), "weights": wdt.String(), "activations": act.String(), "double_blocks": cfg.NumLayers,
		"single_blocks": cfg.NumSingleLayers, "heads": cfg.NumAttentionHeads, "head_dim": cfg.AttentionHeadDim,
		"resident_blocks": m.ResidentBlocks(), "streamed_blocks": m.StreamedBlocks(), "streamed_bytes": m.StreamedBytes(),
		"memory_cap": req.MemoryCapBytes, "fp8": string(m.FP8Format), "checkpoint": req.Checkpoint, "activations_estimate": lopts.ActivationBytes, "max_resident_blocks": req.MaxResidentBlocks,
		"transparent_hugepages": nn.TransparentHugePages(), "elapsed": resp.LoadDuration}).Info("model loaded")
	for _, n := range m.Unexpected {
		w.log.WithField("tensor", n).Warn("unexpected tensor in checkpoint")
	}
	return resp, nil
}

// residencyOptions are the load options that plan block residency for req: the memory cap
// (with none, on a GPU, the device's free memory, as FramePack plans against it), the larger
// of the workload's activation estimate and its reserve (gpu_memory_preservation_gb) kept
// free beside the weights, and max_resident_blocks. A cap too small for the model with every
// block streamed fails in Load, before anything loads.
func residencyOptions(rt *runtime.Runtime, req *workerkit.LoadRequest, wdt, act runtime.DType) (dit.LoadOptions, error) {
	opts := dit.LoadOptions{WeightDType: wdt, ActivationDType: act, MemoryCap: int64(min(req.MemoryCapBytes, math.MaxInt64)), MaxResidentBlocks: int(req.MaxResidentBlocks)}
	w := req.Workload
	if w == nil {
		return opts, nil
	}
	cfg, err := dit.LoadConfig(req.ModelDir)
	if err != nil {
		return opts, fmt.Errorf("load transformer: %w", err)
	}
	est := cfg.ActivationBytes(dit.Workload{Height: int(w.Height), Width: int(w.Width), LatentWindowSize: int(w.LatentWindowSize), ActivationDType: act})
	opts.ActivationBytes = max(est, int64(min(w.ReserveBytes, math.MaxInt64)))
	if opts.MemoryCap == 0 && w.ReserveBytes > 0 {
		// ErrUnsupported on cpu: no device to run out of, every block stays resident.
		if free, _, err := rt.DeviceMemory(); err == nil {
			opts.MemoryCap = int64(min(free, math.MaxInt64))
		}
	}
	return opts, nil
}

// weightOptions applies req's weight choices to opts: the single-file checkpoint (which must be a
// file), quantization at load ("fp8") and the fp8 compute mode.
func weightOptions(rt *runtime.Runtime, req *workerkit.LoadRequest, opts *dit.LoadOptions) error {
	switch req.Weights {
	case "":
	case "fp8":
		opts.QuantizeLinear = true
	default:
		return workerkit.InvalidArgumentf("weights %q: want empty (as stored) or fp8", req.Weights)
	}
	mode, err := runtime.ParseFP8Compute(req.FP8Compute)
	if err != nil {
		return workerkit.InvalidArgumentf("fp8_compute: %v", err)
	}
	rt.SetFP8Compute(mode)
	if req.Checkpoint != "" {
		st, err := os.Stat(req.Checkpoint)
		switch {
		case err != nil:
			return workerkit.InvalidArgumentf("checkpoint: %v", err)
		case st.IsDir():
			return workerkit.InvalidArgumentf("checkpoint %s is a folder, want one .safetensors file", req.Checkpoint)
		}
		opts.Checkpoint = req.Checkpoint
	}
	return nil
}

// loadModel loads the transformer of req.ModelDir with req.Loras merged into its weights as
// they are read (see workers/transformer/lora), so the weights' storage (dtype, residency) is
// the same with LoRAs as without.
func loadModel(rt *runtime.Runtime, req *workerkit.LoadRequest, opts dit.LoadOptions) (*dit.Model, []workerkit.LoraApplied, error) {
	if len(req.Loras) == 0 {
		m, err := dit.Load(rt, req.ModelDir, opts)
		return m, nil, err
	}
	cfg, err := dit.LoadConfig(req.ModelDir)
	if err != nil {
		return nil, nil, fmt.Errorf("load transformer: %w", err)
	}
	ck, err := dit.OpenWeights(req.ModelDir, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("load transformer: %w", err)
	}
	defer ck.Close()
	specs := make([]lora.Spec, len(req.Loras))
	for i, l := range req.Loras {
		specs[i] = lora.Spec{Path: l.Path, Strength: l.Strength}
	}
	// Weights kept as stored keep a merged weight in the checkpoint's dtype too.
	src, applied, err := lora.Merge(ck, specs, lora.Options{KeepDType: opts.WeightDType == runtime.AsStored, MatMul: runtimeMatMul(rt)})
	if err != nil {
		return nil, nil, err
	}
	m, err := dit.New(rt, cfg, src, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("load transformer %s: %w", filepath.Base(ck.Path), err)
	}
	out := make([]workerkit.LoraApplied, len(applied))
	for i, a := range applied {
		out[i] = workerkit.LoraApplied{Path: a.Path, Strength: a.Strength, Format: string(a.Format), WeightsChanged: uint32(a.WeightsChanged)}
	}
	return m, out, nil
}

// runtimeMatMul computes a LoRA's up @ down with the runtime's GEMM (OpenBLAS, or the GPU).
func runtimeMatMul(rt *runtime.Runtime) func(up []float32, rows, rank int, down []float32, in int) ([]float32, error) {
	return func(up []float32, rows, rank int, down []float32, in int) ([]float32, error) {
		a, err := rt.FromFloat32(up, rows, rank)
		if err != nil {
			return nil, err
		}
		defer a.Free()
		b, err := rt.FromFloat32(down, rank, in)
		if err != nil {
			return nil, err
		}
		defer b.Free()
		c, err := rt.MatMul(a, b, runtime.GemmParams{})
		if err != nil {
			return nil, err
		}
		defer c.Free()
		return c.Float32()
	}
}

// transformerInfo is the model's constants as LoadResponse reports them to the supervisor.
func transformerInfo(m *dit.Model) *workerkit.TransformerInfo {
	u := modelrt.Uint32
	c := m.Config
	info := &workerkit.TransformerInfo{
		InChannels: u(c.InChannels), OutChannels: u(c.OutChannelsOrIn()), PatchSize: u(c.PatchSize), PatchSizeT: u(c.PatchSizeT),
		TextEmbedDim: u(c.TextEmbedDim), PooledProjectionDim: u(c.PooledProjectionDim),
		NumLayers: u(c.NumLayers), NumSingleLayers: u(c.NumSingleLayers), HasCleanXEmbedder: m.CleanXEmbedder != nil,
	}
	if m.ImageProjection != nil {
		info.ImageProjDim = u(c.ImageProjDim)
	}
	return info
}

// Run serves one transformer_section or transformer_forward stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.model == nil {
		return nil, classify(workerkit.InvalidArgumentf("run: not loaded"))
	}
	start := time.Now()
	defer w.base.AddCompute(start)
	log := w.log.WithField("job", req.JobID)
	var stage string
	var res *workerkit.Result
	var err error
	switch s := req.Stage.(type) {
	case *workerkit.TransformerSectionRequest:
		stage = "transformer_section"
		res, err = w.section(ctx, s, emit, start, log.WithField("stage", stage))
	case *workerkit.TransformerForwardRequest:
		stage = "transformer_forward"
		res, err = w.forward(ctx, s, emit, start, log.WithField("stage", stage))
	default:
		return nil, classify(workerkit.InvalidArgumentf("run: the transformer worker runs transformer_section and transformer_forward stages, not %T", req.Stage))
	}
	log = log.WithField("stage", stage)
	if err != nil {
		err = classify(fmt.Errorf("%s: %w", stage, err))
		log.WithError(err).Warn("stage failed")
		return nil, err
	}
	log.WithField("elapsed", time.Since(start)).Info("stage done")
	return res, nil
}

// Stats reports the runtime's memory, op counts and timings.
func (w *worker) Stats(ctx context.Context) (*workerkit.Stats, error) {
	return w.base.Stats(), nil
}
