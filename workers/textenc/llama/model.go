// Package llama is transformers' LlamaModel as HunyuanVideo's text encoder uses it: the
// hidden states of one prompt, up to the layer a caller asks for.
//
// Module tree (checkpoint names; "model." in front for a LlamaForCausalLM checkpoint):
//
//	embed_tokens                        Embedding [vocab, hidden] (kept on the host, see nn.HostEmbedding)
//	layers.{i}.input_layernorm          RMSNorm [hidden]
//	layers.{i}.self_attn.{q,k,v,o}_proj Linear (GQA: k and v have num_key_value_heads heads)
//	layers.{i}.post_attention_layernorm RMSNorm [hidden]
//	layers.{i}.mlp.{gate,up,down}_proj  Linear, down(act(gate(x)) · up(x))
//	norm                                RMSNorm [hidden]
//
// hidden_states follows transformers: entry 0 is the embeddings, entry i (1 ≤ i < L) the output
// of layer i−1, entry L the last layer's output after the final norm. Only the layers (and the
// norm) the asked-for entry depends on are loaded and computed: for FramePack's
// hidden_states[-3] that is num_hidden_layers − 2 layers and no final norm.
package llama

import (
	"errors"
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Plan says which parts of the model one hidden-state entry needs.
type Plan struct {
	// HiddenStateIndex is the entry asked for; negative counts from the end of the
	// num_hidden_layers+1 entries.
	HiddenStateIndex int
	// Layers is the number of decoder layers computed (layers 0 … Layers−1).
	Layers int
	// FinalNorm is whether the final norm is applied (the last entry only).
	FinalNorm bool
}

// NewPlan resolves hidden-state entry index for cfg.
func NewPlan(cfg Config, index int) (Plan, error) {
	n := cfg.NumHiddenLayers + 1
	i := index
	if i < 0 {
		i += n
	}
	if i < 0 || i >= n {
		return Plan{}, fmt.Errorf("hidden state %d out of range for %d layers (%d entries)", index, cfg.NumHiddenLayers, n)
	}
	return Plan{HiddenStateIndex: index, Layers: i, FinalNorm: i == cfg.NumHiddenLayers}, nil
}

// RMSNorm is LlamaRMSNorm: x / sqrt(mean(x²) + eps) · weight over the last dim.
type RMSNorm struct {
	Weight *runtime.Tensor // [hidden]
	Eps    float32
}

// Forward keeps x's shape.
func (n RMSNorm) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	return rt.RMSNorm(x, n.Weight, n.Eps)
}

// RotaryEmbedding is LlamaRotaryEmbedding of the default type: inv_freq[i] = 1/θ^(2i/head_dim),
// computed in float32 as transformers does, so the phases match it bit for bit.
type RotaryEmbedding struct {
	InvFreq []float32 // [head_dim/2]
}

// NewRotaryEmbedding builds the frequencies for head_dim and theta.
func NewRotaryEmbedding(headDim int, theta float64) RotaryEmbedding {
	inv := make([]float32, headDim/2)
	base := float64(float32(theta))
	for i := range inv {
		e := float32(2*i) / float32(headDim)
		inv[i] = 1 / float32(math.Pow(base, float64(e)))
	}
	return RotaryEmbedding{InvFreq: inv}
}

// Tables returns cos and sin [n, head_dim] for positions 0 … n−1 as transformers lays them out
// (cat(freqs, freqs)): columns i and i + head_dim/2 both hold frequency i, for
// runtime.RoPEHalves (rotate_half).
func (r RotaryEmbedding) Tables(rt *runtime.Runtime, n int) (cos, sin *runtime.Tensor, err error) {
	d := 2 * len(r.InvFreq)
	h := d / 2
	c := make([]float32, n*d)
	s := make([]float32, n*d)
	for p := range n {
		for i, f := range r.InvFreq {
			ph := float64(float32(p) * f) // float32 product, as torch's float32 matmul
			cv, sv := float32(math.Cos(ph)), float32(math.Sin(ph))
			c[p*d+i], c[p*d+i+h] = cv, cv
			s[p*d+i], s[p*d+i+h] = sv, sv
		}
	}
	if cos, err = rt.FromFloat32(c, n, d); err != nil {
		return nil, nil, err
	}
	if sin, err = rt.FromFloat32(s, n, d); err != nil {
		cos.Free()
		return nil, nil, err
	}
	return cos, sin, nil
}

