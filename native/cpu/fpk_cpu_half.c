/*
 * fpk_cpu_half.c — f16/bf16 weights on the cpu backend: the weight is widened to f32 a panel at
 * a time into bounded scratch (counted by the allocator) and each panel goes through SGEMM, so
 * a model can keep its weights in 16 bits while computing in f32. The widening is exact (the
 * same values an f32 copy of the weight holds), so results equal the f32 path's up to how
 * OpenBLAS splits the work.
 *
 * 8-bit float weights (fpk_op_gemm_q) go the same way: each panel of rows is widened through a
 * table of the dtype's 256 values and multiplied by its scale (per tensor, per output row or per
 * block of the row) as it is written, so the f32 panel holds dequant(w) = q·s rounded once; no
 * copy of the whole weight is made. With activation quantization (the fp8 × fp8 paths of the
 * GPUs) the activations are first replaced by their e4m3 values times their scale, computed as
 * those paths compute them: this is the reference their results are checked against.
 */
#include "fpk_cpu.h"
#include "fpk_cpu_vexp.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Most bytes of f32 weight panel a half-weight GEMM widens at a time (2048 rows of a 4096-wide
 * weight). Measured on 16 threads, a 4096² Linear at 351 tokens keeps 89–97 % of the f32 rate
 * with 32 MiB panels but 67–86 % with 4–8 MiB: every SGEMM call repacks the activations and
 * splits the work among OpenBLAS's threads again, so fewer, larger panels win. */
#define PANEL_BUDGET ((size_t)32 << 20)

typedef uint32_t fpk_v8u __attribute__((vector_size(32)));
typedef uint16_t fpk_v8h __attribute__((vector_size(16)));

#define FPK_V8U(c) ((fpk_v8u){c, c, c, c, c, c, c, c})

/* dst[i] = (float)src[i] for n f16 or bf16 values. Exact: bf16 is a shift; f16 uses the
 * branch-free widening of Maratyszcza's FP16 library (normal values rescaled by 2^-112, subnormals
 * through a magic-number subtraction), which vectorises; it equals fpk_f16_to_f32 bit for bit
 * except that a signalling NaN comes out quiet. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void widen_row(float *dst, const uint16_t *src, int64_t n, int bf16) {
    int64_t i = 0;
    if (bf16) {
        for (; i + 8 <= n; i += 8) {
            fpk_v8h h;
            memcpy(&h, src + i, sizeof h);
            fpk_v8u u = __builtin_convertvector(h, fpk_v8u) << 16;
            memcpy(dst + i, &u, sizeof u);
        }
        for (; i < n; i++) dst[i] = fpk_bf16_to_f32(src[i]);
        return;
    }
    const fpk_v8u sign_mask = FPK_V8U(0x80000000u), exp_offset = FPK_V8U(0xE0u << 23),
                  magic = FPK_V8U(126u << 23), cutoff = FPK_V8U(1u << 27);
    const fpk_v8f exp_scale = FPK_V8F(0x1.0p-112f), half = FPK_V8F(0.5f);
    for (; i + 8 <= n; i += 8) {
        fpk_v8h h;
        memcpy(&h, src + i, sizeof h);
        fpk_v8u w = __builtin_convertvector(h, fpk_v8u) << 16;
        fpk_v8u sign = w & sign_mask, two_w = w + w;
        fpk_v8f norm = (fpk_v8f)((two_w >> 4) + exp_offset) * exp_scale;
        fpk_v8f denorm = (fpk_v8f)((two_w >> 17) | magic) - half;
        fpk_v8f v = FPK_V8_SELECT(two_w < cutoff, denorm, norm);
        fpk_v8u r = sign | (fpk_v8u)v;
        memcpy(dst + i, &r, sizeof r);
    }
    for (; i < n; i++) dst[i] = fpk_f16_to_f32(src[i]);
}

typedef struct {
    float *dst;
    const uint16_t *src;
    int64_t ldd, lds, cols;
    int bf16;
} widen_job;

static void widen_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    widen_job *j = arg;
    if (j->ldd == j->cols && j->lds == j->cols) { /* contiguous: one run */
        widen_row(j->dst + rb * j->cols, j->src + rb * j->cols, (re - rb) * j->cols, j->bf16);
        return;
    }
    for (int64_t r = rb; r < re; r++) widen_row(j->dst + r * j->ldd, j->src + r * j->lds, j->cols, j->bf16);
}

