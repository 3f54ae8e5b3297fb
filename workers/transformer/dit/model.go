package dit

import (
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// FramePackDType is the dtype FramePack runs the packed transformer: bfloat16 (demo_gradio.py): its
// weights' and activations' dtype on a GPU unless the load asks for another.
const FramePackDType = runtime.BF16

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
	// FP8Format is the format of the 8-bit Linear weights (fp8.None: none).
	FP8Format fp8.Format

	nn.Weights // the resident weights (WeightBytes and NumParams below add the streamed blocks')
	rt         *runtime.Runtime
	act        runtime.DType // activation dtype (LoadOptions.ActivationDType)

	// Streaming: blocks past the first residentDouble double and residentSingle single blocks
	// are kept in host memory (their fields here hold no tensors) and copied into slots one
	// block ahead of compute.
	residentDouble, residentSingle int
	double                         *nn.BlockStream[HunyuanVideoTransformerBlock]
	single                         *nn.BlockStream[HunyuanVideoSingleTransformerBlock]
	copies                         *nn.CopyStream // the streamed blocks' copies (nil: none stream)
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
	// (F32 with RandomWeights); zero means F32.
	WeightDType runtime.DType
	// ActivationDType is the dtype activations, norms and biases are in (FramePack: BF16 on a
	// GPU); the zero value is F32. The inputs are rounded to it at the model's entry, the velocity
	// comes back as float32; rope tables stay f32 (the reference rotates in float32).
	ActivationDType runtime.DType
	// MemoryCap is the runtime's memory cap the residency plan is made for (0: no cap, every
	// block resident unless MaxResidentBlocks says otherwise). The runtime enforces its own
	// cap (runtime.SetMemoryCap); this only sizes the plan.
	MemoryCap int64
	// ActivationBytes is the activations' estimated peak (Config.ActivationBytes), reserved
	// under MemoryCap.
	ActivationBytes int64
	// MaxResidentBlocks caps the blocks kept in the runtime's memory (double blocks first,
	// then single); the rest stream. 0: no limit; NoResidentBlocks streams every block.
	MaxResidentBlocks int
	// Checkpoint is a single safetensors file read instead of the folder's weights (the
	// folder's config.json still describes the model): FramePack's weights as one file, or in
	// 8 bits as ComfyUI and musubi-tuner users have them (internal/fp8).
	Checkpoint string
	// QuantizeLinear quantizes the Linear weights stored in 16 or 32 bits to e4m3, one scale
	// per output channel, at load (weights "fp8"); 8-bit ones stay as stored either way.
	QuantizeLinear bool
}

// NoResidentBlocks, as LoadOptions.MaxResidentBlocks, streams every block.
const NoResidentBlocks = -1

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
	ck, err := OpenWeights(dir, opts)
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

// OpenWeights opens the checkpoint Load reads for opts: opts.Checkpoint when set, else the
// folder's (one file or a sharded index).
func OpenWeights(dir string, opts LoadOptions) (*safetensors.Checkpoint, error) {
	if opts.Checkpoint != "" {
		return safetensors.OpenCheckpoint(opts.Checkpoint)
	}
	return safetensors.OpenCheckpoint(dir)
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
	fp, err := EstimateFootprint(cfg, src, opts)
	if err != nil {
		return nil, err
	}
	resident, err := planResident(fp, opts)
	if err != nil {
		return nil, err
	}
	dts := nn.Options{DType: opts.ActivationDType, WeightDType: opts.WeightDType, QuantizeLinear: opts.QuantizeLinear}
	var l *nn.Loader
	if src == nil {
		l = nn.NewRandomLoader(rt, opts.Seed, dts)
	} else {
		l = nn.NewLoader(rt, src, dts, "")
	}
	m := &Model{Config: cfg, rt: rt, act: opts.ActivationDType}
	m.residentDouble, m.residentSingle = fp.split(resident)
	m.double = nn.NewBlockStream(rt, "transformer_blocks", func(l *nn.Loader) HunyuanVideoTransformerBlock { return bindDoubleBlock(l, "", cfg) })
	m.single = nn.NewBlockStream(rt, "single_transformer_blocks", func(l *nn.Loader) HunyuanVideoSingleTransformerBlock { return bindSingleBlock(l, "", cfg) })
	bindAll(l, cfg, m)
	m.FP8Format = l.FP8Format()
	ws, rep, err := l.Finish()
	if err != nil {
		return nil, err
	}
	m.Weights, m.Unexpected = ws, rep.Unexpected
	if m.StreamedBlocks() > 0 {
		if m.copies, err = nn.NewCopyStream(rt, m.double, m.single); err != nil {
			m.Close()
			return nil, fmt.Errorf("new transformer: copy stream: %w", err)
		}
	}
	return m, nil
}

