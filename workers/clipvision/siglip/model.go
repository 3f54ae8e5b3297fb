// Package siglip is transformers' SiglipVisionModel as FramePack uses it (FLUX Redux's
// image_encoder, SigLIP so400m-patch14-384): last_hidden_state of one preprocessed image, with
// the SiglipImageProcessor that prepares it (processor.go).
//
// Module tree (checkpoint names; "vision_model." in front for checkpoints saved by
// transformers 4 and for the FLUX Redux checkpoint):
//
//	embeddings.patch_embedding         Conv2d [hidden, channels, patch, patch] stride patch, bias
//	embeddings.position_embedding      Embedding [(image_size/patch)², hidden]
//	encoder.layers.{i}.layer_norm1     LayerNorm [hidden]
//	encoder.layers.{i}.self_attn.{q,k,v,out}_proj  Linear [hidden, hidden] with bias
//	encoder.layers.{i}.layer_norm2     LayerNorm [hidden]
//	encoder.layers.{i}.mlp.fc1, fc2    Linear with bias; hidden_act (gelu_pytorch_tanh) between
//	post_layernorm                     LayerNorm [hidden]; its output is last_hidden_state
//	head.…                             attention pooling head (pooler_output): not loaded
package siglip

import (
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Embeddings is SiglipVisionEmbeddings: a patchifying convolution plus learned position
// embeddings (no class token).
type Embeddings struct {
	PatchWeight       *runtime.Tensor // patch_embedding.weight [hidden, channels, patch, patch]
	PatchBias         *runtime.Tensor // patch_embedding.bias [hidden]
	PositionEmbedding *runtime.Tensor // position_embedding.weight [grid², hidden]

	patch int
}

// Forward: pixels [B, C, H, W] → [B, (H/patch)·(W/patch), hidden].
func (e *Embeddings) Forward(rt *runtime.Runtime, pixels *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	x, err := sc.Track(rt.Conv2d(pixels, e.PatchWeight, e.PatchBias,
		runtime.Conv2dParams{Stride: [2]int{e.patch, e.patch}})) // [B, hidden, g, g]
	if err != nil {
		return nil, fmt.Errorf("patch embedding: %w", err)
	}
	B, D := x.Dim(0), x.Dim(1)
	if x, err = sc.Track(x.Reshape(B, D, -1)); err != nil {
		return nil, err
	}
	if x, err = sc.Track(rt.Permute(x, 0, 2, 1)); err != nil { // flatten(2).transpose(1, 2)
		return nil, err
	}
	return rt.Add(x, e.PositionEmbedding)
}

// Attention is SiglipAttention: multi-head self-attention with biases, scale head_dim^−½, no mask.
type Attention struct {
	QProj, KProj, VProj, OutProj nn.Linear // [hidden, hidden]

	heads, headDim int
}

// Forward: x [B, N, hidden] → [B, N, hidden].
func (a *Attention) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	B, N := x.Dim(0), x.Dim(1)
	split := func(p nn.Linear) (*runtime.Tensor, error) { // → [B, heads, N, head_dim]
		y, err := sc.Track(p.Forward(rt, x))
		if err != nil {
			return nil, err
		}
		if y, err = sc.Track(y.Reshape(B, N, a.heads, a.headDim)); err != nil {
			return nil, err
		}
		return sc.Track(rt.Permute(y, 0, 2, 1, 3))
	}
	q, err := split(a.QProj)
	if err != nil {
		return nil, err
	}
	k, err := split(a.KProj)
	if err != nil {
		return nil, err
	}
	v, err := split(a.VProj)
	if err != nil {
		return nil, err
	}
	scale := float32(1 / math.Sqrt(float64(a.headDim)))
	o, err := sc.Track(rt.Attention(q, k, v, nil, runtime.AttentionParams{Scale: scale}))
	if err != nil {
		return nil, err
	}
	if o, err = sc.Track(rt.Permute(o, 0, 2, 1, 3)); err != nil { // [B, N, heads, head_dim]
		return nil, err
	}
	if o, err = sc.Track(o.Reshape(B, N, a.heads*a.headDim)); err != nil {
		return nil, err
	}
	return a.OutProj.Forward(rt, o)
}

// MLP is SiglipMLP: fc2(act(fc1(x))), shared with the other CLIP-family encoder (nn.MLP).
type MLP = nn.MLP

// EncoderLayer is SiglipEncoderLayer: pre-norm attention and MLP, each with a residual.
type EncoderLayer struct {
	LayerNorm1 nn.LayerNorm
	SelfAttn   Attention
	LayerNorm2 nn.LayerNorm
	MLP        MLP
}

