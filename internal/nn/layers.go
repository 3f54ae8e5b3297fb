package nn

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// Linear is torch.nn.Linear: y = x·Weightᵀ + Bias.
type Linear struct {
	Weight *runtime.Tensor // [out, in]
	Bias   *runtime.Tensor // [out], nil when the layer has no bias
}

// LoadLinear binds <name>.weight [out, in] (in the loader's weight dtype) and, when bias is
// set, <name>.bias [out].
func LoadLinear(l *Loader, name string, in, out int, bias bool) (Linear, error) {
	var lin Linear
	var err error
	if lin.Weight, err = l.LoadWeight(name+".weight", out, in); err != nil {
		return Linear{}, err
	}
	if bias {
		if lin.Bias, err = l.Load(name+".bias", out); err != nil {
			return Linear{}, err
		}
	}
	return lin, nil
}

// Forward maps x [..., in] → [..., out].
func (m Linear) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	return rt.Linear(x, m.Weight, m.Bias)
}

// LayerNorm is torch.nn.LayerNorm over the last dim.
type LayerNorm struct {
	Weight *runtime.Tensor // [hidden]
	Bias   *runtime.Tensor // [hidden]
	Eps    float32
}

// LoadLayerNorm binds <name>.weight and <name>.bias [d].
func LoadLayerNorm(l *Loader, name string, d int, eps float32) (LayerNorm, error) {
	n := LayerNorm{Eps: eps}
	var err error
	if n.Weight, err = l.Load(name+".weight", d); err != nil {
		return LayerNorm{}, err
	}
	if n.Bias, err = l.Load(name+".bias", d); err != nil {
		return LayerNorm{}, err
	}
	return n, nil
}

// Forward keeps x's shape.
func (n LayerNorm) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	return rt.LayerNorm(x, n.Weight, n.Bias, n.Eps)
}

// Activation is an elementwise activation function.
type Activation func(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error)

// ActivationByName returns transformers' ACT2FN[name] for the names the text encoders use.
func ActivationByName(name string) (Activation, error) {
	var op runtime.UnaryOp
	switch name {
	case "silu", "swish":
		op = runtime.OpSiLU
	case "quick_gelu":
		op = runtime.OpQuickGELU
	case "gelu":
		op = runtime.OpGELUErf
	case "gelu_new", "gelu_pytorch_tanh", "gelu_fast":
		op = runtime.OpGELUTanh
	default:
		return nil, fmt.Errorf("hidden_act %q is not supported (silu, swish, quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)", name)
	}
	return func(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) { return rt.Unary(op, x) }, nil
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

// LoadHostEmbedding binds name [rows, dim] without uploading it.
func LoadHostEmbedding(l *Loader, name string, rows, dim int) (*HostEmbedding, error) {
	src, raw, err := l.Raw(name, rows, dim)
	if err != nil {
		return nil, err
	}
	return &HostEmbedding{raw: raw, src: src, dt: l.dtype, Rows: rows, Dim: dim}, nil
}

// Forward returns the rows of ids: [len(ids)] → [1, len(ids), Dim]. An id outside the table is
// an error wrapping ErrBadInput.
func (e *HostEmbedding) Forward(rt *runtime.Runtime, ids []int32) (*runtime.Tensor, error) {
	es := e.src.Size()
	row := e.Dim * es
	buf := make([]byte, len(ids)*row)
	for i, id := range ids {
		if id < 0 || int(id) >= e.Rows {
			return nil, fmt.Errorf("embedding: token id %d at %d outside the vocabulary [0, %d): %w", id, i, e.Rows, ErrBadInput)
		}
		copy(buf[i*row:(i+1)*row], e.raw[int(id)*row:(int(id)+1)*row])
	}
	return rt.FromBytes(e.dt, e.src, buf, 1, len(ids), e.Dim)
}

// CausalMask returns a U8 mask [1, 1, n, n] for runtime.Attention: query i may attend key j
// when j ≤ i and keep[j] (keep nil means every key).
func CausalMask(rt *runtime.Runtime, n int, keep []bool) (*runtime.Tensor, error) {
	m := make([]uint8, n*n)
	for i := range n {
		for j := 0; j <= i; j++ {
			if keep == nil || keep[j] {
				m[i*n+j] = 1
			}
		}
	}
	return rt.FromUint8(m, 1, 1, n, n)
}

// MLP is the two-layer feed-forward block of CLIP and SigLIP encoder layers (CLIPMLP,
// SiglipMLP): fc2(act(fc1(x))).
type MLP struct {
	FC1 Linear // fc1 [intermediate, hidden]
	FC2 Linear // fc2 [hidden, intermediate]

	act Activation
}

// LoadMLP binds <name>.fc1 and <name>.fc2 (both with bias) for hidden → intermediate → hidden.
func LoadMLP(l *Loader, name string, hidden, intermediate int, act Activation) (MLP, error) {
	m := MLP{act: act}
	var err error
	if m.FC1, err = LoadLinear(l, name+".fc1", hidden, intermediate, true); err != nil {
		return MLP{}, err
	}
	if m.FC2, err = LoadLinear(l, name+".fc2", intermediate, hidden, true); err != nil {
		return MLP{}, err
	}
	return m, nil
}

// Forward keeps x's shape [..., hidden].
func (m MLP) Forward(rt *runtime.Runtime, x *runtime.Tensor) (*runtime.Tensor, error) {
	var sc runtime.Scope
	defer sc.Free()
	h, err := sc.Track(m.FC1.Forward(rt, x))
	if err != nil {
		return nil, err
	}
	if h, err = sc.Track(m.act(rt, h)); err != nil {
		return nil, err
	}
	return m.FC2.Forward(rt, h)
}
