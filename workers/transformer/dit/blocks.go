package dit

import (
	"github.com/framepackd/framepackd/internal/runtime"
)

// rope is the joint sequence's rotation table, [1, L, 1, D] each (L = image tokens then
// encoder tokens; the encoder rows are cos 1, sin 0, which leaves them unrotated exactly).
type rope struct {
	cos, sin *runtime.Tensor
}

// apply rotates x [1, L, H, D] (interleaved pairs, apply_rotary_emb_transposed).
func (r rope) apply(p *pass, x *runtime.Tensor) *runtime.Tensor {
	return p.do(p.rt.RoPE(runtime.RoPEInterleaved, x, r.cos, r.sin))
}

// JointAttention is the double block's attn (HunyuanAttnProcessorFlashAttnDouble): image q/k/v
// with RMS-normed q/k and rope, text q/k/v from the added projections with their own RMS norms
// and no rope, one attention over [image | text], then to_out.0 for the image part and
// to_add_out for the text part.
type JointAttention struct {
	ToQ, ToK, ToV          Linear  // to_q, to_k, to_v [dim, dim]
	NormQ, NormK           RMSNorm // norm_q, norm_k [head_dim]
	AddQ, AddK, AddV       Linear  // add_q_proj, add_k_proj, add_v_proj [dim, dim]
	NormAddedQ, NormAddedK RMSNorm // norm_added_q, norm_added_k [head_dim]
	ToOut                  Linear  // to_out.0 [dim, dim] (to_out.1 is Dropout)
	ToAddOut               Linear  // to_add_out [dim, dim]
	heads                  int
}

func bindJointAttention(b *binder, prefix string, cfg Config) JointAttention {
	dim, hd := cfg.InnerDim(), cfg.AttentionHeadDim
	return JointAttention{
		ToQ: bindLinear(b, join(prefix, "to_q"), dim, dim, true), ToK: bindLinear(b, join(prefix, "to_k"), dim, dim, true),
		ToV:   bindLinear(b, join(prefix, "to_v"), dim, dim, true),
		NormQ: bindRMSNorm(b, join(prefix, "norm_q"), hd), NormK: bindRMSNorm(b, join(prefix, "norm_k"), hd),
		AddQ: bindLinear(b, join(prefix, "add_q_proj"), dim, dim, true), AddK: bindLinear(b, join(prefix, "add_k_proj"), dim, dim, true),
		AddV:       bindLinear(b, join(prefix, "add_v_proj"), dim, dim, true),
		NormAddedQ: bindRMSNorm(b, join(prefix, "norm_added_q"), hd), NormAddedK: bindRMSNorm(b, join(prefix, "norm_added_k"), hd),
		ToOut:    bindLinear(b, join(prefix, "to_out.0"), dim, dim, true),
		ToAddOut: bindLinear(b, join(prefix, "to_add_out"), dim, dim, true),
		heads:    cfg.NumAttentionHeads,
	}
}

