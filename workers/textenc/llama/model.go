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

// FramePackDType is the dtype FramePack runs the Llama text encoder: float16 (demo_gradio.py): its
// weights' and activations' dtype on a GPU unless the load asks for another.
const FramePackDType = runtime.F16

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
type RMSNorm = nn.RMSNorm

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

// Tables returns cos and sin [n, 1, head_dim] in dtype dt (the activations', as transformers
// casts them) for positions 0 … n−1 (broadcast over the heads) as transformers lays them out
// (cat(freqs, freqs)): columns i and i + head_dim/2 both hold frequency i, for
// runtime.RoPEHalves (rotate_half).
func (r RotaryEmbedding) Tables(p *nn.Pass, n int, dt runtime.DType) (cos, sin *runtime.Tensor) {
	d := 2 * len(r.InvFreq)
	h := d / 2
	c := make([]float32, n*d)
	s := make([]float32, n*d)
	for pos := range n {
		for i, f := range r.InvFreq {
			ph := float64(float32(pos) * f) // float32 product, as torch's float32 matmul
			cv, sv := float32(math.Cos(ph)), float32(math.Sin(ph))
			c[pos*d+i], c[pos*d+i+h] = cv, cv
			s[pos*d+i], s[pos*d+i+h] = sv, sv
		}
	}
	return p.Do(p.RT.FromFloat32As(dt, c, n, 1, d)), p.Do(p.RT.FromFloat32As(dt, s, n, 1, d))
}

// Attention is LlamaAttention: grouped-query attention with rotary embeddings on q and k
// (transformers' rotate_half layout: runtime.RoPEHalves).
type Attention struct {
	QProj nn.Linear // q_proj [heads·head_dim, hidden]
	KProj nn.Linear // k_proj [kv_heads·head_dim, hidden]
	VProj nn.Linear // v_proj [kv_heads·head_dim, hidden]
	OProj nn.Linear // o_proj [hidden, heads·head_dim]
	nn.Attention
}

// Forward: x [1, L, hidden], cos/sin [L, 1, head_dim], mask U8 [1, 1, L, L] → [1, L, hidden].
func (a *Attention) Forward(p *nn.Pass, x, cos, sin, mask *runtime.Tensor) *runtime.Tensor {
	// rotated projects x to [1, L, h·D] and rotates it as [1, L, h, D].
	rotated := func(l nn.Linear, h int) *runtime.Tensor {
		y := l.Forward(p, x)
		if !p.OK() {
			return nil
		}
		y = p.Reshape(y, 1, y.Dim(1), h, a.HeadDim)
		return p.Then(y, func(y *runtime.Tensor) *runtime.Tensor {
			return p.Do(p.RT.RoPE(runtime.RoPEHalves, y, cos, sin))
		})
	}
	q := rotated(a.QProj, a.Heads)
	k := rotated(a.KProj, a.KVHeads)
	v := a.VProj.Forward(p, x)
	o := a.Attention.Forward(p, q, k, v, mask) // [1, L, heads·D]
	p.Drop(q, k, v)
	return p.Then(o, func(o *runtime.Tensor) *runtime.Tensor { return a.OProj.Forward(p, o) })
}

// MLP is LlamaMLP: down_proj(act(gate_proj(x)) · up_proj(x)).
type MLP struct {
	GateProj nn.Linear // gate_proj [intermediate, hidden]
	UpProj   nn.Linear // up_proj [intermediate, hidden]
	DownProj nn.Linear // down_proj [hidden, intermediate]
	Act      nn.Activation
}

// Forward: x [1, L, hidden] → [1, L, hidden].
func (m *MLP) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	g := m.GateProj.Forward(p, x)
	g = p.Then(g, func(g *runtime.Tensor) *runtime.Tensor { return m.Act.Forward(p, g) })
	u := m.UpProj.Forward(p, x)
	gu := p.Do(p.RT.Mul(g, u))
	p.Drop(g, u)
	return p.Then(gu, func(gu *runtime.Tensor) *runtime.Tensor { return m.DownProj.Forward(p, gu) })
}

