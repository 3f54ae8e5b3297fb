package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// DType is a tensor element type. Activations may be F32, F16 or BF16 (the activation dtype a
// model is loaded with): every op's output takes its (first) activation input's dtype and
// accumulates in f32. The cpu backend computes 16-bit activations on f32 stand-ins and rounds
// the result once; GPU backends run 16-bit operands on their matrix units. Cast or a
// converting upload moves between dtypes exactly (round to nearest even where a value does not
// fit). Weights may stay in F16/BF16: MatMul/Linear (b), Conv3d (w) and EmbeddingAs (table)
// widen them as they go where they meet another dtype.
type DType int

// Element types.
const (
	F32  DType = C.FPK_F32
	F16  DType = C.FPK_F16
	BF16 DType = C.FPK_BF16
	U8   DType = C.FPK_U8  // bytes; boolean masks (nonzero = keep)
	I32  DType = C.FPK_I32 // indices (token ids)
	// F8E4M3 and F8E5M2 are PyTorch's float8_e4m3fn and float8_e5m2: weight storage only, read
	// by LinearQ (native/src/fpk_dtype.h has their conversions; a cast to them rounds to nearest
	// even without saturating, as PyTorch's).
	F8E4M3 DType = C.FPK_F8E4M3
	F8E5M2 DType = C.FPK_F8E5M2
)

// AsStored, given to LoadTensor as the dtype, keeps a tensor in the dtype its source stores it
// in (F32, F16, BF16, U8 or I32; F64 becomes F32 and I64 becomes I32): weights loaded with
// LoadRequest dtype "auto". It is not a dtype of any tensor.
const AsStored DType = -1

// ParseWeightDType maps a LoadRequest dtype to the dtype a worker keeps its weight matrices in
// (activations stay F32 on the cpu backend): "" and "fp32" F32, "fp16" F16, "bf16" BF16, "auto"
// AsStored (the checkpoint's own dtype).
func ParseWeightDType(s string) (DType, error) {
	switch s {
	case "", "fp32":
		return F32, nil
	case "fp16":
		return F16, nil
	case "bf16":
		return BF16, nil
	case "auto":
		return AsStored, nil
	}
	return 0, fmt.Errorf("dtype %q: want fp32, fp16, bf16 or auto", s)
}

// ParseActivationDType maps an activation dtype name to the dtype: "fp32"/"f32" F32,
// "bf16" BF16, "fp16"/"f16" F16. (F32 is DType's zero value: a caller with a default checks for
// an empty name itself.)
func ParseActivationDType(s string) (DType, error) {
	switch s {
	case "fp32", "f32", "float32":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp16", "f16", "float16":
		return F16, nil
	}
	return 0, fmt.Errorf("activation dtype %q: want fp32, bf16 or fp16", s)
}

// ProtoName is the dtype's name in the worker protocol ("fp32", "bf16", "fp16"; others as
// String).
func (d DType) ProtoName() string {
	switch d {
	case F32:
		return "fp32"
	case F16:
		return "fp16"
	case BF16:
		return "bf16"
	}
	return d.String()
}

// String returns the dtype's short name ("f32").
func (d DType) String() string {
	switch d {
	case AsStored:
		return "as stored"
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case U8:
		return "u8"
	case I32:
		return "i32"
	case F8E4M3:
		return "f8e4m3"
	case F8E5M2:
		return "f8e5m2"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Size returns the size of one element in bytes (0 for an unknown dtype).
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case U8, F8E4M3, F8E5M2:
		return 1
	}
	return 0
}

// IsFloat reports whether d is a floating-point dtype (the 8-bit ones included).
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 || d.IsFP8() }

// IsFP8 reports whether d is an 8-bit float dtype.
func (d DType) IsFP8() bool { return d == F8E4M3 || d == F8E5M2 }

// DTypeOf maps a safetensors dtype to the runtime's (ok false for F64 and I64, which the
// runtime does not store; LoadTensor converts those on the Go side).
func DTypeOf(d safetensors.DType) (DType, bool) {
	switch d {
	case safetensors.F32:
		return F32, true
	case safetensors.F16:
		return F16, true
	case safetensors.BF16:
		return BF16, true
	case safetensors.U8, safetensors.Bool:
		return U8, true
	case safetensors.I32:
		return I32, true
	case safetensors.F8E4M3:
		return F8E4M3, true
	case safetensors.F8E5M2:
		return F8E5M2, true
	}
	return 0, false
}

// StoredDType is the dtype the runtime keeps a tensor stored as d in (LoadTensor with AsStored):
// d itself where the runtime has it, F32 for F64 (and other floats), I32 for I64.
func StoredDType(d safetensors.DType) DType {
	if dt, ok := DTypeOf(d); ok {
		return dt
	}
	if d == safetensors.I64 {
		return I32
	}
	return F32
}