// Forward: x [B, N, hidden] → [B, N, hidden].
func (l *EncoderLayer) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	h, err := sc.Track(l.LayerNorm1.Forward(rt, x))
	if err != nil {
		return nil, err
	}
	if h, err = sc.Track(l.SelfAttn.Forward(rt, h)); err != nil {
		return nil, fmt.Errorf("self_attn: %w", err)
	}
	r, err := sc.Track(rt.Add(x, h))
	if err != nil {
		return nil, err
	}
	if h, err = sc.Track(l.LayerNorm2.Forward(rt, r)); err != nil {
		return nil, err
	}
	if h, err = sc.Track(l.MLP.Forward(rt, h)); err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	return rt.Add(r, h)
}

// Model is SiglipVisionModel without its pooling head.
type Model struct {
	Config        Config
	Embeddings    Embeddings
	Layers        []EncoderLayer
	PostLayerNorm nn.LayerNorm

	rt      *runtime.Runtime
	weights []*runtime.Tensor
	report  nn.Report
}

// LoadOptions are Load's options.
type LoadOptions struct {
	// DType is the dtype the weights are stored in on the runtime; 0 means F32 (the cpu backend
	// computes in F32 only).
	DType runtime.DType
	// WeightDType is the dtype of the Linear and patch-embedding weights (nearly all the bytes):
	// F16 or BF16 keep them in 16 bits, runtime.AsStored in the checkpoint's dtype; 0 means F32.
	WeightDType runtime.DType
}

// Load reads dir/config.json and the checkpoint in dir and uploads the weights into rt. The
// pooling head's tensors are not loaded; they and any unknown tensors are listed in Report.
func Load(rt *runtime.Runtime, dir string, opts LoadOptions) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("load siglip: %w", err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("load siglip: %w", err)
	}
	defer ck.Close()
	m, err := LoadFrom(rt, cfg, ck, opts)
	if err != nil {
		return nil, fmt.Errorf("load siglip %s: %w", dir, err)
	}
	return m, nil
}

// LoadFrom uploads the weights of a validated cfg from src (a *safetensors.Checkpoint) into rt.
// src may be closed once it returns: every weight is copied into the runtime.
func LoadFrom(rt *runtime.Runtime, cfg Config, src Source, opts LoadOptions) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	dt := opts.DType
	if dt == 0 {
		dt = runtime.F32
	}
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, err
	}
	prefix, err := nn.DetectPrefix(src, "embeddings.patch_embedding.weight", checkpointPrefixes...)
	if err != nil {
		return nil, err
	}
	l := nn.NewLoader(rt, src, dt, prefix)
	l.SetWeightDType(opts.WeightDType)
	ok := false
	defer func() {
		if !ok {
			l.Free()
		}
	}()
	D, I, P, C := cfg.HiddenSize, cfg.IntermediateSize, cfg.PatchSize, cfg.NumChannels
	eps := float32(cfg.LayerNormEps)
	m := &Model{Config: cfg, rt: rt}
	m.Embeddings.patch = P
	if m.Embeddings.PatchWeight, err = l.LoadWeight("embeddings.patch_embedding.weight", D, C, P, P); err != nil {
		return nil, err
	}
	if m.Embeddings.PatchBias, err = l.Load("embeddings.patch_embedding.bias", D); err != nil {
		return nil, err
	}
	if m.Embeddings.PositionEmbedding, err = l.Load("embeddings.position_embedding.weight", cfg.NumPatches(), D); err != nil {
		return nil, err
	}
	m.Layers = make([]EncoderLayer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		p := fmt.Sprintf("encoder.layers.%d.", i)
		ly := &m.Layers[i]
		ly.SelfAttn.heads, ly.SelfAttn.headDim = cfg.NumAttentionHeads, cfg.HeadDim()
		if ly.LayerNorm1, err = nn.LoadLayerNorm(l, p+"layer_norm1", D, eps); err != nil {
			return nil, err
		}
		if ly.LayerNorm2, err = nn.LoadLayerNorm(l, p+"layer_norm2", D, eps); err != nil {
			return nil, err
		}
		for _, lin := range []struct {
			name string
			dst  *nn.Linear
		}{{"self_attn.q_proj", &ly.SelfAttn.QProj}, {"self_attn.k_proj", &ly.SelfAttn.KProj},
			{"self_attn.v_proj", &ly.SelfAttn.VProj}, {"self_attn.out_proj", &ly.SelfAttn.OutProj}} {
			if *lin.dst, err = nn.LoadLinear(l, p+lin.name, D, D, true); err != nil {
				return nil, err
			}
		}
		if ly.MLP, err = nn.LoadMLP(l, p+"mlp", D, I, act); err != nil {
			return nil, err
		}
	}
	if m.PostLayerNorm, err = nn.LoadLayerNorm(l, "post_layernorm", D, eps); err != nil {
		return nil, err
	}
	l.Skip("head.")
	m.report = l.Report()
	m.weights = l.Tensors()
	ok = true
	return m, nil
}

