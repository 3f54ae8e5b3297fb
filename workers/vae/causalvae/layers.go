package causalvae

import (
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// normEps is the epsilon of every GroupNorm of the model (resnets, attention, conv_norm_out).
const normEps = 1e-6

var unit = [3]int{1, 1, 1}

// ---- leaf modules ----------------------------------------------------------------------------

// CausalConv3d is HunyuanVideoCausalConv3d: replicate padding of kH/2 and kW/2 on both sides
// and kT−1 frames before (copies of the first frame, none after), then a convolution without
// padding of its own.
type CausalConv3d struct {
	Conv nn.Conv3d // conv [Cout, Cin, kT, kH, kW]
}

func bindCausalConv3d(l *nn.Loader, prefix string, cin, cout, k int, stride [3]int) CausalConv3d {
	return CausalConv3d{Conv: nn.NewConv3d(l, nn.Join(prefix, "conv"), cin, cout, [3]int{k, k, k}, stride)}
}

// Forward: x [B, Cin, T, H, W] → [B, Cout, (T−1)/sT+1, (H−1)/sH+1, (W−1)/sW+1] for k = 3.
// The conv reads x through the padding (runtime.ConvInput): no padded copy where the backend
// reads it in place.
func (c *CausalConv3d) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	return c.Conv.ForwardInput(p, x, runtime.ConvInput{Replicate: c.padding(0)})
}

// padding is the conv's replicate padding when the input's first `extra` frames already are
// copies of frame `extra` (they serve as part of the causal padding): kT−1−extra frames before.
func (c *CausalConv3d) padding(extra int) runtime.Pad3d {
	k := c.Conv.Kernel
	return runtime.Pad3d{Before: [3]int{k[0] - 1 - extra, k[1] / 2, k[2] / 2}, After: [3]int{0, k[1] / 2, k[2] / 2}}
}

// ---- blocks --------------------------------------------------------------------------------

// ResnetBlock is HunyuanVideoResnetBlockCausal3D: norm1 → SiLU → conv1 → norm2 → SiLU →
// (dropout) → conv2, plus the input (through conv_shortcut, a 1×1×1 causal conv, when the
// channel count changes).
type ResnetBlock struct {
	Norm1        nn.GroupNorm  // norm1 [Cin]
	Conv1        CausalConv3d  // conv1 [Cout, Cin, 3, 3, 3]
	Norm2        nn.GroupNorm  // norm2 [Cout]
	Conv2        CausalConv3d  // conv2 [Cout, Cout, 3, 3, 3]
	ConvShortcut *CausalConv3d // conv_shortcut [Cout, Cin, 1, 1, 1] when Cin ≠ Cout

	// halves, when set (a block that narrows its channels: split), runs norm1 and conv1 over
	// the two halves of the input channels and adds the two convs: the wide activation and its
	// padded copy are then held half at a time (the decoder's 256 → 128 resnet at full
	// resolution was its peak). Same sums, in another order.
	halves *[2]resnetHalf
}

// resnetHalf is norm1 and conv1 restricted to one half of the input channels (contiguous
// copies of the weights made at load; a half holds whole groups).
type resnetHalf struct {
	norm nn.GroupNorm // norm1's weight and bias [Cin/2], groups/2 groups
	conv CausalConv3d // conv1's weight [Cout, Cin/2, 3, 3, 3]; bias on the second half only
}

// canSplit reports whether the block narrows its channels and its input halves hold whole
// groups.
func (r *ResnetBlock) canSplit() bool {
	w := r.Conv1.Conv.Weight
	if w == nil || r.ConvShortcut == nil || r.Norm1.Groups%2 != 0 {
		return false
	}
	cin, cout := w.Dim(1), w.Dim(0)
	return cin > cout && cin%2 == 0
}