// Attention is LlamaAttention: grouped-query attention with rotary embeddings on q and k
// (transformers' rotate_half layout: runtime.RoPEHalves).
type Attention struct {
	QProj nn.Linear // [heads·head_dim, hidden]
	KProj nn.Linear // [kv_heads·head_dim, hidden]
	VProj nn.Linear // [kv_heads·head_dim, hidden]
	OProj nn.Linear // [hidden, heads·head_dim]

	heads, kvHeads, headDim int
}

// Forward: x [1, L, hidden], cos/sin [L, head_dim], mask U8 [1, 1, L, L] → [1, L, hidden].
func (a *Attention) Forward(rt *runtime.Runtime, x, cos, sin, mask *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	L := x.Dim(1)
	// heads projects x to [1, L, h·D] and returns it as [1, h, L, D].
	heads := func(p nn.Linear, h int) (*runtime.Tensor, error) {
		y, err := sc.Track(p.Forward(rt, x))
		if err != nil {
			return nil, err
		}
		y, err = sc.Track(y.Reshape(1, L, h, a.headDim))
		if err != nil {
			return nil, err
		}
		return sc.Track(rt.Permute(y, 0, 2, 1, 3))
	}
	q, err := heads(a.QProj, a.heads)
	if err != nil {
		return nil, err
	}
	k, err := heads(a.KProj, a.kvHeads)
	if err != nil {
		return nil, err
	}
	v, err := heads(a.VProj, a.kvHeads)
	if err != nil {
		return nil, err
	}
	if q, err = sc.Track(rt.RoPEWith(runtime.RoPEHalves, q, cos, sin)); err != nil {
		return nil, err
	}
	if k, err = sc.Track(rt.RoPEWith(runtime.RoPEHalves, k, cos, sin)); err != nil {
		return nil, err
	}
	scale := float32(1 / math.Sqrt(float64(a.headDim)))
	o, err := sc.Track(rt.Attention(q, k, v, mask, runtime.AttentionParams{Scale: scale})) // [1, H, L, D]
	if err != nil {
		return nil, err
	}
	if o, err = sc.Track(rt.Permute(o, 0, 2, 1, 3)); err != nil { // [1, L, H, D]
		return nil, err
	}
	if o, err = sc.Track(o.Reshape(1, L, a.heads*a.headDim)); err != nil {
		return nil, err
	}
	return a.OProj.Forward(rt, o)
}

// MLP is LlamaMLP: down_proj(act(gate_proj(x)) · up_proj(x)).
type MLP struct {
	GateProj nn.Linear // [intermediate, hidden]
	UpProj   nn.Linear // [intermediate, hidden]
	DownProj nn.Linear // [hidden, intermediate]

	act nn.Activation
}

// Forward keeps x's shape [1, L, hidden].
func (m *MLP) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	g, err := sc.Track(m.GateProj.Forward(rt, x))
	if err != nil {
		return nil, err
	}
	if g, err = sc.Track(m.act(rt, g)); err != nil {
		return nil, err
	}
	u, err := sc.Track(m.UpProj.Forward(rt, x))
	if err != nil {
		return nil, err
	}
	if g, err = sc.Track(rt.Mul(g, u)); err != nil {
		return nil, err
	}
	return m.DownProj.Forward(rt, g)
}

// DecoderLayer is LlamaDecoderLayer (pre-norm attention and MLP, each with a residual).
type DecoderLayer struct {
	InputLayernorm         RMSNorm
	SelfAttn               Attention
	PostAttentionLayernorm RMSNorm
	MLP                    MLP
}

// Forward: h [1, L, hidden] → [1, L, hidden].
func (l *DecoderLayer) Forward(rt *runtime.Runtime, h, cos, sin, mask *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	x, err := sc.Track(l.InputLayernorm.Forward(rt, h))
	if err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.SelfAttn.Forward(rt, x, cos, sin, mask)); err != nil {
		return nil, err
	}
	if h, err = sc.Track(rt.Add(h, x)); err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.PostAttentionLayernorm.Forward(rt, h)); err != nil {
		return nil, err
	}
	if x, err = sc.Track(l.MLP.Forward(rt, x)); err != nil {
		return nil, err
	}
	return rt.Add(h, x)
}