// Report says which checkpoint tensors were loaded, skipped (the pooling head) and unexpected.
func (m *Model) Report() nn.Report { return m.report }

// WeightBytes is the size of the loaded weights in the runtime's memory.
func (m *Model) WeightBytes() int64 { return m.report.Bytes }

// Free frees the weights.
func (m *Model) Free() {
	for _, t := range m.weights {
		t.Free()
	}
	m.weights = nil
}

// checkPixels checks that pixels is [B, num_channels, H, W] with the model's patch grid.
func (m *Model) checkPixels(pixels *runtime.Tensor) error {
	c := m.Config
	if pixels == nil {
		return fmt.Errorf("%w: no pixel values", ErrBadInput)
	}
	s := pixels.Shape()
	if len(s) != 4 || s[0] < 1 || s[1] != c.NumChannels {
		return fmt.Errorf("%w: pixel values %v: want [B, %d, %d, %d]", ErrBadInput, s, c.NumChannels, c.ImageSize, c.ImageSize)
	}
	if g := c.GridSize(); s[2]/c.PatchSize != g || s[3]/c.PatchSize != g {
		return fmt.Errorf("%w: pixel values %v make a %dx%d patch grid, the model's position embeddings are %dx%d (image_size %d, patch_size %d)",
			ErrBadInput, s, s[2]/c.PatchSize, s[3]/c.PatchSize, g, g, c.ImageSize, c.PatchSize)
	}
	if pixels.DType() != runtime.F32 {
		return fmt.Errorf("%w: pixel values are %s, want f32", ErrBadInput, pixels.DType())
	}
	return nil
}

// Forward computes last_hidden_state: pixels [B, C, H, W] (f32, H/patch = W/patch = grid) →
// [B, grid², hidden], after post_layernorm. hook, if not nil, is called before each encoder
// layer (i from 0) and before the post layer norm (i = NumHiddenLayers), for progress reports;
// an error from it stops the pass.
func (m *Model) Forward(pixels *runtime.Tensor, hook func(i int) error) (*runtime.Tensor, error) {
	if err := m.checkPixels(pixels); err != nil {
		return nil, fmt.Errorf("siglip forward: %w", err)
	}
	rt := m.rt
	x, err := m.Embeddings.Forward(rt, pixels)
	if err != nil {
		return nil, fmt.Errorf("siglip forward: embeddings: %w", err)
	}
	for i := range m.Layers {
		if hook != nil {
			if err := hook(i); err != nil {
				x.Free()
				return nil, fmt.Errorf("siglip forward: %w", err)
			}
		}
		y, err := m.Layers[i].Forward(rt, x)
		x.Free()
		if err != nil {
			return nil, fmt.Errorf("siglip forward: encoder.layers.%d: %w", i, err)
		}
		x = y
	}
	if hook != nil {
		if err := hook(len(m.Layers)); err != nil {
			x.Free()
			return nil, fmt.Errorf("siglip forward: %w", err)
		}
	}
	y, err := m.PostLayerNorm.Forward(rt, x)
	x.Free()
	if err != nil {
		return nil, fmt.Errorf("siglip forward: post_layernorm: %w", err)
	}
	return y, nil
}

// ForwardHost is Forward from and to host memory: pixels [B, C, H, W] as float32 values →
// last_hidden_state values and shape.
func (m *Model) ForwardHost(pixels []float32, shape []int, hook func(i int) error) ([]float32, []int, error) {
	if len(shape) != 4 {
		return nil, nil, fmt.Errorf("siglip forward: %w: pixel shape %v is not [B, C, H, W]", ErrBadInput, shape)
	}
	for _, d := range shape {
		if d <= 0 {
			return nil, nil, fmt.Errorf("siglip forward: %w: pixel shape %v", ErrBadInput, shape)
		}
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n != len(pixels) {
		return nil, nil, fmt.Errorf("siglip forward: %w: %d values for pixel shape %v", ErrBadInput, len(pixels), shape)
	}
	x, err := m.rt.FromFloat32(pixels, shape...)
	if err != nil {
		return nil, nil, fmt.Errorf("siglip forward: upload pixels: %w", err)
	}
	defer x.Free()
	y, err := m.Forward(x, hook)
	if err != nil {
		return nil, nil, err
	}
	defer y.Free()
	out, err := y.Float32()
	if err != nil {
		return nil, nil, fmt.Errorf("siglip forward: download: %w", err)
	}
	return out, y.Shape(), nil
}