// split makes the halves' weights (contiguous slices); the caller frees them with the model.
func (r *ResnetBlock) split(rt *runtime.Runtime) ([]*runtime.Tensor, error) {
	if !r.canSplit() {
		return nil, nil
	}
	cin := r.Conv1.Conv.Weight.Dim(1)
	var made []*runtime.Tensor
	slice := func(t *runtime.Tensor, dim, a, b int) (*runtime.Tensor, error) {
		if t == nil {
			return nil, nil
		}
		out, err := hostSlice(rt, t, dim, a, b)
		if err == nil {
			made = append(made, out)
		}
		return out, err
	}
	var hs [2]resnetHalf
	for i := range 2 {
		a, b := i*cin/2, (i+1)*cin/2
		nw, err := slice(r.Norm1.Weight, 0, a, b)
		if err != nil {
			return made, err
		}
		nb, err := slice(r.Norm1.Bias, 0, a, b)
		if err != nil {
			return made, err
		}
		cw, err := slice(r.Conv1.Conv.Weight, 1, a, b)
		if err != nil {
			return made, err
		}
		conv := r.Conv1.Conv
		conv.Weight = cw
		if i == 0 {
			conv.Bias = nil
		}
		hs[i] = resnetHalf{norm: nn.GroupNorm{Weight: nw, Bias: nb, Groups: r.Norm1.Groups / 2, Eps: r.Norm1.Eps},
			conv: CausalConv3d{Conv: conv}}
	}
	r.halves = &hs
	return made, nil
}

func bindResnet(l *nn.Loader, prefix string, cin, cout, groups int) *ResnetBlock {
	r := &ResnetBlock{
		Norm1: nn.NewGroupNorm(l, nn.Join(prefix, "norm1"), cin, groups, normEps),
		Conv1: bindCausalConv3d(l, nn.Join(prefix, "conv1"), cin, cout, 3, unit),
		Norm2: nn.NewGroupNorm(l, nn.Join(prefix, "norm2"), cout, groups, normEps),
		Conv2: bindCausalConv3d(l, nn.Join(prefix, "conv2"), cout, cout, 3, unit),
	}
	if cin != cout {
		sc := bindCausalConv3d(l, nn.Join(prefix, "conv_shortcut"), cin, cout, 1, unit)
		r.ConvShortcut = &sc
	}
	return r
}

// Forward: x [B, Cin, T, H, W] → [B, Cout, T, H, W]; x stays the caller's.
func (r *ResnetBlock) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	return r.forward(p, x, false)
}

// Consume is Forward that frees x (the pass's) as soon as the block no longer reads it: with a
// channel-changing shortcut, right after the shortcut and norm1 (the shortcut runs first), so
// the wide input is not held through conv1 (the decoder's peak).
func (r *ResnetBlock) Consume(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	out := r.forward(p, x, true)
	p.Drop(x)
	return out
}

func (r *ResnetBlock) forward(p *nn.Pass, x *runtime.Tensor, consume bool) *runtime.Tensor {
	if !p.Check() {
		return nil
	}
	residual := x
	if r.ConvShortcut != nil {
		residual = r.ConvShortcut.Forward(p, x)
		defer p.Drop(residual)
	}
	var h *runtime.Tensor
	if r.halves != nil {
		h = r.halvesConv1(p, x, consume)
	} else {
		h = r.Norm1.ForwardSiLU(p, x) // norm1 and nonlinearity in one op
		if consume && residual != x {
			p.Drop(x)
		}
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return r.Conv1.Forward(p, x) })
	}
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return r.Norm2.ForwardSiLU(p, x) })
	// dropout is the identity at inference
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return r.Conv2.Forward(p, x) })
	return p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Add(h, residual)) })
}

// hostSlice returns a contiguous copy of t[..., a:b, ...] along dim, made through host memory
// (a download and an upload, not a runtime op: Load runs no ops).
func hostSlice(rt *runtime.Runtime, t *runtime.Tensor, dim, a, b int) (*runtime.Tensor, error) {
	raw, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	shape := t.Shape()
	es := t.DType().Size()
	outer, inner := 1, es
	for _, d := range shape[:dim] {
		outer *= d
	}
	for _, d := range shape[dim+1:] {
		inner *= d
	}
	n := shape[dim]
	out := make([]byte, 0, outer*(b-a)*inner)
	for o := range outer {
		out = append(out, raw[(o*n+a)*inner:(o*n+b)*inner]...)
	}
	shape[dim] = b - a
	return rt.FromBytes(t.DType(), t.DType(), out, shape...)
}

