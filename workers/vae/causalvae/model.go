package causalvae

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// ErrBadInput is wrapped by errors about a stage's input (wrong rank, channel count, empty
// dims) or its tiling parameters: the request is wrong and retrying cannot help.
var ErrBadInput = errors.New("bad vae input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// Checkpoint is a set of named tensors with their list of names (*safetensors.Checkpoint).
type Checkpoint interface {
	runtime.TensorSource
	Names() []string
}

// Options configure Load.
type Options struct {
	// DType is the dtype weights are held and computed in; zero means F32 (the cpu backend
	// computes in f32 whatever the storage).
	DType runtime.DType
	// WeightDType is the dtype of the conv and linear weights (nearly all the bytes): F16 or
	// BF16 keep them in 16 bits, runtime.AsStored in the checkpoint's dtype; zero means DType.
	WeightDType runtime.DType
}

// LoadInfo says what a load found besides the model.
type LoadInfo struct {
	WeightBytes       int64    // bytes of weights held by the runtime
	Unexpected        []string // checkpoint tensors the model does not use (callers log them)
	UnknownConfigKeys []string // config.json keys starting with "_" that the model ignores
}

// Model is AutoencoderKLHunyuanVideo: a causal 3-D VAE whose encoder maps pixels
// [B, 3, T, H, W] in [-1, 1] to posterior moments [B, 2·16, (T−1)/4+1, H/8, W/8] and whose
// decoder maps latents back. Its weights live in one runtime; it is not safe for concurrent
// stages (a worker runs one at a time).
type Model struct {
	Config        Config
	Encoder       *Encoder // encoder
	Decoder       *Decoder // decoder
	QuantConv     Conv3d   // quant_conv [2·latent, 2·latent, 1, 1, 1]
	PostQuantConv Conv3d   // post_quant_conv [latent, latent, 1, 1, 1]
	Info          LoadInfo

	rt      *runtime.Runtime
	weights []*runtime.Tensor
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
	b := newBinder(rt, ck, dt)
	if opts.WeightDType != 0 {
		b.wdtype = opts.WeightDType
	}
	L := cfg.LatentChannels
	m := &Model{
		Config:        cfg,
		Encoder:       bindEncoder(b, "encoder", cfg),
		Decoder:       bindDecoder(b, "decoder", cfg),
		QuantConv:     bindConv3d(b, "quant_conv", 2*L, 2*L),
		PostQuantConv: bindConv3d(b, "post_quant_conv", L, L),
		rt:            rt,
	}
	if err := b.err(); err != nil {
		b.free()
		return nil, err
	}
	m.weights = b.owned
	m.Info.WeightBytes = b.bytes
	m.Info.Unexpected = b.unexpected(ck.Names())
	return m, nil
}

// Runtime returns the runtime holding the weights.
func (m *Model) Runtime() *runtime.Runtime { return m.rt }

// Close frees the weights.
func (m *Model) Close() {
	for _, t := range m.weights {
		t.Free()
	}
	m.weights = nil
}

// encodeTile runs encoder and quant_conv on one tile: x [B, in, T, H, W] → moments
// [B, 2·latent, T', H', W'], on the host.
func (m *Model) encodeTile(f *fwd, x Volume) (Volume, error) {
	xt, err := m.rt.FromFloat32(x.Data, x.ShapeInt()...)
	if err != nil {
		return Volume{}, fmt.Errorf("encode tile %v: %w", x.Shape, err)
	}
	defer xt.Free()
	enc, err := chain(xt,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return m.Encoder.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return m.QuantConv.forward(f, x) })
	if err != nil {
		return Volume{}, fmt.Errorf("encode tile %v: %w", x.Shape, err)
	}
	defer enc.Free()
	return download(enc)
}

// decodeTile runs post_quant_conv and the decoder on one tile: z [B, latent, T, h, w] →
// pixels [B, out, T', H, W], on the host.
func (m *Model) decodeTile(f *fwd, z Volume) (Volume, error) {
	zt, err := m.rt.FromFloat32(z.Data, z.ShapeInt()...)
	if err != nil {
		return Volume{}, fmt.Errorf("decode tile %v: %w", z.Shape, err)
	}
	defer zt.Free()
	dec, err := chain(zt,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return m.PostQuantConv.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return m.Decoder.forward(f, x) })
	if err != nil {
		return Volume{}, fmt.Errorf("decode tile %v: %w", z.Shape, err)
	}
	defer dec.Free()
	return download(dec)
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