// DecoderLayer is LlamaDecoderLayer (pre-norm attention and MLP, each with a residual).
type DecoderLayer struct {
	InputLayernorm         RMSNorm   // input_layernorm [hidden]
	SelfAttn               Attention // self_attn
	PostAttentionLayernorm RMSNorm   // post_attention_layernorm [hidden]
	MLP                    MLP       // mlp
}

// Forward: h [1, L, hidden] → [1, L, hidden].
func (l *DecoderLayer) Forward(p *nn.Pass, h, cos, sin, mask *runtime.Tensor) *runtime.Tensor {
	x := l.InputLayernorm.Forward(p, h)
	x = p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return l.SelfAttn.Forward(p, x, cos, sin, mask) })
	r := p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Add(h, x)) })
	x = l.PostAttentionLayernorm.Forward(p, r)
	x = p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return l.MLP.Forward(p, x) })
	return p.Do(p.RT.Add(r, x))
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

	nn.Weights // the resident weights (WeightBytes below adds the streamed layers')
	rt         *runtime.Runtime
	ckpt       *safetensors.Checkpoint

	// Layers past the first `resident` stay in host memory (their entries in Layers hold no
	// tensors) and stream through two slots (nn.BlockStream) on copies.
	resident int
	stream   *nn.BlockStream[*DecoderLayer]
	copies   *nn.CopyStream
	act      runtime.DType // activation dtype
}

// Options configure Load.
type Options struct {
	// HiddenStateIndex is the hidden_states entry HiddenState computes (FramePack: −3).
	HiddenStateIndex int
	// Options are the activation dtype (DType; 0 is F32: the embedded rows are uploaded in it,
	// HiddenState's result is in it) and the dtype the weights are uploaded in (WeightDType: the
	// Linear weights, the bulk of the model; the embedding table stays in the checkpoint).
	nn.Options
	// MemoryCap is the runtime's cap the layer residency is planned for (0: none, every layer
	// resident unless MaxResidentLayers says otherwise).
	MemoryCap int64
	// ActivationBytes is kept free beside the weights under MemoryCap.
	ActivationBytes int64
	// MaxResidentLayers caps the layers kept in the runtime's memory; the rest stream from
	// host memory. 0: no limit; NoResidentLayers streams every layer.
	MaxResidentLayers int
}

// NoResidentLayers, as Options.MaxResidentLayers, streams every layer.
const NoResidentLayers = -1

// ErrMemoryBudget: the memory cap cannot hold the model with every layer streamed.
var ErrMemoryBudget = errors.New("memory cap too small for the llama text encoder")

// Load reads dir/config.json and binds the checkpoint in dir (one file or shards) for the
// hidden-state entry o.HiddenStateIndex: weights of layers past the plan and the final norm
// (unless needed) are not loaded.
func Load(rt *runtime.Runtime, dir string, o Options) (*Model, error) {
	cfg, ckpt, err := nn.OpenDir(dir, LoadConfig)
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
func New(rt *runtime.Runtime, cfg Config, src nn.Source, o Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("llama config: %w", err)
	}
	plan, err := NewPlan(cfg, o.HiddenStateIndex)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	theta, _ := cfg.Rope()
	prefix, err := nn.DetectPrefix(src, "embed_tokens.weight", "", "model.")
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	ld := nn.NewLoader(rt, src, o.Options, prefix)
	m := &Model{Config: cfg, Plan: plan, rt: rt, act: ld.DType(), RotaryEmb: NewRotaryEmbedding(cfg.HeadDim, theta)}
	H := cfg.HiddenSize
	m.EmbedTokens = nn.NewHostEmbedding(ld, "embed_tokens.weight", cfg.VocabSize, H)
	bind := func(l *nn.Loader, name string) *DecoderLayer { return bindLayer(l, name, cfg, act) }
	if m.resident, err = planLayers(cfg, plan, src, prefix, o); err != nil {
		return nil, err
	}
	m.stream = nn.NewBlockStream(rt, "layers", func(l *nn.Loader) *DecoderLayer { return bind(l, "") })
	m.Layers = nn.BindBlocks(ld, m.stream, "layers", plan.Layers, m.resident, bind)
	for i := plan.Layers; i < cfg.NumHiddenLayers; i++ {
		ld.Skip(nn.Join("layers", i) + ".")
	}
	if plan.FinalNorm {
		norm := nn.NewRMSNorm(ld, "norm", H, float32(cfg.RMSNormEps))
		m.Norm = &norm
	} else {
		ld.Skip("norm.weight")
	}
	ld.SkipRoot("lm_head.") // LlamaForCausalLM's head, beside "model.": never used by an encoder
	if m.Weights, m.Report, err = ld.Finish(); err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if m.StreamedLayers() > 0 {
		if m.copies, err = nn.NewCopyStream(rt, m.stream); err != nil {
			m.Close()
			return nil, fmt.Errorf("llama: copy stream: %w", err)
		}
	}
	return m, nil
}