// Model is LlamaModel, loaded for one Plan.
type Model struct {
	Config Config
	Plan   Plan

	EmbedTokens *nn.HostEmbedding // embed_tokens.weight [vocab, hidden]
	Layers      []*DecoderLayer   // layers.0 … layers.{Plan.Layers−1}
	Norm        *RMSNorm          // norm.weight [hidden]; nil unless Plan.FinalNorm
	RotaryEmb   RotaryEmbedding

	// Report says which checkpoint tensors were loaded, skipped (layers never computed) and
	// unexpected.
	Report nn.Report

	rt      *runtime.Runtime
	ckpt    *safetensors.Checkpoint
	weights []*runtime.Tensor
}

// Options configure Load.
type Options struct {
	// HiddenStateIndex is the hidden_states entry HiddenState computes (FramePack: −3).
	HiddenStateIndex int
	// DType is the dtype weights are stored in the runtime as (F32 on the cpu backend).
	DType runtime.DType
	// WeightDType is the dtype of the Linear weights (the bulk of the model): F16 or BF16 keep
	// them in 16 bits, runtime.AsStored in the checkpoint's dtype; zero means F32.
	WeightDType runtime.DType
}

// Load reads dir/config.json and binds the checkpoint in dir (one file or shards) for the
// hidden-state entry o.HiddenStateIndex: weights of layers past the plan and the final norm
// (unless needed) are not loaded.
func Load(rt *runtime.Runtime, dir string, o Options) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ckpt, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	m, err := New(rt, cfg, ckpt, o)
	if err != nil {
		ckpt.Close()
		return nil, err
	}
	m.ckpt = ckpt
	return m, nil
}

// New binds the tensors of src (which must stay open while the model is used) for cfg.
func New(rt *runtime.Runtime, cfg Config, src nn.Source, o Options) (_ *Model, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("llama config: %w", err)
	}
	plan, err := NewPlan(cfg, o.HiddenStateIndex)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if o.DType == 0 {
		o.DType = runtime.F32
	}
	theta, _ := cfg.Rope()
	prefix, err := nn.DetectPrefix(src, "embed_tokens.weight", "", "model.")
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	ld := nn.NewLoader(rt, src, o.DType, prefix)
	ld.SetWeightDType(o.WeightDType)
	defer func() {
		if err != nil {
			ld.Free()
			err = fmt.Errorf("llama: %w", err)
		}
	}()
	m := &Model{Config: cfg, Plan: plan, rt: rt, RotaryEmb: NewRotaryEmbedding(cfg.HeadDim, theta)}
	H, D := cfg.HiddenSize, cfg.HeadDim
	if m.EmbedTokens, err = nn.LoadHostEmbedding(ld, "embed_tokens.weight", cfg.VocabSize, H); err != nil {
		return nil, err
	}
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, err
	}
	eps := float32(cfg.RMSNormEps)
	for i := range plan.Layers {
		p := fmt.Sprintf("layers.%d.", i)
		l := &DecoderLayer{}
		l.InputLayernorm.Eps, l.PostAttentionLayernorm.Eps = eps, eps
		if l.InputLayernorm.Weight, err = ld.Load(p+"input_layernorm.weight", H); err != nil {
			return nil, err
		}
		if l.PostAttentionLayernorm.Weight, err = ld.Load(p+"post_attention_layernorm.weight", H); err != nil {
			return nil, err
		}
		a := &l.SelfAttn
		a.heads, a.kvHeads, a.headDim = cfg.NumAttentionHeads, cfg.NumKeyValueHeads, D
		if a.QProj, err = nn.LoadLinear(ld, p+"self_attn.q_proj", H, a.heads*D, cfg.AttentionBias); err != nil {
			return nil, err
		}
		if a.KProj, err = nn.LoadLinear(ld, p+"self_attn.k_proj", H, a.kvHeads*D, cfg.AttentionBias); err != nil {
			return nil, err
		}
		if a.VProj, err = nn.LoadLinear(ld, p+"self_attn.v_proj", H, a.kvHeads*D, cfg.AttentionBias); err != nil {
			return nil, err
		}
		if a.OProj, err = nn.LoadLinear(ld, p+"self_attn.o_proj", a.heads*D, H, cfg.AttentionBias); err != nil {
			return nil, err
		}
		l.MLP.act = act
		I := cfg.IntermediateSize
		if l.MLP.GateProj, err = nn.LoadLinear(ld, p+"mlp.gate_proj", H, I, cfg.MLPBias); err != nil {
			return nil, err
		}
		if l.MLP.UpProj, err = nn.LoadLinear(ld, p+"mlp.up_proj", H, I, cfg.MLPBias); err != nil {
			return nil, err
		}
		if l.MLP.DownProj, err = nn.LoadLinear(ld, p+"mlp.down_proj", I, H, cfg.MLPBias); err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, l)
	}
	for i := plan.Layers; i < cfg.NumHiddenLayers; i++ {
		ld.Skip(fmt.Sprintf("layers.%d.", i))
	}
	if plan.FinalNorm {
		m.Norm = &RMSNorm{Eps: eps}
		if m.Norm.Weight, err = ld.Load("norm.weight", H); err != nil {
			return nil, err
		}
	} else {
		ld.Skip("norm.weight")
	}
	ld.SkipRoot("lm_head.") // LlamaForCausalLM's head, beside "model.": never used by an encoder
	m.weights = ld.Tensors()
	m.Report = ld.Report()
	return m, nil
}

