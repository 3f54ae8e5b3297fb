package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// FP8Compute is how LinearQ multiplies by an 8-bit weight.
type FP8Compute int

// The fp8 compute modes (fpk_act_quant). The activation modes quantize the activations to e4m3
// (scale max|x|/448 over the whole input or per token) so the product runs fp8 × fp8 on the
// matrix units where the device has them; where it does not (or its self-check failed) LinearQ
// falls back to weight-only, the product of the activations with the widened weight.
const (
	FP8WeightOnly   FP8Compute = C.FPK_ACT_QUANT_NONE
	FP8ActPerTensor FP8Compute = C.FPK_ACT_QUANT_TENSOR
	FP8ActPerToken  FP8Compute = C.FPK_ACT_QUANT_TOKEN
)

// ParseFP8Compute maps a name to the mode: "" and "weight_only" FP8WeightOnly, "tensor"
// FP8ActPerTensor, "token" FP8ActPerToken.
func ParseFP8Compute(s string) (FP8Compute, error) {
	switch s {
	case "", "weight_only":
		return FP8WeightOnly, nil
	case "tensor":
		return FP8ActPerTensor, nil
	case "token":
		return FP8ActPerToken, nil
	}
	return 0, fmt.Errorf("fp8 compute %q: want weight_only, tensor or token", s)
}

// String names the mode as ParseFP8Compute reads it.
func (m FP8Compute) String() string {
	switch m {
	case FP8WeightOnly:
		return "weight_only"
	case FP8ActPerTensor:
		return "tensor"
	case FP8ActPerToken:
		return "token"
	}
	return fmt.Sprintf("fp8compute(%d)", int(m))
}

// fp8State is the runtime's fp8 compute mode and what served its products.
type fp8State struct {
	mode     atomic.Int32
	fellBack atomic.Uint64 // products an activation mode could not serve (weight-only instead)
	served   [3]atomic.Uint64
}

// SetFP8Compute sets the mode LinearQ uses from now on.
func (rt *Runtime) SetFP8Compute(m FP8Compute) { rt.fp8.mode.Store(int32(m)) }

// FP8Stats counts the fp8 products by the mode that served them and those an activation mode
// handed to the weight-only path.
type FP8Stats struct {
	WeightOnly, PerTensor, PerToken uint64
	FellBack                        uint64
}

// FP8Stats returns the counts so far.
func (rt *Runtime) FP8Stats() FP8Stats {
	return FP8Stats{WeightOnly: rt.fp8.served[0].Load(), PerTensor: rt.fp8.served[1].Load(), PerToken: rt.fp8.served[2].Load(),
		FellBack: rt.fp8.fellBack.Load()}
}

// LinearQ is Linear for an 8-bit float weight: x [..., in] · dequant(w)ᵀ + bias with w [out, in]
// (F8E4M3 or F8E5M2) and scale [1 or out, blocks] F32 (nil: 1; see fpk_op_gemm_q), then epi,
// → [..., out] in x's dtype. The runtime's FP8Compute picks the path; an activation mode the
// backend cannot serve falls back to weight-only.
func (rt *Runtime) LinearQ(x, w, scale, bias *Tensor, epi GemmEpilogue) (*Tensor, error) {
	const op = "linear q"
	if err := required(op, x, w); err != nil {
		return nil, err
	}
	if !w.dtype.IsFP8() || w.Rank() != 2 {
		return nil, argError(op, "w %s is not an 8-bit float [out, in]", w)
	}
	if x.Rank() == 1 {
		x2, err := x.Reshape(1, x.Dim(0))
		if err != nil {
			return nil, err
		}
		defer x2.Free()
		y, err := rt.LinearQ(x2, w, scale, bias, epi)
		if err != nil {
			return nil, err
		}
		defer y.Free()
		return y.Reshape(y.Dim(1))
	}
	shape := append(x.Shape()[:x.Rank()-1], w.Dim(0))
	mode := FP8Compute(rt.fp8.mode.Load())
	run := func(m FP8Compute) (*Tensor, error) {
		p := C.fpk_gemm_q_params{epilogue: C.int32_t(epi), act_quant: C.int32_t(m)}
		return rt.op(op, x.dtype, shape, []*Tensor{x, w, scale, bias}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
			return C.fpk_op_gemm_q(rt.stream, &p, in[0], in[1], in[2], in[3], out)
		})
	}
	y, err := run(mode)
	if mode != FP8WeightOnly && errors.Is(err, ErrUnavailable) {
		rt.fp8.fellBack.Add(1)
		mode = FP8WeightOnly
		y, err = run(mode)
	}
	if err == nil && mode >= 0 && int(mode) < len(rt.fp8.served) {
		rt.fp8.served[mode].Add(1)
	}
	return y, err
}

