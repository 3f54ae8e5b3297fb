package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"errors"
	"slices"
)

// op allocates an output of dtype dt and shape, resolves the handles of ins (nil stays nil:
// optional inputs), runs f and returns the output; on error the output is freed.
func (rt *Runtime) op(name string, dt DType, shape []int, ins []*Tensor,
	f func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status) (*Tensor, error) {
	hs, err := rt.handles(name, ins)
	if err != nil {
		return nil, err
	}
	out, err := rt.newTensor(name, dt, shape)
	if err != nil {
		return nil, err
	}
	if err := rt.run(name, out, func() C.fpk_status { return f(hs, out.h) }); err != nil {
		out.Free()
		return nil, err
	}
	return out, nil
}

// handles returns the live handles of ts (nil for nil entries), checking they belong to rt.
func (rt *Runtime) handles(op string, ts []*Tensor) ([]C.fpk_tensor_t, error) {
	hs := make([]C.fpk_tensor_t, len(ts))
	for i, t := range ts {
		if t == nil {
			continue
		}
		if t.rt != rt {
			return nil, argError(op, "tensor %d (%s) belongs to another runtime", i, t)
		}
		h, err := t.handle(op)
		if err != nil {
			return nil, err
		}
		hs[i] = h
	}
	return hs, nil
}

func required(op string, ts ...*Tensor) error {
	for i, t := range ts {
		if t == nil {
			return argError(op, "tensor argument %d is nil", i)
		}
	}
	return nil
}

func normDim(op string, dim, rank int) (int, error) {
	if dim < 0 {
		dim += rank
	}
	if dim < 0 || dim >= rank {
		return 0, argError(op, "dim %d out of range for rank %d", dim, rank)
	}
	return dim, nil
}

// ---- GEMM ---------------------------------------------------------------------------------

// GemmParams are the options of MatMul.
type GemmParams struct {
	TransA bool    // a holds [..., K, M]
	TransB bool    // b holds [..., N, K]
	Alpha  float32 // scale of the product (0 means 1)
	// Epilogue is applied after the bias (EpilogueNone, the zero value: nothing).
	Epilogue GemmEpilogue
}

// MatMul computes alpha·op(a)·op(b). a: [batch..., M, K]; b: [batch..., K, N] with the same
// batch dims, or [K, N] shared by every batch; → [batch..., M, N] in a's dtype (the activation
// dtype: f32, or a 16-bit one with f32 accumulation). b may be F16 or BF16 (weights kept in 16
// bits); on the cpu backend it is widened to f32 a panel at a time into bounded scratch, with
// the results of an f32 copy of b.
func (rt *Runtime) MatMul(a, b *Tensor, p GemmParams) (*Tensor, error) {
	return rt.gemm("matmul", a, b, nil, p)
}

// Linear is a PyTorch linear layer: x [..., in] · wᵀ + bias with w [out, in], bias [out] or
// nil → [..., out] in x's dtype. w may be F16 or BF16 (see MatMul).
func (rt *Runtime) Linear(x, w, bias *Tensor) (*Tensor, error) {
	return rt.linear("linear", x, w, bias, EpilogueNone)
}

// linear is Linear with an epilogue after the bias.
func (rt *Runtime) linear(op string, x, w, bias *Tensor, epi GemmEpilogue) (*Tensor, error) {
	if err := required(op, x, w); err != nil {
		return nil, err
	}
	if x.Rank() == 1 {
		x2, err := x.Reshape(1, x.Dim(0))
		if err != nil {
			return nil, err
		}
		defer x2.Free()
		y, err := rt.gemm(op, x2, w, bias, GemmParams{TransB: true, Epilogue: epi})
		if err != nil {
			return nil, err
		}
		defer y.Free()
		return y.Reshape(y.Dim(1))
	}
	return rt.gemm(op, x, w, bias, GemmParams{TransB: true, Epilogue: epi})
}

