package sampler

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// DType is the dtype the reference's fm_wrapper casts the model's inputs to (its `dtype`
// argument): x, the timestep and the distilled guidance are rounded to it before the transformer
// sees them, and x0 is computed from the rounded x.
type DType int

const (
	// BF16 is what FramePack's app passes (torch.bfloat16): 10000 becomes 9984.
	BF16 DType = iota
	// F16 rounds to IEEE half precision.
	F16
	// F32 leaves the float32 values as they are.
	F32
	// F64 is what a float64 reference run passes; the float32 inputs convert exactly, so it
	// behaves as F32.
	F64
)

// String returns the torch name of the dtype.
func (d DType) String() string {
	switch d {
	case BF16:
		return "bfloat16"
	case F16:
		return "float16"
	case F32:
		return "float32"
	case F64:
		return "float64"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// ParseDType reads a torch dtype name ("bfloat16", "bf16", "float16", "float32", "float64", ...).
func ParseDType(s string) (DType, error) {
	switch s {
	case "bfloat16", "bf16", "torch.bfloat16":
		return BF16, nil
	case "float16", "fp16", "f16", "half", "torch.float16":
		return F16, nil
	case "float32", "fp32", "f32", "float", "torch.float32":
		return F32, nil
	case "float64", "fp64", "f64", "double", "torch.float64":
		return F64, nil
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

func (d DType) valid() bool { return d >= BF16 && d <= F64 }

// Round returns v as the tensor .to(d) would hold it, as a float32 (round to nearest even).
func (d DType) Round(v float32) float32 {
	switch d {
	case BF16:
		return safetensors.BF16ToF32(safetensors.F32ToBF16(v))
	case F16:
		return safetensors.F16ToF32(safetensors.F32ToF16(v))
	}
	return v
}

// roundInto writes d.Round of every src element into dst (same length).
func (d DType) roundInto(dst, src []float32) {
	if d == F32 || d == F64 {
		copy(dst, src)
		return
	}
	for i, v := range src {
		dst[i] = d.Round(v)
	}
}
