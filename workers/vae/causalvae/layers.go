package causalvae

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// normEps is the epsilon of every GroupNorm of the model (resnets, attention, conv_norm_out).
const normEps = 1e-6

// fwd carries what every forward needs: the runtime and the stage's context (checked between
// blocks, so a cancelled stage stops at the next block).
type fwd struct {
	ctx context.Context
	rt  *runtime.Runtime
}

func (f *fwd) check() error {
	if err := f.ctx.Err(); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// step is one op of a chain: it reads its input and returns a new tensor.
type step func(x *runtime.Tensor) (*runtime.Tensor, error)

// chain runs steps in order; each intermediate is freed as soon as the next step has read it,
// so a chain holds at most two activations at once. x itself is left alone.
func chain(x *runtime.Tensor, steps ...step) (*runtime.Tensor, error) {
	cur, owned := x, false
	for _, s := range steps {
		next, err := s(cur)
		if owned {
			cur.Free()
		}
		if err != nil {
			return nil, err
		}
		cur, owned = next, true
	}
	if !owned {
		return nil, fmt.Errorf("chain: no steps")
	}
	return cur, nil
}

// ---- leaf modules ----------------------------------------------------------------------------

// Conv3d is a plain nn.Conv3d with a 1×1×1 kernel (quant_conv, post_quant_conv).
type Conv3d struct {
	Weight *runtime.Tensor // weight [Cout, Cin, 1, 1, 1]
	Bias   *runtime.Tensor // bias [Cout]
}

func bindConv3d(b *binder, prefix string, cin, cout int) Conv3d {
	return Conv3d{
		Weight: b.weight(prefix+".weight", cout, cin, 1, 1, 1),
		Bias:   b.tensor(prefix+".bias", cout),
	}
}

func (c *Conv3d) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, Cin, T, H, W] → [B, Cout, T, H, W]
	return f.rt.Conv3d(x, c.Weight, c.Bias, runtime.Conv3dParams{})
}

// CausalConv3d is HunyuanVideoCausalConv3d: replicate padding of kH/2 and kW/2 on both sides
// and kT−1 frames before (copies of the first frame, none after), then a convolution without
// padding of its own.
type CausalConv3d struct {
	Weight *runtime.Tensor // conv.weight [Cout, Cin, kT, kH, kW]
	Bias   *runtime.Tensor // conv.bias [Cout]
	Kernel [3]int          // kT, kH, kW
	Stride [3]int          // T, H, W
}

func bindCausalConv3d(b *binder, prefix string, cin, cout, k int, stride [3]int) CausalConv3d {
	return CausalConv3d{
		Weight: b.weight(prefix+".conv.weight", cout, cin, k, k, k),
		Bias:   b.tensor(prefix+".conv.bias", cout),
		Kernel: [3]int{k, k, k},
		Stride: stride,
	}
}

func (c *CausalConv3d) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, Cin, T, H, W] → [B, Cout, (T−1)/sT+1, (H−1)/sH+1, (W−1)/sW+1] for k = 3
	p := runtime.Conv3dParams{Stride: c.Stride}
	pad := runtime.Pad3d{
		Before: [3]int{c.Kernel[0] - 1, c.Kernel[1] / 2, c.Kernel[2] / 2},
		After:  [3]int{0, c.Kernel[1] / 2, c.Kernel[2] / 2},
	}
	if pad.Before == [3]int{} && pad.After == [3]int{} {
		return f.rt.Conv3d(x, c.Weight, c.Bias, p)
	}
	return chain(x,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return f.rt.Pad3d(x, runtime.PadReplicate, pad) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return f.rt.Conv3d(x, c.Weight, c.Bias, p) })
}

// GroupNorm is nn.GroupNorm with affine weights (eps 1e-6 throughout the model).
type GroupNorm struct {
	Weight *runtime.Tensor // weight [C]
	Bias   *runtime.Tensor // bias [C]
	Groups int
}

func bindGroupNorm(b *binder, prefix string, c, groups int) GroupNorm {
	return GroupNorm{Weight: b.tensor(prefix+".weight", c), Bias: b.tensor(prefix+".bias", c), Groups: groups}
}

func (g *GroupNorm) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, C, ...] → same
	return f.rt.GroupNorm(x, g.Weight, g.Bias, g.Groups, normEps)
}

// Linear is nn.Linear.
type Linear struct {
	Weight *runtime.Tensor // weight [out, in]
	Bias   *runtime.Tensor // bias [out]
}

func bindLinear(b *binder, prefix string, in, out int) Linear {
	return Linear{Weight: b.weight(prefix+".weight", out, in), Bias: b.tensor(prefix+".bias", out)}
}

func (l *Linear) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [..., in] → [..., out]
	return f.rt.Linear(x, l.Weight, l.Bias)
}