func (rt *Runtime) gemm(op string, a, b, bias *Tensor, p GemmParams) (*Tensor, error) {
	if err := required(op, a, b); err != nil {
		return nil, err
	}
	if a.Rank() < 2 || b.Rank() < 2 {
		return nil, argError(op, "a %s and b %s need at least 2 dims", a, b)
	}
	M, K := a.Dim(-2), a.Dim(-1)
	if p.TransA {
		M, K = K, M
	}
	Kb, N := b.Dim(-2), b.Dim(-1)
	if p.TransB {
		Kb, N = N, Kb
	}
	if K != Kb {
		return nil, argError(op, "inner dims differ: a %s, b %s (transA %v, transB %v)", a, b, p.TransA, p.TransB)
	}
	shape := append(slices.Clone(a.shape[:a.Rank()-2]), M, N)
	cp := C.fpk_gemm_params{alpha: C.float(p.Alpha), epilogue: C.int32_t(p.Epilogue)}
	if p.TransA {
		cp.trans_a = 1
	}
	if p.TransB {
		cp.trans_b = 1
	}
	return rt.op(op, a.dtype, shape, []*Tensor{a, b, bias}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_gemm(rt.stream, &cp, in[0], in[1], in[2], out)
	})
}

// ---- norms --------------------------------------------------------------------------------

// GroupNorm normalises x [N, C, ...] per sample over groups of C/groups channels and all
// trailing dims; weight and bias [C] or nil.
func (rt *Runtime) GroupNorm(x, weight, bias *Tensor, groups int, eps float32) (*Tensor, error) {
	const op = "group norm"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, weight, bias}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_group_norm(rt.stream, C.int64_t(groups), C.float(eps), in[0], in[1], in[2], out)
	})
}

// GroupNormSiLU is SiLU(GroupNorm(x, …)) in one pass (fpk_op_group_norm_act): statistics in
// f32 or wider, the output in x's dtype, rounded once, without the normalised intermediate.
func (rt *Runtime) GroupNormSiLU(x, weight, bias *Tensor, groups int, eps float32) (*Tensor, error) {
	const op = "group norm silu"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, weight, bias}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_group_norm_act(rt.stream, C.int64_t(groups), C.float(eps), C.FPK_NORM_ACT_SILU, in[0], in[1], in[2], out)
	})
}

// LayerNorm normalises the last dim; weight and bias [D] or nil (elementwise_affine=False).
func (rt *Runtime) LayerNorm(x, weight, bias *Tensor, eps float32) (*Tensor, error) {
	const op = "layer norm"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, weight, bias}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_layer_norm(rt.stream, C.float(eps), in[0], in[1], in[2], out)
	})
}

// RMSNorm computes x / sqrt(mean(x²) + eps) · weight over the last dim; weight [D] or nil.
func (rt *Runtime) RMSNorm(x, weight *Tensor, eps float32) (*Tensor, error) {
	const op = "rms norm"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, weight}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_rms_norm(rt.stream, C.float(eps), in[0], in[1], out)
	})
}

// ---- elementwise ----------------------------------------------------------------------------

// UnaryOp is an elementwise function of one tensor.
type UnaryOp int

// Unary ops.
const (
	OpSiLU      UnaryOp = C.FPK_UNARY_SILU       // x·sigmoid(x)
	OpGELUTanh  UnaryOp = C.FPK_UNARY_GELU_TANH  // GELU, tanh approximation
	OpQuickGELU UnaryOp = C.FPK_UNARY_QUICK_GELU // x·sigmoid(1.702x)
	OpGELUErf   UnaryOp = C.FPK_UNARY_GELU_ERF   // GELU, exact (erf)
	OpSigmoid   UnaryOp = C.FPK_UNARY_SIGMOID
	OpTanh      UnaryOp = C.FPK_UNARY_TANH
	OpExp       UnaryOp = C.FPK_UNARY_EXP
	OpNeg       UnaryOp = C.FPK_UNARY_NEG
	OpSqrt      UnaryOp = C.FPK_UNARY_SQRT
	OpRsqrt     UnaryOp = C.FPK_UNARY_RSQRT
)

