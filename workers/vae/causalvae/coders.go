package causalvae

import (
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// DownBlock is HunyuanVideoDownBlock3D: resnets, then an optional strided downsampler.
type DownBlock struct {
	Resnets      []*ResnetBlock      // resnets.i [Cin → Cout, then Cout → Cout]
	Downsamplers *DownsampleCausal3D // downsamplers.0, nil when the block keeps the size
}

func bindDownBlock(l *nn.Loader, prefix string, p blockPlan, groups int) *DownBlock {
	d := &DownBlock{}
	for i := range p.layers {
		in := p.out
		if i == 0 {
			in = p.in
		}
		d.Resnets = append(d.Resnets, bindResnet(l, nn.Join(prefix, "resnets", i), in, p.out, groups))
	}
	if p.resampled() {
		d.Downsamplers = &DownsampleCausal3D{
			Conv: bindCausalConv3d(l, nn.Join(prefix, "downsamplers.0.conv"), p.out, p.out, 3, p.stride),
		}
	}
	return d
}

// Forward: x [B, Cin, T, H, W] → [B, Cout, T', H', W']. x (the pass's) is freed by the
// first resnet as soon as it has read it.
func (d *DownBlock) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := d.Resnets[0].Consume(p, x)
	for _, r := range d.Resnets[1:] {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return r.Forward(p, x) })
	}
	if d.Downsamplers != nil {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return d.Downsamplers.Forward(p, x) })
	}
	return h
}

// UpBlock is HunyuanVideoUpBlock3D: layers_per_block+1 resnets, then an optional upsampler.
type UpBlock struct {
	Resnets    []*ResnetBlock    // resnets.i [Cin → Cout, then Cout → Cout]
	Upsamplers *UpsampleCausal3D // upsamplers.0, nil when the block keeps the size
}

func bindUpBlock(l *nn.Loader, prefix string, p blockPlan, groups int) *UpBlock {
	u := &UpBlock{}
	for i := range p.layers {
		in := p.out
		if i == 0 {
			in = p.in
		}
		u.Resnets = append(u.Resnets, bindResnet(l, nn.Join(prefix, "resnets", i), in, p.out, groups))
	}
	if p.resampled() {
		u.Upsamplers = &UpsampleCausal3D{
			Conv:   bindCausalConv3d(l, nn.Join(prefix, "upsamplers.0.conv"), p.out, p.out, 3, unit),
			Factor: p.stride,
		}
	}
	return u
}

// Forward: x [B, Cin, T, H, W] → [B, Cout, T', H', W']. x (the pass's) is freed by the
// first resnet as soon as it has read it.
func (u *UpBlock) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := u.Resnets[0].Consume(p, x)
	for _, r := range u.Resnets[1:] {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return r.Forward(p, x) })
	}
	if u.Upsamplers != nil {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return u.Upsamplers.Forward(p, x) })
	}
	return h
}

// Encoder is HunyuanVideoEncoder3D (double_z: conv_out gives mean and log-variance).
type Encoder struct {
	ConvIn      CausalConv3d // conv_in [C0, in_channels, 3, 3, 3]
	DownBlocks  []*DownBlock // down_blocks.i
	MidBlock    *MidBlock    // mid_block [C_last]
	ConvNormOut nn.GroupNorm // conv_norm_out [C_last]; conv_act is SiLU
	ConvOut     CausalConv3d // conv_out [2·latent_channels, C_last, 3, 3, 3]
}

func bindEncoder(l *nn.Loader, prefix string, c Config) *Encoder {
	bo := c.BlockOutChannels
	last := bo[len(bo)-1]
	e := &Encoder{
		ConvIn: bindCausalConv3d(l, nn.Join(prefix, "conv_in"), c.InChannels, bo[0], 3, unit),
	}
	for i, p := range c.downPlan() {
		e.DownBlocks = append(e.DownBlocks, bindDownBlock(l, nn.Join(prefix, "down_blocks", i), p, c.NormNumGroups))
	}
	e.MidBlock = bindMidBlock(l, nn.Join(prefix, "mid_block"), last, c.NormNumGroups, c.MidBlockAddAttention)
	e.ConvNormOut = nn.NewGroupNorm(l, nn.Join(prefix, "conv_norm_out"), last, c.NormNumGroups, normEps)
	e.ConvOut = bindCausalConv3d(l, nn.Join(prefix, "conv_out"), last, 2*c.LatentChannels, 3, unit)
	return e
}

// Forward: x [B, in, T, H, W] → [B, 2·latent, (T−1)/4+1, H/8, W/8].
func (e *Encoder) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := e.ConvIn.Forward(p, x)
	for _, d := range e.DownBlocks {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return d.Forward(p, x) })
	}
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return e.MidBlock.Forward(p, x) })
	// conv_norm_out and conv_act (SiLU) in one op
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return e.ConvNormOut.ForwardSiLU(p, x) })
	return p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return e.ConvOut.Forward(p, x) })
}

// Decoder is HunyuanVideoDecoder3D.
type Decoder struct {
	ConvIn      CausalConv3d // conv_in [C_last, latent_channels, 3, 3, 3]
	MidBlock    *MidBlock    // mid_block [C_last]
	UpBlocks    []*UpBlock   // up_blocks.i (channels reversed)
	ConvNormOut nn.GroupNorm // conv_norm_out [C0]; conv_act is SiLU
	ConvOut     CausalConv3d // conv_out [out_channels, C0, 3, 3, 3]
}

func bindDecoder(l *nn.Loader, prefix string, c Config) *Decoder {
	bo := c.BlockOutChannels
	last := bo[len(bo)-1]
	d := &Decoder{
		ConvIn:   bindCausalConv3d(l, nn.Join(prefix, "conv_in"), c.LatentChannels, last, 3, unit),
		MidBlock: bindMidBlock(l, nn.Join(prefix, "mid_block"), last, c.NormNumGroups, c.MidBlockAddAttention),
	}
	for i, p := range c.upPlan() {
		d.UpBlocks = append(d.UpBlocks, bindUpBlock(l, nn.Join(prefix, "up_blocks", i), p, c.NormNumGroups))
	}
	d.ConvNormOut = nn.NewGroupNorm(l, nn.Join(prefix, "conv_norm_out"), bo[0], c.NormNumGroups, normEps)
	d.ConvOut = bindCausalConv3d(l, nn.Join(prefix, "conv_out"), bo[0], c.OutChannels, 3, unit)
	return d
}

// Forward: z [B, latent, T, h, w] → [B, out, 4T−3, 8h, 8w].
func (d *Decoder) Forward(p *nn.Pass, z *runtime.Tensor) *runtime.Tensor {
	h := d.ConvIn.Forward(p, z)
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return d.MidBlock.Forward(p, x) })
	for _, u := range d.UpBlocks {
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return u.Forward(p, x) })
	}
	// conv_norm_out and conv_act (SiLU) in one op
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return d.ConvNormOut.ForwardSiLU(p, x) })
	return p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return d.ConvOut.Forward(p, x) })
}
