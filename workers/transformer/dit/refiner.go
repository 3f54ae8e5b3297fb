package dit

import (
	"strconv"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// SelfAttention is diffusers' Attention as the token refiner uses it (AttnProcessor2_0, no
// q/k norm): to_q, to_k, to_v, to_out.0 (to_out.1 is Dropout).
type SelfAttention struct {
	ToQ, ToK, ToV nn.Linear // to_q, to_k, to_v [dim, dim]
	ToOut         nn.Linear // to_out.0 [dim, dim]
	nn.Attention
}

func bindSelfAttention(l *nn.Loader, prefix string, dim, heads int) SelfAttention {
	lin := func(name string) nn.Linear { return nn.NewLinear(l, nn.Join(prefix, name), dim, dim, true) }
	return SelfAttention{ToQ: lin("to_q"), ToK: lin("to_k"), ToV: lin("to_v"), ToOut: lin("to_out.0"), Attention: nn.NewAttention(heads, dim/heads)}
}

// Forward: x [1, L, dim], mask nil or U8 [1, 1, L, L] → [1, L, dim].
func (a SelfAttention) Forward(p *nn.Pass, x, mask *runtime.Tensor) *runtime.Tensor {
	q, k, v := a.ToQ.Forward(p, x), a.ToK.Forward(p, x), a.ToV.Forward(p, x)
	o := a.Attention.Forward(p, q, k, v, mask)
	p.Drop(q, k, v)
	return p.Then(o, func(o *runtime.Tensor) *runtime.Tensor { return a.ToOut.Forward(p, o) })
}

// HunyuanVideoAdaNorm is the refiner block's norm_out: SiLU → linear → (gate_msa, gate_mlp).
type HunyuanVideoAdaNorm struct {
	Linear nn.Linear // linear [2·dim, dim]
}

// HunyuanVideoIndividualTokenRefinerBlock is one refiner block: pre-norm self-attention and a
// SiLU feed-forward, each gated by the refiner's time/text embedding.
type HunyuanVideoIndividualTokenRefinerBlock struct {
	Norm1   nn.LayerNorm        // norm1 (affine)
	Attn    SelfAttention       // attn
	Norm2   nn.LayerNorm        // norm2 (affine)
	FF      FeedForward         // ff: net.0.proj [mlp, dim] + SiLU, net.2 [dim, mlp]
	NormOut HunyuanVideoAdaNorm // norm_out
}

func bindRefinerBlock(l *nn.Loader, prefix string, cfg Config) HunyuanVideoIndividualTokenRefinerBlock {
	dim := cfg.InnerDim()
	return HunyuanVideoIndividualTokenRefinerBlock{
		Norm1:   nn.NewLayerNorm(l, nn.Join(prefix, "norm1"), dim, normEps),
		Attn:    bindSelfAttention(l, nn.Join(prefix, "attn"), dim, cfg.NumAttentionHeads),
		Norm2:   nn.NewLayerNorm(l, nn.Join(prefix, "norm2"), dim, normEps),
		FF:      bindFeedForward(l, nn.Join(prefix, "ff"), dim, int(float64(dim)*4.0), runtime.OpSiLU),
		NormOut: HunyuanVideoAdaNorm{Linear: nn.NewLinear(l, nn.Join(prefix, "norm_out.linear"), dim, 2*dim, true)},
	}
}

// Forward: x [1, L, dim], temb [1, dim], mask nil or [1, 1, L, L] → [1, L, dim].
func (blk HunyuanVideoIndividualTokenRefinerBlock) Forward(p *nn.Pass, x, temb, mask *runtime.Tensor) *runtime.Tensor {
	n1 := blk.Norm1.Forward(p, x)
	attn := blk.Attn.Forward(p, n1, mask)
	st := p.Do(p.RT.SiLU(temb))
	gates := p.Chunk(blk.NormOut.Linear.Forward(p, st), 2)
	h := p.Do(p.RT.GateResidual(x, gates[0], attn))
	ff := blk.FF.Forward(p, blk.Norm2.Forward(p, h))
	return p.Do(p.RT.GateResidual(h, gates[1], ff))
}

// HunyuanVideoTokenRefiner is context_embedder: the text states' own small transformer,
// conditioned on the timestep and the masked mean of the text states.
type HunyuanVideoTokenRefiner struct {
	TimeTextEmbed CombinedTimestepTextProjEmbeddings        // time_text_embed
	ProjIn        nn.Linear                                 // proj_in [dim, text_embed_dim]
	Blocks        []HunyuanVideoIndividualTokenRefinerBlock // token_refiner.refiner_blocks.N
}

func bindTokenRefiner(l *nn.Loader, prefix string, cfg Config) HunyuanVideoTokenRefiner {
	dim := cfg.InnerDim()
	r := HunyuanVideoTokenRefiner{
		TimeTextEmbed: bindTimeText(l, nn.Join(prefix, "time_text_embed"), dim, cfg.TextEmbedDim),
		ProjIn:        nn.NewLinear(l, nn.Join(prefix, "proj_in"), cfg.TextEmbedDim, dim, true),
	}
	for i := range cfg.NumRefinerLayers {
		r.Blocks = append(r.Blocks, bindRefinerBlock(l, nn.Join(prefix, "token_refiner.refiner_blocks."+strconv.Itoa(i)), cfg))
	}
	return r
}

// Forward: text [1, L, text_embed_dim], its masked mean pooled [1, text_embed_dim], the
// refiner's self-attention mask (nil when text holds only real tokens) → [1, L, dim].
//
// The reference runs all 512 padded tokens with mask m_i ∧ m_j (plus key 0 for every query).
// For a mask of leading ones the real tokens only ever see real tokens, so running the real
// tokens alone without a mask gives their rows exactly; that is what the model does then.
func (r HunyuanVideoTokenRefiner) Forward(p *nn.Pass, text, pooled *runtime.Tensor, timestep float32, mask *runtime.Tensor) *runtime.Tensor {
	temb := r.TimeTextEmbed.Forward(p, timestep, pooled)
	h := r.ProjIn.Forward(p, text)
	for i, blk := range r.Blocks {
		h = p.Sub(nn.Join("refiner_blocks", i), func(q *nn.Pass) *runtime.Tensor { return blk.Forward(q, h, temb, mask) })
	}
	return h
}