// halvesConv1 is conv1(SiLU(norm1(x))) over the two halves of x's channels, summed (x is
// freed once sliced when consume).
func (r *ResnetBlock) halvesConv1(p *nn.Pass, x *runtime.Tensor, consume bool) *runtime.Tensor {
	c := x.Dim(1)
	parts := [2]*runtime.Tensor{p.Do(p.RT.Slice(x, 1, 0, c/2)), p.Do(p.RT.Slice(x, 1, c/2, c))}
	if consume {
		p.Drop(x)
	}
	var outs [2]*runtime.Tensor
	for i, hf := range r.halves {
		h := p.Then(parts[i], func(x *runtime.Tensor) *runtime.Tensor { return hf.norm.ForwardSiLU(p, x) })
		outs[i] = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return hf.conv.Forward(p, x) })
	}
	if !p.OK() {
		return nil
	}
	sum := p.Do(p.RT.Add(outs[0], outs[1]))
	p.Drop(outs[0], outs[1])
	return sum
}

// Attention is the mid block's diffusers Attention (_from_deprecated_attn_block: one head of
// dim C, group norm first, residual added), run under the frame-causal mask of
// prepare_causal_attention_mask: a token attends to the tokens of its own and earlier frames.
type Attention struct {
	GroupNorm nn.GroupNorm // group_norm [C]
	ToQ       nn.Linear    // to_q [C, C]
	ToK       nn.Linear    // to_k [C, C]
	ToV       nn.Linear    // to_v [C, C]
	ToOut     nn.Linear    // to_out.0 [C, C]; to_out.1 is Dropout
	nn.Attention
}

func bindAttention(l *nn.Loader, prefix string, c, groups int) *Attention {
	lin := func(name string) nn.Linear { return nn.NewLinear(l, nn.Join(prefix, name), c, c, true) }
	return &Attention{
		GroupNorm: nn.NewGroupNorm(l, nn.Join(prefix, "group_norm"), c, groups, normEps),
		ToQ:       lin("to_q"),
		ToK:       lin("to_k"),
		ToV:       lin("to_v"),
		ToOut:     lin("to_out.0"),
		Attention: nn.NewAttention(1, c),
	}
}

// Forward: x [B, C, T, H, W] → same.
func (a *Attention) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.Check() {
		return nil
	}
	B, C, T, H, W := x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3), x.Dim(4)
	HW := H * W
	// Group norm over [B, C, L] equals group norm over [B, C, T, H, W]; then tokens
	// [B, L, C] in (t, h, w) order, as permute(0, 2, 3, 4, 1).flatten(1, 3).
	tok := a.GroupNorm.Forward(p, x)
	tok = p.Then(tok, func(x *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Permute(x, 0, 2, 3, 4, 1)) })
	tok = p.Reshape(tok, B, T*HW, C)
	q, k, v := a.ToQ.Forward(p, tok), a.ToK.Forward(p, tok), a.ToV.Forward(p, tok) // [B, L, C]
	p.Drop(tok)

	// The causal mask is block lower-triangular by frame, so the queries of frame t see
	// exactly the keys of frames 0..t: attend frame by frame without materialising an L×L mask.
	outs := make([]*runtime.Tensor, 0, T)
	for t := range T {
		if !p.Check() {
			return nil
		}
		outs = append(outs, p.Sub("", func(f *nn.Pass) *runtime.Tensor {
			qt, kt, vt := q, k, v
			if T > 1 {
				qt = f.Do(f.RT.Slice(q, 1, t*HW, (t+1)*HW))
			}
			if t < T-1 {
				kt = f.Do(f.RT.Slice(k, 1, 0, (t+1)*HW))
				vt = f.Do(f.RT.Slice(v, 1, 0, (t+1)*HW))
			}
			return a.Attention.Forward(f, qt, kt, vt, nil)
		}))
	}
	p.Drop(q, k, v)
	att := outs[0]
	if len(outs) > 1 {
		att = p.Do(p.RT.Concat(1, outs...))
		p.Drop(outs...)
	}
	// [B, L, C] → to_out → [B, T, H, W, C] → [B, C, T, H, W] + x
	h := p.Then(att, func(x *runtime.Tensor) *runtime.Tensor { return a.ToOut.Forward(p, x) })
	h = p.Reshape(h, B, T, H, W, C)
	h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Permute(x, 0, 4, 1, 2, 3)) })
	return p.Then(h, func(h *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Add(h, x)) })
}

