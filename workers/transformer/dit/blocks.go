package dit

import (
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// rope is the joint sequence's rotation table, [1, L, 1, D] each (L = image tokens then
// encoder tokens; the encoder rows are cos 1, sin 0, which leaves them unrotated exactly), and
// its image rows alone, [1, Li, 1, D].
type rope struct {
	cos, sin       *runtime.Tensor
	imgCos, imgSin *runtime.Tensor
}

// normApply is norm_q / norm_k then the rotation (interleaved pairs,
// apply_rotary_emb_transposed) of x [1, L, H, D] in one op: over the joint sequence's table, or
// with image set over the image rows alone (x is the image stream's part).
func (r rope) normApply(p *nn.Pass, n *nn.RMSNorm, x *runtime.Tensor, image bool) *runtime.Tensor {
	cos, sin := r.cos, r.sin
	if image {
		cos, sin = r.imgCos, r.imgSin
	}
	return p.Do(p.RT.RMSNormRoPE(runtime.RoPEInterleaved, x, n.Weight, cos, sin, n.Eps))
}

// JointAttention is the double block's attn (HunyuanAttnProcessorFlashAttnDouble): image q/k/v
// with RMS-normed q/k and rope, text q/k/v from the added projections with their own RMS norms
// and no rope, one attention over [image | text], then to_out.0 for the image part and
// to_add_out for the text part.
type JointAttention struct {
	ToQ, ToK, ToV          nn.Linear  // to_q, to_k, to_v [dim, dim]
	NormQ, NormK           nn.RMSNorm // norm_q, norm_k [head_dim]
	AddQ, AddK, AddV       nn.Linear  // add_q_proj, add_k_proj, add_v_proj [dim, dim]
	NormAddedQ, NormAddedK nn.RMSNorm // norm_added_q, norm_added_k [head_dim]
	ToOut                  nn.Linear  // to_out.0 [dim, dim] (to_out.1 is Dropout)
	ToAddOut               nn.Linear  // to_add_out [dim, dim]
	nn.Attention
}

func bindJointAttention(l *nn.Loader, prefix string, cfg Config) JointAttention {
	dim, hd := cfg.InnerDim(), cfg.AttentionHeadDim
	lin := func(name string) nn.Linear { return nn.NewLinear(l, nn.Join(prefix, name), dim, dim, true) }
	norm := func(name string) nn.RMSNorm { return nn.NewRMSNorm(l, nn.Join(prefix, name), hd, normEps) }
	return JointAttention{
		ToQ: lin("to_q"), ToK: lin("to_k"), ToV: lin("to_v"),
		NormQ: norm("norm_q"), NormK: norm("norm_k"),
		AddQ: lin("add_q_proj"), AddK: lin("add_k_proj"), AddV: lin("add_v_proj"),
		NormAddedQ: norm("norm_added_q"), NormAddedK: norm("norm_added_k"),
		ToOut: lin("to_out.0"), ToAddOut: lin("to_add_out"),
		Attention: nn.NewAttention(cfg.NumAttentionHeads, hd),
	}
}

// heads projects x [1, L, dim] with l to [1, L, H, D] and applies norm when it is not nil.
func heads(p *nn.Pass, a nn.Attention, l nn.Linear, norm *nn.RMSNorm, x *runtime.Tensor) *runtime.Tensor {
	return headsWith(p, a, l, x, func(h *runtime.Tensor) *runtime.Tensor {
		if norm == nil {
			return h
		}
		return norm.Forward(p, h)
	})
}

// headsWith projects x [1, L, dim] with l to [1, L, H, D] and passes the heads through f (which
// returns them or a new tensor).
func headsWith(p *nn.Pass, a nn.Attention, l nn.Linear, x *runtime.Tensor, f func(*runtime.Tensor) *runtime.Tensor) *runtime.Tensor {
	h := l.Forward(p, x)
	if !p.OK() {
		return nil
	}
	return p.Then(p.Reshape(h, h.Dim(0), h.Dim(1), a.Heads, a.HeadDim), f)
}

// Forward: img [1, Li, dim], txt [1, Lt, dim] → attention outputs of the same shapes.
func (a JointAttention) Forward(p *nn.Pass, img, txt *runtime.Tensor, r rope) (*runtime.Tensor, *runtime.Tensor) {
	cat := func(x, y *runtime.Tensor) *runtime.Tensor { // [1, Li+Lt, H, D]
		out := p.Do(p.RT.Concat(1, x, y))
		p.Drop(x, y)
		return out
	}
	// image q/k: norm and rope in one op; text q/k: their own norms, no rope (the reference
	// rotates the image part only)
	imgQK := func(l nn.Linear, n *nn.RMSNorm) *runtime.Tensor {
		return headsWith(p, a.Attention, l, img, func(h *runtime.Tensor) *runtime.Tensor { return r.normApply(p, n, h, true) })
	}
	q := cat(imgQK(a.ToQ, &a.NormQ), heads(p, a.Attention, a.AddQ, &a.NormAddedQ, txt))
	k := cat(imgQK(a.ToK, &a.NormK), heads(p, a.Attention, a.AddK, &a.NormAddedK, txt))
	v := cat(heads(p, a.Attention, a.ToV, nil, img), heads(p, a.Attention, a.AddV, nil, txt))
	o := a.Attention.Forward(p, q, k, v, nil) // [1, Li+Lt, dim]
	p.Drop(q, k, v)
	if !p.OK() {
		return nil, nil
	}
	li := img.Dim(1)
	oi := p.Do(p.RT.Slice(o, 1, 0, li))
	ot := p.Do(p.RT.Slice(o, 1, li, o.Dim(1)))
	p.Drop(o)
	return a.ToOut.Forward(p, oi), a.ToAddOut.Forward(p, ot)
}

// HunyuanVideoTransformerBlock is a double-stream block: AdaLN-zero for the image and the text
// streams, joint attention, gated residuals, and a GELU(tanh) feed-forward per stream.
type HunyuanVideoTransformerBlock struct {
	Norm1        AdaLayerNormZero // norm1
	Norm1Context AdaLayerNormZero // norm1_context
	Attn         JointAttention   // attn
	// norm2 and norm2_context are LayerNorms without affine.
	FF        FeedForward // ff: net.0.proj [mlp, dim] + GELU(tanh), net.2 [dim, mlp]
	FFContext FeedForward // ff_context
}

func bindDoubleBlock(l *nn.Loader, prefix string, cfg Config) HunyuanVideoTransformerBlock {
	dim := cfg.InnerDim()
	return HunyuanVideoTransformerBlock{
		Norm1:        AdaLayerNormZero{Linear: nn.NewLinear(l, nn.Join(prefix, "norm1.linear"), dim, 6*dim, true)},
		Norm1Context: AdaLayerNormZero{Linear: nn.NewLinear(l, nn.Join(prefix, "norm1_context.linear"), dim, 6*dim, true)},
		Attn:         bindJointAttention(l, nn.Join(prefix, "attn"), cfg),
		FF:           bindFeedForward(l, nn.Join(prefix, "ff"), dim, cfg.MLPDim(), runtime.OpGELUTanh),
		FFContext:    bindFeedForward(l, nn.Join(prefix, "ff_context"), dim, cfg.MLPDim(), runtime.OpGELUTanh),
	}
}

// Forward: img [1, Li, dim], txt [1, Lt, dim], temb [1, dim] → new img, txt (owned by the
// caller).
func (blk HunyuanVideoTransformerBlock) Forward(rt *runtime.Runtime, img, txt, temb *runtime.Tensor, r rope) (*runtime.Tensor, *runtime.Tensor, error) {
	p := nn.NewPass(nil, rt)
	defer p.Free()
	a := blk.Norm1.Forward(p, img, temb)
	c := blk.Norm1Context.Forward(p, txt, temb)
	ia, ta := blk.Attn.Forward(p, a.x, c.x, r)
	p.Drop(a.x, c.x)

	// residual + gate·attn, then residual + gate·ff(modulated LayerNorm).
	stream := func(x, attn *runtime.Tensor, m adaZeroOut, ff FeedForward) *runtime.Tensor {
		h := p.Do(p.RT.GateResidual(x, m.gateMSA, attn))
		p.Drop(attn)
		n := layerNorm.Forward(p, h)
		mn := modulate(p, n, m.scaleMLP, m.shiftMLP)
		p.Drop(n)
		f := ff.Forward(p, mn)
		p.Drop(mn)
		out := p.Do(p.RT.GateResidual(h, m.gateMLP, f))
		p.Drop(h, f)
		return out
	}
	imgOut := stream(img, ia, a, blk.FF)
	txtOut := stream(txt, ta, c, blk.FFContext)
	if !p.OK() {
		return nil, nil, p.Err()
	}
	return p.Keep(imgOut), p.Keep(txtOut), nil
}

// SingleAttention is the single block's attn (HunyuanAttnProcessorFlashAttnSingle, pre_only):
// q/k/v over the whole [image | text] sequence, RMS-normed q/k, rope on the image part.
type SingleAttention struct {
	ToQ, ToK, ToV nn.Linear  // to_q, to_k, to_v [dim, dim]
	NormQ, NormK  nn.RMSNorm // norm_q, norm_k [head_dim]
	nn.Attention
}

// Forward: x [1, L, dim] → [1, L, dim].
func (a SingleAttention) Forward(p *nn.Pass, x *runtime.Tensor, r rope) *runtime.Tensor {
	qk := func(l nn.Linear, n *nn.RMSNorm) *runtime.Tensor { // norm, then rope over the joint table
		return headsWith(p, a.Attention, l, x, func(h *runtime.Tensor) *runtime.Tensor { return r.normApply(p, n, h, false) })
	}
	q, k := qk(a.ToQ, &a.NormQ), qk(a.ToK, &a.NormK)
	v := heads(p, a.Attention, a.ToV, nil, x)
	o := a.Attention.Forward(p, q, k, v, nil)
	p.Drop(q, k, v)
	return o
}

// HunyuanVideoSingleTransformerBlock is a single-stream block: one AdaLN-zero, attention and a
// fused MLP (proj_mlp + GELU(tanh)) side by side, one proj_out over their concatenation, gated.
type HunyuanVideoSingleTransformerBlock struct {
	Norm    AdaLayerNormZeroSingle // norm
	Attn    SingleAttention        // attn
	ProjMLP nn.Linear              // proj_mlp [mlp, dim]; act_mlp is GELU(tanh)
	ProjOut nn.Linear              // proj_out [dim, dim + mlp]
}

func bindSingleBlock(l *nn.Loader, prefix string, cfg Config) HunyuanVideoSingleTransformerBlock {
	dim, hd, mlp := cfg.InnerDim(), cfg.AttentionHeadDim, cfg.MLPDim()
	return HunyuanVideoSingleTransformerBlock{
		Norm: AdaLayerNormZeroSingle{Linear: nn.NewLinear(l, nn.Join(prefix, "norm.linear"), dim, 3*dim, true)},
		Attn: SingleAttention{
			ToQ: nn.NewLinear(l, nn.Join(prefix, "attn.to_q"), dim, dim, true), ToK: nn.NewLinear(l, nn.Join(prefix, "attn.to_k"), dim, dim, true),
			ToV:       nn.NewLinear(l, nn.Join(prefix, "attn.to_v"), dim, dim, true),
			NormQ:     nn.NewRMSNorm(l, nn.Join(prefix, "attn.norm_q"), hd, normEps),
			NormK:     nn.NewRMSNorm(l, nn.Join(prefix, "attn.norm_k"), hd, normEps),
			Attention: nn.NewAttention(cfg.NumAttentionHeads, hd),
		},
		ProjMLP: nn.NewLinear(l, nn.Join(prefix, "proj_mlp"), dim, mlp, true),
		ProjOut: nn.NewLinear(l, nn.Join(prefix, "proj_out"), dim+mlp, dim, true),
	}
}

// Forward: x [1, L, dim] (image then text tokens), temb [1, dim] → [1, L, dim] (owned by the
// caller).
func (blk HunyuanVideoSingleTransformerBlock) Forward(rt *runtime.Runtime, x, temb *runtime.Tensor, r rope) (*runtime.Tensor, error) {
	p := nn.NewPass(nil, rt)
	defer p.Free()
	nx, gate := blk.Norm.Forward(p, x, temb)
	var mlp *runtime.Tensor // act_mlp(proj_mlp(x)): GELU(tanh) in the GEMM's epilogue
	if p.OK() {
		mlp = blk.ProjMLP.ForwardGELU(p, nx)
	}
	attn := blk.Attn.Forward(p, nx, r)
	p.Drop(nx)
	cat := p.Do(p.RT.Concat(-1, attn, mlp))
	p.Drop(attn, mlp)
	o := blk.ProjOut.Forward(p, cat)
	p.Drop(cat)
	out := p.Do(p.RT.GateResidual(x, gate, o))
	p.Drop(o)
	if !p.OK() {
		return nil, p.Err()
	}
	return p.Keep(out), nil
}
