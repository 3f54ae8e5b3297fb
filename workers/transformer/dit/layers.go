package dit

import (
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// normEps is the eps of every LayerNorm and RMSNorm of the model.
const normEps = 1e-6

// layerNorm is the model's LayerNorm without affine (norm2, norm2_context, the AdaLN norms).
var layerNorm = nn.LayerNorm{Eps: normEps}

// FeedForward is diffusers' FeedForward: net.0 is a projection with its activation
// (GELU(tanh) for "gelu-approximate", SiLU for "linear-silu"), net.1 is Dropout, net.2 the
// output Linear.
type FeedForward struct {
	Proj nn.Linear // net.0.proj [inner, dim]
	Out  nn.Linear // net.2 [dim, inner]
	act  runtime.UnaryOp
}

func bindFeedForward(l *nn.Loader, prefix string, dim, inner int, act runtime.UnaryOp) FeedForward {
	return FeedForward{
		Proj: nn.NewLinear(l, nn.Join(prefix, "net.0.proj"), dim, inner, true),
		Out:  nn.NewLinear(l, nn.Join(prefix, "net.2"), inner, dim, true),
		act:  act,
	}
}

// Forward: x [..., dim] → [..., dim].
func (f FeedForward) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	var a *runtime.Tensor
	switch {
	case !p.OK():
	case f.act == runtime.OpGELUTanh: // net.0's projection and GELU(tanh) in one op (GEMM epilogue)
		a = f.Proj.ForwardGELU(p, x)
	default:
		h := f.Proj.Forward(p, x)
		a = p.Do(p.RT.Unary(f.act, h))
		p.Drop(h)
	}
	out := f.Out.Forward(p, a)
	p.Drop(a)
	return out
}

// modulate is x·(1 + scale) + shift with scale and shift [1, dim] broadcast over the tokens,
// in one fused pass.
func modulate(p *nn.Pass, x, scale, shift *runtime.Tensor) *runtime.Tensor {
	return p.Do(p.RT.Modulate(x, scale, shift))
}

// AdaLayerNormZero is the double block's norm1 / norm1_context: SiLU → linear → 6 chunks
// (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp); norm is LayerNorm without
// affine.
type AdaLayerNormZero struct {
	Linear nn.Linear // linear [6·dim, dim]
}

// adaZeroOut is AdaLayerNormZero's result: the modulated input and the five other chunks
// ([1, dim] each).
type adaZeroOut struct {
	x                                    *runtime.Tensor
	gateMSA, shiftMLP, scaleMLP, gateMLP *runtime.Tensor
}

// Forward: x [1, L, dim], temb [1, dim].
func (a AdaLayerNormZero) Forward(p *nn.Pass, x, temb *runtime.Tensor) adaZeroOut {
	st := p.Do(p.RT.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.Chunk(emb, 6)
	n := layerNorm.Forward(p, x)
	out := adaZeroOut{x: modulate(p, n, c[1], c[0]), gateMSA: c[2], shiftMLP: c[3], scaleMLP: c[4], gateMLP: c[5]}
	p.Drop(n)
	return out
}

// AdaLayerNormZeroSingle is the single block's norm: SiLU → linear → (shift, scale, gate).
type AdaLayerNormZeroSingle struct {
	Linear nn.Linear // linear [3·dim, dim]
}

// Forward: x [1, L, dim], temb [1, dim] → modulated x, gate [1, dim].
func (a AdaLayerNormZeroSingle) Forward(p *nn.Pass, x, temb *runtime.Tensor) (*runtime.Tensor, *runtime.Tensor) {
	st := p.Do(p.RT.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.Chunk(emb, 3)
	n := layerNorm.Forward(p, x)
	out := modulate(p, n, c[1], c[0])
	p.Drop(n)
	return out, c[2]
}

// AdaLayerNormContinuous is the output norm: SiLU → linear → (scale, shift) — scale first —
// on a LayerNorm without affine.
type AdaLayerNormContinuous struct {
	Linear nn.Linear // linear [2·dim, dim]
}

// Forward: x [1, L, dim], temb [1, dim] → [1, L, dim].
func (a AdaLayerNormContinuous) Forward(p *nn.Pass, x, temb *runtime.Tensor) *runtime.Tensor {
	st := p.Do(p.RT.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.Chunk(emb, 2)
	n := layerNorm.Forward(p, x)
	out := modulate(p, n, c[0], c[1])
	p.Drop(n)
	return out
}
