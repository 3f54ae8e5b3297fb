/*
 * fpk_gpu_gemm_q.cu — GEMM with an 8-bit float weight (fpk_op_gemm_q), weight-only: the weight
 * [N, K] (e4m3 or e5m2) is widened a panel of rows at a time into bounded scratch, in the
 * activation dtype, each value multiplied by its scale (per tensor, per output row or per block of
 * the row) as it is written, and each panel goes through the GEMM every 16-bit product uses
 * (vendor BLAS on the matrix units, else our kernel), writing its columns of the output, with the
 * bias and GELU(tanh) in cuBLASLt's epilogue where it takes them (else one kernel over the panel's
 * columns after). So no copy of the whole weight is made beyond one panel (about 64 MiB at most;
 * the panels are of equal width, a multiple of 64 columns, so none is a sliver that wastes the
 * matrix units' waves), and the product runs at the 16-bit rate; the widening (8 bytes a thread)
 * reads 1 byte and writes 2 per weight element, small next to the GEMM at the token counts of a
 * transformer forward.
 *
 * Rounding: q widens exactly (fp8 ⊂ bf16, f16, f32); an unscaled weight is exact. A scaled one is
 * q·s rounded once to the activation dtype (f32 activations: to f32).
 *
 * The activation-quantized modes (fp8 × fp8 on the matrix units) are not here: this file answers
 * FPK_ERR_UNAVAILABLE for them unless fpk_gpu_gemm_q_mma serves them (fpk_gpu_gemm_q_mma.cu).
 */
#include "fpk_gpu_internal.h"

#include <string.h>

/* Most bytes of widened weight panel at a time (a little more when rounding to 64 rows). */
#define QPANEL_BUDGET ((size_t)64 << 20)

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

/* k_widen_q eight elements a thread: K a multiple of 8, q 8-byte and dst 16-byte aligned (one
 * 8-byte load, one or two 16-byte stores). */
__global__ void k_widen_q8(void *dst, int ddt, const uint8_t *q, int qdt, const float *scale, int64_t srows, int64_t nb,
                           int64_t block, int64_t row0, int64_t rows, int64_t K) {
    const int64_t n8 = rows * K / 8;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)blockDim.x * gridDim.x) {
        const int64_t e = i * 8, r = e / K, k = e - r * K;
        uint2 b = *(const uint2 *)(q + (row0 + r) * K + k);
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = fpk_fp8_to_f32((uint8_t)((j < 4 ? b.x : b.y) >> (8 * (j % 4))), qdt);
        if (scale) {
            const float *sr = scale + (srows == 1 ? 0 : row0 + r) * nb;
            if (nb == 1) {
                for (int j = 0; j < 8; j++) v[j] *= sr[0];
            } else {
                for (int j = 0; j < 8; j++) v[j] *= sr[(k + j) / block];
            }
        }
        if (ddt == FPK_F32) {
            float4 *o = (float4 *)((float *)dst + e);
            o[0] = make_float4(v[0], v[1], v[2], v[3]);
            o[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            uint32_t h[4];
            for (int j = 0; j < 4; j++) {
                uint32_t lo = ddt == FPK_F16 ? fpk_f32_f16(v[2 * j]) : fpk_f32_bf16(v[2 * j]);
                uint32_t hi = ddt == FPK_F16 ? fpk_f32_f16(v[2 * j + 1]) : fpk_f32_bf16(v[2 * j + 1]);
                h[j] = lo | hi << 16;
            }
            *(uint4 *)((uint16_t *)dst + e) = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}

/* out[r][n0 + j] = GELU?(out[r][n0 + j] + bias[n0 + j]), r < rows, j < nn (row stride ldo). */
__global__ void k_bias_gelu_cols(void *out, int odt, int64_t ldo, int64_t rows, int64_t n0, int64_t nn, const void *bias,
                                 int bdt, int gelu) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * nn; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t r = i / nn, n = n0 + (i - r * nn), at = r * ldo + n;
        float v = fpk_ld(out, odt, at);
        if (bias) v += fpk_ld(bias, bdt, n);
        if (gelu) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        fpk_st(out, odt, at, v);
    }
}

fpk_status fpk_gpu_bias_gelu_cols(cudaStream_t st, void *out, int odt, int64_t ldo, int64_t rows, int64_t n0, int64_t nn,
                                  const void *bias, int bdt, int gelu) {
    if (rows == 0 || nn == 0 || (!bias && !gelu)) return FPK_OK;
    k_bias_gelu_cols<<<fpk_blocks(rows * nn), FPK_BLOCK, 0, st>>>(out, odt, ldo, rows, n0, nn, bias, bdt, gelu);
    return fpk_gpu_launched("gemm q: bias and gelu");
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
    /* equal panels of at most the budget's rows, each a multiple of 64 rows (aligned output columns) */
    int64_t most = K ? (int64_t)(QPANEL_BUDGET / ((size_t)K * es)) : N;
    if (most < 1) most = 1;
    int64_t panels = (N + most - 1) / most;
    int64_t nb = (N + panels - 1) / panels;
    if (nb > 64) nb = (nb + 63) / 64 * 64;
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
    const int gelu = p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH;
    const size_t bes = bias ? fpk_dt_size(bias->dtype) : 0;
    const int vec8 = K % 8 == 0 && ((uintptr_t)w->data % 8) == 0;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t nn = N - n0 < nb ? N - n0 : nb;
        if (K > 0 && vec8) {
            k_widen_q8<<<fpk_blocks(nn * K / 8), FPK_BLOCK, 0, st>>>(panel.ptr, pdt, (const uint8_t *)w->data, w->dtype, sd, srows,
                                                                      snb, block ? block : 1, n0, nn, K);
            FPK_TRY(fpk_gpu_launched("gemm q: widen"));
        } else if (K > 0) {
            k_widen_q<<<fpk_blocks(nn * K), FPK_BLOCK, 0, st>>>(panel.ptr, pdt, (const uint8_t *)w->data, w->dtype, sd, srows,
                                                                 snb, block ? block : 1, n0, nn, K);
            FPK_TRY(fpk_gpu_launched("gemm q: widen"));
        }
        int fused = 0;
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
        /* the panel's bias and GELU in cuBLASLt's epilogue where it takes them */
        d.bias = bias ? (const char *)bias->data + (size_t)n0 * bes : NULL;
        d.bias_dt = bias ? bias->dtype : 0;
        d.gelu = gelu;
        d.fused = &fused;
        FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &d));
        if (!fused)
            FPK_TRY(fpk_gpu_bias_gelu_cols(st, out->data, out->dtype, N, M, n0, nn, bias ? bias->data : NULL, bias ? bias->dtype : 0,
                                           gelu));
    }
    return FPK_OK;
}