// bindLayer binds decoder layer name (layers.N; "" for a streaming slot).
func bindLayer(ld *nn.Loader, name string, cfg Config, act nn.Activation) *DecoderLayer {
	H, D, I := cfg.HiddenSize, cfg.HeadDim, cfg.IntermediateSize
	heads, kvHeads := cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	eps := float32(cfg.RMSNormEps)
	at, mlp := nn.Join(name, "self_attn"), nn.Join(name, "mlp")
	return &DecoderLayer{
		InputLayernorm: nn.NewRMSNorm(ld, nn.Join(name, "input_layernorm"), H, eps),
		SelfAttn: Attention{
			QProj:     nn.NewLinear(ld, nn.Join(at, "q_proj"), H, heads*D, cfg.AttentionBias),
			KProj:     nn.NewLinear(ld, nn.Join(at, "k_proj"), H, kvHeads*D, cfg.AttentionBias),
			VProj:     nn.NewLinear(ld, nn.Join(at, "v_proj"), H, kvHeads*D, cfg.AttentionBias),
			OProj:     nn.NewLinear(ld, nn.Join(at, "o_proj"), heads*D, H, cfg.AttentionBias),
			Attention: nn.Attention{Heads: heads, KVHeads: kvHeads, HeadDim: D, Scale: float32(1 / math.Sqrt(float64(D))), Causal: true}, // nn.CausalMask: causal AND padding
		},
		PostAttentionLayernorm: nn.NewRMSNorm(ld, nn.Join(name, "post_attention_layernorm"), H, eps),
		MLP: MLP{
			GateProj: nn.NewLinear(ld, nn.Join(mlp, "gate_proj"), H, I, cfg.MLPBias),
			UpProj:   nn.NewLinear(ld, nn.Join(mlp, "up_proj"), H, I, cfg.MLPBias),
			DownProj: nn.NewLinear(ld, nn.Join(mlp, "down_proj"), I, H, cfg.MLPBias),
			Act:      act,
		},
	}
}

// LayerBytes is the size one decoder layer takes in the runtime for o (sized from shapes
// and, for weights kept as stored, the checkpoint's dtypes; nothing is loaded).
func LayerBytes(cfg Config, src nn.Source, prefix string, o Options) int64 {
	act, _ := nn.ActivationByName(cfg.HiddenAct)
	l := nn.NewShapeLoaderFor(o.Options)
	bindLayer(l, "layers.0", cfg, act)
	return l.ShapeBytes(src, prefix)
}

// planLayers is how many of plan's layers stay resident under o: the most whose weights, two
// streaming slots (one when a single layer streams) and o.ActivationBytes fit o.MemoryCap, at
// most o.MaxResidentLayers.
func planLayers(cfg Config, plan Plan, src nn.Source, prefix string, o Options) (int, error) {
	n := plan.Layers
	limit := n
	switch {
	case o.MaxResidentLayers == NoResidentLayers:
		limit = 0
	case o.MaxResidentLayers > 0:
		limit = min(limit, o.MaxResidentLayers)
	}
	if o.MemoryCap <= 0 || n == 0 {
		return limit, nil
	}
	layer := LayerBytes(cfg, src, prefix, o)
	base := planBase(cfg, plan, o)
	need := func(r int) int64 { return layerNeed(base, layer, n, r) + o.ActivationBytes }
	for r := limit; r >= 0; r-- {
		if need(r) <= o.MemoryCap {
			return r, nil
		}
	}
	return 0, fmt.Errorf("llama: %w: the cap is %d bytes; streaming every layer needs %d (%d per layer, two slots, %d kept free for activations)",
		ErrMemoryBudget, o.MemoryCap, need(0), layer, o.ActivationBytes)
}

