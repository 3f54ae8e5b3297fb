/* fpk_cpu.h — internals shared by the cpu backend's source files. */
#ifndef FPK_CPU_H
#define FPK_CPU_H

#include "fpk_impl.h"
#include "fpk_pool.h"

typedef struct fpk_cpu_ctx {
    fpk_pool *pool;
    int threads;
    uint32_t flags;
    char device_name[128];
} fpk_cpu_ctx;

/* Fails with FPK_ERR_UNSUPPORTED unless t is NULL or F32 (the cpu backend computes in f32). */
fpk_status fpk_cpu_require_f32(const char *op, fpk_tensor_t t, const char *name);

/* ---- 16-bit activations (fpk_cpu.c) ----
 * The cpu backend computes in f32. An op given F16/BF16 activations (inputs or output) runs on
 * f32 stand-ins: each 16-bit input is widened exactly into scratch charged to the allocator,
 * the output is computed into f32 scratch and rounded to its dtype (nearest even) at the end,
 * so a 16-bit op equals the f32 op on the same values followed by one rounding. Weight operands
 * the op widens itself (gemm's b, conv3d's w) are not listed. */
#define FPK_CPU_WIDE_MAX 6
typedef struct fpk_cpu_wide {
    int n;
    fpk_status status;      /* of the widening itself */
    fpk_tensor_t *slot[FPK_CPU_WIDE_MAX]; /* the caller's tensor variables, repointed */
    fpk_tensor_t orig[FPK_CPU_WIDE_MAX];
    int is_out[FPK_CPU_WIDE_MAX];
    struct fpk_buffer buf[FPK_CPU_WIDE_MAX];
    struct fpk_tensor t[FPK_CPU_WIDE_MAX];
} fpk_cpu_wide;
/* If any non-NULL tensor of io (the first nin inputs, the rest outputs) is F16 or BF16, points
 * each such variable at an f32 stand-in (inputs widened) and returns 1 (wd->status says whether
 * that worked); returns 0, changing nothing, when every one is f32 or not a float. */
int fpk_cpu_widen_begin(fpk_cpu_ctx *c, fpk_cpu_wide *wd, fpk_tensor_t **io, int n, int nin);
/* Rounds the stand-in outputs into the real ones when st is FPK_OK, frees the scratch and
 * restores the caller's variables; returns st. */
fpk_status fpk_cpu_widen_end(fpk_cpu_ctx *c, fpk_cpu_wide *wd, fpk_status st);
/* Runs call on f32 stand-ins when a tensor of io is 16-bit, and returns its status. */
#define FPK_CPU_WIDE(ctx, io, nin, call)                                                        \
    do {                                                                                        \
        fpk_cpu_wide wd_;                                                                       \
        if (fpk_cpu_widen_begin((fpk_cpu_ctx *)(ctx), &wd_, io, (int)(sizeof io / sizeof *io), nin)) { \
            fpk_status wst_ = wd_.status;                                                       \
            if (wst_ == FPK_OK) wst_ = (call);                                                  \
            return fpk_cpu_widen_end((fpk_cpu_ctx *)(ctx), &wd_, wst_);                         \
        }                                                                                       \
    } while (0)

/* Scratch memory counted against the backend's cap. */
fpk_status fpk_cpu_scratch(fpk_tensor_t any, size_t nbytes, void **out);
void fpk_cpu_scratch_free(fpk_tensor_t any, void *ptr, size_t nbytes);

/* y[i] += bias[c] for the channel c of each element of [N, C, inner]. */
void fpk_cpu_add_channel_bias(fpk_cpu_ctx *c, float *y, const float *bias, int64_t N, int64_t C,
                              int64_t inner);

fpk_status fpk_cpu_conv3d(void *ctx, void *stream, fpk_conv_tier tier, const fpk_conv3d_params *p,
                          fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out);
fpk_status fpk_cpu_attention(void *ctx, void *stream, const fpk_attention_params *p,
                             fpk_tensor_t q, fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask,
                             fpk_tensor_t out);
/* ---- half-precision weights (fpk_cpu_half.c) ---- */

/* Whether t is F16 or BF16 (a weight the cpu backend widens to f32 as it goes). */
int fpk_cpu_is_half(fpk_tensor_t t);
/* Widens rows x cols f16/bf16 values (row stride lds) to f32 (row stride ldd), exactly, on the
 * backend's pool. */
void fpk_cpu_widen_2d(fpk_cpu_ctx *c, float *dst, int64_t ldd, const void *src, int64_t lds,
                      fpk_dtype sdt, int64_t rows, int64_t cols);
/* Scratch for an f32 panel of *rows rows of row_elems floats: at most budget_rows (at least 1)
 * and *rows rows; halves the rows under memory pressure down to 1. Sets *rows, *panel and
 * *nbytes (free with fpk_cpu_scratch_free). */
fpk_status fpk_cpu_panel_alloc(fpk_tensor_t any, int64_t row_elems, int64_t budget_rows,
                               int64_t *rows, float **panel, size_t *nbytes);
/* out = alpha·op(a)·op(b) for f32 a and out and an f16/bf16 b, b widened a panel of output
 * columns at a time (bstride: elements between b's batches, 0 when b is shared). */
fpk_status fpk_cpu_gemm_half_b(fpk_cpu_ctx *c, const fpk_gemm_params *p, fpk_tensor_t a,
                               fpk_tensor_t b, fpk_tensor_t out, int64_t batch, int64_t M,
                               int64_t N, int64_t K, int64_t bstride, float alpha);

/* ---- 8-bit float weights (fpk_cpu_half.c) ---- */

/* Widens rows × cols 8-bit float values of dtype sdt (contiguous rows) to f32 times their scale:
 * scale [scale_rows, nb] (NULL: 1), row r of the source using scale row row0 + r (or 0 when
 * scale_rows is 1) and block k / (cols / nb). */
void fpk_cpu_widen_q(fpk_cpu_ctx *c, float *dst, const uint8_t *src, fpk_dtype sdt, const float *scale,
                     int64_t scale_rows, int64_t nb, int64_t row0, int64_t rows, int64_t cols);
/* Replaces each of the rows × K values of x by its e4m3 quantization times the scale
 * (max|x| / 448 per row when per_row, over all of x otherwise; 1 for zeros): x ← q(x / s)·s with
 * x / s clamped to ±448. */
void fpk_cpu_quantize_act(fpk_cpu_ctx *c, float *x, int64_t rows, int64_t K, int per_row);
/* y [rows, N] = alpha · a [rows, K] · dequant(w)ᵀ for an 8-bit float w [N, K] with scales
 * w_scale (fpk_op_gemm_q), w widened a panel of rows at a time into scratch charged to any's
 * backend. */
fpk_status fpk_cpu_gemm_fp8_w(fpk_cpu_ctx *c, const float *a, fpk_tensor_t w, fpk_tensor_t w_scale, float *y,
                              int64_t rows, float alpha, fpk_tensor_t any);

/* SiLU of n floats of x into y (y may be x): the unary op's arithmetic. */
void fpk_cpu_silu_row(float *y, const float *x, int64_t n);
/* Group norm then an activation in one pass (fpk_cpu_norm.c). */
fpk_status fpk_cpu_group_norm_act(void *ctx, void *stream, int64_t groups, float eps, fpk_norm_act act,
                                  fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out);

/* Softmax of each of `rows` rows of length n in place (x*scale), rows with all -inf → zeros. */
void fpk_cpu_softmax_rows(fpk_cpu_ctx *c, float *x, int64_t rows, int64_t n, float scale);

#endif /* FPK_CPU_H */
