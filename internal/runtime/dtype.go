package runtime

/*
#include "fpk.h"
*/
import "C"

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// DType is a tensor element type. F16 and BF16 are storage types: the cpu backend computes in
// F32, and Cast or a converting upload moves between them exactly (round to nearest even
// where a value does not fit). Weights may stay in F16/BF16: MatMul/Linear (b), Conv3d (w) and
// EmbeddingAs (table) widen them to f32 as they go.
type DType int

// Element types.
const (
	F32  DType = C.FPK_F32
	F16  DType = C.FPK_F16
	BF16 DType = C.FPK_BF16
	U8   DType = C.FPK_U8  // bytes; boolean masks (nonzero = keep)
	I32  DType = C.FPK_I32 // indices (token ids)
)

// String returns the dtype's short name ("f32").
func (d DType) String() string {
	switch d {
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
	case U8:
		return 1
	}
	return 0
}

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 }

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
	}
	return 0, false
}
