package main

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

var _ workerkit.Estimator = (*worker)(nil)

// Estimate sizes the VAE for req's workload without loading it: its weights plus the peak of
// the tiling an automatic choice would run, for the decode of the most latent frames the job
// decodes at once and for the encode of one frame, whichever holds more: the tiling of least
// work for the fastest configuration, the smallest tiles for the least. The tiling the loaded
// worker chooses under a cap is the one these figures stand for (AutoTiling from the same
// candidates).
func (w *worker) Estimate(_ context.Context, req *workerkit.EstimateRequest) (*workerkit.EstimateResponse, error) {
	lr := &req.Load
	if lr.ModelDir == "" {
		return nil, classify(workerkit.InvalidArgumentf("estimate: model_dir is required"))
	}
	act, wdt, err := modelrt.EstimateDTypes(lr, causalvae.FramePackDType)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w", err))
	}
	cfg, _, err := causalvae.LoadConfig(lr.ModelDir)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w: %w", causalvae.ErrCheckpoint, err))
	}
	ck, err := safetensors.OpenCheckpoint(lr.ModelDir)
	if err != nil {
		return nil, classify(fmt.Errorf("estimate: %w: %w", causalvae.ErrCheckpoint, err))
	}
	defer ck.Close()
	weights := causalvae.EstimateWeights(cfg, ck, causalvae.Options{DType: act, WeightDType: wdt})
	resp := &workerkit.EstimateResponse{WeightBytes: modelrt.Bytes(weights), MinDeviceBytes: modelrt.Bytes(weights),
		FullDeviceBytes: modelrt.Bytes(weights)}
	wl := lr.Workload
	if wl == nil || wl.Height == 0 || wl.Width == 0 {
		return resp, nil
	}
	convW := wdt
	if convW == runtime.AsStored {
		convW = runtime.F32
		if info, ok := ck.Info("decoder.conv_out.conv.weight"); ok {
			convW = runtime.StoredDType(info.DType)
		}
	}
	o := causalvae.FootprintFor(lr.Backend, act, convW)
	frames := int(req.VAEDecodeLatentFrames)
	if frames == 0 {
		frames = int(max(wl.LatentWindowSize, 1))
	}
	r := cfg.SpatialCompressionRatio
	h, wd := int(wl.Height), int(wl.Width)
	for _, in := range []struct {
		shape  [5]int
		encode bool
	}{
		{[5]int{1, cfg.LatentChannels, frames, h / r, wd / r}, false},
		{[5]int{1, cfg.InChannels, 1, h, wd}, true},
	} {
		fastest, least, err := cfg.Need(in.shape, in.encode, o)
		if err != nil {
			return nil, classify(fmt.Errorf("estimate: %w", err))
		}
		resp.FullDeviceBytes = max(resp.FullDeviceBytes, modelrt.Bytes(weights+fastest.PeakBytes))
		resp.MinDeviceBytes = max(resp.MinDeviceBytes, modelrt.Bytes(weights+least.PeakBytes))
	}
	return resp, nil
}
