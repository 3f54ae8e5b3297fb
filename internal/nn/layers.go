package nn

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// Linear is torch.nn.Linear: y = x·Weightᵀ + Bias.
type Linear struct {
	// Weight is <name>.weight [out, in]: the weight dtype, or 8 bits (F8E4M3, F8E5M2) as an
	// 8-bit checkpoint stores it or as quantized at load (Loader.LinearWeight).
	Weight *runtime.Tensor
	// Scale is an 8-bit weight's scales, F32 [1 or out, blocks] (nil: 1, and for 16/32 bits).
	Scale *runtime.Tensor
	Bias  *runtime.Tensor // <name>.bias [out], nil when the layer has no bias
}

// NewLinear binds <name>.weight [out, in] (Loader.LinearWeight) and, when bias is set,
// <name>.bias [out].
func NewLinear(l *Loader, name string, in, out int, bias bool) Linear {
	var lin Linear
	lin.Weight, lin.Scale = l.LinearWeight(Join(name, "weight"), out, in)
	if bias {
		lin.Bias = l.Tensor(Join(name, "bias"), out)
	}
	return lin
}

// Forward: x [..., in] → [..., out].
func (m Linear) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	return m.forward(p, x, runtime.EpilogueNone)
}

// ForwardGELU is GELU(tanh)(Forward(x)) in one op (the GEMM's epilogue).
func (m Linear) ForwardGELU(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	return m.forward(p, x, runtime.EpilogueGELUTanh)
}

func (m Linear) forward(p *Pass, x *runtime.Tensor, epi runtime.GemmEpilogue) *runtime.Tensor {
	switch {
	case !p.OK():
		return nil
	case m.Weight != nil && m.Weight.DType().IsFP8():
		return p.Do(p.RT.LinearQ(x, m.Weight, m.Scale, m.Bias, epi))
	case epi == runtime.EpilogueGELUTanh:
		return p.Do(p.RT.LinearGELU(x, m.Weight, m.Bias))
	}
	return p.Do(p.RT.Linear(x, m.Weight, m.Bias))
}

// LayerNorm is torch.nn.LayerNorm over the last dim; Weight and Bias are nil when
// elementwise_affine is False.
type LayerNorm struct {
	Weight *runtime.Tensor // <name>.weight [dim]
	Bias   *runtime.Tensor // <name>.bias [dim]
	Eps    float32
}

// NewLayerNorm binds <name>.weight and <name>.bias [dim].
func NewLayerNorm(l *Loader, name string, dim int, eps float32) LayerNorm {
	return LayerNorm{Weight: l.Tensor(Join(name, "weight"), dim), Bias: l.Tensor(Join(name, "bias"), dim), Eps: eps}
}

// Forward: x [..., dim] → [..., dim].
func (n LayerNorm) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.LayerNorm(x, n.Weight, n.Bias, n.Eps))
}

// RMSNorm is x / sqrt(mean(x²) + eps) · weight over the last dim (LlamaRMSNorm, diffusers'
// RMSNorm).
type RMSNorm struct {
	Weight *runtime.Tensor // <name>.weight [dim]
	Eps    float32
}

// NewRMSNorm binds <name>.weight [dim].
func NewRMSNorm(l *Loader, name string, dim int, eps float32) RMSNorm {
	return RMSNorm{Weight: l.Tensor(Join(name, "weight"), dim), Eps: eps}
}

// Forward: x [..., dim] → [..., dim].
func (n RMSNorm) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.RMSNorm(x, n.Weight, n.Eps))
}

// GroupNorm is torch.nn.GroupNorm with affine weights over dim 1.
type GroupNorm struct {
	Weight *runtime.Tensor // <name>.weight [C]
	Bias   *runtime.Tensor // <name>.bias [C]
	Groups int
	Eps    float32
}

// NewGroupNorm binds <name>.weight and <name>.bias [c].
func NewGroupNorm(l *Loader, name string, c, groups int, eps float32) GroupNorm {
	return GroupNorm{Weight: l.Tensor(Join(name, "weight"), c), Bias: l.Tensor(Join(name, "bias"), c), Groups: groups, Eps: eps}
}

// Forward: x [B, C, ...] → same.
func (g GroupNorm) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.GroupNorm(x, g.Weight, g.Bias, g.Groups, g.Eps))
}

// ForwardSiLU is SiLU(Forward(x)) in one op (the runtime's fused group norm and SiLU).
func (g GroupNorm) ForwardSiLU(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.GroupNormSiLU(x, g.Weight, g.Bias, g.Groups, g.Eps))
}

// Conv3d is torch.nn.Conv3d without padding of its own (callers pad: replicate for the causal
// VAE, none for patch embeddings).
type Conv3d struct {
	Weight *runtime.Tensor // <name>.weight [Cout, Cin, kT, kH, kW] (the weight dtype)
	Bias   *runtime.Tensor // <name>.bias [Cout]
	Kernel [3]int          // kT, kH, kW
	Stride [3]int          // T, H, W
}

// NewConv3d binds <name>.weight [cout, cin, kernel...] and <name>.bias [cout].
func NewConv3d(l *Loader, name string, cin, cout int, kernel, stride [3]int) Conv3d {
	return Conv3d{
		Weight: l.Weight(Join(name, "weight"), cout, cin, kernel[0], kernel[1], kernel[2]),
		Bias:   l.Tensor(Join(name, "bias"), cout),
		Kernel: kernel,
		Stride: stride,
	}
}

// Forward: x [B, Cin, T, H, W] → [B, Cout, (T−kT)/sT+1, (H−kH)/sH+1, (W−kW)/sW+1].
func (c Conv3d) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	return c.ForwardInput(p, x, runtime.ConvInput{})
}