// planResident is how many blocks stay resident for opts (see LoadOptions).
func planResident(fp Footprint, opts LoadOptions) (int, error) {
	switch {
	case opts.MaxResidentBlocks == NoResidentBlocks && opts.MemoryCap <= 0:
		return 0, nil
	case opts.MaxResidentBlocks == NoResidentBlocks:
		if _, err := fp.Plan(opts.MemoryCap, opts.ActivationBytes, 0); err != nil {
			return 0, err
		}
		return 0, nil
	}
	return fp.Plan(opts.MemoryCap, opts.ActivationBytes, opts.MaxResidentBlocks)
}

// bindAll binds every module of cfg into m (nil: a throwaway, for size estimates); blocks past
// m's resident counts go to host memory and into m's block stacks.
func bindAll(l *nn.Loader, cfg Config, m *Model) {
	if m == nil {
		m = &Model{Config: cfg, residentDouble: cfg.NumLayers, residentSingle: cfg.NumSingleLayers}
	}
	dim := cfg.InnerDim()
	p := cfg.PatchSize
	m.Rope = HunyuanVideoRotaryPosEmbed{AxesDim: cfg.RopeAxesDim, Theta: cfg.RopeTheta}
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
	m.TransformerBlocks = nn.BindBlocks(l, m.double, "transformer_blocks", cfg.NumLayers, m.residentDouble,
		func(l *nn.Loader, name string) HunyuanVideoTransformerBlock { return bindDoubleBlock(l, name, cfg) })
	m.SingleTransformerBlocks = nn.BindBlocks(l, m.single, "single_transformer_blocks", cfg.NumSingleLayers, m.residentSingle,
		func(l *nn.Loader, name string) HunyuanVideoSingleTransformerBlock {
			return bindSingleBlock(l, name, cfg)
		})
	m.NormOut = AdaLayerNormContinuous{Linear: nn.NewLinear(l, "norm_out.linear", dim, 2*dim, true)}
	m.ProjOut = nn.NewLinear(l, "proj_out", dim, cfg.PatchSizeT*p*p*cfg.OutChannelsOrIn(), true)
}

// ResidentBlocks is the number of blocks kept in the runtime's memory; StreamedBlocks the
// number copied in from host memory for every forward.
func (m *Model) ResidentBlocks() int { return m.residentDouble + m.residentSingle }

// StreamedBlocks is the number of blocks streamed from host memory.
func (m *Model) StreamedBlocks() int {
	return len(m.TransformerBlocks) + len(m.SingleTransformerBlocks) - m.ResidentBlocks()
}

// StreamedBytes is the size of the streamed blocks' host copies.
func (m *Model) StreamedBytes() int64 { return m.double.HostBytes() + m.single.HostBytes() }

// CopiedBytes is how many bytes of streamed blocks have been copied into slots so far.
func (m *Model) CopiedBytes() int64 { return m.double.CopiedBytes() + m.single.CopiedBytes() }

// releaseSlots frees the streaming slots (the end of a forward).
func (m *Model) releaseSlots() {
	m.double.Release()
	m.single.Release()
}

// Runtime returns the runtime holding the weights.
func (m *Model) Runtime() *runtime.Runtime { return m.rt }

// WeightBytes is the size of the weights as held (float32, or 16 bits per LoadOptions.WeightDType):
// in the runtime's memory plus the streamed blocks' host copies.
func (m *Model) WeightBytes() int64 { return m.Weights.WeightBytes() + m.StreamedBytes() }

// NumParams is the number of weight elements, the streamed blocks' included.
func (m *Model) NumParams() int64 {
	return m.Weights.NumParams() + m.double.NumElements() + m.single.NumElements()
}

// Close frees the weights.
func (m *Model) Close() { m.Free() }

// Free frees the resident weights, the streaming slots (first: no copy in flight
// afterwards), the copy stream and the streamed blocks' host copies (FreeHost unpins them
// before it unmaps them). A second Free does nothing.
func (m *Model) Free() {
	m.Weights.Free()
	m.releaseSlots()
	m.copies.Free()
	m.copies = nil
	m.double.FreeHost()
	m.single.FreeHost()
}
