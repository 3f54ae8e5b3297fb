package causalvae

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// FramePackDType is the dtype FramePack runs the VAE: float16 (demo_gradio.py): its
// weights' and activations' dtype on a GPU unless the load asks for another.
const FramePackDType = runtime.F16

// ErrBadInput is wrapped by errors about a stage's input (wrong rank, channel count, empty
// dims) or its tiling parameters: the request is wrong and retrying cannot help.
var ErrBadInput = errors.New("bad vae input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// Checkpoint is a set of named tensors with their list of names (*safetensors.Checkpoint).
type Checkpoint = nn.Source

// Options are the activation dtype (DType: F32, or F16/BF16 with f32 accumulation; inputs are
// rounded to it on upload, outputs come back as float32) and the dtype the weights are uploaded
// in (WeightDType: the conv and linear weights, nearly all the bytes).
type Options = nn.Options

// LoadInfo says what a load found besides the model.
type LoadInfo struct {
	WeightBytes       int64    // bytes of weights held by the runtime
	StagedBytes       int64    // the part of WeightBytes uploaded through the staging ring (nn.Staging)
	Unexpected        []string // checkpoint tensors the model does not use (callers log them)
	UnknownConfigKeys []string // config.json keys starting with "_" that the model ignores
}

// Model is AutoencoderKLHunyuanVideo: a causal 3-D VAE whose encoder maps pixels
// [B, 3, T, H, W] in [-1, 1] to posterior moments [B, 2·16, (T−1)/4+1, H/8, W/8] and whose
// decoder maps latents back. Its weights live in one runtime; it is not safe for concurrent
// stages (a worker runs one at a time).
type Model struct {
	Config        Config
	Encoder       *Encoder  // encoder
	Decoder       *Decoder  // decoder
	QuantConv     nn.Conv3d // quant_conv [2·latent, 2·latent, 1, 1, 1]
	PostQuantConv nn.Conv3d // post_quant_conv [latent, latent, 1, 1, 1]
	Info          LoadInfo

	nn.Weights
	halves []*runtime.Tensor // the split resnets' half weights (ResnetBlock.split)
	rt     *runtime.Runtime
	act    runtime.DType // the dtype of the tensors bound by Tensor (norms, biases) and of the activations
}

// Load reads dir/config.json and the checkpoint in dir (diffusion_pytorch_model.safetensors or
// a sharded index) and uploads the weights into rt. A missing tensor, a wrong shape or a config
// the weights contradict fails with an error naming the tensor (errors.Is ErrCheckpoint).
func Load(rt *runtime.Runtime, dir string, opts Options) (*Model, error) {
	cfg, unknown, err := LoadConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("load vae: %w: %w", ErrCheckpoint, err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("load vae: %w: %w", ErrCheckpoint, err)
	}
	defer ck.Close()
	m, err := LoadFrom(rt, cfg, ck, opts)
	if err != nil {
		return nil, fmt.Errorf("load vae %s: %w", filepath.Base(ck.Path), err)
	}
	m.Info.UnknownConfigKeys = unknown
	return m, nil
}

// LoadFrom builds the model of cfg from the tensors of ck (which may be closed afterwards).
func LoadFrom(rt *runtime.Runtime, cfg Config, ck Checkpoint, opts Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	dt := opts.DType
	if dt == 0 {
		dt = runtime.F32
	}
	if !dt.IsFloat() {
		return nil, fmt.Errorf("load vae: dtype %s is not a float type", dt)
	}
	opts.DType = dt
	l := nn.NewLoader(rt, ck, opts, "")
	m := &Model{Config: cfg, rt: rt, act: dt}
	m.bind(l)
	ws, rep, err := l.Finish()
	if err != nil {
		return nil, err
	}
	m.Weights = ws
	m.Info.WeightBytes, m.Info.StagedBytes, m.Info.Unexpected = rep.Bytes, rep.StagedBytes, rep.Unexpected
	for _, r := range m.resnets() {
		made, err := r.split(rt)
		m.halves = append(m.halves, made...)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("load vae: split %w", err)
		}
	}
	for _, t := range m.halves {
		m.Info.WeightBytes += int64(t.NumBytes())
	}
	return m, nil
}

