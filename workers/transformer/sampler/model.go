package sampler

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// Shape is a latent's shape [B, C, T, H, W].
type Shape [5]int

// B returns the batch size.
func (s Shape) B() int { return s[0] }

// C returns the channel count.
func (s Shape) C() int { return s[1] }

// T returns the latent frame count.
func (s Shape) T() int { return s[2] }

// H returns the latent height.
func (s Shape) H() int { return s[3] }

// W returns the latent width.
func (s Shape) W() int { return s[4] }

// Numel returns the number of elements (0 for an invalid shape).
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		if d <= 0 || n > (1<<40)/d {
			return 0
		}
		n *= d
	}
	return n
}

// Ints returns the shape as a slice.
func (s Shape) Ints() []int { return s[:] }

func (s Shape) validate() error {
	if s.Numel() == 0 {
		return fmt.Errorf("%w: latent shape %v", ErrBadRequest, s)
	}
	return nil
}

// LatentShape is the shape of the noise sample_hunyuan draws for a section of frames pixel frames
// at width×height: [batch, 16, (frames+3)/4, height/8, width/8].
func LatentShape(batch, width, height, frames int) Shape {
	return Shape{batch, 16, (frames + 3) / 4, height / 8, width / 8}
}

// Conditioning is one branch (positive or negative prompt) of what the transformer is
// conditioned on besides x, the timestep and the guidance. The sampler never reads it; it hands
// the branch's Conditioning to Model.Forward.
type Conditioning = conditioning.Conditioning

// Branch says which conditioning a forward pass uses.
type Branch int

const (
	// Positive is the prompt branch; it is always evaluated.
	Positive Branch = iota
	// Negative is the negative-prompt branch, evaluated only for real CFG (cfg ≠ 1).
	Negative
)

// String names the branch.
func (b Branch) String() string {
	if b == Negative {
		return "negative"
	}
	return "positive"
}

// ForwardInput is one transformer evaluation, with every value already as the reference's
// fm_wrapper hands it to the transformer (rounded to the model dtype).
type ForwardInput struct {
	// X is the noisy latent [B, C, T, H, W] (Shape), rounded to the model dtype. The model must
	// not keep or modify it after Forward returns.
	X     []float32
	Shape Shape
	// Sigma is the sampler's noise level for this evaluation (float32, unrounded).
	Sigma float32
	// Timestep is σ·1000 rounded to the model dtype: the value to embed (the same for the whole
	// batch).
	Timestep float32
	// Guidance is the distilled guidance scale ·1000 rounded to the model dtype (the guidance
	// embedding's input; 10 → 10000 → 9984 in bf16).
	Guidance float32
	// Branch and Cond are the conditioning of this pass.
	Branch Branch
	Cond   *Conditioning
	// Step is the sampler step (0-based) this evaluation belongs to, for progress and telemetry.
	Step int
}

// Model is the transformer as the sampler needs it: a flow-matching velocity prediction.
type Model interface {
	// Forward returns the predicted velocity (the flow-matching target noise − x0) for in.X, as
	// float32 of in.Shape. The sampler calls it once per step for the positive branch and, with
	// real CFG, once more for the negative branch; calls never overlap. The returned slice is
	// only read until the next call.
	Forward(ctx context.Context, in ForwardInput) ([]float32, error)
}

// TeaCacheModel is a Model with FramePack's TeaCache (the transformer skips its blocks when the
// modulated input barely changed since the last computed step). Sample calls InitializeTeaCache
// before the first forward of every section, as the reference app calls
// transformer.initialize_teacache, with enable false when TeaCache is off.
type TeaCacheModel interface {
	Model
	InitializeTeaCache(enable bool, numSteps int, relL1Threshold float64)
}

// MagCacheModel is a Model with MagCache (FramePack-Studio's magnitude-ratio step skipping,
// whose settings the model holds). Sample calls InitializeMagCache before the first forward of
// every section, with enable false when MagCache is off; shape is the section's latents'.
type MagCacheModel interface {
	Model
	InitializeMagCache(enable bool, numSteps int, shape Shape) error
}