void fpk_cpu_widen_2d(fpk_cpu_ctx *c, float *dst, int64_t ldd, const void *src, int64_t lds,
                      fpk_dtype sdt, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    widen_job j = {.dst = dst, .src = src, .ldd = ldd, .lds = lds, .cols = cols, .bf16 = sdt == FPK_BF16};
    int64_t grain = cols >= (1 << 15) ? 1 : (1 << 15) / cols;
    fpk_pool_run(c->pool, rows, grain, widen_task, &j);
}

int fpk_cpu_is_half(fpk_tensor_t t) { return t && (t->dtype == FPK_F16 || t->dtype == FPK_BF16); }

fpk_status fpk_cpu_panel_alloc(fpk_tensor_t any, int64_t row_elems, int64_t budget_rows,
                               int64_t *rows, float **panel, size_t *nbytes) {
    int64_t r = budget_rows;
    if (r > *rows) r = *rows;
    if (r < 1) r = 1;
    size_t n = (size_t)r * (size_t)row_elems * sizeof(float);
    fpk_status st = fpk_cpu_scratch(any, n, (void **)panel);
    while (st == FPK_ERR_OUT_OF_MEMORY && r > 1) { /* fewer rows under memory pressure */
        r = (r + 1) / 2;
        n = (size_t)r * (size_t)row_elems * sizeof(float);
        st = fpk_cpu_scratch(any, n, (void **)panel);
    }
    if (st != FPK_OK) return st;
    fpk_clear_error();
    *rows = r;
    *nbytes = n;
    return FPK_OK;
}

fpk_status fpk_cpu_gemm_half_b(fpk_cpu_ctx *c, const fpk_gemm_params *p, fpk_tensor_t a,
                               fpk_tensor_t b, fpk_tensor_t out, int64_t batch, int64_t M,
                               int64_t N, int64_t K, int64_t bstride, float alpha) {
    /* panels of nb output columns: rows n0.. of b [N, K] (trans_b) or columns n0.. of b [K, N] */
    int64_t nb = N;
    float *panel = NULL;
    size_t pbytes = 0;
    fpk_status st = fpk_cpu_panel_alloc(a, K, (int64_t)(PANEL_BUDGET / ((size_t)K * sizeof(float))), &nb,
                                        &panel, &pbytes);
    if (st != FPK_OK) return st;
    const uint16_t *bd = fpk_tensor_data(b);
    const float *ad = fpk_tensor_data(a);
    float *yd = fpk_tensor_data(out);
    int64_t nbb = bstride ? batch : 1; /* batches of b to widen */
    for (int64_t ib = 0; ib < nbb; ib++) {
        const uint16_t *bb = bd + ib * bstride;
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            int64_t nn = N - n0 < nb ? N - n0 : nb;
            if (p->trans_b)
                fpk_cpu_widen_2d(c, panel, K, bb + n0 * K, K, b->dtype, nn, K);
            else
                fpk_cpu_widen_2d(c, panel, nn, bb + n0, N, b->dtype, K, nn);
            /* a shared b is widened once for every batch of a */
            int64_t i0 = bstride ? ib : 0, i1 = bstride ? ib + 1 : batch;
            for (int64_t i = i0; i < i1; i++)
                cblas_sgemm(CblasRowMajor, p->trans_a ? CblasTrans : CblasNoTrans,
                            p->trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)nn, (blasint)K,
                            alpha, ad + i * M * K, (blasint)(p->trans_a ? M : K), panel,
                            (blasint)(p->trans_b ? K : nn), 0.0f, yd + i * M * N + n0, (blasint)N);
        }
    }
    fpk_cpu_scratch_free(a, panel, pbytes);
    return FPK_OK;
}

/* ---- 8-bit float weights ------------------------------------------------------------------- */

typedef struct {
    float *dst;
    const uint8_t *src;
    const float *scale; /* [R, nb] or NULL */
    float table[256];   /* the 256 values of the source dtype */
    int64_t row0, cols, nb, block, scale_rows;
} widen_q_job;