// planBase is what a plan holds in the runtime besides its layers: the final norm when it is
// used (the embedding table is host memory).
func planBase(cfg Config, plan Plan, o Options) int64 {
	if !plan.FinalNorm {
		return 0
	}
	dt := o.DType
	if dt == 0 {
		dt = runtime.F32
	}
	return int64(cfg.HiddenSize * dt.Size())
}

// layerNeed is the runtime memory of a plan of n layers with r of them resident: the resident
// layers and the streaming slots (two, one when a single layer streams), besides base.
func layerNeed(base, layer int64, n, r int) int64 {
	return base + int64(r)*layer + int64(min(2, n-r))*layer
}

// Need sizes, before anything loads, the runtime memory of the hidden-state entry
// o.HiddenStateIndex of the model in src: every layer resident (all) and every layer streamed
// (least), o.ActivationBytes included in both, and the host memory the streamed layers then
// take (host).
func Need(cfg Config, src nn.Source, o Options) (all, least, host int64, err error) {
	if err := cfg.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("llama config: %w", err)
	}
	plan, err := NewPlan(cfg, o.HiddenStateIndex)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("llama: %w", err)
	}
	prefix, err := nn.DetectPrefix(src, "embed_tokens.weight", "", "model.")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("llama: %w", err)
	}
	layer := LayerBytes(cfg, src, prefix, o)
	base, n := planBase(cfg, plan, o), plan.Layers
	return layerNeed(base, layer, n, n) + o.ActivationBytes, layerNeed(base, layer, n, 0) + o.ActivationBytes, int64(n) * layer, nil
}

// WeightBytes returns the size of the weights: in the runtime plus the streamed layers' host
// copies.
func (m *Model) WeightBytes() int64 { return m.Weights.WeightBytes() + m.stream.HostBytes() }

// ResidentLayers is the number of layers kept in the runtime's memory.
func (m *Model) ResidentLayers() int { return min(m.resident, len(m.Layers)) }

// StreamedLayers is the number of layers streamed from host memory.
func (m *Model) StreamedLayers() int { return len(m.Layers) - m.ResidentLayers() }

// Close frees the weights and closes the checkpoint (when Load opened it).
func (m *Model) Close() error {
	m.Free()
	if m.ckpt != nil {
		err := m.ckpt.Close()
		m.ckpt = nil
		return err
	}
	return nil
}

// Free frees the resident weights, the streaming slots (first: no copy in flight
// afterwards), the copy stream and the streamed layers' host copies (FreeHost unpins them
// before it unmaps them). A second Free does nothing.
func (m *Model) Free() {
	m.Weights.Free()
	m.stream.Release()
	m.copies.Free()
	m.copies = nil
	m.stream.FreeHost()
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
	p := nn.NewPass(nil, rt)
	defer p.Free()
	h := m.EmbedTokens.Forward(p, ids) // [1, n, hidden]
	if len(m.Layers) > 0 {
		cos, sin := m.RotaryEmb.Tables(p, n, m.act)
		causal := nn.CausalMask(p, n, mask)
		defer m.stream.Release()
		for i, l := range m.Layers {
			if m.stream.Streamed(i) && p.OK() {
				var err error
				if l, err = m.stream.Use(i); err == nil {
					err = m.stream.Prefetch(i)
				}
				p.Fail(err)
			}
			h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor {
				return p.Sub(fmt.Sprintf("layer %d", i), func(q *nn.Pass) *runtime.Tensor { return l.Forward(q, h, cos, sin, causal) })
			})
			if p.OK() {
				p.Fail(m.stream.Computed(i))
			}
		}
	}
	if m.Norm != nil {
		h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return m.Norm.Forward(p, h) })
	}
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	return p.Keep(h), nil
}
