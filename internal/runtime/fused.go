package runtime

/*
#include "fpk.h"
*/
import "C"

// GemmEpilogue is what a GEMM applies to its result after the bias, in the same op.
type GemmEpilogue int

// GEMM epilogues.
const (
	// EpilogueNone leaves the product (plus bias) as it is.
	EpilogueNone GemmEpilogue = C.FPK_GEMM_EPILOGUE_NONE
	// EpilogueGELUTanh applies GELU(tanh) (OpGELUTanh's formula): cuBLASLt's GELU_BIAS epilogue
	// on CUDA, the GEMM then an in-place activation elsewhere.
	EpilogueGELUTanh GemmEpilogue = C.FPK_GEMM_EPILOGUE_GELU_TANH
)

// LinearGELU is GELU(tanh)(Linear(x, w, bias)) in one op (a feed-forward's first layer):
// x [..., in], w [out, in], bias [out] or nil → [..., out]; on CUDA the bias and the activation
// run in the GEMM's epilogue instead of two more passes over the output.
func (rt *Runtime) LinearGELU(x, w, bias *Tensor) (*Tensor, error) {
	return rt.linear("linear gelu", x, w, bias, EpilogueGELUTanh)
}

// RMSNormRoPE is RoPE(mode, RMSNorm(x, weight, eps), cos, sin) in one pass over x (the q/k of
// HunyuanVideo's attention: x [B, L, H, D], one normalised row per head): weight [D] or nil,
// cos and sin with the full last dim, broadcast to x. The normalised row stays f32 into the
// rotation, so in 16 bits the result is closer to f32 than the two ops in turn.
func (rt *Runtime) RMSNormRoPE(mode RoPEMode, x, weight, cos, sin *Tensor, eps float32) (*Tensor, error) {
	const op = "rms norm rope"
	if err := required(op, x, cos, sin); err != nil {
		return nil, err
	}
	return rt.op(op, x.dtype, x.shape, []*Tensor{x, weight, cos, sin}, func(in []C.fpk_tensor_t, out C.fpk_tensor_t) C.fpk_status {
		return C.fpk_op_rms_norm_rope(rt.stream, C.fpk_rope_mode(mode), C.float(eps), in[0], in[1], in[2], in[3], out)
	})
}