var unaryNames = map[UnaryOp]string{OpSiLU: "silu", OpGELUTanh: "gelu tanh", OpQuickGELU: "quick gelu",
	OpGELUErf: "gelu erf", OpSigmoid: "sigmoid", OpTanh: "tanh", OpExp: "exp", OpNeg: "neg",
	OpSqrt: "sqrt", OpRsqrt: "rsqrt"}

// String returns the op's name.
func (u UnaryOp) String() string {
	if s, ok := unaryNames[u]; ok {
		return s
	}
	return "unary?"
}

// Unary applies u elementwise.
func (rt *Runtime) Unary(u UnaryOp, x *Tensor) (*Tensor, error) {
	op := u.String()
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_unary(rt.stream, C.fpk_unary_op(u), in[0], out)
	})
}

// SiLU is x·sigmoid(x).
func (rt *Runtime) SiLU(x *Tensor) (*Tensor, error) { return rt.Unary(OpSiLU, x) }

// GELU is GELU with the tanh approximation (PyTorch approximate="tanh").
func (rt *Runtime) GELU(x *Tensor) (*Tensor, error) { return rt.Unary(OpGELUTanh, x) }

// QuickGELU is x·sigmoid(1.702x) (CLIP).
func (rt *Runtime) QuickGELU(x *Tensor) (*Tensor, error) { return rt.Unary(OpQuickGELU, x) }

// Affine computes x·scale + shift with scalars.
func (rt *Runtime) Affine(x *Tensor, scale, shift float32) (*Tensor, error) {
	const op = "affine"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_affine(rt.stream, C.float(scale), C.float(shift), in[0], out)
	})
}

// Scale computes x·s.
func (rt *Runtime) Scale(x *Tensor, s float32) (*Tensor, error) { return rt.Affine(x, s, 0) }

// BinaryOp is an elementwise function of two tensors.
type BinaryOp int

// Binary ops.
const (
	OpAdd BinaryOp = C.FPK_BINARY_ADD
	OpSub BinaryOp = C.FPK_BINARY_SUB
	OpMul BinaryOp = C.FPK_BINARY_MUL
	OpDiv BinaryOp = C.FPK_BINARY_DIV
	OpMax BinaryOp = C.FPK_BINARY_MAX
	OpMin BinaryOp = C.FPK_BINARY_MIN
)

// String returns the op's name.
func (b BinaryOp) String() string {
	switch b {
	case OpAdd:
		return "add"
	case OpSub:
		return "sub"
	case OpMul:
		return "mul"
	case OpDiv:
		return "div"
	case OpMax:
		return "max"
	case OpMin:
		return "min"
	}
	return "binary?"
}

// BroadcastShape returns the NumPy broadcast shape of a and b.
func BroadcastShape(a, b []int) ([]int, bool) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := range n {
		da, db := 1, 1
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		if da != db && da != 1 && db != 1 {
			return nil, false
		}
		out[i] = da
		if da == 1 {
			out[i] = db
		}
	}
	return out, true
}

// Binary applies bop elementwise with NumPy broadcasting.
func (rt *Runtime) Binary(bop BinaryOp, a, b *Tensor) (*Tensor, error) {
	op := bop.String()
	if err := required(op, a, b); err != nil {
		return nil, err
	}
	shape, ok := BroadcastShape(a.shape, b.shape)
	if !ok {
		return nil, argError(op, "shapes %v and %v do not broadcast", a.shape, b.shape)
	}
	return rt.op(op, a.dtype, shape, []*Tensor{a, b}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_binary(rt.stream, C.fpk_binary_op(bop), in[0], in[1], out)
	})
}

// Add is a + b with broadcasting.
func (rt *Runtime) Add(a, b *Tensor) (*Tensor, error) { return rt.Binary(OpAdd, a, b) }