// MidBlock is HunyuanVideoMidBlock3D with one layer: resnets.0, then (attention when
// mid_block_add_attention) and resnets.1.
type MidBlock struct {
	Resnets    []*ResnetBlock // resnets.0, resnets.1 [C → C]
	Attentions []*Attention   // attentions.0, nil when the config has no mid-block attention
}

func bindMidBlock(l *nn.Loader, prefix string, c, groups int, attention bool) *MidBlock {
	m := &MidBlock{
		Resnets: []*ResnetBlock{
			bindResnet(l, nn.Join(prefix, "resnets.0"), c, c, groups),
			bindResnet(l, nn.Join(prefix, "resnets.1"), c, c, groups),
		},
		Attentions: []*Attention{nil},
	}
	if attention {
		m.Attentions[0] = bindAttention(l, nn.Join(prefix, "attentions.0"), c, groups)
	}
	return m
}

// Forward: x [B, C, T, H, W] → same. x (the pass's) is freed after the first resnet, which is
// its last reader.
func (m *MidBlock) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	h := m.Resnets[0].Consume(p, x)
	for i, attn := range m.Attentions {
		if attn != nil {
			h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return attn.Forward(p, x) })
		}
		h = p.Then(h, func(x *runtime.Tensor) *runtime.Tensor { return m.Resnets[i+1].Forward(p, x) })
	}
	return h
}

// DownsampleCausal3D is HunyuanVideoDownsampleCausal3D: a strided causal conv.
type DownsampleCausal3D struct {
	Conv CausalConv3d // conv [C, C, 3, 3, 3], stride (sT, 2, 2)
}

// Forward: x [B, C, T, H, W] → [B, C, (T−1)/sT+1, (H−1)/2+1, (W−1)/2+1].
func (d *DownsampleCausal3D) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	return d.Conv.Forward(p, x)
}

// UpsampleCausal3D is HunyuanVideoUpsampleCausal3D: nearest upsampling in which the first
// frame is only upsampled in space (the others also repeat in time), then a causal conv.
type UpsampleCausal3D struct {
	Conv   CausalConv3d // conv [C, C, 3, 3, 3]
	Factor [3]int       // T, H, W
}

// Forward: x [B, C, T, H, W] → [B, C, 1 + sT·(T−1), sH·H, sW·W].
func (u *UpsampleCausal3D) Forward(p *nn.Pass, x *runtime.Tensor) *runtime.Tensor {
	// Repeating every frame sT times and dropping the first sT−1 copies leaves frame 0 once and
	// every other frame sT times: cat(first_frame, interpolate(other_frames)). The dropped
	// copies of frame 0 are what the conv's causal padding would put back (replicates of frame
	// 0), so they stay and serve as part of it, and the conv reads the upsampled, padded input
	// in place (runtime.ConvInput): neither the upsampled nor a sliced copy is made (where the
	// backend cannot read it in place — cpu, MIOpen, f32 on cuda — the native core makes the
	// upsampled, padded tensor once for the call).
	extra := u.Factor[0] - 1
	if extra <= u.Conv.Conv.Kernel[0]-1 {
		return u.Conv.Conv.ForwardInput(p, x, runtime.ConvInput{Upsample: u.Factor, Replicate: u.Conv.padding(extra)})
	}
	up := p.Do(p.RT.UpsampleNearest3d(x, u.Factor))
	up = p.Then(up, func(up *runtime.Tensor) *runtime.Tensor { return p.Do(p.RT.Slice(up, 2, extra, up.Dim(2))) })
	return p.Then(up, func(x *runtime.Tensor) *runtime.Tensor { return u.Conv.Forward(p, x) })
}
