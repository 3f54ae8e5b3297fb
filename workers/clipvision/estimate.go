package main

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/clipvision/siglip"
)

var _ workerkit.Estimator = (*worker)(nil)

// activationFactor is how many [patches, hidden] activations an encoder layer holds at once at
// its peak (x, the normed input, q/k/v, the attention output, the 4·hidden MLP activation) with
// room for the runtime's rounding.
const activationFactor = 16

// Estimate sizes SigLIP without loading it: every weight but the pooling head (which Load
// skips), plus one layer's activations over the image's patches and the f32 attention scores
// of every head. Nothing streams: the least and the fastest configuration are the same.
func (w *worker) Estimate(_ context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error) {
	lr := &req.Load
	act, wdt, err := modelrt.EstimateDTypes(lr, siglip.FramePackDType)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w", err))
	}
	encDir, _, err := modelDirs(lr.ModelDir)
	if err != nil {
		return nil, err
	}
	cfg, err := siglip.LoadConfig(encDir)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w", err))
	}
	weights, err := modelrt.CheckpointBytes(encDir, wdt, "head.", "vision_model.head.")
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate: %w", err))
	}
	l, d := int64(cfg.NumPatches()), int64(cfg.HiddenSize)
	acts := activationFactor*l*d*int64(act.Size()) + int64(cfg.NumAttentionHeads)*l*l*4 +
		int64(cfg.NumChannels*cfg.ImageSize*cfg.ImageSize)*4
	n := modelrt.Bytes(weights + acts)
	return &workerkit.EstimateResponse{WeightBytes: modelrt.Bytes(weights), MinDeviceBytes: n, FullDeviceBytes: n}, nil
}