// Sub is a − b with broadcasting.
func (rt *Runtime) Sub(a, b *Tensor) (*Tensor, error) { return rt.Binary(OpSub, a, b) }

// Mul is a · b with broadcasting.
func (rt *Runtime) Mul(a, b *Tensor) (*Tensor, error) { return rt.Binary(OpMul, a, b) }

// Div is a / b with broadcasting.
func (rt *Runtime) Div(a, b *Tensor) (*Tensor, error) { return rt.Binary(OpDiv, a, b) }

// ternary runs a fused three-operand op whose output has x's shape and dtype; the other two
// operands broadcast to it.
func (rt *Runtime) ternary(op string, top C.fpk_ternary_op, x, b, c *Tensor) (*Tensor, error) {
	if err := required(op, x, b, c); err != nil {
		return nil, err
	}
	for _, t := range []*Tensor{b, c} {
		if s, ok := BroadcastShape(x.shape, t.shape); !ok || !slices.Equal(s, x.shape) {
			return nil, argError(op, "%s does not broadcast to x %s", t, x)
		}
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, b, c}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_ternary(rt.stream, top, in[0], in[1], in[2], out)
	})
}

// Modulate is the AdaLN modulation x·(1 + scale) + shift in one pass (scale and shift
// broadcast to x, e.g. [1, dim] over [1, L, dim]), in x's dtype with one rounding.
func (rt *Runtime) Modulate(x, scale, shift *Tensor) (*Tensor, error) {
	return rt.ternary("modulate", C.FPK_TERNARY_MODULATE, x, scale, shift)
}

// GateResidual is the gated residual x + y·gate in one pass (y has x's shape, gate broadcasts
// to it), in x's dtype with one rounding.
func (rt *Runtime) GateResidual(x, gate, y *Tensor) (*Tensor, error) {
	if y != nil && x != nil && !slices.Equal(x.shape, y.shape) {
		return nil, argError("gate residual", "y %s and x %s differ in shape", y, x)
	}
	return rt.ternary("gate residual", C.FPK_TERNARY_GATE_RESIDUAL, x, gate, y)
}

// Softmax is the softmax of x·scale over the last dim (scale 0 means 1).
func (rt *Runtime) Softmax(x *Tensor, scale float32) (*Tensor, error) {
	const op = "softmax"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_softmax(rt.stream, C.float(scale), in[0], out)
	})
}

// ---- rope ---------------------------------------------------------------------------------

// RoPEMode is the layout of the pairs RoPE rotates.
type RoPEMode int

// RoPE layouts.
const (
	// RoPEInterleaved rotates pairs (x[2i], x[2i+1]):
	// out[2i] = x[2i]·cos[2i] − x[2i+1]·sin[2i], out[2i+1] = x[2i+1]·cos[2i+1] + x[2i]·sin[2i+1]
	// (HunyuanVideo's apply_rotary_emb).
	RoPEInterleaved RoPEMode = C.FPK_ROPE_INTERLEAVED
	// RoPEHalves rotates pairs (x[i], x[i+D/2]): transformers' x·cos + rotate_half(x)·sin with
	// rotate_half(x) = cat(−x[D/2:], x[:D/2]) and cos, sin = cat(freqs, freqs) (Llama): for
	// i < D/2, out[i] = x[i]·cos[i] − x[i+D/2]·sin[i], out[i+D/2] = x[i+D/2]·cos[i+D/2] + x[i]·sin[i+D/2].
	RoPEHalves RoPEMode = C.FPK_ROPE_HALVES
)

// RoPE rotates the last dim of x in layout mode; cos and sin have the full last dim and
// broadcast to x.
func (rt *Runtime) RoPE(mode RoPEMode, x, cos, sin *Tensor) (*Tensor, error) {
	const op = "rope"
	if err := required(op, x, cos, sin); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, cos, sin}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_rope(rt.stream, C.fpk_rope_mode(mode), in[0], in[1], in[2], out)
	})
}

