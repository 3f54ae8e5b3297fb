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

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// FramePackDType is the dtype FramePack runs the SigLIP image encoder: float16 (demo_gradio.py): its
// weights' and activations' dtype on a GPU unless the load asks for another.
const FramePackDType = runtime.F16

// Embeddings is SiglipVisionEmbeddings: a patchifying convolution plus learned position
// embeddings (no class token).
type Embeddings struct {
	PatchEmbedding    nn.Conv2d       // patch_embedding [hidden, channels, patch, patch], stride patch
	PositionEmbedding *runtime.Tensor // position_embedding.weight [grid², hidden]
}

// Forward: pixels [B, C, H, W] → [B, (H/patch)·(W/patch), hidden].
func (e *Embeddings) Forward(p *nn.Pass, pixels *runtime.Tensor) *runtime.Tensor {
	x := e.PatchEmbedding.Forward(p, pixels) // [B, hidden, g, g]
	if !p.OK() {
		return nil
	}
	x = p.Reshape(x, x.Dim(0), x.Dim(1), -1)
	x = p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Permute(x, 0, 2, 1)) }) // flatten(2).transpose(1, 2)
	return p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Add(x, e.PositionEmbedding)) })
}

// Attention is SiglipAttention: multi-head self-attention with biases, scale head_dim^−½, no
// mask (q_proj, k_proj, v_proj, out_proj [hidden, hidden]).
type Attention = nn.EncoderAttention

// MLP is SiglipMLP: fc2(act(fc1(x))), shared with the other CLIP-family encoder (nn.MLP).
type MLP = nn.MLP

// EncoderLayer is SiglipEncoderLayer: pre-norm attention (no mask) and MLP, each with a
// residual (layer_norm1, self_attn, layer_norm2, mlp), shared with CLIP (nn.EncoderLayer).
type EncoderLayer = nn.EncoderLayer

// Model is SiglipVisionModel without its pooling head.
type Model struct {
	Config        Config
	Embeddings    Embeddings     // embeddings
	Layers        []EncoderLayer // encoder.layers.{i}
	PostLayerNorm nn.LayerNorm   // post_layernorm [hidden]

	nn.Weights // WeightBytes, Free
	rt         *runtime.Runtime
	act        runtime.DType // activation dtype
	report     nn.Report
}

// LoadOptions are the activation dtype (DType; 0 is F32: the pixels are cast to it at the
// model's entry, Forward's result is in it) and the dtype the weights are uploaded in.
type LoadOptions = nn.Options

// Load reads dir/config.json and the checkpoint in dir and uploads the weights into rt. The
// pooling head's tensors are not loaded; they and any unknown tensors are listed in Report.
func Load(rt *runtime.Runtime, dir string, opts LoadOptions) (*Model, error) {
	cfg, ck, err := nn.OpenDir(dir, LoadConfig)
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
	act, err := nn.ActivationByName(cfg.HiddenAct)
	if err != nil {
		return nil, err
	}
	prefix, err := nn.DetectPrefix(src, "embeddings.patch_embedding.weight", checkpointPrefixes...)
	if err != nil {
		return nil, err
	}
	l := nn.NewLoader(rt, src, opts, prefix)
	D, P := cfg.HiddenSize, cfg.PatchSize
	eps := float32(cfg.LayerNormEps)
	m := &Model{Config: cfg, rt: rt, act: l.DType()}
	m.Embeddings = Embeddings{
		PatchEmbedding:    nn.NewConv2d(l, "embeddings.patch_embedding", cfg.NumChannels, D, P, [2]int{P, P}),
		PositionEmbedding: l.Tensor("embeddings.position_embedding.weight", cfg.NumPatches(), D),
	}
	m.Layers = make([]EncoderLayer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		name := nn.Join("encoder.layers", i)
		m.Layers[i] = nn.NewEncoderLayer(l, name, D, cfg.IntermediateSize, cfg.NumAttentionHeads, eps, act)
	}
	m.PostLayerNorm = nn.NewLayerNorm(l, "post_layernorm", D, eps)
	l.Skip("head.")
	if m.Weights, m.report, err = l.Finish(); err != nil {
		return nil, err
	}
	return m, nil
}

// Report says which checkpoint tensors were loaded, skipped (the pooling head) and unexpected.
func (m *Model) Report() nn.Report { return m.report }

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
// [B, grid², hidden] in the activation dtype, after post_layernorm. hook, if not nil, is called before each encoder
// layer (i from 0) and before the post layer norm (i = NumHiddenLayers), for progress reports;
// an error from it stops the pass.
func (m *Model) Forward(pixels *runtime.Tensor, hook func(i int) error) (*runtime.Tensor, error) {
	if err := m.checkPixels(pixels); err != nil {
		return nil, fmt.Errorf("siglip forward: %w", err)
	}
	p := nn.NewPass(nil, m.rt)
	defer p.Free()
	call := func(i int) {
		if hook != nil && p.OK() {
			p.Fail(hook(i))
		}
	}
	if m.act != runtime.F32 { // the model's entry: pixels in the activation dtype
		pixels = p.Do(m.rt.Cast(pixels, m.act))
	}
	x := p.Sub("embeddings", func(q *nn.Pass) *runtime.Tensor { return m.Embeddings.Forward(q, pixels) })
	for i := range m.Layers {
		call(i)
		x = p.Then(x, func(x *runtime.Tensor) *runtime.Tensor {
			return p.Sub(nn.Join("encoder.layers", i), func(q *nn.Pass) *runtime.Tensor { return m.Layers[i].Forward(q, x, nil) })
		})
	}
	call(len(m.Layers))
	x = p.Then(x, func(x *runtime.Tensor) *runtime.Tensor { return m.PostLayerNorm.Forward(p, x) })
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("siglip forward: %w", err)
	}
	return p.Keep(x), nil
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
