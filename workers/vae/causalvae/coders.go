package causalvae

import (
	"github.com/framepackd/framepackd/internal/runtime"
)

// DownBlock is HunyuanVideoDownBlock3D: resnets, then an optional strided downsampler.
type DownBlock struct {
	Resnets      []*ResnetBlock      // resnets.i [Cin → Cout, then Cout → Cout]
	Downsamplers *DownsampleCausal3D // downsamplers.0, nil when the block keeps the size
}

func bindDownBlock(b *binder, prefix string, p blockPlan, groups int) *DownBlock {
	d := &DownBlock{}
	for i := range p.layers {
		in := p.out
		if i == 0 {
			in = p.in
		}
		d.Resnets = append(d.Resnets, bindResnet(b, join(prefix, "resnets", i), in, p.out, groups))
	}
	if p.resampled() {
		d.Downsamplers = &DownsampleCausal3D{
			Conv: bindCausalConv3d(b, prefix+".downsamplers.0.conv", p.out, p.out, 3, p.stride),
		}
	}
	return d
}

func (d *DownBlock) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, Cin, T, H, W] → [B, Cout, T', H', W']
	steps := make([]step, 0, len(d.Resnets)+1)
	for _, r := range d.Resnets {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.forward(f, x) })
	}
	if d.Downsamplers != nil {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.Downsamplers.forward(f, x) })
	}
	return chain(x, steps...)
}

// UpBlock is HunyuanVideoUpBlock3D: layers_per_block+1 resnets, then an optional upsampler.
type UpBlock struct {
	Resnets    []*ResnetBlock    // resnets.i [Cin → Cout, then Cout → Cout]
	Upsamplers *UpsampleCausal3D // upsamplers.0, nil when the block keeps the size
}

func bindUpBlock(b *binder, prefix string, p blockPlan, groups int) *UpBlock {
	u := &UpBlock{}
	for i := range p.layers {
		in := p.out
		if i == 0 {
			in = p.in
		}
		u.Resnets = append(u.Resnets, bindResnet(b, join(prefix, "resnets", i), in, p.out, groups))
	}
	if p.resampled() {
		u.Upsamplers = &UpsampleCausal3D{
			Conv:   bindCausalConv3d(b, prefix+".upsamplers.0.conv", p.out, p.out, 3, [3]int{1, 1, 1}),
			Factor: p.stride,
		}
	}
	return u
}

func (u *UpBlock) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, Cin, T, H, W] → [B, Cout, T', H', W']
	steps := make([]step, 0, len(u.Resnets)+1)
	for _, r := range u.Resnets {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.forward(f, x) })
	}
	if u.Upsamplers != nil {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return u.Upsamplers.forward(f, x) })
	}
	return chain(x, steps...)
}

// Encoder is HunyuanVideoEncoder3D (double_z: conv_out gives mean and log-variance).
type Encoder struct {
	ConvIn      CausalConv3d // conv_in [C0, in_channels, 3, 3, 3]
	DownBlocks  []*DownBlock // down_blocks.i
	MidBlock    *MidBlock    // mid_block [C_last]
	ConvNormOut GroupNorm    // conv_norm_out [C_last]; conv_act is SiLU
	ConvOut     CausalConv3d // conv_out [2·latent_channels, C_last, 3, 3, 3]
}

func bindEncoder(b *binder, prefix string, c Config) *Encoder {
	bo := c.BlockOutChannels
	last := bo[len(bo)-1]
	e := &Encoder{
		ConvIn: bindCausalConv3d(b, prefix+".conv_in", c.InChannels, bo[0], 3, [3]int{1, 1, 1}),
	}
	for i, p := range c.downPlan() {
		e.DownBlocks = append(e.DownBlocks, bindDownBlock(b, join(prefix, "down_blocks", i), p, c.NormNumGroups))
	}
	e.MidBlock = bindMidBlock(b, prefix+".mid_block", last, c.NormNumGroups, c.MidBlockAddAttention)
	e.ConvNormOut = bindGroupNorm(b, prefix+".conv_norm_out", last, c.NormNumGroups)
	e.ConvOut = bindCausalConv3d(b, prefix+".conv_out", last, 2*c.LatentChannels, 3, [3]int{1, 1, 1})
	return e
}

func (e *Encoder) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, in, T, H, W] → [B, 2·latent, (T−1)/4+1, H/8, W/8]
	steps := []step{func(x *runtime.Tensor) (*runtime.Tensor, error) { return e.ConvIn.forward(f, x) }}
	for _, d := range e.DownBlocks {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.forward(f, x) })
	}
	steps = append(steps,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return e.MidBlock.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return e.ConvNormOut.forward(f, x) },
		f.rt.SiLU,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return e.ConvOut.forward(f, x) })
	return chain(x, steps...)
}

// Decoder is HunyuanVideoDecoder3D.
type Decoder struct {
	ConvIn      CausalConv3d // conv_in [C_last, latent_channels, 3, 3, 3]
	MidBlock    *MidBlock    // mid_block [C_last]
	UpBlocks    []*UpBlock   // up_blocks.i (channels reversed)
	ConvNormOut GroupNorm    // conv_norm_out [C0]; conv_act is SiLU
	ConvOut     CausalConv3d // conv_out [out_channels, C0, 3, 3, 3]
}

func bindDecoder(b *binder, prefix string, c Config) *Decoder {
	bo := c.BlockOutChannels
	last := bo[len(bo)-1]
	d := &Decoder{
		ConvIn:   bindCausalConv3d(b, prefix+".conv_in", c.LatentChannels, last, 3, [3]int{1, 1, 1}),
		MidBlock: bindMidBlock(b, prefix+".mid_block", last, c.NormNumGroups, c.MidBlockAddAttention),
	}
	for i, p := range c.upPlan() {
		d.UpBlocks = append(d.UpBlocks, bindUpBlock(b, join(prefix, "up_blocks", i), p, c.NormNumGroups))
	}
	d.ConvNormOut = bindGroupNorm(b, prefix+".conv_norm_out", bo[0], c.NormNumGroups)
	d.ConvOut = bindCausalConv3d(b, prefix+".conv_out", bo[0], c.OutChannels, 3, [3]int{1, 1, 1})
	return d
}

func (d *Decoder) forward(f *fwd, z *runtime.Tensor) (*runtime.Tensor, error) {
	// z: [B, latent, T, h, w] → [B, out, 4T−3, 8h, 8w]
	steps := []step{
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.ConvIn.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.MidBlock.forward(f, x) },
	}
	for _, u := range d.UpBlocks {
		steps = append(steps, func(x *runtime.Tensor) (*runtime.Tensor, error) { return u.forward(f, x) })
	}
	steps = append(steps,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.ConvNormOut.forward(f, x) },
		f.rt.SiLU,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return d.ConvOut.forward(f, x) })
	return chain(z, steps...)
}
