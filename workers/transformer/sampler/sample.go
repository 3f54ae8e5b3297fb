package sampler

import (
	"context"
	"fmt"
	"math"
)

// DefaultTeaCacheThreshold is the reference's rel_l1_thresh (0.15: about 2.1× faster).
const DefaultTeaCacheThreshold = 0.15

// Options are sample_hunyuan's settings for one section.
type Options struct {
	// Steps is num_inference_steps (FramePack: 25).
	Steps int
	// Shift, when positive, fixes mu = ln(Shift); 0 derives mu from the sequence length
	// (FramePack's default).
	Shift float64
	// Guidance holds gs (distilled), cfg (real) and rs (rescale). FramePack: 10, 1, 0.
	Guidance Guidance
	// Variant is UniPC's B(h) (FramePack: bh1).
	Variant Variant
	// DType is the dtype fm_wrapper casts the model's inputs to (FramePack: bf16).
	DType DType
	// TeaCache enables the model's TeaCache with threshold TeaCacheThreshold (0 means the
	// reference's 0.15). The model must implement TeaCacheModel.
	TeaCache          bool
	TeaCacheThreshold float64
	// MagCache enables the model's MagCache (its settings are the model's); not with TeaCache.
	// The model must implement MagCacheModel.
	MagCache bool
	// InitialLatent, when set, starts from InitialLatent·(1−σ0) + noise·σ0 with the sigmas
	// scaled by Strength (sample_hunyuan's initial_latent and strength; FramePack's i2v app does
	// not use it).
	InitialLatent []float32
	Strength      float64
	// OnStep is called after every step (previews, progress, cancellation); may be nil.
	OnStep StepFunc
}

// DefaultOptions returns the reference app's settings: 25 steps, gs 10, cfg 1, rs 0, bh1, bf16,
// no TeaCache.
func DefaultOptions() Options {
	return Options{Steps: 25, Guidance: Guidance{Distilled: 10, CFG: 1}, Variant: BH1, DType: BF16}
}

// Request is one section to sample.
type Request struct {
	// Noise is the initial latent, Shape's element count of float32: torch.randn(Shape) on the
	// job's generator (torchrng.Generator.Randn(Shape.Ints()) reproduces it).
	Noise []float32
	Shape Shape
	// Positive and Negative are the two conditioning branches; Negative is needed only when
	// Guidance.CFG ≠ 1.
	Positive, Negative *Conditioning
	Options
}

// Plan is what Sample will do for a request: the schedule and the UniPC order.
type Plan struct {
	SeqLength int       // T·H·W // 4
	Mu        float64   // the flux time shift's mu
	Sigmas    []float32 // steps+1 values, the last 0
	Order     int       // UniPC's order after the warm-up steps
}

// PlanFor computes a request's schedule without running the model.
func PlanFor(shape Shape, opts Options) (Plan, error) {
	if err := shape.validate(); err != nil {
		return Plan{}, err
	}
	if opts.Steps < 1 {
		return Plan{}, fmt.Errorf("%w: steps %d < 1", ErrBadRequest, opts.Steps)
	}
	p := Plan{SeqLength: SeqLength(shape)}
	switch {
	case opts.Shift > 0 && !math.IsInf(opts.Shift, 0):
		p.Mu = ShiftMu(opts.Shift)
	case opts.Shift == 0:
		p.Mu = FluxMu(p.SeqLength)
	default:
		return Plan{}, fmt.Errorf("%w: shift %v", ErrBadRequest, opts.Shift)
	}
	var err error
	if p.Sigmas, err = Sigmas(opts.Steps, p.Mu); err != nil {
		return Plan{}, err
	}
	p.Order = max(0, min(MaxOrder, opts.Steps-1))
	return p, nil
}

// Sample is sample_hunyuan with the UniPC sampler: it samples one section and returns its
// latents (the last data prediction), float32 of req.Shape.
func Sample(ctx context.Context, model Model, req Request) ([]float32, error) {
	plan, err := PlanFor(req.Shape, req.Options)
	if err != nil {
		return nil, err
	}
	n := req.Shape.Numel()
	if len(req.Noise) != n {
		return nil, fmt.Errorf("%w: noise has %d values, shape %v needs %d", ErrBadRequest, len(req.Noise), req.Shape, n)
	}
	x := append([]float32(nil), req.Noise...)
	sigmas := plan.Sigmas
	if req.InitialLatent != nil {
		if len(req.InitialLatent) != n {
			return nil, fmt.Errorf("%w: initial latent has %d values, want %d", ErrBadRequest, len(req.InitialLatent), n)
		}
		if !(req.Strength >= 0 && req.Strength <= 1) {
			return nil, fmt.Errorf("%w: strength %v not in [0, 1]", ErrBadRequest, req.Strength)
		}
		s := float32(req.Strength)
		for i := range sigmas {
			sigmas[i] = float32(sigmas[i] * s)
		}
		first := sigmas[0]
		keep := 1 - first
		for i, v := range req.InitialLatent {
			x[i] = float32(v*keep) + float32(x[i]*first)
		}
	}
	denoise, err := FlowMatchDenoiser(model, req.Shape, req.Positive, req.Negative, req.Guidance, req.DType)
	if err != nil {
		return nil, err
	}
	if req.TeaCache && req.MagCache {
		return nil, fmt.Errorf("%w: TeaCache and MagCache both requested; use one", ErrBadRequest)
	}
	if mc, ok := model.(MagCacheModel); ok {
		if err := mc.InitializeMagCache(req.MagCache, req.Steps, req.Shape); err != nil {
			return nil, fmt.Errorf("%w: magcache: %w", ErrBadRequest, err)
		}
	} else if req.MagCache {
		return nil, fmt.Errorf("%w: MagCache requested but the model has none", ErrBadRequest)
	}
	if tc, ok := model.(TeaCacheModel); ok {
		th := req.TeaCacheThreshold
		if th == 0 {
			th = DefaultTeaCacheThreshold
		}
		tc.InitializeTeaCache(req.TeaCache, req.Steps, th)
	} else if req.TeaCache {
		return nil, fmt.Errorf("%w: TeaCache requested but the model has none", ErrBadRequest)
	}
	out, err := UniPC(ctx, denoise, x, sigmas, req.Variant, req.OnStep)
	if err != nil {
		return nil, fmt.Errorf("sample section: %w", err)
	}
	return out, nil
}
