package sampler

import (
	"context"
	"fmt"
	"math"
)

// Denoiser returns the data prediction x0 for x at noise level sigma (k-diffusion's model
// signature). step is the sampler step the call belongs to. The returned slice belongs to the
// caller.
type Denoiser func(ctx context.Context, x []float32, sigma float32, step int) ([]float32, error)

// Guidance is how a FlowMatchDenoiser guides the transformer.
type Guidance struct {
	// Distilled is the distilled guidance scale (FramePack's gs), embedded as Distilled·1000.
	Distilled float64
	// CFG is the real classifier-free guidance scale; 1 runs no negative pass.
	CFG float64
	// Rescale is the CFG rescale factor (rs): 0 leaves the guided prediction as it is.
	Rescale float64
}

// FlowMatchDenoiser is the reference's fm_wrapper: it turns a velocity Model into a Denoiser.
// Each call rounds x, the timestep σ·1000 and the guidance to dtype, runs the positive branch
// (and the negative one when cfg ≠ 1), combines them as neg + cfg·(pos − neg), rescales the
// result toward the positive branch's standard deviation when rescale ≠ 0, and returns
// x0 = x − σ·v in float32, with x the rounded input.
func FlowMatchDenoiser(model Model, shape Shape, pos, neg *Conditioning, g Guidance, dtype DType) (Denoiser, error) {
	if model == nil {
		return nil, fmt.Errorf("%w: no model", ErrBadRequest)
	}
	if err := shape.validate(); err != nil {
		return nil, err
	}
	if !dtype.valid() {
		return nil, fmt.Errorf("%w: dtype %v", ErrBadRequest, dtype)
	}
	for name, v := range map[string]float64{"distilled guidance": g.Distilled, "cfg": g.CFG, "rescale": g.Rescale} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: %s %v", ErrBadRequest, name, v)
		}
	}
	if pos == nil {
		return nil, fmt.Errorf("%w: no positive conditioning", ErrBadRequest)
	}
	realCFG := g.CFG != 1
	if realCFG && neg == nil {
		return nil, fmt.Errorf("%w: cfg %v needs a negative conditioning", ErrBadRequest, g.CFG)
	}
	// torch.tensor([gs * 1000.0] * B) is float32, then .to(dtype).
	guidance := dtype.Round(float32(g.Distilled * 1000.0))
	n := shape.Numel()
	w := &fmWrapper{
		model: model, shape: shape, pos: pos, neg: neg, dtype: dtype, guidance: guidance,
		realCFG: realCFG, cfg: float32(g.CFG), rescale: g.Rescale,
		xr: make([]float32, n), vpos: make([]float32, n),
	}
	return w.denoise, nil
}

type fmWrapper struct {
	model    Model
	shape    Shape
	pos, neg *Conditioning
	dtype    DType
	guidance float32
	realCFG  bool
	cfg      float32
	rescale  float64
	xr, vpos []float32 // the rounded x and the positive prediction, reused across calls
}

// Timestep is the timestep fm_wrapper gives the model for sigma: (σ·1000 in float32).to(dtype).
func Timestep(sigma float32, dtype DType) float32 { return dtype.Round(float32(sigma * 1000.0)) }

func (w *fmWrapper) forward(ctx context.Context, x []float32, sigma float32, step int, b Branch, cond *Conditioning) ([]float32, error) {
	v, err := w.model.Forward(ctx, ForwardInput{
		X: x, Shape: w.shape, Sigma: sigma, Timestep: Timestep(sigma, w.dtype), Guidance: w.guidance,
		Branch: b, Cond: cond, Step: step,
	})
	if err != nil {
		return nil, fmt.Errorf("transformer %s pass, step %d: %w", b, step, err)
	}
	if len(v) != len(x) {
		return nil, fmt.Errorf("transformer %s pass, step %d: %d values, want %d", b, step, len(v), len(x))
	}
	return v, nil
}

func (w *fmWrapper) denoise(ctx context.Context, x []float32, sigma float32, step int) ([]float32, error) {
	if len(x) != len(w.xr) {
		return nil, fmt.Errorf("%w: x has %d values, want %d", ErrBadRequest, len(x), len(w.xr))
	}
	w.dtype.roundInto(w.xr, x)
	v, err := w.forward(ctx, w.xr, sigma, step, Positive, w.pos)
	if err != nil {
		return nil, err
	}
	copy(w.vpos, v)
	pred := make([]float32, len(x))
	if !w.realCFG {
		// pred_negative is zeros: 0 + 1·(pos − 0) is pos.
		for i, p := range w.vpos {
			pred[i] = 0 + p
		}
	} else {
		vneg, err := w.forward(ctx, w.xr, sigma, step, Negative, w.neg)
		if err != nil {
			return nil, err
		}
		for i, p := range w.vpos {
			pred[i] = vneg[i] + float32(w.cfg*(p-vneg[i]))
		}
		if w.rescale != 0 {
			rescaleCFG(pred, w.vpos, w.shape.B(), w.rescale)
		}
	}
	x0 := make([]float32, len(x))
	for i, p := range pred {
		x0[i] = w.xr[i] - float32(p*sigma)
	}
	return x0, nil
}

// rescaleCFG is rescale_noise_cfg: per batch item, scale cfg by std(text)/std(cfg) (unbiased
// std over all other dims) and mix rs of that with 1−rs of cfg, in float32.
func rescaleCFG(cfg, text []float32, batch int, rs float64) {
	per := len(cfg) / batch
	a, b := float32(rs), float32(1.0-rs)
	for k := 0; k < batch; k++ {
		c, t := cfg[k*per:(k+1)*per], text[k*per:(k+1)*per]
		ratio := std32(t) / std32(c)
		for i, v := range c {
			c[i] = float32(a*float32(v*ratio)) + float32(b*v)
		}
	}
}

// std32 is torch.std of a float32 tensor (correction 1): accumulated in float64, then float32.
func std32(v []float32) float32 {
	if len(v) < 2 {
		return float32(math.NaN())
	}
	var mean float64
	for _, x := range v {
		mean += float64(x)
	}
	mean /= float64(len(v))
	var ss float64
	for _, x := range v {
		d := float64(x) - mean
		ss += d * d
	}
	return float32(math.Sqrt(ss / float64(len(v)-1)))
}
