// Package clip is transformers' CLIPTextModel as HunyuanVideo's second text encoder uses it: the
// pooled output (pooler_output) of one prompt.
//
// Module tree (checkpoint names; "text_model." in front for checkpoints saved with the wrapper):
//
//	embeddings.token_embedding         Embedding [vocab, hidden]
//	embeddings.position_embedding      Embedding [max_position_embeddings, hidden]
//	encoder.layers.{i}.layer_norm1     LayerNorm [hidden]
//	encoder.layers.{i}.self_attn.{q,k,v,out}_proj  Linear with bias
//	encoder.layers.{i}.layer_norm2     LayerNorm [hidden]
//	encoder.layers.{i}.mlp.fc1, fc2    Linear with bias, hidden_act between
//	final_layer_norm                   LayerNorm [hidden]
//
// The text transformer is causal (no padding mask: FramePack passes none), so the pooled row
// depends only on the positions up to it; later positions are not computed.
package clip

import (
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Embeddings is CLIPTextEmbeddings: token embedding plus learned position embedding.
type Embeddings struct {
	TokenEmbedding    *runtime.Tensor // token_embedding.weight [vocab, hidden] (may be 16-bit)
	PositionEmbedding *runtime.Tensor // position_embedding.weight [max_position_embeddings, hidden]
}

// Forward: ids [S] → [1, S, hidden] (positions 0 … S−1).
func (e *Embeddings) Forward(rt *runtime.Runtime, ids []int32) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	S := len(ids)
	t, err := sc.Track(rt.FromInt32(ids, 1, S))
	if err != nil {
		return nil, err
	}
	tok, err := sc.Track(rt.EmbeddingAs(e.TokenEmbedding, t, e.PositionEmbedding.DType())) // [1, S, hidden]
	if err != nil {
		return nil, err
	}
	pos, err := sc.Track(rt.Slice(e.PositionEmbedding, 0, 0, S)) // [S, hidden]
	if err != nil {
		return nil, err
	}
	return rt.Add(tok, pos)
}

// Attention is CLIPAttention: multi-head attention with biases, scale head_dim^−½.
type Attention struct {
	QProj   nn.Linear // [hidden, hidden]
	KProj   nn.Linear // [hidden, hidden]
	VProj   nn.Linear // [hidden, hidden]
	OutProj nn.Linear // [hidden, hidden]

	heads, headDim int
}

// Forward: x [1, S, hidden], mask U8 [1, 1, S, S] → [1, S, hidden].
func (a *Attention) Forward(rt *runtime.Runtime, x, mask *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	S := x.Dim(1)
	heads := func(p nn.Linear) (*runtime.Tensor, error) { // → [1, heads, S, head_dim]
		y, err := sc.Track(p.Forward(rt, x))
		if err != nil {
			return nil, err
		}
		if y, err = sc.Track(y.Reshape(1, S, a.heads, a.headDim)); err != nil {
			return nil, err
		}
		return sc.Track(rt.Permute(y, 0, 2, 1, 3))
	}
	q, err := heads(a.QProj)
	if err != nil {
		return nil, err
	}
	k, err := heads(a.KProj)
	if err != nil {
		return nil, err
	}
	v, err := heads(a.VProj)
	if err != nil {
		return nil, err
	}
	scale := float32(1 / math.Sqrt(float64(a.headDim)))
	o, err := sc.Track(rt.Attention(q, k, v, mask, runtime.AttentionParams{Scale: scale}))
	if err != nil {
		return nil, err
	}
	if o, err = sc.Track(rt.Permute(o, 0, 2, 1, 3)); err != nil {
		return nil, err
	}
	if o, err = sc.Track(o.Reshape(1, S, a.heads*a.headDim)); err != nil {
		return nil, err
	}
	return a.OutProj.Forward(rt, o)
}

// MLP is CLIPMLP: fc2(act(fc1(x))), shared with the other CLIP-family encoder (nn.MLP).
type MLP = nn.MLP

// EncoderLayer is CLIPEncoderLayer (pre-norm attention and MLP, each with a residual).
type EncoderLayer struct {
	LayerNorm1 nn.LayerNorm
	SelfAttn   Attention
	LayerNorm2 nn.LayerNorm
	MLP        MLP
}

// Forward: h [1, S, hidden] → [1, S, hidden].
func (l *EncoderLayer) Forward(rt *runtime.Runtime, h, mask *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	x, err := sc.Track(l.LayerNorm1.Forward(rt, h))
	if err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.SelfAttn.Forward(rt, x, mask)); err != nil {
		return nil, err
	}
	if h, err = sc.Track(rt.Add(h, x)); err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.LayerNorm2.Forward(rt, h)); err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.MLP.Forward(rt, x)); err != nil {
		return nil, err
	}
	return rt.Add(h, x)
}

// Model is CLIPTextModel (its CLIPTextTransformer).
type Model struct {
	Config Config

	Embeddings     Embeddings
	Layers         []*EncoderLayer // encoder.layers.{i}
	FinalLayerNorm nn.LayerNorm    // final_layer_norm

	// Report says which checkpoint tensors were loaded and which were unexpected.
	Report nn.Report

	rt      *runtime.Runtime
	ckpt    *safetensors.Checkpoint
	weights []*runtime.Tensor
}

// Options configure Load.
type Options struct {
	// DType is the dtype weights are stored in the runtime as (F32 on the cpu backend).
	DType runtime.DType
	// WeightDType is the dtype of the Linear weights and the token embedding: F16 or BF16 keep
	// them in 16 bits, runtime.AsStored in the checkpoint's dtype; zero means F32.
	WeightDType runtime.DType
}