// fp8Max is the largest finite e4m3 value.
const fp8Max = 448

// fp8MinScale is the smallest scale QuantizeRows gives (musubi-tuner's clamp): a row of zeros
// gets it and quantizes to zeros.
const fp8MinScale = 1e-8

// QuantizeRows quantizes w [rows, cols] (any float dtype) to e4m3 with one scale per row (a
// Linear weight per output channel): s[r] = max(max|w[r]| / 448, 1e-8) in f32,
// q = e4m3(clamp(w / s, −448, 448)). It returns q [rows, cols] F8E4M3 and s [rows, 1] F32;
// dequant(q)[r][c] = q[r][c]·s[r]. Computed with the runtime's own ops in f32, so the rounding
// is the one conversion of native/src/fpk_dtype.h.
func (rt *Runtime) QuantizeRows(w *Tensor) (q, s *Tensor, err error) {
	const op = "quantize rows"
	if err := required(op, w); err != nil {
		return nil, nil, err
	}
	if w.Rank() != 2 || !w.dtype.IsFloat() {
		return nil, nil, argError(op, "w %s is not a float matrix", w)
	}
	var free []*Tensor
	defer func() {
		for _, t := range free {
			t.Free()
		}
	}()
	keep := func(t *Tensor, e error) *Tensor {
		if e != nil && err == nil {
			err = e
		}
		if t != nil {
			free = append(free, t)
		}
		return t
	}
	wf := w
	if w.dtype != F32 {
		wf = keep(rt.Cast(w, F32))
		if err != nil {
			return nil, nil, err
		}
	}
	neg := keep(rt.Unary(OpNeg, wf))
	if err != nil {
		return nil, nil, err
	}
	hi := keep(rt.Reduce(ReduceMax, wf, 1))
	if err != nil {
		return nil, nil, err
	}
	lo := keep(rt.Reduce(ReduceMax, neg, 1))
	if err != nil {
		return nil, nil, err
	}
	absmax := keep(rt.Binary(OpMax, hi, lo))
	if err != nil {
		return nil, nil, err
	}
	maxv := keep(rt.FromFloat32([]float32{fp8Max}, 1, 1))
	if err != nil {
		return nil, nil, err
	}
	sc := keep(rt.Div(absmax, maxv))
	if err != nil {
		return nil, nil, err
	}
	floor := keep(rt.FromFloat32([]float32{fp8MinScale}, 1, 1))
	if err != nil {
		return nil, nil, err
	}
	s, err = rt.Binary(OpMax, sc, floor)
	if err != nil {
		return nil, nil, err
	}
	div := keep(rt.Div(wf, s))
	if err == nil {
		bottom := keep(rt.FromFloat32([]float32{-fp8Max}, 1, 1))
		c1 := keep(rt.Binary(OpMin, div, maxv))
		if err == nil {
			c2 := keep(rt.Binary(OpMax, c1, bottom))
			if err == nil {
				q, err = rt.Cast(c2, F8E4M3)
			}
		}
	}
	if err != nil {
		s.Free()
		return nil, nil, err
	}
	return q, s, nil
}
