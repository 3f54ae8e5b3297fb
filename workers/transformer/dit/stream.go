package dit

import (
	"errors"
	"fmt"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// ErrMemoryBudget: the memory cap cannot hold the model even with every block streamed (the
// weights outside the blocks, the slots two blocks are streamed through and the activations).
// A lower cap or fewer resident blocks cannot help; a larger cap or a smaller job can.
var ErrMemoryBudget = errors.New("memory cap too small for the transformer")

// Footprint is what the model holds in the runtime's memory, by part: what the residency plan
// is computed from before anything is loaded.
type Footprint struct {
	// Base is every weight outside the double and single blocks (embedders, refiner, norm_out,
	// proj_out).
	Base int64
	// Double and Single are the bytes of one double and one single block.
	Double, Single int64
	// NumDouble and NumSingle are the number of blocks of each kind.
	NumDouble, NumSingle int
}

// Blocks is the number of double and single blocks.
func (f Footprint) Blocks() int { return f.NumDouble + f.NumSingle }

// split returns how many double and single blocks stay resident when resident blocks do:
// double blocks first, then single ones, in order.
func (f Footprint) split(resident int) (double, single int) {
	double = min(resident, f.NumDouble)
	single = min(max(resident-f.NumDouble, 0), f.NumSingle)
	return double, single
}

// Need is the memory the weights take with resident blocks resident and the rest streamed: the
// resident weights plus the streaming slots (two of the kind being streamed, one when only one
// block of it streams; the double blocks' slots are freed before the single blocks' are made).
func (f Footprint) Need(resident int) int64 {
	d, s := f.split(resident)
	slots := max(int64(min(2, f.NumDouble-d))*f.Double, int64(min(2, f.NumSingle-s))*f.Single)
	return f.Base + int64(d)*f.Double + int64(s)*f.Single + slots
}

// Plan returns how many blocks stay resident under memCap (0: no cap) with activations bytes
// of activations, at most maxResident (0: no limit): the most that fit. It fails with
// ErrMemoryBudget when not even streaming every block fits.
func (f Footprint) Plan(memCap, activations int64, maxResident int) (int, error) {
	limit := f.Blocks()
	if maxResident > 0 {
		limit = min(limit, maxResident)
	}
	if memCap <= 0 {
		return limit, nil
	}
	for r := limit; r >= 0; r-- {
		if f.Need(r)+activations <= memCap {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w: the cap is %d bytes; streaming every block needs %d (%d of weights outside the blocks, "+
		"%d for the slots blocks stream through, %d kept free for activations: the larger of their estimate and gpu_memory_preservation_gb)", ErrMemoryBudget, memCap,
		f.Need(0)+activations, f.Base, f.Need(0)-f.Base, activations)
}

// EstimateFootprint sizes the model of cfg as New would load it from src (nil: random
// weights, F32 unless opts.WeightDType says otherwise) without loading anything.
func EstimateFootprint(cfg Config, src nn.Source, opts LoadOptions) (Footprint, error) {
	if err := cfg.Validate(); err != nil {
		return Footprint{}, err
	}
	size := func(bind func(l *nn.Loader)) int64 {
		l := nn.NewShapeLoaderFor(nn.Options{DType: opts.ActivationDType, WeightDType: opts.WeightDType, QuantizeLinear: opts.QuantizeLinear})
		bind(l)
		return l.ShapeBytes(src, "")
	}
	f := Footprint{NumDouble: cfg.NumLayers, NumSingle: cfg.NumSingleLayers}
	// Block 0 of each kind stands for all of them: same shapes, and a sharded checkpoint keeps
	// one dtype per kind of tensor.
	if f.NumDouble > 0 {
		f.Double = size(func(l *nn.Loader) { bindDoubleBlock(l, "transformer_blocks.0", cfg) })
	}
	if f.NumSingle > 0 {
		f.Single = size(func(l *nn.Loader) { bindSingleBlock(l, "single_transformer_blocks.0", cfg) })
	}
	all := size(func(l *nn.Loader) { bindAll(l, cfg, nil) })
	f.Base = all - int64(f.NumDouble)*f.Double - int64(f.NumSingle)*f.Single
	return f, nil
}

// Workload is the job a transformer is loaded for, as far as its activations' size goes.
type Workload struct {
	// Height and Width are the video's size in pixels (the VAE makes 8 × 8 pixels one latent).
	Height, Width int
	// LatentWindowSize is the number of latent frames sampled per section (FramePack's 9).
	LatentWindowSize int
	// ActivationDType is the activation dtype the forward runs in (the zero value is F32).
	ActivationDType runtime.DType
}

// vaeScale is the VAE's spatial compression: pixels per latent along height and width.
const vaeScale = 8

// Tokens is the joint sequence length of one forward: the noisy window plus FramePack's clean
// context (two 1x latent frames, one 2x-pooled and four 4x-pooled frames), 512 text tokens and
// 729 SigLIP tokens at most.
func (c Config) Tokens(w Workload) int {
	p := max(c.PatchSize, 1)
	lh, lw := ceilDiv(w.Height, vaeScale), ceilDiv(w.Width, vaeScale)
	frame := ceilDiv(lh, p) * ceilDiv(lw, p)
	img := frame*(w.LatentWindowSize+2) + ceilDiv(lh, 2*p)*ceilDiv(lw, 2*p) + 4*ceilDiv(lh, 4*p)*ceilDiv(lw, 4*p)
	return img + 512 + 729
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// activationFactor is how many [L, dim] activation tensors a block holds at once at its peak:
// a single block keeps x, the modulated input, q/k/v, the attention output and the 4·dim MLP
// activation (twice while GELU runs) and then their 5·dim concatenation; 16 covers that with
// room for the outer stream and the attention's chunked scores.
const activationFactor = 16

// ActivationBytes estimates the activations one forward holds at its peak for w:
// activationFactor [L, dim] tensors in w.ActivationDType plus the f32 rope tables (the joint one
// and its image rows). It is an estimate: the
// OOM ladder's resident-block rungs catch an underestimate.
func (c Config) ActivationBytes(w Workload) int64 {
	if w.Height <= 0 || w.Width <= 0 || w.LatentWindowSize <= 0 {
		return 0
	}
	l := int64(c.Tokens(w))
	es := int64(w.ActivationDType.Size())
	return l * (es*activationFactor*int64(c.InnerDim()) + 4*4*int64(c.AttentionHeadDim))
}
