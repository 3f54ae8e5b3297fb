package sampler

import (
	"errors"
	"fmt"
	"math"
)

// The reference's calculate_flux_mu constants: mu is linear through (256, 0.5) and
// (4096, 1.15) in the sequence length, capped at ln(exp_max) with exp_max = 7.
const (
	fluxX1     = 256.0
	fluxY1     = 0.5
	fluxX2     = 4096.0
	fluxY2     = 1.15
	fluxExpMax = 7.0
)

// ErrBadRequest is returned (wrapped) for a request the sampler cannot run: a bad shape, step
// count, scale, missing conditioning or a noise buffer of the wrong size.
var ErrBadRequest = errors.New("bad sampler request")

// FluxMu is calculate_flux_mu(seqLen): the flow shift's mu for a sequence of seqLen tokens.
func FluxMu(seqLen int) float64 {
	k := (fluxY2 - fluxY1) / (fluxX2 - fluxX1)
	b := fluxY1 - k*fluxX1
	mu := k*float64(seqLen) + b
	return math.Min(mu, math.Log(fluxExpMax))
}

// ShiftMu is the mu of an explicit shift (sample_hunyuan's shift argument): ln(shift).
func ShiftMu(shift float64) float64 { return math.Log(shift) }

// SeqLength is sample_hunyuan's seq_length for a latent of shape [B, C, T, H, W]: T·H·W // 4.
func SeqLength(s Shape) int { return s.T() * s.H() * s.W() / 4 }

// Sigmas returns get_flux_sigmas_from_mu(steps, mu): torch.linspace(1, 0, steps+1) in float32
// through the flux time shift e^mu / (e^mu + (1/t − 1)), computed with the reference's float32
// tensor operations (Python's scalar / tensor is reciprocal then multiply). It has steps+1
// values, from about 1 down to exactly 0.
func Sigmas(steps int, mu float64) ([]float32, error) {
	if steps < 1 {
		return nil, fmt.Errorf("%w: steps %d < 1", ErrBadRequest, steps)
	}
	if math.IsNaN(mu) || math.IsInf(mu, 0) {
		return nil, fmt.Errorf("%w: mu %v", ErrBadRequest, mu)
	}
	t := linspace32(1, 0, steps+1)
	em := float32(math.Exp(mu))
	out := make([]float32, len(t))
	for i, ti := range t {
		r := 1 / ti // reciprocal (×1)
		r -= 1      // − 1, then ** 1.0 (identity)
		d := em + r
		out[i] = float32((1 / d) * em) // e^mu / d: reciprocal(d) × e^mu
	}
	return out, nil
}

// linspace32 is torch.linspace(start, end, steps) for float32 on CPU (its scalar loop): the
// first half counts up from start, the second half down from end.
func linspace32(start, end float32, steps int) []float32 {
	out := make([]float32, steps)
	if steps == 1 {
		out[0] = start
		return out
	}
	step := (end - start) / float32(steps-1)
	half := steps / 2
	for i := range out {
		if i < half {
			out[i] = start + float32(step*float32(i))
		} else {
			out[i] = end - float32(step*float32(steps-i-1))
		}
	}
	return out
}