// Forward: img [1, Li, dim], txt [1, Lt, dim] → attention outputs of the same shapes.
func (a JointAttention) Forward(p *pass, img, txt *runtime.Tensor, r rope) (*runtime.Tensor, *runtime.Tensor) {
	proj := func(l Linear, n *RMSNorm, x *runtime.Tensor) *runtime.Tensor {
		h := toHeads(p, l.Forward(p, x), a.heads)
		if n == nil {
			return h
		}
		out := n.Forward(p, h)
		p.drop(h)
		return out
	}
	cat := func(x, y *runtime.Tensor) *runtime.Tensor {
		out := p.do(p.rt.Concat(1, x, y))
		p.drop(x, y)
		return out
	}
	q := cat(proj(a.ToQ, &a.NormQ, img), proj(a.AddQ, &a.NormAddedQ, txt))
	k := cat(proj(a.ToK, &a.NormK, img), proj(a.AddK, &a.NormAddedK, txt))
	v := cat(proj(a.ToV, nil, img), proj(a.AddV, nil, txt))
	qr, kr := r.apply(p, q), r.apply(p, k)
	p.drop(q, k)
	o := sdpa(p, qr, kr, v, nil)
	p.drop(qr, kr, v)
	if p.err != nil {
		return nil, nil
	}
	li := img.Dim(1)
	oi := p.do(p.rt.Slice(o, 1, 0, li))
	ot := p.do(p.rt.Slice(o, 1, li, o.Dim(1)))
	p.drop(o)
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

func bindDoubleBlock(b *binder, prefix string, cfg Config) HunyuanVideoTransformerBlock {
	dim := cfg.InnerDim()
	return HunyuanVideoTransformerBlock{
		Norm1:        AdaLayerNormZero{Linear: bindLinear(b, join(prefix, "norm1.linear"), dim, 6*dim, true)},
		Norm1Context: AdaLayerNormZero{Linear: bindLinear(b, join(prefix, "norm1_context.linear"), dim, 6*dim, true)},
		Attn:         bindJointAttention(b, join(prefix, "attn"), cfg),
		FF:           bindFeedForward(b, join(prefix, "ff"), dim, cfg.MLPDim(), runtime.OpGELUTanh),
		FFContext:    bindFeedForward(b, join(prefix, "ff_context"), dim, cfg.MLPDim(), runtime.OpGELUTanh),
	}
}

// Forward: img [1, Li, dim], txt [1, Lt, dim], temb [1, dim] → new img, txt (owned by the
// caller).
func (blk HunyuanVideoTransformerBlock) Forward(rt *runtime.Runtime, img, txt, temb *runtime.Tensor, r rope) (*runtime.Tensor, *runtime.Tensor, error) {
	p := newPass(rt)
	defer p.free()
	a := blk.Norm1.Forward(p, img, temb)
	c := blk.Norm1Context.Forward(p, txt, temb)
	ia, ta := blk.Attn.Forward(p, a.x, c.x, r)
	p.drop(a.x, c.x)

	// residual + gate·attn, then residual + gate·ff(modulated LayerNorm).
	stream := func(x, attn *runtime.Tensor, m adaZeroOut, ff FeedForward) *runtime.Tensor {
		g := p.do(p.rt.Mul(attn, m.gateMSA))
		p.drop(attn)
		h := p.do(p.rt.Add(x, g))
		p.drop(g)
		n := p.do(p.rt.LayerNorm(h, nil, nil, normEps))
		mn := modulate(p, n, m.scaleMLP, m.shiftMLP)
		p.drop(n)
		f := ff.Forward(p, mn)
		p.drop(mn)
		gf := p.do(p.rt.Mul(f, m.gateMLP))
		p.drop(f)
		out := p.do(p.rt.Add(h, gf))
		p.drop(h, gf)
		return out
	}
	imgOut := stream(img, ia, a, blk.FF)
	txtOut := stream(txt, ta, c, blk.FFContext)
	if p.err != nil {
		return nil, nil, p.err
	}
	return p.keep(imgOut), p.keep(txtOut), nil
}

// SingleAttention is the single block's attn (HunyuanAttnProcessorFlashAttnSingle, pre_only):
// q/k/v over the whole [image | text] sequence, RMS-normed q/k, rope on the image part.
type SingleAttention struct {
	ToQ, ToK, ToV Linear  // to_q, to_k, to_v [dim, dim]
	NormQ, NormK  RMSNorm // norm_q, norm_k [head_dim]
	heads         int
}

// Forward: x [1, L, dim] → [1, L, dim].
func (a SingleAttention) Forward(p *pass, x *runtime.Tensor, r rope) *runtime.Tensor {
	qk := func(l Linear, n RMSNorm) *runtime.Tensor {
		h := toHeads(p, l.Forward(p, x), a.heads)
		nh := n.Forward(p, h)
		p.drop(h)
		out := r.apply(p, nh)
		p.drop(nh)
		return out
	}
	q := qk(a.ToQ, a.NormQ)
	k := qk(a.ToK, a.NormK)
	v := toHeads(p, a.ToV.Forward(p, x), a.heads)
	o := sdpa(p, q, k, v, nil)
	p.drop(q, k, v)
	return o
}

// HunyuanVideoSingleTransformerBlock is a single-stream block: one AdaLN-zero, attention and a
// fused MLP (proj_mlp + GELU(tanh)) side by side, one proj_out over their concatenation, gated.
type HunyuanVideoSingleTransformerBlock struct {
	Norm    AdaLayerNormZeroSingle // norm
	Attn    SingleAttention        // attn
	ProjMLP Linear                 // proj_mlp [mlp, dim]; act_mlp is GELU(tanh)
	ProjOut Linear                 // proj_out [dim, dim + mlp]
}

func bindSingleBlock(b *binder, prefix string, cfg Config) HunyuanVideoSingleTransformerBlock {
	dim, hd, mlp := cfg.InnerDim(), cfg.AttentionHeadDim, cfg.MLPDim()
	return HunyuanVideoSingleTransformerBlock{
		Norm: AdaLayerNormZeroSingle{Linear: bindLinear(b, join(prefix, "norm.linear"), dim, 3*dim, true)},
		Attn: SingleAttention{
			ToQ: bindLinear(b, join(prefix, "attn.to_q"), dim, dim, true), ToK: bindLinear(b, join(prefix, "attn.to_k"), dim, dim, true),
			ToV:   bindLinear(b, join(prefix, "attn.to_v"), dim, dim, true),
			NormQ: bindRMSNorm(b, join(prefix, "attn.norm_q"), hd), NormK: bindRMSNorm(b, join(prefix, "attn.norm_k"), hd),
			heads: cfg.NumAttentionHeads,
		},
		ProjMLP: bindLinear(b, join(prefix, "proj_mlp"), dim, mlp, true),
		ProjOut: bindLinear(b, join(prefix, "proj_out"), dim+mlp, dim, true),
	}
}

// Forward: x [1, L, dim] (image then text tokens), temb [1, dim] → [1, L, dim] (owned by the
// caller).
func (blk HunyuanVideoSingleTransformerBlock) Forward(rt *runtime.Runtime, x, temb *runtime.Tensor, r rope) (*runtime.Tensor, error) {
	p := newPass(rt)
	defer p.free()
	nx, gate := blk.Norm.Forward(p, x, temb)
	pm := blk.ProjMLP.Forward(p, nx)
	mlp := p.do(p.rt.GELU(pm))
	p.drop(pm)
	attn := blk.Attn.Forward(p, nx, r)
	p.drop(nx)
	cat := p.do(p.rt.Concat(-1, attn, mlp))
	p.drop(attn, mlp)
	o := blk.ProjOut.Forward(p, cat)
	p.drop(cat)
	g := p.do(p.rt.Mul(o, gate))
	p.drop(o)
	out := p.do(p.rt.Add(g, x))
	if p.err != nil {
		return nil, p.err
	}
	return p.keep(out), nil
}