// bind binds every module of m.Config from l.
func (m *Model) bind(l *nn.Loader) {
	L := m.Config.LatentChannels
	m.Encoder = bindEncoder(l, "encoder", m.Config)
	m.Decoder = bindDecoder(l, "decoder", m.Config)
	m.QuantConv = nn.NewConv3d(l, "quant_conv", 2*L, 2*L, unit, unit)
	m.PostQuantConv = nn.NewConv3d(l, "post_quant_conv", L, L, unit, unit)
}

// Runtime returns the runtime holding the weights.
func (m *Model) Runtime() *runtime.Runtime { return m.rt }

// Footprint returns what the memory estimate needs to know of how m runs: its backend (the
// cpu's scratch on a host backend) and its activation and conv weight dtypes.
func (m *Model) Footprint() FootprintOptions {
	o := FootprintOptions{Backend: "cpu", DType: m.act, WeightDType: m.act}
	if b := m.rt.Backend(); !b.IsHost {
		o.Backend = b.Name
	}
	if w := m.Decoder.ConvOut.Conv.Weight; w != nil {
		o.WeightDType = w.DType()
	}
	return o
}

// resnets lists every resnet block of the model.
func (m *Model) resnets() []*ResnetBlock {
	var out []*ResnetBlock
	for _, b := range m.Encoder.DownBlocks {
		out = append(out, b.Resnets...)
	}
	out = append(out, m.Encoder.MidBlock.Resnets...)
	out = append(out, m.Decoder.MidBlock.Resnets...)
	for _, b := range m.Decoder.UpBlocks {
		out = append(out, b.Resnets...)
	}
	return out
}

// Close frees the weights.
func (m *Model) Close() {
	for _, t := range m.halves {
		t.Free()
	}
	m.halves = nil
	m.Free()
}

// encodeTile runs encoder and quant_conv on one tile: x [B, in, T, H, W] → moments
// [B, 2·latent, T', H', W'], on the host.
func (m *Model) encodeTile(ctx context.Context, x Volume) (Volume, error) {
	t, err := m.rt.FromFloat32As(m.act, x.Data, x.ShapeInt()...)
	if err != nil {
		return Volume{}, fmt.Errorf("encode tile %v: %w", x.Shape, err)
	}
	return downloadFree(m.encodeForward(ctx, t))
}

// encodeForward is encodeTile on x in the runtime (consumed): the moments, in the runtime.
func (m *Model) encodeForward(ctx context.Context, x *runtime.Tensor) (*runtime.Tensor, error) {
	shape := x.Shape()
	p := nn.NewPass(ctx, m.rt)
	defer p.Free()
	h := m.Encoder.Forward(p, p.Do(x, nil))
	h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return m.QuantConv.Forward(p, h) })
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("encode tile %v: %w", shape, err)
	}
	return p.Keep(h), nil
}

// decodeTile runs post_quant_conv and the decoder on one tile: z [B, latent, T, h, w] →
// pixels [B, out, T', H, W], on the host.
func (m *Model) decodeTile(ctx context.Context, z Volume) (Volume, error) {
	t, err := m.rt.FromFloat32As(m.act, z.Data, z.ShapeInt()...)
	if err != nil {
		return Volume{}, fmt.Errorf("decode tile %v: %w", z.Shape, err)
	}
	return downloadFree(m.decodeForward(ctx, t))
}

// decodeForward is decodeTile on z in the runtime (consumed): the pixels, in the runtime.
func (m *Model) decodeForward(ctx context.Context, z *runtime.Tensor) (*runtime.Tensor, error) {
	shape := z.Shape()
	p := nn.NewPass(ctx, m.rt)
	defer p.Free()
	h := m.PostQuantConv.Forward(p, p.Do(z, nil))
	h = p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return m.Decoder.Forward(p, h) })
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("decode tile %v: %w", shape, err)
	}
	return p.Keep(h), nil
}

// downloadFree downloads t and frees it.
func downloadFree(t *runtime.Tensor, err error) (Volume, error) {
	if err != nil {
		return Volume{}, err
	}
	defer t.Free()
	return download(t)
}

func download(t *runtime.Tensor) (Volume, error) {
	if t.Rank() != 5 {
		return Volume{}, fmt.Errorf("download %s: not 5-d", t)
	}
	data, err := t.Float32()
	if err != nil {
		return Volume{}, err
	}
	return WrapVolume([5]int(t.Shape()), data)
}
