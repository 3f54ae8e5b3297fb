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

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// FramePackDType is the dtype FramePack runs the CLIP-L text encoder: float16 (demo_gradio.py): its
// weights' and activations' dtype on a GPU unless the load asks for another.
const FramePackDType = runtime.F16

// Embeddings is CLIPTextEmbeddings: token embedding plus learned position embedding.
type Embeddings struct {
	TokenEmbedding    *runtime.Tensor // token_embedding.weight [vocab, hidden] (the weight dtype)
	PositionEmbedding *runtime.Tensor // position_embedding.weight [max_position_embeddings, hidden]
}

// Forward: ids [S] → [1, S, hidden] (positions 0 … S−1).
func (e *Embeddings) Forward(p *nn.Pass, ids []int32) *runtime.Tensor {
	S := len(ids)
	t := p.Do(p.RT.FromInt32(ids, 1, S))
	if !p.OK() {
		return nil
	}
	tok := p.Do(p.RT.EmbeddingAs(e.TokenEmbedding, t, e.PositionEmbedding.DType())) // [1, S, hidden]
	pos := p.Do(p.RT.Slice(e.PositionEmbedding, 0, 0, S))                           // [S, hidden]
	return p.Do(p.RT.Add(tok, pos))
}

// Attention is CLIPAttention: multi-head attention with biases, scale head_dim^−½ (q_proj,
// k_proj, v_proj, out_proj [hidden, hidden]).
type Attention = nn.EncoderAttention

// MLP is CLIPMLP: fc2(act(fc1(x))), shared with the other CLIP-family encoder (nn.MLP).
type MLP = nn.MLP

// EncoderLayer is CLIPEncoderLayer: pre-norm attention and MLP, each with a residual
// (layer_norm1, self_attn, layer_norm2, mlp), shared with SigLIP (nn.EncoderLayer).
type EncoderLayer = nn.EncoderLayer

// Model is CLIPTextModel (its CLIPTextTransformer).
type Model struct {
	Config Config

	Embeddings     Embeddings      // embeddings
	Layers         []*EncoderLayer // encoder.layers.{i}
	FinalLayerNorm nn.LayerNorm    // final_layer_norm

	// Report says which checkpoint tensors were loaded and which were unexpected.
	Report nn.Report

	nn.Weights // WeightBytes
	rt         *runtime.Runtime
}

// Options are the dtypes the weights are uploaded in (WeightDType: the Linear weights and the
// token embedding).
type Options = nn.Options

// Load reads dir/config.json and loads the checkpoint in dir.
func Load(rt *runtime.Runtime, dir string, o Options) (*Model, error) {
	cfg, ckpt, err := nn.OpenDir(dir, LoadConfig)
	if err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	defer ckpt.Close() // every weight is uploaded; nothing refers to the mapping afterwards
	return New(rt, cfg, ckpt, o)
}

// New uploads the tensors of src for cfg.
func New(rt *runtime.Runtime, cfg Config, src nn.Source, o Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("clip config: %w", err)
	}
	prefix, err := nn.DetectPrefix(src, "embeddings.token_embedding.weight", "", "text_model.")
	if err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	ld := nn.NewLoader(rt, src, o, prefix)
	H := cfg.HiddenSize
	eps := float32(cfg.LayerNormEps)
	m := &Model{Config: cfg, rt: rt}
	m.Embeddings = Embeddings{
		TokenEmbedding:    ld.Weight("embeddings.token_embedding.weight", cfg.VocabSize, H),
		PositionEmbedding: ld.Tensor("embeddings.position_embedding.weight", cfg.MaxPositionEmbeddings, H),
	}
	for i := range cfg.NumHiddenLayers {
		name := nn.Join("encoder.layers", i)
		l := nn.NewEncoderLayer(ld, name, H, cfg.IntermediateSize, cfg.NumAttentionHeads, eps, act)
		l.SelfAttn.Causal = true // the text transformer's causal mask (nn.CausalMask)
		m.Layers = append(m.Layers, &l)
	}
	m.FinalLayerNorm = nn.NewLayerNorm(ld, "final_layer_norm", H, eps)
	// position_ids is a non-persistent buffer in current transformers, saved by older ones.
	ld.Skip("embeddings.position_ids")
	if m.Weights, m.Report, err = ld.Finish(); err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	return m, nil
}

// Close frees the weights.
func (m *Model) Close() error {
	m.Free()
	return nil
}

// Pooled computes CLIPTextModel's pooler_output for one sequence: ids [S] → [1, hidden], the
// final layer norm of the row at Config.PoolIndex(ids). S must not exceed
// max_position_embeddings; an id outside the vocabulary or a sequence too long is an error
// wrapping nn.ErrBadInput.
func (m *Model) Pooled(ids []int32) (*runtime.Tensor, error) {
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
	p := nn.NewPass(nil, m.rt)
	defer p.Free()
	h := p.Sub("embeddings", func(q *nn.Pass) *runtime.Tensor { return m.Embeddings.Forward(q, ids[:n]) })
	mask := nn.CausalMask(p, n, nil)
	for i, l := range m.Layers {
		h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor {
			return p.Sub(fmt.Sprintf("layer %d", i), func(q *nn.Pass) *runtime.Tensor { return l.Forward(q, h, mask) })
		})
	}
	row := p.Do(p.RT.Slice(h, 1, idx, idx+1)) // [1, 1, hidden]
	row = m.FinalLayerNorm.Forward(p, row)
	out := p.Reshape(row, 1, m.Config.HiddenSize)
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("clip: %w", err)
	}
	return p.Keep(out), nil
}
