/*
 * fpk_gpu_gemm_q_mma.cu — fp8 × fp8 GEMM with activation quantization (fpk_op_gemm_q's per-tensor
 * and per-token modes).
 */
#include "fpk_gpu_internal.h"

fpk_status fpk_gpu_gemm_q_mma(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                              const fpk_gt *a, const fpk_gt *w, const fpk_gt *w_scale, const fpk_gt *bias,
                              const fpk_gt *out) {
    (void)c, (void)st, (void)sf, (void)p, (void)a, (void)w, (void)w_scale, (void)bias, (void)out;
    return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: no fp8 x fp8 path in this build");
}
