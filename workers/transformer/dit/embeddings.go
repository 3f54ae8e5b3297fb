package dit

import (
	"math"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// timestepChannels is the sinusoidal projection's width (Timesteps(num_channels=256)).
const timestepChannels = 256

// timestepProj is diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) of
// one value: [cos(t·f_i) | sin(t·f_i)], f_i = exp(−ln(10000)·i/128). The reference computes it
// in float32 whatever the model dtype (timesteps.float()), so it is computed here in float32
// arithmetic step by step: ln(10000)·i, /128, exp, t·f, each rounded to float32 as torch does.
// (At the guidance input 10000 the float32 product t·f decides cos/sin to ~1e-3.)
func timestepProj(t float32) []float32 {
	const half = timestepChannels / 2
	out := make([]float32, timestepChannels)
	c := float32(-math.Log(10000))
	for i := range half {
		e := c * float32(i) / float32(half)
		f := float32(math.Exp(float64(e)))
		a := t * f
		out[i] = float32(math.Cos(float64(a)))
		out[half+i] = float32(math.Sin(float64(a)))
	}
	return out
}

// TimestepEmbedding is diffusers' TimestepEmbedding: linear_1, SiLU, linear_2.
type TimestepEmbedding struct {
	Linear1 nn.Linear // linear_1 [dim, 256]
	Linear2 nn.Linear // linear_2 [dim, dim]
}

func bindTimestepEmbedding(l *nn.Loader, prefix string, in, dim int) TimestepEmbedding {
	return TimestepEmbedding{
		Linear1: nn.NewLinear(l, nn.Join(prefix, "linear_1"), in, dim, true),
		Linear2: nn.NewLinear(l, nn.Join(prefix, "linear_2"), dim, dim, true),
	}
}

// Forward: x [1, in] → [1, dim].
func (e TimestepEmbedding) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := e.Linear1.Forward(p, x)
	a := p.Do(p.RT.SiLU(h))
	return e.Linear2.Forward(p, a)
}

// embedTimestep is TimestepEmbedding(Timesteps(t)), the projection cast to like's dtype (the
// activations'), as diffusers casts it to the pooled projection's.
func (e TimestepEmbedding) embedTimestep(p *nn.Pass, t float32, like *runtime.Tensor) *runtime.Tensor {
	dt := runtime.F32
	if like != nil {
		dt = like.DType()
	}
	proj := p.Do(p.RT.FromFloat32As(dt, timestepProj(t), 1, timestepChannels))
	return e.Forward(p, proj)
}

// PixArtAlphaTextProjection with act_fn="silu": linear_1, SiLU, linear_2.
type PixArtAlphaTextProjection struct {
	Linear1 nn.Linear // linear_1 [dim, in]
	Linear2 nn.Linear // linear_2 [dim, dim]
}

func bindTextProjection(l *nn.Loader, prefix string, in, dim int) PixArtAlphaTextProjection {
	return PixArtAlphaTextProjection{
		Linear1: nn.NewLinear(l, nn.Join(prefix, "linear_1"), in, dim, true),
		Linear2: nn.NewLinear(l, nn.Join(prefix, "linear_2"), dim, dim, true),
	}
}

// Forward: x [1, in] → [1, dim].
func (t PixArtAlphaTextProjection) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := t.Linear1.Forward(p, x)
	a := p.Do(p.RT.SiLU(h))
	return t.Linear2.Forward(p, a)
}

// CombinedTimestepGuidanceTextProjEmbeddings is the model's time_text_embed:
// timestep_embedder(t) + guidance_embedder(g) + text_embedder(CLIP pooled). The packed model
// always has the guidance embedder (its constructor ignores guidance_embeds).
type CombinedTimestepGuidanceTextProjEmbeddings struct {
	TimestepEmbedder TimestepEmbedding         // timestep_embedder
	GuidanceEmbedder TimestepEmbedding         // guidance_embedder
	TextEmbedder     PixArtAlphaTextProjection // text_embedder [dim, pooled_projection_dim]
}

func bindTimeGuidanceText(l *nn.Loader, prefix string, dim, pooledDim int) CombinedTimestepGuidanceTextProjEmbeddings {
	return CombinedTimestepGuidanceTextProjEmbeddings{
		TimestepEmbedder: bindTimestepEmbedding(l, nn.Join(prefix, "timestep_embedder"), timestepChannels, dim),
		GuidanceEmbedder: bindTimestepEmbedding(l, nn.Join(prefix, "guidance_embedder"), timestepChannels, dim),
		TextEmbedder:     bindTextProjection(l, nn.Join(prefix, "text_embedder"), pooledDim, dim),
	}
}

// Forward: timestep, guidance scalars, pooled [1, pooled_projection_dim] → temb [1, dim].
func (e CombinedTimestepGuidanceTextProjEmbeddings) Forward(p *nn.Pass, timestep, guidance float32, pooled *runtime.Tensor) *runtime.Tensor {
	te := e.TimestepEmbedder.embedTimestep(p, timestep, pooled)
	ge := e.GuidanceEmbedder.embedTimestep(p, guidance, pooled)
	tg := p.Do(p.RT.Add(te, ge))
	pe := e.TextEmbedder.Forward(p, pooled)
	return p.Do(p.RT.Add(tg, pe))
}