// ---- blocks --------------------------------------------------------------------------------

// ResnetBlock is HunyuanVideoResnetBlockCausal3D: norm1 → SiLU → conv1 → norm2 → SiLU →
// (dropout) → conv2, plus the input (through conv_shortcut, a 1×1×1 causal conv, when the
// channel count changes).
type ResnetBlock struct {
	Norm1        GroupNorm     // norm1 [Cin]
	Conv1        CausalConv3d  // conv1 [Cout, Cin, 3, 3, 3]
	Norm2        GroupNorm     // norm2 [Cout]
	Conv2        CausalConv3d  // conv2 [Cout, Cout, 3, 3, 3]
	ConvShortcut *CausalConv3d // conv_shortcut [Cout, Cin, 1, 1, 1] when Cin ≠ Cout
}

func bindResnet(b *binder, prefix string, cin, cout, groups int) *ResnetBlock {
	r := &ResnetBlock{
		Norm1: bindGroupNorm(b, prefix+".norm1", cin, groups),
		Conv1: bindCausalConv3d(b, prefix+".conv1", cin, cout, 3, [3]int{1, 1, 1}),
		Norm2: bindGroupNorm(b, prefix+".norm2", cout, groups),
		Conv2: bindCausalConv3d(b, prefix+".conv2", cout, cout, 3, [3]int{1, 1, 1}),
	}
	if cin != cout {
		sc := bindCausalConv3d(b, prefix+".conv_shortcut", cin, cout, 1, [3]int{1, 1, 1})
		r.ConvShortcut = &sc
	}
	return r
}

func (r *ResnetBlock) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, Cin, T, H, W] → [B, Cout, T, H, W]
	if err := f.check(); err != nil {
		return nil, err
	}
	h, err := chain(x,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.Norm1.forward(f, x) },
		f.rt.SiLU,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.Conv1.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.Norm2.forward(f, x) },
		f.rt.SiLU,
		// dropout is the identity at inference
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return r.Conv2.forward(f, x) })
	if err != nil {
		return nil, err
	}
	defer h.Free()
	residual := x
	if r.ConvShortcut != nil {
		residual, err = r.ConvShortcut.forward(f, x)
		if err != nil {
			return nil, err
		}
		defer residual.Free()
	}
	return f.rt.Add(h, residual)
}

// Attention is the mid block's diffusers Attention (_from_deprecated_attn_block: one head of
// dim C, group norm first, residual added), run under the frame-causal mask of
// prepare_causal_attention_mask: a token attends to the tokens of its own and earlier frames.
type Attention struct {
	GroupNorm GroupNorm // group_norm [C]
	ToQ       Linear    // to_q [C, C]
	ToK       Linear    // to_k [C, C]
	ToV       Linear    // to_v [C, C]
	ToOut     Linear    // to_out.0 [C, C]; to_out.1 is Dropout
}

func bindAttention(b *binder, prefix string, c, groups int) *Attention {
	return &Attention{
		GroupNorm: bindGroupNorm(b, prefix+".group_norm", c, groups),
		ToQ:       bindLinear(b, prefix+".to_q", c, c),
		ToK:       bindLinear(b, prefix+".to_k", c, c),
		ToV:       bindLinear(b, prefix+".to_v", c, c),
		ToOut:     bindLinear(b, prefix+".to_out.0", c, c),
	}
}