static void widen_q_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    const widen_q_job *j = arg;
    for (int64_t r = rb; r < re; r++) {
        const uint8_t *q = j->src + r * j->cols;
        float *d = j->dst + r * j->cols;
        if (!j->scale) {
            for (int64_t k = 0; k < j->cols; k++) d[k] = j->table[q[k]];
            continue;
        }
        const float *s = j->scale + (j->scale_rows == 1 ? 0 : (j->row0 + r) * j->nb);
        for (int64_t b = 0; b < j->nb; b++) {
            const float sb = s[b];
            const int64_t k0 = b * j->block;
            for (int64_t k = k0; k < k0 + j->block; k++) d[k] = j->table[q[k]] * sb;
        }
    }
}

void fpk_cpu_widen_q(fpk_cpu_ctx *c, float *dst, const uint8_t *src, fpk_dtype sdt, const float *scale,
                     int64_t scale_rows, int64_t nb, int64_t row0, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    widen_q_job j = {.dst = dst, .src = src, .scale = scale, .row0 = row0, .cols = cols, .nb = nb ? nb : 1,
                     .scale_rows = scale_rows};
    j.block = cols / j.nb;
    for (int q = 0; q < 256; q++) j.table[q] = fpk_fp8_to_f32((uint8_t)q, sdt);
    int64_t grain = cols >= (1 << 15) ? 1 : (1 << 15) / cols;
    fpk_pool_run(c->pool, rows, grain, widen_q_task, &j);
}

typedef struct {
    float *x; /* [rows, K], quantized in place to the e4m3 values times their scale */
    int64_t K;
    int per_row;
    float tensor_scale;
} quant_act_job;

/* The fp8 value of v / s as PyTorch's saturating quantizers compute it: clamped to ±448, cast. */
static inline float quant_e4m3(float v, float s) {
    float q = v / s;
    q = q != q ? 0.0f : q > 448.0f ? 448.0f : q < -448.0f ? -448.0f : q;
    return fpk_e4m3_to_f32(fpk_f32_to_e4m3(q));
}

/* The activation scale of n values: max|x| / 448, 1 when every value is 0. */
static float act_scale(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > m) m = v;
    }
    return m > 0.0f ? m / 448.0f : 1.0f;
}

static void quant_act_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    const quant_act_job *j = arg;
    for (int64_t r = rb; r < re; r++) {
        float *x = j->x + r * j->K;
        float s = j->per_row ? act_scale(x, j->K) : j->tensor_scale;
        for (int64_t k = 0; k < j->K; k++) x[k] = quant_e4m3(x[k], s) * s;
    }
}

void fpk_cpu_quantize_act(fpk_cpu_ctx *c, float *x, int64_t rows, int64_t K, int per_row) {
    quant_act_job j = {.x = x, .K = K, .per_row = per_row, .tensor_scale = per_row ? 1.0f : act_scale(x, rows * K)};
    int64_t grain = K >= (1 << 15) ? 1 : (1 << 15) / (K ? K : 1);
    fpk_pool_run(c->pool, rows, grain, quant_act_task, &j);
}

fpk_status fpk_cpu_gemm_fp8_w(fpk_cpu_ctx *c, const float *a, fpk_tensor_t w, fpk_tensor_t w_scale, float *y,
                              int64_t rows, float alpha, fpk_tensor_t any) {
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t nb = N;
    float *panel = NULL;
    size_t pbytes = 0;
    fpk_status st = fpk_cpu_panel_alloc(any, K, (int64_t)(PANEL_BUDGET / ((size_t)K * sizeof(float))), &nb, &panel,
                                        &pbytes);
    if (st != FPK_OK) return st;
    const uint8_t *wd = fpk_tensor_data(w);
    const float *sd = w_scale ? fpk_tensor_data(w_scale) : NULL;
    int64_t srows = w_scale ? w_scale->shape[0] : 1, snb = w_scale ? w_scale->shape[1] : 1;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t nn = N - n0 < nb ? N - n0 : nb;
        fpk_cpu_widen_q(c, panel, wd + n0 * K, w->dtype, sd, srows, snb, n0, nn, K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)nn, (blasint)K, alpha, a,
                    (blasint)K, panel, (blasint)K, 0.0f, y + n0, (blasint)N);
    }
    fpk_cpu_scratch_free(any, panel, pbytes);
    return FPK_OK;
}