// ---- data movement --------------------------------------------------------------------------

// Concat joins tensors along dim (negative counts from the end).
func (rt *Runtime) Concat(dim int, ts ...*Tensor) (*Tensor, error) {
	const op = "concat"
	if len(ts) == 0 {
		return nil, argError(op, "no tensors")
	}
	if err := required(op, ts...); err != nil {
		return nil, err
	}
	d, err := normDim(op, dim, ts[0].Rank())
	if err != nil {
		return nil, err
	}
	shape := slices.Clone(ts[0].shape)
	shape[d] = 0
	for _, t := range ts {
		if t.Rank() != len(shape) {
			return nil, argError(op, "%s and %s differ in rank", ts[0], t)
		}
		shape[d] += t.Dim(d)
	}
	return rt.op(op, ts[0].dtype, shape, ts, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_concat(rt.stream, C.int(d), C.int(len(in)), &in[0], out)
	})
}

// Slice returns x[..., start:end, ...] along dim (negative dim counts from the end).
func (rt *Runtime) Slice(x *Tensor, dim, start, end int) (*Tensor, error) {
	return rt.SliceStep(x, dim, start, end, 1)
}

// SliceStep returns x[..., start:end:step, ...] along dim.
func (rt *Runtime) SliceStep(x *Tensor, dim, start, end, step int) (*Tensor, error) {
	const op = "slice"
	if err := required(op, x); err != nil {
		return nil, err
	}
	d, err := normDim(op, dim, x.Rank())
	if err != nil {
		return nil, err
	}
	if step < 1 || start < 0 || end < start || end > x.Dim(d) {
		return nil, argError(op, "[%d:%d:%d] of dim %d (size %d)", start, end, step, d, x.Dim(d))
	}
	shape := slices.Clone(x.shape)
	shape[d] = (end - start + step - 1) / step
	return rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_slice(rt.stream, C.int(d), C.int64_t(start), C.int64_t(step), in[0], out)
	})
}

// Permute returns x with dims reordered: out dim i is x dim perm[i].
func (rt *Runtime) Permute(x *Tensor, perm ...int) (*Tensor, error) {
	const op = "permute"
	if err := required(op, x); err != nil {
		return nil, err
	}
	if len(perm) != x.Rank() {
		return nil, argError(op, "perm %v for rank %d", perm, x.Rank())
	}
	shape := make([]int, len(perm))
	cperm := make([]C.int, len(perm))
	seen := make([]bool, len(perm))
	for i, p := range perm {
		if p < 0 || p >= len(perm) || seen[p] {
			return nil, argError(op, "bad permutation %v", perm)
		}
		seen[p] = true
		shape[i] = x.Dim(p)
		cperm[i] = C.int(p)
	}
	if len(cperm) == 0 {
		cperm = append(cperm, 0)
	}
	return rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_permute(rt.stream, &cperm[0], in[0], out)
	})
}

// PadMode is how Pad fills the new border.
type PadMode int

// Pad modes.
const (
	PadZero      PadMode = C.FPK_PAD_ZERO
	PadReplicate PadMode = C.FPK_PAD_REPLICATE // repeat the edge element
)

// Pad pads every dim i with before[i] and after[i] elements (len = rank).
func (rt *Runtime) Pad(x *Tensor, mode PadMode, before, after []int) (*Tensor, error) {
	const op = "pad"
	if err := required(op, x); err != nil {
		return nil, err
	}
	if len(before) != x.Rank() || len(after) != x.Rank() {
		return nil, argError(op, "pads %v/%v for rank %d", before, after, x.Rank())
	}
	shape := slices.Clone(x.shape)
	cb := make([]C.int64_t, len(shape)+1)
	ca := make([]C.int64_t, len(shape)+1)
	for i := range shape {
		if before[i] < 0 || after[i] < 0 {
			return nil, argError(op, "negative pad %v/%v", before, after)
		}
		shape[i] += before[i] + after[i]
		cb[i], ca[i] = C.int64_t(before[i]), C.int64_t(after[i])
	}
	return rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_pad(rt.stream, C.fpk_pad_mode(mode), &cb[0], &ca[0], in[0], out)
	})
}