func (a *Attention) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, C, T, H, W] → same
	if err := f.check(); err != nil {
		return nil, err
	}
	rt := f.rt
	B, C, T, H, W := x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3), x.Dim(4)
	HW := H * W
	L := T * HW
	var sc runtime.Scope
	defer sc.Free()

	// Group norm over [B, C, L] equals group norm over [B, C, T, H, W]; then tokens
	// [B, L, C] in (t, h, w) order, as permute(0, 2, 3, 4, 1).flatten(1, 3).
	tok, err := chain(x,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return a.GroupNorm.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return rt.Permute(x, 0, 2, 3, 4, 1) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return x.Reshape(B, 1, L, C) })
	if err != nil {
		return nil, err
	}
	sc.Add(tok)
	// q, k, v: [B, 1, L, C] (one head of dim C)
	q, err := sc.Track(a.ToQ.forward(f, tok))
	if err != nil {
		return nil, err
	}
	k, err := sc.Track(a.ToK.forward(f, tok))
	if err != nil {
		return nil, err
	}
	v, err := sc.Track(a.ToV.forward(f, tok))
	if err != nil {
		return nil, err
	}
	tok.Free()

	// The causal mask is block lower-triangular by frame, so the queries of frame t see
	// exactly the keys of frames 0..t: attend frame by frame without materialising an L×L mask.
	outs := make([]*runtime.Tensor, 0, T)
	defer func() {
		for _, o := range outs {
			o.Free()
		}
	}()
	for t := range T {
		if err := f.check(); err != nil {
			return nil, err
		}
		o, err := func() (*runtime.Tensor, error) {
			var fs runtime.Scope
			defer fs.Free()
			var err error
			qt, kt, vt := q, k, v
			if T > 1 {
				if qt, err = fs.Track(rt.Slice(q, 2, t*HW, (t+1)*HW)); err != nil {
					return nil, err
				}
			}
			if t < T-1 {
				if kt, err = fs.Track(rt.Slice(k, 2, 0, (t+1)*HW)); err != nil {
					return nil, err
				}
				if vt, err = fs.Track(rt.Slice(v, 2, 0, (t+1)*HW)); err != nil {
					return nil, err
				}
			}
			return rt.Attention(qt, kt, vt, nil, runtime.AttentionParams{})
		}()
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
	}
	q.Free()
	k.Free()
	v.Free()
	var att *runtime.Tensor
	if len(outs) == 1 {
		att, outs = outs[0], nil
	} else {
		att, err = rt.Concat(2, outs...)
		if err != nil {
			return nil, err
		}
		for _, o := range outs {
			o.Free()
		}
		outs = nil
	}
	// [B, 1, L, C] → to_out → [B, T, H, W, C] → [B, C, T, H, W] + x
	h, err := chain(att,
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return a.ToOut.forward(f, x) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return x.Reshape(B, T, H, W, C) },
		func(x *runtime.Tensor) (*runtime.Tensor, error) { return rt.Permute(x, 0, 4, 1, 2, 3) })
	att.Free()
	if err != nil {
		return nil, err
	}
	defer h.Free()
	return rt.Add(h, x)
}

// MidBlock is HunyuanVideoMidBlock3D with one layer: resnets.0, then (attention when
// mid_block_add_attention) and resnets.1.
type MidBlock struct {
	Resnets    []*ResnetBlock // resnets.0, resnets.1 [C → C]
	Attentions []*Attention   // attentions.0, nil when the config has no mid-block attention
}

func bindMidBlock(b *binder, prefix string, c, groups int, attention bool) *MidBlock {
	m := &MidBlock{
		Resnets: []*ResnetBlock{
			bindResnet(b, prefix+".resnets.0", c, c, groups),
			bindResnet(b, prefix+".resnets.1", c, c, groups),
		},
		Attentions: []*Attention{nil},
	}
	if attention {
		m.Attentions[0] = bindAttention(b, prefix+".attentions.0", c, groups)
	}
	return m
}

func (m *MidBlock) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, C, T, H, W] → same
	h, err := m.Resnets[0].forward(f, x)
	if err != nil {
		return nil, err
	}
	for i, attn := range m.Attentions {
		if attn != nil {
			a, err := attn.forward(f, h)
			h.Free()
			if err != nil {
				return nil, err
			}
			h = a
		}
		r, err := m.Resnets[i+1].forward(f, h)
		h.Free()
		if err != nil {
			return nil, err
		}
		h = r
	}
	return h, nil
}

// DownsampleCausal3D is HunyuanVideoDownsampleCausal3D: a strided causal conv.
type DownsampleCausal3D struct {
	Conv CausalConv3d // conv [C, C, 3, 3, 3], stride (sT, 2, 2)
}

func (d *DownsampleCausal3D) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, C, T, H, W] → [B, C, (T−1)/sT+1, (H−1)/2+1, (W−1)/2+1]
	return d.Conv.forward(f, x)
}

// UpsampleCausal3D is HunyuanVideoUpsampleCausal3D: nearest upsampling in which the first
// frame is only upsampled in space (the others also repeat in time), then a causal conv.
type UpsampleCausal3D struct {
	Conv   CausalConv3d // conv [C, C, 3, 3, 3]
	Factor [3]int       // T, H, W
}

func (u *UpsampleCausal3D) forward(f *fwd, x *runtime.Tensor) (*runtime.Tensor, error) {
	// x: [B, C, T, H, W] → [B, C, 1 + sT·(T−1), sH·H, sW·W]
	rt := f.rt
	st := u.Factor[0]
	up, err := rt.UpsampleNearest3d(x, u.Factor)
	if err != nil {
		return nil, err
	}
	if st > 1 {
		// Repeating every frame sT times and dropping the first sT−1 copies leaves frame 0
		// once and every other frame sT times: cat(first_frame, interpolate(other_frames)).
		cut, err := rt.Slice(up, 2, st-1, up.Dim(2))
		up.Free()
		if err != nil {
			return nil, err
		}
		up = cut
	}
	defer up.Free()
	return u.Conv.forward(f, up)
}