// CombinedTimestepTextProjEmbeddings is the token refiner's time_text_embed:
// timestep_embedder(t) + text_embedder(masked mean of the text states).
type CombinedTimestepTextProjEmbeddings struct {
	TimestepEmbedder TimestepEmbedding         // timestep_embedder
	TextEmbedder     PixArtAlphaTextProjection // text_embedder [dim, text_embed_dim]
}

func bindTimeText(l *nn.Loader, prefix string, dim, pooledDim int) CombinedTimestepTextProjEmbeddings {
	return CombinedTimestepTextProjEmbeddings{
		TimestepEmbedder: bindTimestepEmbedding(l, nn.Join(prefix, "timestep_embedder"), timestepChannels, dim),
		TextEmbedder:     bindTextProjection(l, nn.Join(prefix, "text_embedder"), pooledDim, dim),
	}
}

// Forward: timestep, pooled [1, text_embed_dim] → [1, dim].
func (e CombinedTimestepTextProjEmbeddings) Forward(p *nn.Pass, timestep float32, pooled *runtime.Tensor) *runtime.Tensor {
	te := e.TimestepEmbedder.embedTimestep(p, timestep, pooled)
	pe := e.TextEmbedder.Forward(p, pooled)
	return p.Do(p.RT.Add(te, pe))
}

// ClipVisionProjection is image_projection: down(SiLU(up(x))).
type ClipVisionProjection struct {
	Up   nn.Linear // up [3·dim, image_proj_dim]
	Down nn.Linear // down [dim, 3·dim]
}

func bindClipVisionProjection(l *nn.Loader, prefix string, in, dim int) ClipVisionProjection {
	return ClipVisionProjection{
		Up:   nn.NewLinear(l, nn.Join(prefix, "up"), in, 3*dim, true),
		Down: nn.NewLinear(l, nn.Join(prefix, "down"), 3*dim, dim, true),
	}
}

// Forward: SigLIP states [1, Li, image_proj_dim] → [1, Li, dim].
func (c ClipVisionProjection) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := c.Up.Forward(p, x)
	a := p.Do(p.RT.SiLU(h))
	p.Drop(h)
	return c.Down.Forward(p, a)
}

// PatchConv is torch.nn.Conv3d with kernel = stride (a patch embedding) whose output is read as
// tokens.
type PatchConv struct {
	nn.Conv3d // <prefix> [dim, in, kt, kh, kw], stride = kernel
}

func bindPatchConv(l *nn.Loader, prefix string, in, dim int, kernel [3]int) PatchConv {
	return PatchConv{nn.NewConv3d(l, prefix, in, dim, kernel, kernel)}
}

// Forward: x [1, in, T, H, W] (each dim a multiple of the kernel) → tokens [1, T/kt·H/kh·W/kw, dim]
// in (t, h, w) order (the reference's flatten(2).transpose(1, 2)).
func (c PatchConv) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	y := c.Conv3d.Forward(p, x)
	if !p.OK() {
		return nil
	}
	flat := p.Reshape(y, y.Dim(0), y.Dim(1), -1)
	return p.Then(flat, func(f *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Permute(f, 0, 2, 1)) })
}

// HunyuanVideoPatchEmbed is x_embedder: proj is a Conv3d with kernel (patch_size_t, p, p).
type HunyuanVideoPatchEmbed struct {
	Proj PatchConv // proj [dim, in_channels, 1, p, p]
}

// HunyuanVideoPatchEmbedForCleanLatents is clean_x_embedder: the 1x, 2x and 4x context
// embedders (16 input channels, kernels (1,2,2), (2,4,4), (4,8,8)).
type HunyuanVideoPatchEmbedForCleanLatents struct {
	Proj   PatchConv // proj [dim, 16, 1, 2, 2]
	Proj2x PatchConv // proj_2x [dim, 16, 2, 4, 4]
	Proj4x PatchConv // proj_4x [dim, 16, 4, 8, 8]
}

func bindCleanEmbedder(l *nn.Loader, prefix string, dim int) *HunyuanVideoPatchEmbedForCleanLatents {
	return &HunyuanVideoPatchEmbedForCleanLatents{
		Proj:   bindPatchConv(l, nn.Join(prefix, "proj"), cleanInChannels, dim, [3]int{1, 2, 2}),
		Proj2x: bindPatchConv(l, nn.Join(prefix, "proj_2x"), cleanInChannels, dim, [3]int{2, 4, 4}),
		Proj4x: bindPatchConv(l, nn.Join(prefix, "proj_4x"), cleanInChannels, dim, [3]int{4, 8, 8}),
	}
}

// padTo is pad_for_3d_conv: replicate-pads the end of (T, H, W) up to multiples of k.
func padTo(p *nn.Pass, x *runtime.Tensor, k [3]int) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	var pad runtime.Pad3d
	need := false
	for i := range 3 {
		d := x.Dim(x.Rank() - 3 + i)
		pad.After[i] = (k[i] - d%k[i]) % k[i]
		need = need || pad.After[i] != 0
	}
	if !need {
		return x
	}
	return p.Do(p.RT.Pad3d(x, runtime.PadReplicate, pad))
}