// WeightBytes returns the size of the weights held in the runtime.
func (m *Model) WeightBytes() int64 { return m.Report.Bytes }

// Close frees the weights and closes the checkpoint (when Load opened it).
func (m *Model) Close() error {
	for _, t := range m.weights {
		t.Free()
	}
	m.weights = nil
	if m.ckpt != nil {
		err := m.ckpt.Close()
		m.ckpt = nil
		return err
	}
	return nil
}

// ErrEmptyMask is returned by HiddenState when the mask attends no position.
var ErrEmptyMask = errors.New("attention mask attends no position")

// HiddenState computes hidden_states[Plan.HiddenStateIndex] of one sequence, as LlamaModel
// with output_hidden_states and this attention mask does (causal AND padding mask, positions
// 0 … S−1). ids and mask have S entries (mask true = attend).
//
// Rows past the last attended position are not computed: under the causal mask no earlier row
// sees them, so the rows returned are those transformers gives. The result is
// [1, n, hidden] with n = last attended position + 1.
func (m *Model) HiddenState(ids []int32, mask []bool) (*runtime.Tensor, error) {
	rt := m.rt
	if len(ids) != len(mask) {
		return nil, fmt.Errorf("llama: %d ids and %d mask entries: %w", len(ids), len(mask), nn.ErrBadInput)
	}
	n := 0
	for i, keep := range mask {
		if keep {
			n = i + 1
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("llama: %w: %w", ErrEmptyMask, nn.ErrBadInput)
	}
	ids, mask = ids[:n], mask[:n]
	h, err := m.EmbedTokens.Forward(rt, ids) // [1, n, hidden]
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if len(m.Layers) == 0 && m.Norm == nil {
		return h, nil
	}
	var sc runtime.Scope
	defer sc.Free()
	sc.Add(h)
	cos, sin, err := m.RotaryEmb.Tables(rt, n)
	if err != nil {
		return nil, fmt.Errorf("llama: rope: %w", err)
	}
	sc.Add(cos, sin)
	causal, err := sc.Track(nn.CausalMask(rt, n, mask))
	if err != nil {
		return nil, fmt.Errorf("llama: mask: %w", err)
	}
	for i, l := range m.Layers {
		next, err := l.Forward(rt, h, cos, sin, causal)
		if err != nil {
			return nil, fmt.Errorf("llama: layer %d: %w", i, err)
		}
		h.Free()
		h = next
		sc.Add(h)
	}
	if m.Norm != nil {
		if h, err = sc.Track(m.Norm.Forward(rt, h)); err != nil {
			return nil, fmt.Errorf("llama: norm: %w", err)
		}
	}
	return sc.Keep(h), nil
}