// ForwardInput is Forward on the input in describes: x upsampled (nearest) and replicate
// padded, read in place where the backend can (runtime.ConvInput).
func (c Conv3d) ForwardInput(p *Pass, x *runtime.Tensor, in runtime.ConvInput) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.Conv3d(x, c.Weight, c.Bias, runtime.Conv3dParams{Stride: c.Stride, Input: in}))
}

// Conv2d is torch.nn.Conv2d without padding (SigLIP's patch embedding).
type Conv2d struct {
	Weight *runtime.Tensor // <name>.weight [Cout, Cin, kH, kW] (the weight dtype)
	Bias   *runtime.Tensor // <name>.bias [Cout]
	Stride [2]int
}

// NewConv2d binds <name>.weight [cout, cin, k, k] and <name>.bias [cout].
func NewConv2d(l *Loader, name string, cin, cout, k int, stride [2]int) Conv2d {
	return Conv2d{Weight: l.Weight(Join(name, "weight"), cout, cin, k, k), Bias: l.Tensor(Join(name, "bias"), cout), Stride: stride}
}

// Forward: x [B, Cin, H, W] → [B, Cout, (H−k)/sH+1, (W−k)/sW+1].
func (c Conv2d) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.Conv2d(x, c.Weight, c.Bias, runtime.Conv2dParams{Stride: c.Stride}))
}

// Activation is an elementwise activation function.
type Activation runtime.UnaryOp

// ActivationByName returns transformers' ACT2FN[name] for the names the text encoders use.
func ActivationByName(name string) (Activation, error) {
	switch name {
	case "silu", "swish":
		return Activation(runtime.OpSiLU), nil
	case "quick_gelu":
		return Activation(runtime.OpQuickGELU), nil
	case "gelu":
		return Activation(runtime.OpGELUErf), nil
	case "gelu_new", "gelu_pytorch_tanh", "gelu_fast":
		return Activation(runtime.OpGELUTanh), nil
	}
	return 0, fmt.Errorf("hidden_act %q is not supported (silu, swish, quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)", name)
}

// Forward: x → act(x), same shape.
func (a Activation) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	return p.Do(p.RT.Unary(runtime.UnaryOp(a), x))
}

// HostEmbedding is torch.nn.Embedding whose table stays in the mapped checkpoint: the rows a
// call needs are gathered on the host and uploaded, so the runtime never holds the table
// (a Llama 3 vocabulary of 128k rows is 1 GB in 16 bits, of which a prompt uses a few hundred).
// The checkpoint must stay open while the embedding is used.
type HostEmbedding struct {
	raw       []byte        // [Rows, Dim] as stored
	src       runtime.DType // stored dtype
	dt        runtime.DType // dtype of the uploaded rows
	Rows, Dim int
}

// NewHostEmbedding binds name [rows, dim] without uploading it.
func NewHostEmbedding(l *Loader, name string, rows, dim int) *HostEmbedding {
	src, raw := l.Raw(name, rows, dim)
	return &HostEmbedding{raw: raw, src: src, dt: l.dtype, Rows: rows, Dim: dim}
}

// Forward returns the rows of ids: [len(ids)] → [1, len(ids), Dim]. An id outside the table is
// an error wrapping ErrBadInput.
func (e *HostEmbedding) Forward(p *Pass, ids []int32) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	es := e.src.Size()
	row := e.Dim * es
	buf := make([]byte, len(ids)*row)
	for i, id := range ids {
		if id < 0 || int(id) >= e.Rows {
			p.Failf("embedding: token id %d at %d outside the vocabulary [0, %d): %w", id, i, e.Rows, ErrBadInput)
			return nil
		}
		copy(buf[i*row:(i+1)*row], e.raw[int(id)*row:(int(id)+1)*row])
	}
	return p.Do(p.RT.FromBytes(e.dt, e.src, buf, 1, len(ids), e.Dim))
}

// CausalMask returns a U8 mask [1, 1, n, n] for attention: query i may attend key j when
// j ≤ i and keep[j] (keep nil means every key).
func CausalMask(p *Pass, n int, keep []bool) *runtime.Tensor {
	if !p.OK() {
		return nil
	}
	m := make([]uint8, n*n)
	for i := range n {
		for j := 0; j <= i; j++ {
			if keep == nil || keep[j] {
				m[i*n+j] = 1
			}
		}
	}
	return p.Do(p.RT.FromUint8(m, 1, 1, n, n))
}

// MLP is the two-layer feed-forward block of CLIP and SigLIP encoder layers (CLIPMLP,
// SiglipMLP): fc2(act(fc1(x))).
type MLP struct {
	FC1 Linear // fc1 [intermediate, hidden]
	FC2 Linear // fc2 [hidden, intermediate]
	Act Activation
}

// NewMLP binds <name>.fc1 and <name>.fc2 (both with bias) for hidden → intermediate → hidden.
func NewMLP(l *Loader, name string, hidden, intermediate int, act Activation) MLP {
	return MLP{
		FC1: NewLinear(l, Join(name, "fc1"), hidden, intermediate, true),
		FC2: NewLinear(l, Join(name, "fc2"), intermediate, hidden, true),
		Act: act,
	}
}

// Forward: x [..., hidden] → [..., hidden].
func (m MLP) Forward(p *Pass, x *runtime.Tensor) *runtime.Tensor {
	var a *runtime.Tensor
	switch {
	case !p.OK():
	case m.Act == Activation(runtime.OpGELUTanh): // fc1 and GELU(tanh) in one op (GEMM epilogue)
		a = m.FC1.ForwardGELU(p, x)
	default:
		h := m.FC1.Forward(p, x)
		a = m.Act.Forward(p, h)
		p.Drop(h)
	}
	out := m.FC2.Forward(p, a)
	p.Drop(a)
	return out
}
