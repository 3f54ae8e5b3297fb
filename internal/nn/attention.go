package nn

import (
	"math"

	"github.com/framepackd/framepackd/internal/runtime"
)

// Attention is multi-head scaled dot-product attention on token-major tensors: the one place
// the models call the runtime's attention op (SigLIP, CLIP, Llama, the DiT's blocks and
// refiner, the VAE's mid block). The runtime reads q, k and v as [B, L, H, D] through strides
// (runtime.AttentionBLHD), so no head transposes are made: [B, L, H·D] is reshaped in place.
type Attention struct {
	Heads   int     // query heads
	KVHeads int     // key/value heads (grouped-query attention); 0 means Heads
	HeadDim int     // D
	Scale   float32 // softmax scale; 0 means D^−½
	// Causal says the masks passed to Forward are causal (and key padding), as CausalMask makes
	// them: the vendor attention tier may then serve them (runtime.AttentionParams.Causal).
	Causal bool
}

// NewAttention returns attention with heads heads of headDim and the default scale.
func NewAttention(heads, headDim int) Attention {
	return Attention{Heads: heads, HeadDim: headDim}
}

// Forward: q [B, Lq, Heads·D] or [B, Lq, Heads, D]; k, v [B, Lk, KVHeads·D] or
// [B, Lk, KVHeads, D]; mask nil or U8 broadcastable to [B, Heads, Lq, Lk] (nonzero = attend; a
// fully masked query row gives zeros) → [B, Lq, Heads·D]. q, k and v stay the caller's.
func (a Attention) Forward(p *Pass, q, k, v, mask *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	kvh := a.KVHeads
	if kvh == 0 {
		kvh = a.Heads
	}
	qh, kh, vh := a.toHeads(p, q, a.Heads), a.toHeads(p, k, kvh), a.toHeads(p, v, kvh)
	o := p.Do(p.RT.Attention(qh, kh, vh, mask, runtime.AttentionParams{Scale: a.Scale, Layout: runtime.AttentionBLHD, Causal: a.Causal && mask != nil})) // [B, Lq, H, D]
	if !p.OK() {
		return nil
	}
	return p.Reshape(o, o.Dim(0), o.Dim(1), a.Heads*a.HeadDim)
}

// toHeads: x [B, L, h·D] or [B, L, h, D] → a [B, L, h, D] view of x (no copy).
func (a Attention) toHeads(p *Pass, x *runtime.Tensor, h int) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	if x.Rank() == 4 {
		return x
	}
	return p.Do(x.Reshape(x.Dim(0), x.Dim(1), h, a.HeadDim))
}

// EncoderAttention is the attention of the CLIP-family encoder layers (CLIPAttention,
// SiglipAttention): q_proj, k_proj, v_proj and out_proj, all with bias, scale head_dim^−½.
type EncoderAttention struct {
	QProj   Linear // q_proj [hidden, hidden]
	KProj   Linear // k_proj [hidden, hidden]
	VProj   Linear // v_proj [hidden, hidden]
	OutProj Linear // out_proj [hidden, hidden]
	Attention
}

// NewEncoderAttention binds <name>.{q,k,v,out}_proj for hidden = heads·(hidden/heads).
func NewEncoderAttention(l *Loader, name string, hidden, heads int) EncoderAttention {
	d := hidden / heads
	return EncoderAttention{
		QProj:     NewLinear(l, Join(name, "q_proj"), hidden, hidden, true),
		KProj:     NewLinear(l, Join(name, "k_proj"), hidden, hidden, true),
		VProj:     NewLinear(l, Join(name, "v_proj"), hidden, hidden, true),
		OutProj:   NewLinear(l, Join(name, "out_proj"), hidden, hidden, true),
		Attention: Attention{Heads: heads, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d)))},
	}
}

// Forward: x [B, L, hidden], mask nil or U8 [1, 1, L, L] → [B, L, hidden].
func (a EncoderAttention) Forward(p *Pass, x, mask *runtime.Tensor) *runtime.Tensor {
	q, k, v := a.QProj.Forward(p, x), a.KProj.Forward(p, x), a.VProj.Forward(p, x)
	o := a.Attention.Forward(p, q, k, v, mask)
	p.Drop(q, k, v)
	out := a.OutProj.Forward(p, o)
	p.Drop(o)
	return out
}

// EncoderLayer is the pre-norm transformer layer of the CLIP-family encoders (CLIPEncoderLayer,
// SiglipEncoderLayer): attention and MLP, each after a LayerNorm and with a residual.
type EncoderLayer struct {
	LayerNorm1 LayerNorm        // layer_norm1 [hidden]
	SelfAttn   EncoderAttention // self_attn
	LayerNorm2 LayerNorm        // layer_norm2 [hidden]
	MLP        MLP              // mlp: fc1 [intermediate, hidden], act, fc2 [hidden, intermediate]
}

// NewEncoderLayer binds <name>.{layer_norm1, self_attn, layer_norm2, mlp}.
func NewEncoderLayer(l *Loader, name string, hidden, intermediate, heads int, eps float32, act Activation) EncoderLayer {
	return EncoderLayer{
		LayerNorm1: NewLayerNorm(l, Join(name, "layer_norm1"), hidden, eps),
		SelfAttn:   NewEncoderAttention(l, Join(name, "self_attn"), hidden, heads),
		LayerNorm2: NewLayerNorm(l, Join(name, "layer_norm2"), hidden, eps),
		MLP:        NewMLP(l, Join(name, "mlp"), hidden, intermediate, act),
	}
}

// Forward: x [B, L, hidden], mask nil or U8 [1, 1, L, L] → [B, L, hidden].
func (e *EncoderLayer) Forward(p *Pass, x, mask *runtime.Tensor) *runtime.Tensor {
	h := e.LayerNorm1.Forward(p, x)
	h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return e.SelfAttn.Forward(p, h, mask) })
	r := p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Add(x, h)) })
	h = e.LayerNorm2.Forward(p, r)
	h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return e.MLP.Forward(p, h) })
	return p.Do(p.RT.Add(r, h))
}