// Pad3d pads the last three dims [..., T, H, W]: Before and After are per (T, H, W).
type Pad3d struct {
	Before, After [3]int
}

// Pad3d pads the last three dims of x (e.g. the VAE's causal replicate padding:
// Before {k−1, k/2, k/2}, After {0, k/2, k/2}).
func (rt *Runtime) Pad3d(x *Tensor, mode PadMode, p Pad3d) (*Tensor, error) {
	if err := required("pad", x); err != nil {
		return nil, err
	}
	if x.Rank() < 3 {
		return nil, argError("pad", "%s has fewer than 3 dims", x)
	}
	before := make([]int, x.Rank())
	after := make([]int, x.Rank())
	copy(before[x.Rank()-3:], p.Before[:])
	copy(after[x.Rank()-3:], p.After[:])
	return rt.Pad(x, mode, before, after)
}

// UpsampleNearest3d repeats the last three dims by integer factors (T, H, W).
func (rt *Runtime) UpsampleNearest3d(x *Tensor, scale [3]int) (*Tensor, error) {
	const op = "upsample nearest3d"
	if err := required(op, x); err != nil {
		return nil, err
	}
	if x.Rank() < 3 {
		return nil, argError(op, "%s has fewer than 3 dims", x)
	}
	shape := slices.Clone(x.shape)
	cs := make([]C.int64_t, 3)
	for i := range 3 {
		if scale[i] < 1 {
			return nil, argError(op, "scale %v", scale)
		}
		shape[len(shape)-3+i] *= scale[i]
		cs[i] = C.int64_t(scale[i])
	}
	return rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_upsample_nearest3d(rt.stream, &cs[0], in[0], out)
	})
}

// UpsamplePad is Pad3d(UpsampleNearest3d(x, scale), PadReplicate, p) in one pass
// (fpk_op_upsample_pad), without the upsampled intermediate; a backend without the fused op
// runs the two.
func (rt *Runtime) UpsamplePad(x *Tensor, scale [3]int, p Pad3d) (*Tensor, error) {
	const op = "upsample pad"
	if err := required(op, x); err != nil {
		return nil, err
	}
	if x.Rank() < 3 {
		return nil, argError(op, "%s has fewer than 3 dims", x)
	}
	shape := slices.Clone(x.shape)
	cs, cb, ca := make([]C.int64_t, 3), make([]C.int64_t, 3), make([]C.int64_t, 3)
	for i := range 3 {
		if scale[i] < 1 || p.Before[i] < 0 || p.After[i] < 0 {
			return nil, argError(op, "scale %v, pads %v and %v", scale, p.Before, p.After)
		}
		shape[len(shape)-3+i] = shape[len(shape)-3+i]*scale[i] + p.Before[i] + p.After[i]
		cs[i], cb[i], ca[i] = C.int64_t(scale[i]), C.int64_t(p.Before[i]), C.int64_t(p.After[i])
	}
	out, err := rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_upsample_pad(rt.stream, &cs[0], &cb[0], &ca[0], in[0], out)
	})
	if !errors.Is(err, ErrUnsupported) {
		return out, err
	}
	up, err := rt.UpsampleNearest3d(x, scale)
	if err != nil {
		return nil, err
	}
	defer up.Free()
	return rt.Pad3d(up, PadReplicate, p)
}

