package dit

import (
	"github.com/framepackd/framepackd/internal/runtime"
)

// normEps is the eps of every LayerNorm and RMSNorm of the model.
const normEps = 1e-6

// pass runs a chain of runtime ops: it keeps the first error (later ops see nil inputs and are
// skipped) and frees every intermediate it made when done, except those it hands back with keep.
type pass struct {
	rt  *runtime.Runtime
	sc  runtime.Scope
	err error
}

func newPass(rt *runtime.Runtime) *pass { return &pass{rt: rt} }

// do records an op's result: the tensor is tracked for free; an error is kept.
func (p *pass) do(t *runtime.Tensor, err error) *runtime.Tensor {
	if p.err != nil {
		t.Free()
		return nil
	}
	if err != nil {
		p.err = err
		t.Free()
		return nil
	}
	p.sc.Add(t)
	return t
}

// keep takes t out of the pass's scope: the caller owns it.
func (p *pass) keep(t *runtime.Tensor) *runtime.Tensor {
	if t == nil {
		return nil
	}
	return p.sc.Keep(t)
}

// drop frees intermediates early (to bound the peak); the scope's later free is a no-op for them.
func (p *pass) drop(ts ...*runtime.Tensor) {
	for _, t := range ts {
		t.Free()
	}
}

func (p *pass) free() { p.sc.Free() }

// reshape returns x with a new shape and frees x's handle (x must belong to the pass): the
// storage then lives exactly as long as the new handle.
func (p *pass) reshape(x *runtime.Tensor, shape ...int) *runtime.Tensor {
	if p.err != nil {
		return nil
	}
	out := p.do(x.Reshape(shape...))
	p.drop(x)
	return out
}

// fail records err (if none is recorded yet).
func (p *pass) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

// chunk splits the last dim of x into n equal parts (torch.chunk).
func (p *pass) chunk(x *runtime.Tensor, n int) []*runtime.Tensor {
	out := make([]*runtime.Tensor, n)
	if p.err != nil {
		return out
	}
	w := x.Dim(-1) / n
	for i := range out {
		out[i] = p.do(p.rt.Slice(x, -1, i*w, (i+1)*w))
	}
	return out
}

// Linear is torch.nn.Linear: weight [out, in], bias [out] or nil.
type Linear struct {
	Weight *runtime.Tensor // <prefix>.weight [out, in]
	Bias   *runtime.Tensor // <prefix>.bias [out]
}

func bindLinear(b *binder, prefix string, in, out int, bias bool) Linear {
	l := Linear{Weight: b.weight(join(prefix, "weight"), out, in)}
	if bias {
		l.Bias = b.tensor(join(prefix, "bias"), out)
	}
	return l
}

// Forward: x [..., in] → [..., out].
func (l Linear) Forward(p *pass, x *runtime.Tensor) *runtime.Tensor {
	return p.do(p.rt.Linear(x, l.Weight, l.Bias))
}

// LayerNorm is torch.nn.LayerNorm over the last dim (eps 1e-6); Weight and Bias are nil when
// elementwise_affine is False.
type LayerNorm struct {
	Weight *runtime.Tensor // <prefix>.weight [dim]
	Bias   *runtime.Tensor // <prefix>.bias [dim]
}

func bindLayerNorm(b *binder, prefix string, dim int) LayerNorm {
	return LayerNorm{Weight: b.tensor(join(prefix, "weight"), dim), Bias: b.tensor(join(prefix, "bias"), dim)}
}

// Forward: x [..., dim] → [..., dim].
func (n LayerNorm) Forward(p *pass, x *runtime.Tensor) *runtime.Tensor {
	return p.do(p.rt.LayerNorm(x, n.Weight, n.Bias, normEps))
}

// RMSNorm is diffusers' RMSNorm with a weight (eps 1e-6): the attention's q/k norms over the
// head dim.
type RMSNorm struct {
	Weight *runtime.Tensor // <prefix>.weight [head_dim]
}

func bindRMSNorm(b *binder, prefix string, dim int) RMSNorm {
	return RMSNorm{Weight: b.tensor(join(prefix, "weight"), dim)}
}