// Load reads dir/config.json and loads the checkpoint in dir.
func Load(rt *runtime.Runtime, dir string, o Options) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ckpt, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	defer ckpt.Close() // every weight is uploaded; nothing refers to the mapping afterwards
	return New(rt, cfg, ckpt, o)
}

// New uploads the tensors of src for cfg.
func New(rt *runtime.Runtime, cfg Config, src nn.Source, o Options) (_ *Model, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("clip config: %w", err)
	}
	if o.DType == 0 {
		o.DType = runtime.F32
	}
	prefix, err := nn.DetectPrefix(src, "embeddings.token_embedding.weight", "", "text_model.")
	if err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	ld := nn.NewLoader(rt, src, o.DType, prefix)
	ld.SetWeightDType(o.WeightDType)
	defer func() {
		if err != nil {
			ld.Free()
			err = fmt.Errorf("clip: %w", err)
		}
	}()
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, err
	}
	H, I := cfg.HiddenSize, cfg.IntermediateSize
	eps := float32(cfg.LayerNormEps)
	m := &Model{Config: cfg, rt: rt}
	if m.Embeddings.TokenEmbedding, err = ld.LoadWeight("embeddings.token_embedding.weight", cfg.VocabSize, H); err != nil {
		return nil, err
	}
	if m.Embeddings.PositionEmbedding, err = ld.Load("embeddings.position_embedding.weight", cfg.MaxPositionEmbeddings, H); err != nil {
		return nil, err
	}
	for i := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("encoder.layers.%d.", i)
		l := &EncoderLayer{}
		if l.LayerNorm1, err = nn.LoadLayerNorm(ld, p+"layer_norm1", H, eps); err != nil {
			return nil, err
		}
		if l.LayerNorm2, err = nn.LoadLayerNorm(ld, p+"layer_norm2", H, eps); err != nil {
			return nil, err
		}
		a := &l.SelfAttn
		a.heads, a.headDim = cfg.NumAttentionHeads, H/cfg.NumAttentionHeads
		for _, pr := range []struct {
			lin  *nn.Linear
			name string
		}{{&a.QProj, "q_proj"}, {&a.KProj, "k_proj"}, {&a.VProj, "v_proj"}, {&a.OutProj, "out_proj"}} {
			if *pr.lin, err = nn.LoadLinear(ld, p+"self_attn."+pr.name, H, H, true); err != nil {
				return nil, err
			}
		}
		if l.MLP, err = nn.LoadMLP(ld, p+"mlp", H, I, act); err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, l)
	}
	if m.FinalLayerNorm, err = nn.LoadLayerNorm(ld, "final_layer_norm", H, eps); err != nil {
		return nil, err
	}
	// position_ids is a non-persistent buffer in current transformers, saved by older ones.
	ld.Skip("embeddings.position_ids")
	m.weights = ld.Tensors()
	m.Report = ld.Report()
	return m, nil
}

// WeightBytes returns the size of the weights held in the runtime.
func (m *Model) WeightBytes() int64 { return m.Report.Bytes }

// Close frees the weights.
func (m *Model) Close() error {
	for _, t := range m.weights {
		t.Free()
	}
	m.weights = nil
	return nil
}

// Pooled computes CLIPTextModel's pooler_output for one sequence: ids [S] → [1, hidden], the
// final layer norm of the row at Config.PoolIndex(ids). S must not exceed
// max_position_embeddings; an id outside the vocabulary or a sequence too long is an error
// wrapping nn.ErrBadInput.
func (m *Model) Pooled(ids []int32) (*runtime.Tensor, error) {
	rt := m.rt
	S := len(ids)
	if S == 0 || S > m.Config.MaxPositionEmbeddings {
		return nil, fmt.Errorf("clip: %d ids (1 to %d): %w", S, m.Config.MaxPositionEmbeddings, nn.ErrBadInput)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= m.Config.VocabSize {
			return nil, fmt.Errorf("clip: token id %d at %d outside the vocabulary [0, %d): %w", id, i, m.Config.VocabSize, nn.ErrBadInput)
		}
	}
	idx := m.Config.PoolIndex(ids)
	n := idx + 1 // causal: rows after idx do not change row idx
	var sc runtime.Scope
	defer sc.Free()
	h, err := sc.Track(m.Embeddings.Forward(rt, ids[:n]))
	if err != nil {
		return nil, fmt.Errorf("clip: embeddings: %w", err)
	}
	mask, err := sc.Track(nn.CausalMask(rt, n, nil))
	if err != nil {
		return nil, fmt.Errorf("clip: mask: %w", err)
	}
	for i, l := range m.Layers {
		next, err := l.Forward(rt, h, mask)
		if err != nil {
			return nil, fmt.Errorf("clip: layer %d: %w", i, err)
		}
		h.Free()
		h = next
		sc.Add(h)
	}
	row, err := sc.Track(rt.Slice(h, 1, idx, idx+1)) // [1, 1, hidden]
	if err != nil {
		return nil, fmt.Errorf("clip: pool: %w", err)
	}
	if row, err = sc.Track(m.FinalLayerNorm.Forward(rt, row)); err != nil {
		return nil, fmt.Errorf("clip: final layer norm: %w", err)
	}
	return row.Reshape(1, m.Config.HiddenSize)
}
