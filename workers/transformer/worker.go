package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/transformer/dit"
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
	base := modelrt.New(k, modelrt.Config{Name: "transformer"})
	return &worker{base: base, log: base.Log}
}

// classify maps an error to the worker error the supervisor acts on.
func classify(err error) error {
	return modelrt.Classify(err, dit.ErrInvalidInput, dit.ErrUnsupportedConfig, dit.ErrBadCheckpoint, sampler.ErrBadRequest)
}

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
	opts, err := modelrt.RuntimeOptions(req)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	// The runtime computes in fp32 (on every backend), so fm_wrapper (which rounds the model's
	// inputs to its dtype) has nothing to round; dtype says what the weight matrices are kept in
	// ("fp16"/"bf16", or "auto": the checkpoint's own dtype).
	wdt, err := runtime.ParseWeightDType(req.DType)
	if err != nil {
		return nil, classify(workerkit.InvalidArgumentf("load: %v", err))
	}
	w.dtype = sampler.F32
	if err := modelrt.ApplyEnv(req.Env); err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	rt, err := w.base.NewRuntime(req, opts)
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	m, err := dit.Load(rt, req.ModelDir, dit.LoadOptions{WeightDType: wdt})
	if err != nil {
		rt.Close()
		return nil, modelrt.ClassifyLoad(fmt.Errorf("load %s: %w", req.ModelDir, err))
	}
	w.rt, w.model = rt, m
	resp := w.base.Loaded(rt, start, m.WeightBytes())
	resp.Transformer = transformerInfo(m)
	cfg := m.Config
	w.log.WithFields(logrus.Fields{"params": m.NumParams(), "bytes": m.WeightBytes(), "weights": wdt.String(), "double_blocks": cfg.NumLayers,
		"single_blocks": cfg.NumSingleLayers, "heads": cfg.NumAttentionHeads, "head_dim": cfg.AttentionHeadDim,
		"elapsed": resp.LoadDuration}).Info("model loaded")
	for _, n := range m.Unexpected {
		w.log.WithField("tensor", n).Warn("unexpected tensor in checkpoint")
	}
	if req.MaxResidentBlocks != 0 {
		w.log.WithField("max_resident_blocks", req.MaxResidentBlocks).Info("every block stays resident")
	}
	return resp, nil
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
