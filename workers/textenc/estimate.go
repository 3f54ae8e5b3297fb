package main

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/textenc/llama"
)

var _ workerkit.Estimator = (*worker)(nil)

// Estimate sizes both text encoders without loading them: CLIP-L whole (it always stays
// resident) plus Llama's layers up to the hidden state FramePack reads, every one resident for
// the fastest configuration and every one streamed for the least, with the activation estimate
// of llamaTokens positions beside them, as LoadEncoderWith plans them.
func (w *worker) Estimate(_ context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error) {
	lr := &req.Load
	if lr.ModelDir == "" {
		return nil, classify(workerkit.InvalidArgumentf("estimate: model_dir is required"))
	}
	act, wdt, err := modelrt.EstimateDTypes(lr, llama.FramePackDType)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w", err))
	}
	p := SnapshotPaths(lr.ModelDir)
	clipBytes, err := modelrt.CheckpointBytes(p.TextEncoder2, wdt)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate text_encoder_2: %w", err))
	}
	cfg, ck, err := nn.OpenDir(p.TextEncoder, llama.LoadConfig)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate text_encoder: %w", err))
	}
	defer ck.Close()
	o := llama.Options{HiddenStateIndex: LlamaHiddenStateIndex, Options: nn.Options{DType: act, WeightDType: wdt},
		ActivationBytes: cfg.ActivationBytes(llamaTokens)}
	all, least, host, err := llama.Need(cfg, ck, o)
	if err != nil {
		return nil, modelrt.ClassifyLoad(fmt.Errorf("estimate text_encoder: %w", err))
	}
	return &workerkit.EstimateResponse{
		WeightBytes:     modelrt.Bytes(clipBytes + host),
		MinDeviceBytes:  modelrt.Bytes(clipBytes + least),
		FullDeviceBytes: modelrt.Bytes(clipBytes + all),
		HostBytesAtMin:  modelrt.Bytes(host),
	}, nil
}
