package dit

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Model is HunyuanVideoTransformer3DModelPacked (FramePack's packed HunyuanVideo DiT) with its
// weights in a runtime (weight matrices in LoadOptions.WeightDType, the rest float32). Field names follow the checkpoint's module names.
type Model struct {
	Config Config

	XEmbedder       HunyuanVideoPatchEmbed                     // x_embedder
	ContextEmbedder HunyuanVideoTokenRefiner                   // context_embedder
	TimeTextEmbed   CombinedTimestepGuidanceTextProjEmbeddings // time_text_embed
	CleanXEmbedder  *HunyuanVideoPatchEmbedForCleanLatents     // clean_x_embedder (has_clean_x_embedder)
	ImageProjection *ClipVisionProjection                      // image_projection (has_image_proj)
	Rope            HunyuanVideoRotaryPosEmbed                 // rope (no weights)

	TransformerBlocks       []HunyuanVideoTransformerBlock       // transformer_blocks.N
	SingleTransformerBlocks []HunyuanVideoSingleTransformerBlock // single_transformer_blocks.N

	NormOut AdaLayerNormContinuous // norm_out (LayerNorm without affine)
	ProjOut nn.Linear              // proj_out [p·p·out_channels, dim]

	// Unexpected lists checkpoint tensors no module uses (the loader's caller logs them).
	Unexpected []string

	nn.Weights // WeightBytes (as held: float32, or 16 bits per LoadOptions.WeightDType), NumParams
	rt         *runtime.Runtime
}

// LoadOptions adjust Load and New.
type LoadOptions struct {
	// RandomWeights makes every weight from a seeded generator instead of reading the checkpoint
	// (benchmarks of configs without a checkpoint; only config.json is read).
	RandomWeights bool
	// Seed seeds RandomWeights.
	Seed uint64
	// WeightDType is the dtype of the nn.Linear and patch-embedding weights (nearly all the
	// bytes): F16 or BF16 keep them in 16 bits, runtime.AsStored in the checkpoint's dtype
	// (F32 with RandomWeights); zero means F32. Norms, biases and activations are f32.
	WeightDType runtime.DType
}

// Load reads dir/config.json and the checkpoint in dir (diffusion_pytorch_model.safetensors or
// a sharded index) into rt.
func Load(rt *runtime.Runtime, dir string, opts LoadOptions) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("load transformer: %w", err)
	}
	if opts.RandomWeights {
		return New(rt, cfg, nil, opts)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("load transformer: %w", err)
	}
	defer ck.Close()
	m, err := New(rt, cfg, ck, opts)
	if err != nil {
		return nil, fmt.Errorf("load transformer %s: %w", filepath.Base(ck.Path), err)
	}
	return m, nil
}

// New builds the model of cfg with its weights from src (nil with opts.RandomWeights). Every
// tensor the config needs must be in src with its shape; tensors src has beyond those are listed
// in Model.Unexpected.
func New(rt *runtime.Runtime, cfg Config, src nn.Source, opts LoadOptions) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src == nil && !opts.RandomWeights {
		return nil, fmt.Errorf("new transformer: no weights (a checkpoint or RandomWeights)")
	}
	dts := nn.Options{DType: runtime.F32, WeightDType: opts.WeightDType}
	var l *nn.Loader
	if src == nil {
		l = nn.NewRandomLoader(rt, opts.Seed, dts)
	} else {
		l = nn.NewLoader(rt, src, dts, "")
	}
	dim := cfg.InnerDim()
	p := cfg.PatchSize
	m := &Model{Config: cfg, rt: rt, Rope: HunyuanVideoRotaryPosEmbed{AxesDim: cfg.RopeAxesDim, Theta: cfg.RopeTheta}}
	m.XEmbedder = HunyuanVideoPatchEmbed{Proj: bindPatchConv(l, "x_embedder.proj", cfg.InChannels, dim, [3]int{cfg.PatchSizeT, p, p})}
	m.ContextEmbedder = bindTokenRefiner(l, "context_embedder", cfg)
	m.TimeTextEmbed = bindTimeGuidanceText(l, "time_text_embed", dim, cfg.PooledProjectionDim)
	if cfg.HasCleanXEmbedder {
		m.CleanXEmbedder = bindCleanEmbedder(l, "clean_x_embedder", dim)
	}
	if cfg.HasImageProj {
		ip := bindClipVisionProjection(l, "image_projection", cfg.ImageProjDim, dim)
		m.ImageProjection = &ip
	}
	for i := range cfg.NumLayers {
		m.TransformerBlocks = append(m.TransformerBlocks, bindDoubleBlock(l, "transformer_blocks."+strconv.Itoa(i), cfg))
	}
	for i := range cfg.NumSingleLayers {
		m.SingleTransformerBlocks = append(m.SingleTransformerBlocks, bindSingleBlock(l, "single_transformer_blocks."+strconv.Itoa(i), cfg))
	}
	m.NormOut = AdaLayerNormContinuous{Linear: nn.NewLinear(l, "norm_out.linear", dim, 2*dim, true)}
	m.ProjOut = nn.NewLinear(l, "proj_out", dim, cfg.PatchSizeT*p*p*cfg.OutChannelsOrIn(), true)
	ws, rep, err := l.Finish()
	if err != nil {
		return nil, err
	}
	m.Weights, m.Unexpected = ws, rep.Unexpected
	return m, nil
}

// Runtime returns the runtime holding the weights.
func (m *Model) Runtime() *runtime.Runtime { return m.rt }

// Close frees the weights.
func (m *Model) Close() { m.Free() }
