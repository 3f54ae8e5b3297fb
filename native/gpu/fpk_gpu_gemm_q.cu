/*
 * fpk_gpu_gemm_q.cu — GEMM with an 8-bit float weight (fpk_op_gemm_q), weight-only: the weight
 * [N, K] (e4m3 or e5m2) is widened a panel of rows at a time into bounded scratch, in the
 * activation dtype, each value multiplied by its scale (per tensor, per output row or per block of
 * the row) as it is written, and each panel goes through the GEMM every 16-bit product uses
 * (vendor BLAS on the matrix units, else our kernel), writing its columns of the output. The
 * bias and GELU(tanh) run over the output once after the last panel. So no copy of the whole
 * weight is made beyond one panel (at most 32 MiB, as the cpu backend's panels), and the product
 * runs at the 16-bit rate; the widening reads 1 byte and writes 2 per weight element, small next
 * to the GEMM at the token counts of a transformer forward.
 *
 * Rounding: q widens exactly (fp8 ⊂ bf16, f16, f32); an unscaled weight is exact. A scaled one is
 * q·s rounded once to the activation dtype (f32 activations: to f32).
 *
 * The activation-quantized modes (fp8 × fp8 on the matrix units) are not here: this file answers
 * FPK_ERR_UNAVAILABLE for them unless fpk_gpu_gemm_q_mma serves them (fpk_gpu_gemm_q_mma.cu).
 */
#include "fpk_gpu_internal.h"

#include <string.h>

/* Most bytes of widened weight panel at a time. */
#define QPANEL_BUDGET ((size_t)32 << 20)

/* dst[r][k] = q[row0 + r][k] · scale[(rows_scale == 1 ? 0 : row0 + r)][k / block] in dtype ddt,
 * r < rows, k < K. One thread per element. */
__global__ void k_widen_q(void *dst, int ddt, const uint8_t *q, int qdt, const float *scale, int64_t srows, int64_t nb,
                          int64_t block, int64_t row0, int64_t rows, int64_t K) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * K; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t r = i / K, k = i - r * K;
        float v = fpk_fp8_to_f32(q[(row0 + r) * K + k], qdt);
        if (scale) v *= scale[(srows == 1 ? 0 : row0 + r) * nb + k / block];
        fpk_st(dst, ddt, i, v);
    }
}

extern "C" fpk_status fpk_gpu_gemm_q(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                                     const fpk_gt *a, const fpk_gt *w, const fpk_gt *w_scale, const fpk_gt *bias,
                                     const fpk_gt *out) {
    cudaStream_t st = fpk_stream(c, s);
    if (out->numel == 0) return FPK_OK;
    if (p->act_quant != FPK_ACT_QUANT_NONE) {
        /* FPK_ERR_UNAVAILABLE makes the runtime fall back to weight-only */
        return fpk_gpu_gemm_q_mma(c, st, sf, p, a, w, w_scale, bias, out);
    }
    const int64_t N = w->shape[0], K = w->shape[1];
    const int64_t M = K ? a->numel / K : out->numel / N;
    const int pdt = a->dtype; /* the panel in the activation dtype: 16-bit products stay on the matrix units */
    const size_t es = fpk_dt_size(pdt);
    int64_t nb = K ? (int64_t)(QPANEL_BUDGET / ((size_t)K * es)) : N;
    if (nb > 64) nb -= nb % 64; /* panels start 64 columns apart: aligned output columns */
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    fpk_scratch panel(sf);
    fpk_status as = panel.alloc((size_t)nb * (size_t)(K ? K : 1) * es);
    while (as == FPK_ERR_OUT_OF_MEMORY && nb > 1) { /* fewer rows under memory pressure */
        nb = (nb + 1) / 2;
        as = panel.alloc((size_t)nb * (size_t)K * es);
    }
    if (as != FPK_OK) return as;
    const float *sd = w_scale ? (const float *)w_scale->data : NULL;
    int64_t srows = w_scale ? w_scale->shape[0] : 1, snb = w_scale ? w_scale->shape[1] : 1;
    int64_t block = K / (snb ? snb : 1);
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t nn = N - n0 < nb ? N - n0 : nb;
        if (K > 0) {
            k_widen_q<<<fpk_blocks(nn * K), FPK_BLOCK, 0, st>>>(panel.ptr, pdt, (const uint8_t *)w->data, w->dtype, sd, srows,
                                                                 snb, block ? block : 1, n0, nn, K);
            FPK_TRY(fpk_gpu_launched("gemm q: widen"));
        }
        fpk_gemm_desc d;
        memset(&d, 0, sizeof d);
        d.trans_b = 1;
        d.M = M;
        d.N = nn;
        d.K = K;
        d.batch = 1;
        d.alpha = p->alpha != 0 ? p->alpha : 1.0f;
        d.a = a->data;
        d.adt = a->dtype;
        d.lda = K;
        d.b = panel.ptr;
        d.bdt = pdt;
        d.ldb = K;
        d.c = (char *)out->data + (size_t)n0 * fpk_dt_size(out->dtype);
        d.cdt = out->dtype;
        d.ldc = N;
        FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &d));
    }
    if (bias) FPK_TRY(fpk_gpu_add_bias(st, out->data, out->dtype, bias->data, bias->dtype, out->numel, N, 0));
    if (p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH) return fpk_gpu_unary(c, s, FPK_UNARY_GELU_TANH, 0, 0, out, out);
    return FPK_OK;
}