// AvgPool3d averages windows of the last three dims without padding: out = (in − k)/s + 1.
func (rt *Runtime) AvgPool3d(x *Tensor, kernel, stride [3]int) (*Tensor, error) {
	const op = "avg pool3d"
	if err := required(op, x); err != nil {
		return nil, err
	}
	if x.Rank() < 3 {
		return nil, argError(op, "%s has fewer than 3 dims", x)
	}
	shape := slices.Clone(x.shape)
	ck := make([]C.int64_t, 3)
	cs := make([]C.int64_t, 3)
	for i := range 3 {
		d := len(shape) - 3 + i
		if kernel[i] < 1 || stride[i] < 1 || kernel[i] > shape[d] {
			return nil, argError(op, "kernel %v stride %v for %s", kernel, stride, x)
		}
		shape[d] = (shape[d]-kernel[i])/stride[i] + 1
		ck[i], cs[i] = C.int64_t(kernel[i]), C.int64_t(stride[i])
	}
	return rt.op(op, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_avg_pool3d(rt.stream, &ck[0], &cs[0], in[0], out)
	})
}

// ReduceOp is a reduction over one dim.
type ReduceOp int

// Reductions.
const (
	ReduceSum  ReduceOp = C.FPK_REDUCE_SUM
	ReduceMean ReduceOp = C.FPK_REDUCE_MEAN
	ReduceMax  ReduceOp = C.FPK_REDUCE_MAX
)

// Reduce reduces x over dim (negative counts from the end), keeping it with size 1: [.., n, ..]
// → [.., 1, ..]. Sums accumulate in double.
func (rt *Runtime) Reduce(op ReduceOp, x *Tensor, dim int) (*Tensor, error) {
	const name = "reduce"
	if err := required(name, x); err != nil {
		return nil, err
	}
	d, err := normDim(name, dim, x.Rank())
	if err != nil {
		return nil, err
	}
	shape := slices.Clone(x.shape)
	shape[d] = 1
	return rt.op(name, x.dtype, shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_reduce(rt.stream, C.fpk_reduce_op(op), C.int(d), in[0], out)
	})
}

// Sum sums x over dim, keeping it with size 1.
func (rt *Runtime) Sum(x *Tensor, dim int) (*Tensor, error) { return rt.Reduce(ReduceSum, x, dim) }

// Mean averages x over dim, keeping it with size 1.
func (rt *Runtime) Mean(x *Tensor, dim int) (*Tensor, error) { return rt.Reduce(ReduceMean, x, dim) }

// Cast returns x converted to dtype dt (a copy even when dt is x's dtype).
func (rt *Runtime) Cast(x *Tensor, dt DType) (*Tensor, error) {
	const op = "cast"
	if err := required(op, x); err != nil {
		return nil, err
	}
	return rt.op(op, dt, x.shape, []*Tensor{x}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_copy(rt.stream, in[0], out)
	})
}

// Copy returns a copy of x.
func (rt *Runtime) Copy(x *Tensor) (*Tensor, error) {
	if err := required("copy", x); err != nil {
		return nil, err
	}
	return rt.Cast(x, x.dtype)
}

// Embedding picks rows of table [V, D] by ids (I32, any shape S) → [S..., D] in the table's
// dtype.
func (rt *Runtime) Embedding(table, ids *Tensor) (*Tensor, error) {
	if err := required("embedding", table, ids); err != nil {
		return nil, err
	}
	return rt.EmbeddingAs(table, ids, table.dtype)
}

// EmbeddingAs is Embedding with the rows converted to dtype dt: an f16/bf16 table (weights kept
// in 16 bits) gives f32 activations.
func (rt *Runtime) EmbeddingAs(table, ids *Tensor, dt DType) (*Tensor, error) {
	const op = "embedding"
	if err := required(op, table, ids); err != nil {
		return nil, err
	}
	if table.Rank() != 2 {
		return nil, argError(op, "table %s must be [V, D]", table)
	}
	shape := append(slices.Clone(ids.shape), table.Dim(1))
	return rt.op(op, dt, shape, []*Tensor{table, ids}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_embedding(rt.stream, in[0], in[1], out)
	})
}
