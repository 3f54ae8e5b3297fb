package main

import (
	"context"
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/transformer/dit"
)

var _ workerkit.Estimator = (*worker)(nil)

// Estimate sizes the transformer for req's workload without loading it (the residency plan's
// own numbers, dit.Footprint): all blocks resident for the fastest configuration, every block
// streamed through two slots for the least, each with the workload's activation estimate (or
// its reserve, when larger) beside the weights. LoRAs merged at load change no size. The weights
// are sized as Load would hold them: the single-file checkpoint when the request names one, 8-bit
// weights at 8 bits, and quantized at load (weights "fp8") at 8 bits with their scales.
func (w *worker) Estimate(_ context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error) {
	lr := &req.Load
	if lr.ModelDir == "" {
		return nil, classify(workerkit.InvalidArgumentf("estimate: model_dir is required"))
	}
	act, wdt, err := modelrt.EstimateDTypes(lr, dit.FramePackDType)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w", err))
	}
	cfg, err := dit.LoadConfig(lr.ModelDir)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate: %w", err))
	}
	opts := dit.LoadOptions{WeightDType: wdt, ActivationDType: act, Checkpoint: lr.Checkpoint, QuantizeLinear: lr.Weights == "fp8"}
	ck, err := dit.OpenWeights(lr.ModelDir, opts)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate: %w", err))
	}
	defer ck.Close()
	f, err := dit.EstimateFootprint(cfg, ck, opts)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate: %w", err))
	}
	var acts int64
	if wl := lr.Workload; wl != nil {
		acts = cfg.ActivationBytes(dit.Workload{Height: int(wl.Height), Width: int(wl.Width), LatentWindowSize: int(wl.LatentWindowSize), ActivationDType: act})
		acts = max(acts, int64(min(wl.ReserveBytes, math.MaxInt64)))
	}
	blocks := int64(f.NumDouble)*f.Double + int64(f.NumSingle)*f.Single
	return &workerkit.EstimateResponse{
		WeightBytes:     modelrt.Bytes(f.Base + blocks),
		MinDeviceBytes:  modelrt.Bytes(f.Need(0) + acts),
		FullDeviceBytes: modelrt.Bytes(f.Need(f.Blocks()) + acts),
		HostBytesAtMin:  modelrt.Bytes(blocks),
	}, nil
}