// Forward: x [..., dim] → [..., dim].
func (n RMSNorm) Forward(p *pass, x *runtime.Tensor) *runtime.Tensor {
	return p.do(p.rt.RMSNorm(x, n.Weight, normEps))
}

// FeedForward is diffusers' FeedForward: net.0 is a projection with its activation
// (GELU(tanh) for "gelu-approximate", SiLU for "linear-silu"), net.1 is Dropout, net.2 the
// output Linear.
type FeedForward struct {
	Proj Linear // net.0.proj [inner, dim]
	Out  Linear // net.2 [dim, inner]
	act  runtime.UnaryOp
}

func bindFeedForward(b *binder, prefix string, dim, inner int, act runtime.UnaryOp) FeedForward {
	return FeedForward{
		Proj: bindLinear(b, join(prefix, "net.0.proj"), dim, inner, true),
		Out:  bindLinear(b, join(prefix, "net.2"), inner, dim, true),
		act:  act,
	}
}

// Forward: x [..., dim] → [..., dim].
func (f FeedForward) Forward(p *pass, x *runtime.Tensor) *runtime.Tensor {
	h := f.Proj.Forward(p, x)
	a := p.do(p.rt.Unary(f.act, h))
	p.drop(h)
	out := f.Out.Forward(p, a)
	p.drop(a)
	return out
}

// modulate is x·(1 + scale) + shift with scale and shift [1, dim] broadcast over the tokens.
func modulate(p *pass, x, scale, shift *runtime.Tensor) *runtime.Tensor {
	s1 := p.do(p.rt.Affine(scale, 1, 1))
	h := p.do(p.rt.Mul(x, s1))
	out := p.do(p.rt.Add(h, shift))
	p.drop(h)
	return out
}

// AdaLayerNormZero is the double block's norm1 / norm1_context: SiLU → linear → 6 chunks
// (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp); norm is LayerNorm without
// affine.
type AdaLayerNormZero struct {
	Linear Linear // linear [6·dim, dim]
}

// adaZeroOut is AdaLayerNormZero's result: the modulated input and the five other chunks
// ([1, dim] each).
type adaZeroOut struct {
	x                                    *runtime.Tensor
	gateMSA, shiftMLP, scaleMLP, gateMLP *runtime.Tensor
}

// Forward: x [1, L, dim], temb [1, dim].
func (a AdaLayerNormZero) Forward(p *pass, x, temb *runtime.Tensor) adaZeroOut {
	st := p.do(p.rt.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.chunk(emb, 6)
	n := p.do(p.rt.LayerNorm(x, nil, nil, normEps))
	out := adaZeroOut{x: modulate(p, n, c[1], c[0]), gateMSA: c[2], shiftMLP: c[3], scaleMLP: c[4], gateMLP: c[5]}
	p.drop(n)
	return out
}

// AdaLayerNormZeroSingle is the single block's norm: SiLU → linear → (shift, scale, gate).
type AdaLayerNormZeroSingle struct {
	Linear Linear // linear [3·dim, dim]
}

// Forward: x [1, L, dim], temb [1, dim] → modulated x, gate [1, dim].
func (a AdaLayerNormZeroSingle) Forward(p *pass, x, temb *runtime.Tensor) (*runtime.Tensor, *runtime.Tensor) {
	st := p.do(p.rt.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.chunk(emb, 3)
	n := p.do(p.rt.LayerNorm(x, nil, nil, normEps))
	out := modulate(p, n, c[1], c[0])
	p.drop(n)
	return out, c[2]
}

// AdaLayerNormContinuous is the output norm: SiLU → linear → (scale, shift) — scale first —
// on a LayerNorm without affine.
type AdaLayerNormContinuous struct {
	Linear Linear // linear [2·dim, dim]
}

// Forward: x [1, L, dim], temb [1, dim] → [1, L, dim].
func (a AdaLayerNormContinuous) Forward(p *pass, x, temb *runtime.Tensor) *runtime.Tensor {
	st := p.do(p.rt.SiLU(temb))
	emb := a.Linear.Forward(p, st)
	c := p.chunk(emb, 2)
	n := p.do(p.rt.LayerNorm(x, nil, nil, normEps))
	out := modulate(p, n, c[0], c[1])
	p.drop(n)
	return out
}
