package dit

import (
	"strconv"

	"github.com/framepackd/framepackd/internal/runtime"
)

// SelfAttention is diffusers' Attention as the token refiner uses it (AttnProcessor2_0, no
// q/k norm): to_q, to_k, to_v, to_out.0 (to_out.1 is Dropout).
type SelfAttention struct {
	ToQ, ToK, ToV Linear // to_q, to_k, to_v [dim, dim]
	ToOut         Linear // to_out.0 [dim, dim]
	heads         int
}

func bindSelfAttention(b *binder, prefix string, dim, heads int) SelfAttention {
	return SelfAttention{
		ToQ:   bindLinear(b, join(prefix, "to_q"), dim, dim, true),
		ToK:   bindLinear(b, join(prefix, "to_k"), dim, dim, true),
		ToV:   bindLinear(b, join(prefix, "to_v"), dim, dim, true),
		ToOut: bindLinear(b, join(prefix, "to_out.0"), dim, dim, true),
		heads: heads,
	}
}

// Forward: x [1, L, dim], mask nil or U8 [1, 1, L, L] → [1, L, dim].
func (a SelfAttention) Forward(p *pass, x, mask *runtime.Tensor) *runtime.Tensor {
	q := toHeads(p, a.ToQ.Forward(p, x), a.heads)
	k := toHeads(p, a.ToK.Forward(p, x), a.heads)
	v := toHeads(p, a.ToV.Forward(p, x), a.heads)
	o := sdpa(p, q, k, v, mask)
	return a.ToOut.Forward(p, o)
}

// toHeads: [1, L, H·D] → [1, L, H, D].
func toHeads(p *pass, x *runtime.Tensor, heads int) *runtime.Tensor {
	if p.err != nil {
		return nil
	}
	return p.reshape(x, x.Dim(0), x.Dim(1), heads, -1)
}

// sdpa is scaled dot-product attention on [1, L, H, D] tensors → [1, L, H·D], read in that
// layout through strides (no permute copies).
func sdpa(p *pass, q, k, v, mask *runtime.Tensor) *runtime.Tensor {
	o := p.do(p.rt.Attention(q, k, v, mask, runtime.AttentionParams{Layout: runtime.AttentionBLHD}))
	if p.err != nil {
		return nil
	}
	return p.reshape(o, o.Dim(0), o.Dim(1), -1)
}

// HunyuanVideoAdaNorm is the refiner block's norm_out: SiLU → linear → (gate_msa, gate_mlp).
type HunyuanVideoAdaNorm struct {
	Linear Linear // linear [2·dim, dim]
}

// HunyuanVideoIndividualTokenRefinerBlock is one refiner block: pre-norm self-attention and a
// SiLU feed-forward, each gated by the refiner's time/text embedding.
type HunyuanVideoIndividualTokenRefinerBlock struct {
	Norm1   LayerNorm           // norm1 (affine)
	Attn    SelfAttention       // attn
	Norm2   LayerNorm           // norm2 (affine)
	FF      FeedForward         // ff: net.0.proj [mlp, dim] + SiLU, net.2 [dim, mlp]
	NormOut HunyuanVideoAdaNorm // norm_out
}

func bindRefinerBlock(b *binder, prefix string, cfg Config) HunyuanVideoIndividualTokenRefinerBlock {
	dim := cfg.InnerDim()
	return HunyuanVideoIndividualTokenRefinerBlock{
		Norm1:   bindLayerNorm(b, join(prefix, "norm1"), dim),
		Attn:    bindSelfAttention(b, join(prefix, "attn"), dim, cfg.NumAttentionHeads),
		Norm2:   bindLayerNorm(b, join(prefix, "norm2"), dim),
		FF:      bindFeedForward(b, join(prefix, "ff"), dim, int(float64(dim)*4.0), runtime.OpSiLU),
		NormOut: HunyuanVideoAdaNorm{Linear: bindLinear(b, join(prefix, "norm_out.linear"), dim, 2*dim, true)},
	}
}

// Forward: x [1, L, dim], temb [1, dim], mask nil or [1, 1, L, L] → [1, L, dim].
func (blk HunyuanVideoIndividualTokenRefinerBlock) Forward(p *pass, x, temb, mask *runtime.Tensor) *runtime.Tensor {
	n1 := blk.Norm1.Forward(p, x)
	attn := blk.Attn.Forward(p, n1, mask)
	st := p.do(p.rt.SiLU(temb))
	gates := p.chunk(blk.NormOut.Linear.Forward(p, st), 2)
	ga := p.do(p.rt.Mul(attn, gates[0]))
	h := p.do(p.rt.Add(x, ga))
	ff := blk.FF.Forward(p, blk.Norm2.Forward(p, h))
	gf := p.do(p.rt.Mul(ff, gates[1]))
	return p.do(p.rt.Add(h, gf))
}

// HunyuanVideoTokenRefiner is context_embedder: the text states' own small transformer,
// conditioned on the timestep and the masked mean of the text states.
type HunyuanVideoTokenRefiner struct {
	TimeTextEmbed CombinedTimestepTextProjEmbeddings        // time_text_embed
	ProjIn        Linear                                    // proj_in [dim, text_embed_dim]
	Blocks        []HunyuanVideoIndividualTokenRefinerBlock // token_refiner.refiner_blocks.N
}

func bindTokenRefiner(b *binder, prefix string, cfg Config) HunyuanVideoTokenRefiner {
	dim := cfg.InnerDim()
	r := HunyuanVideoTokenRefiner{
		TimeTextEmbed: bindTimeText(b, join(prefix, "time_text_embed"), dim, cfg.TextEmbedDim),
		ProjIn:        bindLinear(b, join(prefix, "proj_in"), cfg.TextEmbedDim, dim, true),
	}
	for i := range cfg.NumRefinerLayers {
		r.Blocks = append(r.Blocks, bindRefinerBlock(b, join(prefix, "token_refiner.refiner_blocks."+strconv.Itoa(i)), cfg))
	}
	return r
}

// Forward: text [1, L, text_embed_dim], its masked mean pooled [1, text_embed_dim], the
// refiner's self-attention mask (nil when text holds only real tokens) → [1, L, dim].
//
// The reference runs all 512 padded tokens with mask m_i ∧ m_j (plus key 0 for every query).
// For a mask of leading ones the real tokens only ever see real tokens, so running the real
// tokens alone without a mask gives their rows exactly; that is what the model does then.
func (r HunyuanVideoTokenRefiner) Forward(p *pass, text, pooled *runtime.Tensor, timestep float32, mask *runtime.Tensor) *runtime.Tensor {
	temb := r.TimeTextEmbed.Forward(p, timestep, pooled)
	h := r.ProjIn.Forward(p, text)
	for _, blk := range r.Blocks {
		bp := newPass(p.rt)
		out := bp.keep(blk.Forward(bp, h, temb, mask))
		if bp.err != nil {
			p.fail(bp.err)
		}
		bp.free()
		h = p.do(out, nil)
	}
	return h
}
