/*
 * fpk_cpu.c — the cpu backend: host memory, OpenBLAS for GEMM, own multi-threaded loops for
 * everything else. Computes in f32; f16/bf16 tensors are storage (copy converts), except that
 * the weight operand of gemm and conv3d and an embedding table may be f16/bf16: they are widened
 * to f32 as they are used (fpk_cpu_half.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fpk_cpu.h"
#include "fpk_cpu_vexp.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX(v) ((fpk_cpu_ctx *)(v))
#define F(t) ((float *)fpk_tensor_data(t))
#define CF(t) ((const float *)fpk_tensor_data(t))

fpk_status fpk_cpu_require_f32(const char *op, fpk_tensor_t t, const char *name) {
    if (t && t->dtype != FPK_F32)
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "%s: cpu backend computes in f32, %s is %s",
                             op, name, fpk_dtype_name(t->dtype));
    return FPK_OK;
}

#define REQ(op, t) TRYC(fpk_cpu_require_f32(op, t, #t))
#define TRYC(expr)                                                                              \
    do {                                                                                        \
        fpk_status st_ = (expr);                                                                \
        if (st_ != FPK_OK) return st_;                                                          \
    } while (0)

fpk_status fpk_cpu_scratch(fpk_tensor_t any, size_t nbytes, void **out) {
    return fpk_scratch_alloc(any->buf->backend, nbytes, out);
}

void fpk_cpu_scratch_free(fpk_tensor_t any, void *ptr, size_t nbytes) {
    fpk_scratch_free(any->buf->backend, ptr, nbytes);
}

/* ---- backend object --------------------------------------------------------------------- */

static void cpu_free(void *ctx) {
    fpk_cpu_ctx *c = CTX(ctx);
    fpk_pool_free(c->pool);
    free(c);
}

static fpk_status cpu_get_props(void *ctx, fpk_backend_props *out) {
    fpk_cpu_ctx *c = CTX(ctx);
    snprintf(out->device_name, sizeof out->device_name, "%s", c->device_name);
    out->threads = c->threads;
    out->conv_tiers = (c->flags & FPK_BACKEND_FLAG_TEST_HOST_BOUNCE) ? 0u : (1u << FPK_CONV_TIER_CPU);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    out->device_memory = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    return FPK_OK;
}

static fpk_status cpu_buffer_alloc(void *ctx, size_t nbytes, void **out) {
    (void)ctx;
    size_t n = (nbytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) return fpk_set_oom(nbytes, 0, "host allocation");
    *out = p;
    return FPK_OK;
}

static void cpu_buffer_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static fpk_status cpu_memcpy(void *ctx, void *stream, void *dst, const void *src, size_t n) {
    (void)ctx;
    (void)stream;
    if (n) memmove(dst, src, n);
    return FPK_OK;
}

/* ---- fill and copy ------------------------------------------------------------------------ */

typedef struct {
    void *dst;
    const void *src;
    fpk_dtype ddt, sdt;
    size_t des, ses;
    uint8_t pattern[4];
} conv_job;

static void fill_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    conv_job *j = arg;
    uint8_t *d = (uint8_t *)j->dst;
    for (int64_t i = b; i < e; i++) memcpy(d + (size_t)i * j->des, j->pattern, j->des);
}

static fpk_status cpu_fill(void *ctx, void *stream, fpk_tensor_t t, double value) {
    (void)stream;
    conv_job j = {.dst = fpk_tensor_data(t), .des = fpk_dtype_size(t->dtype)};
    float f = (float)value;
    int isnan_ = value != value;
    switch (t->dtype) {
    case FPK_U8: j.pattern[0] = isnan_ ? 0xff : (uint8_t)f; break;
    case FPK_I32: {
        int32_t v = isnan_ ? -1 : (int32_t)value;
        memcpy(j.pattern, &v, 4);
        break;
    }
    default: fpk_dtype_store(j.pattern, t->dtype, 0, f); /* the float types, rounded as every conversion */
    }
    fpk_pool_run(CTX(ctx)->pool, t->numel, 1 << 16, fill_task, &j);
    return FPK_OK;
}

static void copy_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    conv_job *j = arg;
    fpk_convert((char *)j->dst + (size_t)b * j->des, j->ddt, (const char *)j->src + (size_t)b * j->ses,
                j->sdt, (size_t)(e - b));
}

static void cpu_host_convert(void *ctx, void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt,
                             size_t n) {
    conv_job j = {.dst = dst, .src = src, .ddt = ddt, .sdt = sdt, .des = fpk_dtype_size(ddt),
                  .ses = fpk_dtype_size(sdt)};
    fpk_pool_run(CTX(ctx)->pool, (int64_t)n, 1 << 15, copy_task, &j);
}

int fpk_cpu_widen_begin(fpk_cpu_ctx *c, fpk_cpu_wide *wd, fpk_tensor_t **io, int n, int nin) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= *io[i] && fpk_cpu_is_half(*io[i]);
    if (!any) return 0;
    memset(wd, 0, sizeof *wd);
    for (int i = 0; i < n && wd->status == FPK_OK; i++) {
        fpk_tensor_t t = *io[i];
        if (!t || !fpk_cpu_is_half(t)) continue;
        if (wd->n == FPK_CPU_WIDE_MAX) {
            wd->status = fpk_set_error(FPK_ERR_INTERNAL, "cpu: more than %d 16-bit operands", FPK_CPU_WIDE_MAX);
            break;
        }
        int k = wd->n;
        size_t nbytes = (size_t)t->numel * 4;
        void *data = NULL;
        wd->status = fpk_cpu_scratch(t, nbytes ? nbytes : 4, &data);
        if (wd->status != FPK_OK) break;
        wd->n++;
        wd->slot[k] = io[i];
        wd->orig[k] = t;
        wd->is_out[k] = i >= nin;
        wd->buf[k].backend = t->buf->backend;
        wd->buf[k].data = data;
        wd->buf[k].nbytes = nbytes ? nbytes : 4;
        atomic_init(&wd->buf[k].refs, 1);
        wd->t[k] = *t;
        wd->t[k].buf = &wd->buf[k];
        wd->t[k].offset = 0;
        wd->t[k].dtype = FPK_F32;
        if (!wd->is_out[k]) cpu_host_convert(c, data, FPK_F32, fpk_tensor_data(t), t->dtype, (size_t)t->numel);
        *io[i] = &wd->t[k];
    }
    return 1;
}

fpk_status fpk_cpu_widen_end(fpk_cpu_ctx *c, fpk_cpu_wide *wd, fpk_status st) {
    for (int k = 0; k < wd->n; k++) {
        fpk_tensor_t t = wd->orig[k];
        if (st == FPK_OK && wd->is_out[k])
            cpu_host_convert(c, fpk_tensor_data(t), t->dtype, wd->buf[k].data, FPK_F32, (size_t)t->numel);
        fpk_cpu_scratch_free(t, wd->buf[k].data, wd->buf[k].nbytes);
        *wd->slot[k] = t;
    }
    return st;
}

static fpk_status cpu_copy(void *ctx, void *stream, fpk_tensor_t src, fpk_tensor_t dst) {
    (void)stream;
    conv_job j = {.dst = fpk_tensor_data(dst), .src = fpk_tensor_data(src), .ddt = dst->dtype,
                  .sdt = src->dtype, .des = fpk_dtype_size(dst->dtype), .ses = fpk_dtype_size(src->dtype)};
    fpk_pool_run(CTX(ctx)->pool, src->numel, 1 << 15, copy_task, &j);
    return FPK_OK;
}

/* ---- gemm --------------------------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *bias;
    int64_t C, inner, rowlen;
} bias_job;

static void bias_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    bias_job *j = arg;
    for (int64_t r = b; r < e; r++) {
        float *y = j->y + r * j->inner;
        if (j->rowlen) {
            /* rows of length C: add bias elementwise */
            for (int64_t i = 0; i < j->C; i++) j->y[r * j->C + i] += j->bias[i];
            continue;
        }
        float bv = j->bias[r % j->C];
        for (int64_t i = 0; i < j->inner; i++) y[i] += bv;
    }
}

void fpk_cpu_add_channel_bias(fpk_cpu_ctx *c, float *y, const float *bias, int64_t N, int64_t C,
                              int64_t inner) {
    bias_job j = {.y = y, .bias = bias, .C = C, .inner = inner, .rowlen = 0};
    fpk_pool_run(c->pool, N * C, inner >= 4096 ? 1 : 4096 / (inner ? inner : 1), bias_task, &j);
}

static void gelu_tanh_inplace(fpk_cpu_ctx *c, float *y, int64_t n);

static fpk_status cpu_gemm(void *ctx, void *stream, const fpk_gemm_params *p, fpk_tensor_t a,
                           fpk_tensor_t b, fpk_tensor_t bias, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&a, &bias, &out};
    FPK_CPU_WIDE(ctx, io, 2, cpu_gemm(ctx, stream, p, a, b, bias, out));
    const char *op = "gemm";
    REQ(op, a);
    if (!fpk_cpu_is_half(b)) REQ(op, b); /* f16/bf16 b: a weight widened panel by panel */
    REQ(op, bias);
    REQ(op, out);
    int64_t M = out->shape[out->ndim - 2], N = out->shape[out->ndim - 1];
    int64_t K = p->trans_a ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t batch = 1;
    for (int i = 0; i < out->ndim - 2; i++) batch *= out->shape[i];
    if (out->numel == 0) return FPK_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "%s: dims beyond 32 bits", op);
    int64_t bbatch = 1;
    for (int i = 0; i < b->ndim - 2; i++) bbatch *= b->shape[i];
    int64_t bstride = bbatch == 1 ? 0 : K * N;
    float alpha = p->alpha != 0 ? p->alpha : 1.0f;
    if (K == 0) {
        memset(F(out), 0, (size_t)out->numel * sizeof(float));
    } else if (fpk_cpu_is_half(b)) {
        fpk_status st = fpk_cpu_gemm_half_b(CTX(ctx), p, a, b, out, batch, M, N, K, bstride, alpha);
        if (st != FPK_OK) return st;
    } else {
        for (int64_t i = 0; i < batch; i++)
            cblas_sgemm(CblasRowMajor, p->trans_a ? CblasTrans : CblasNoTrans,
                        p->trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K,
                        alpha, CF(a) + i * M * K, (blasint)(p->trans_a ? M : K), CF(b) + i * bstride,
                        (blasint)(p->trans_b ? K : N), 0.0f, F(out) + i * M * N, (blasint)N);
    }
    if (bias) {
        bias_job j = {.y = F(out), .bias = CF(bias), .C = N, .inner = 1, .rowlen = 1};
        fpk_pool_run(CTX(ctx)->pool, batch * M, 4096 / (N ? N : 1) + 1, bias_task, &j);
    }
    if (p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH) gelu_tanh_inplace(CTX(ctx), F(out), out->numel);
    return FPK_OK;
}

/* fpk_op_gemm_q: an 8-bit float weight, widened and scaled a panel at a time; with act_quant the
 * activations are first quantized to e4m3 (a copy: a is an input). */
static fpk_status cpu_gemm_q(void *ctx, void *stream, const fpk_gemm_q_params *p, fpk_tensor_t a, fpk_tensor_t w,
                             fpk_tensor_t w_scale, fpk_tensor_t bias, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&a, &bias, &out};
    FPK_CPU_WIDE(ctx, io, 2, cpu_gemm_q(ctx, stream, p, a, w, w_scale, bias, out));
    const char *op = "gemm q";
    REQ(op, a);
    REQ(op, bias);
    REQ(op, out);
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t rows = K ? a->numel / K : out->numel / (N ? N : 1);
    if (out->numel == 0) return FPK_OK;
    if (rows > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "%s: dims beyond 32 bits", op);
    float alpha = p->alpha != 0 ? p->alpha : 1.0f;
    if (K == 0) {
        memset(F(out), 0, (size_t)out->numel * sizeof(float));
    } else {
        const float *ad = CF(a);
        float *aq = NULL;
        size_t aqn = 0;
        if (p->act_quant != FPK_ACT_QUANT_NONE) {
            aqn = (size_t)a->numel * sizeof(float);
            fpk_status st = fpk_cpu_scratch(a, aqn, (void **)&aq);
            if (st != FPK_OK) return st;
            memcpy(aq, ad, aqn);
            fpk_cpu_quantize_act(CTX(ctx), aq, rows, K, p->act_quant == FPK_ACT_QUANT_TOKEN);
            ad = aq;
        }
        fpk_status st = fpk_cpu_gemm_fp8_w(CTX(ctx), ad, w, w_scale, F(out), rows, alpha, a);
        if (aq) fpk_cpu_scratch_free(a, aq, aqn);
        if (st != FPK_OK) return st;
    }
    if (bias) {
        bias_job j = {.y = F(out), .bias = CF(bias), .C = N, .inner = 1, .rowlen = 1};
        fpk_pool_run(CTX(ctx)->pool, rows, 4096 / (N ? N : 1) + 1, bias_task, &j);
    }
    if (p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH) gelu_tanh_inplace(CTX(ctx), F(out), out->numel);
    return FPK_OK;
}

/* ---- elementwise ---------------------------------------------------------------------------- */

/* x[i] = exp((x[i] - mx) * scale) for a row whose max is mx (so every argument is <= 0), and
 * returns the row's sum; arguments below -87 (masked scores, -inf) give exactly 0. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static double exp_row(float *x, int64_t n, float mx, float scale) {
    const fpk_v8f vmx = FPK_V8F(mx), vsc = FPK_V8F(scale);
    fpk_v8f acc8 = FPK_V8F(0.0f);
    double acc = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        fpk_v8f v;
        memcpy(&v, x + i, sizeof v);
        v = (v - vmx) * vsc;
        fpk_v8f e = FPK_V8_SELECT(v < FPK_V8F(-87.0f), FPK_V8F(0.0f), FPK_V8_EXP(v));
        memcpy(x + i, &e, sizeof e);
        acc8 += e;
        if ((i & 1023) == 1016) { /* fold into double now and then to keep the sum exact enough */
            for (int l = 0; l < 8; l++) acc += acc8[l];
            acc8 = FPK_V8F(0.0f);
        }
    }
    for (int l = 0; l < 8; l++) acc += acc8[l];
    for (; i < n; i++) {
        float v = (x[i] - mx) * scale;
        x[i] = v < -87.0f ? 0.0f : expf(v);
        acc += x[i];
    }
    return acc;
}

/* The sigmoid family: y = (mulx ? x : 1) · sigmoid(x·(a + b·x²)). SiLU is (1, 0), quick-GELU
 * (1.702, 0), GELU(tanh) (2√(2/π), 2√(2/π)·0.044715) since 0.5(1 + tanh z) = sigmoid(2z),
 * sigmoid is (1, 0) without the factor x. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void sigmoid_family(float *y, const float *x, int64_t n, float a, float b, int mulx) {
    const fpk_v8f va = FPK_V8F(a), vb = FPK_V8F(b), one = FPK_V8F(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        fpk_v8f v;
        memcpy(&v, x + i, sizeof v);
        fpk_v8f t = v * (va + vb * v * v);
        fpk_v8f s = one / (one + FPK_V8_EXP(-t));
        if (mulx) s *= v;
        memcpy(y + i, &s, sizeof s);
    }
    for (; i < n; i++) {
        float v = x[i], t = v * (a + b * v * v);
        float s = 1.0f / (1.0f + expf(-t));
        y[i] = mulx ? v * s : s;
    }
}

void fpk_cpu_silu_row(float *y, const float *x, int64_t n) { sigmoid_family(y, x, n, 1.0f, 0.0f, 1); }

/* Runs the 8-lane statement expression F (a macro of one fpk_v8f) over n floats of x into y;
 * the last partial vector goes through a zero-padded copy, so every element gets the same
 * arithmetic. */
#define FPK_V8_MAP(y, x, n, F)                                                                  \
    do {                                                                                        \
        int64_t i_ = 0;                                                                         \
        for (; i_ + 8 <= (n); i_ += 8) {                                                        \
            fpk_v8f v_;                                                                         \
            memcpy(&v_, (x) + i_, sizeof v_);                                                   \
            v_ = F(v_);                                                                         \
            memcpy((y) + i_, &v_, sizeof v_);                                                   \
        }                                                                                       \
        if (i_ < (n)) {                                                                         \
            float b_[8] = {0};                                                                  \
            memcpy(b_, (x) + i_, (size_t)((n) - i_) * sizeof(float));                           \
            fpk_v8f v_;                                                                         \
            memcpy(&v_, b_, sizeof v_);                                                         \
            v_ = F(v_);                                                                         \
            memcpy(b_, &v_, sizeof v_);                                                         \
            memcpy((y) + i_, b_, (size_t)((n) - i_) * sizeof(float));                           \
        }                                                                                       \
    } while (0)

/* tanh: Cephes' tanhf on 8 lanes: x + x³·P(x²) below |x| = 0.625, 1 − 2/(exp(2|x|) + 1) above
 * (|error| < 1e-7, 1.4e-7 relative); the sign is copied from x (odd, −0 stays −0, NaN stays
 * NaN; ±inf gives ±1). */
#define FPK_V8_TANH(vin)                                                                        \
    ({                                                                                          \
        fpk_v8f v = (vin);                                                                      \
        const fpk_v8i absmask = FPK_V8I(0x7fffffff);                                            \
        fpk_v8f a = (fpk_v8f)((fpk_v8i)v & absmask);                                            \
        fpk_v8f big = FPK_V8F(1.0f) - FPK_V8F(2.0f) / (FPK_V8_EXP(a + a) + FPK_V8F(1.0f));      \
        fpk_v8f s = a * a;                                                                      \
        fpk_v8f p = FPK_V8F(-5.70498872745e-3f) * s + FPK_V8F(2.06390887954e-2f);               \
        p = p * s - FPK_V8F(5.37397155531e-2f);                                                 \
        p = p * s + FPK_V8F(1.33314422036e-1f);                                                 \
        p = p * s - FPK_V8F(3.33332819422e-1f);                                                 \
        fpk_v8f r = FPK_V8_SELECT(a > FPK_V8F(0.625f), big, p * s * a + a);                     \
        (fpk_v8f)((fpk_v8i)r | ((fpk_v8i)v & ~absmask));                                        \
    })

__attribute__((target_clones("arch=x86-64-v3", "default")))
static void tanh_row(float *y, const float *x, int64_t n) {
    FPK_V8_MAP(y, x, n, FPK_V8_TANH);
}

/* GELU(erf) = x·Φ(x) with Φ from erfc(|x|/√2) (Numerical Recipes' erfcc: t·exp(−z² + P(t)),
 * t = 1/(1 + z/2), fractional error < 1.2e-7): Φ = erfc/2 for x < 0, 1 − erfc/2 otherwise, so
 * the negative tail keeps its relative accuracy (0.5x(1 + erf) loses it to cancellation).
 * ≤ 2e-6 relative error down to x = −4, ≤ 5e-7 above −2. */
#define FPK_V8_GELU_ERF(vin)                                                                    \
    ({                                                                                          \
        fpk_v8f v = (vin);                                                                      \
        const fpk_v8f one = FPK_V8F(1.0f), half = FPK_V8F(0.5f), zero = FPK_V8F(0.0f);          \
        fpk_v8f z = (fpk_v8f)((fpk_v8i)v & FPK_V8I(0x7fffffff)) * FPK_V8F(0.70710678118654752f); \
        fpk_v8f t = one / (one + half * z);                                                     \
        fpk_v8f p = FPK_V8F(0.17087277f);                                                       \
        p = p * t + FPK_V8F(-0.82215223f);                                                      \
        p = p * t + FPK_V8F(1.48851587f);                                                       \
        p = p * t + FPK_V8F(-1.13520398f);                                                      \
        p = p * t + FPK_V8F(0.27886807f);                                                       \
        p = p * t + FPK_V8F(-0.18628806f);                                                      \
        p = p * t + FPK_V8F(0.09678418f);                                                       \
        p = p * t + FPK_V8F(0.37409196f);                                                       \
        p = p * t + FPK_V8F(1.00002368f);                                                       \
        p = p * t + FPK_V8F(-1.26551223f);                                                      \
        fpk_v8f c = t * FPK_V8_EXP(p - z * z); /* erfc(|x|/√2) */                               \
        c = FPK_V8_SELECT(z > FPK_V8F(9.0f), zero, c); /* below exp's range: 0, as in f32 */    \
        v * FPK_V8_SELECT(v < zero, half * c, one - half * c);                                  \
    })

__attribute__((target_clones("arch=x86-64-v3", "default")))
static void gelu_erf_row(float *y, const float *x, int64_t n) {
    FPK_V8_MAP(y, x, n, FPK_V8_GELU_ERF);
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
static void scale_row(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

typedef struct {
    const float *x;
    float *y;
    int op;
    float a, b;
} unary_job;


static void unary_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    unary_job *j = arg;
    const float *x = j->x;
    float *y = j->y;
    switch (j->op) {
    case FPK_UNARY_SILU:
        sigmoid_family(y + b, x + b, e - b, 1.0f, 0.0f, 1);
        break;
    case FPK_UNARY_GELU_TANH:
        sigmoid_family(y + b, x + b, e - b, 1.5957691216057308f, 1.5957691216057308f * 0.044715f, 1);
        break;
    case FPK_UNARY_QUICK_GELU:
        sigmoid_family(y + b, x + b, e - b, 1.702f, 0.0f, 1);
        break;
    case FPK_UNARY_GELU_ERF:
        gelu_erf_row(y + b, x + b, e - b);
        break;
    case FPK_UNARY_SIGMOID:
        sigmoid_family(y + b, x + b, e - b, 1.0f, 0.0f, 0);
        break;
    case FPK_UNARY_TANH:
        tanh_row(y + b, x + b, e - b);
        break;
    case FPK_UNARY_EXP:
        for (int64_t i = b; i < e; i++) y[i] = expf(x[i]);
        break;
    case FPK_UNARY_NEG:
        for (int64_t i = b; i < e; i++) y[i] = -x[i];
        break;
    case FPK_UNARY_SQRT:
        for (int64_t i = b; i < e; i++) y[i] = sqrtf(x[i]);
        break;
    case FPK_UNARY_RSQRT:
        for (int64_t i = b; i < e; i++) y[i] = 1.0f / sqrtf(x[i]);
        break;
    case -1: /* affine */
        for (int64_t i = b; i < e; i++) y[i] = x[i] * j->a + j->b;
        break;
    }
}

static void gelu_tanh_inplace(fpk_cpu_ctx *c, float *y, int64_t n) {
    unary_job j = {.x = y, .y = y, .op = FPK_UNARY_GELU_TANH};
    fpk_pool_run(c->pool, n, 1 << 14, unary_task, &j);
}

static fpk_status cpu_unary(void *ctx, void *stream, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &out};
    FPK_CPU_WIDE(ctx, io, 1, cpu_unary(ctx, stream, op, x, out));
    REQ("unary", x);
    REQ("unary", out);
    unary_job j = {.x = CF(x), .y = F(out), .op = (int)op};
    fpk_pool_run(CTX(ctx)->pool, x->numel, 1 << 14, unary_task, &j);
    return FPK_OK;
}

static fpk_status cpu_affine(void *ctx, void *stream, float scale, float shift, fpk_tensor_t x,
                             fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &out};
    FPK_CPU_WIDE(ctx, io, 1, cpu_affine(ctx, stream, scale, shift, x, out));
    REQ("affine", x);
    REQ("affine", out);
    unary_job j = {.x = CF(x), .y = F(out), .op = -1, .a = scale, .b = shift};
    fpk_pool_run(CTX(ctx)->pool, x->numel, 1 << 15, unary_task, &j);
    return FPK_OK;
}

/* Strides (in elements) of t read as a tensor of out's rank with broadcast dims at 0. */
static void bcast_strides(fpk_tensor_t t, int ndim, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        int it = t->ndim - ndim + i;
        int64_t d = it >= 0 ? t->shape[it] : 1;
        st[i] = (d == 1 && shape[i] != 1) || it < 0 ? 0 : s;
        if (it >= 0) s *= d;
    }
}

typedef struct {
    const float *a, *b;
    float *y;
    int op;
    int ndim; /* after merging; the last dim is the inner loop */
    int64_t shape[FPK_MAX_DIMS], sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS];
} binary_job;

static void binary_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    binary_job *j = arg;
    int nd = j->ndim;
    int64_t inner = j->shape[nd - 1], ia = j->sa[nd - 1], ib = j->sb[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t oa = 0, ob = 0, rem = r;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t c = rem % j->shape[d];
            rem /= j->shape[d];
            oa += c * j->sa[d];
            ob += c * j->sb[d];
        }
        const float *a = j->a + oa, *b = j->b + ob;
        float *y = j->y + r * inner;
#define LOOP(EXPR)                                                                              \
    if (ia == 1 && ib == 1)                                                                     \
        for (int64_t i = 0; i < inner; i++) {                                                   \
            float u = a[i], v = b[i];                                                           \
            y[i] = EXPR;                                                                        \
        }                                                                                       \
    else if (ia == 1 && ib == 0) {                                                              \
        float v = b[0];                                                                         \
        for (int64_t i = 0; i < inner; i++) {                                                   \
            float u = a[i];                                                                     \
            y[i] = EXPR;                                                                        \
        }                                                                                       \
    } else                                                                                      \
        for (int64_t i = 0; i < inner; i++) {                                                   \
            float u = a[i * ia], v = b[i * ib];                                                 \
            y[i] = EXPR;                                                                        \
        }
        switch (j->op) {
        case FPK_BINARY_ADD: LOOP(u + v) break;
        case FPK_BINARY_SUB: LOOP(u - v) break;
        case FPK_BINARY_MUL: LOOP(u * v) break;
        case FPK_BINARY_DIV: LOOP(u / v) break;
        case FPK_BINARY_MAX: LOOP(u > v || u != u ? u : v) break;
        case FPK_BINARY_MIN: LOOP(u < v || u != u ? u : v) break;
        }
#undef LOOP
    }
}

static fpk_status cpu_binary(void *ctx, void *stream, fpk_binary_op op, fpk_tensor_t a,
                             fpk_tensor_t b, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&a, &b, &out};
    FPK_CPU_WIDE(ctx, io, 2, cpu_binary(ctx, stream, op, a, b, out));
    REQ("binary", a);
    REQ("binary", b);
    REQ("binary", out);
    if (out->numel == 0) return FPK_OK;
    int nd = out->ndim;
    int64_t sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS];
    bcast_strides(a, nd, out->shape, sa);
    bcast_strides(b, nd, out->shape, sb);
    binary_job j = {.a = CF(a), .b = CF(b), .y = F(out), .op = (int)op};
    /* merge dims that are contiguous for both operands; drop size-1 dims */
    int m = 0;
    for (int i = 0; i < nd; i++) {
        if (out->shape[i] == 1) continue;
        if (m > 0 && j.sa[m - 1] == sa[i] * out->shape[i] && j.sb[m - 1] == sb[i] * out->shape[i]) {
            j.shape[m - 1] *= out->shape[i];
            j.sa[m - 1] = sa[i];
            j.sb[m - 1] = sb[i];
            continue;
        }
        j.shape[m] = out->shape[i];
        j.sa[m] = sa[i];
        j.sb[m] = sb[i];
        m++;
    }
    if (m == 0) {
        j.shape[0] = 1;
        j.sa[0] = j.sb[0] = 0;
        m = 1;
    }
    /* a scalar-like a with a strided b: swap so the fast (1, 0) loop applies where it can */
    j.ndim = m;
    int64_t inner = j.shape[m - 1];
    int64_t rows = out->numel / inner;
    int64_t grain = inner >= (1 << 14) ? 1 : (1 << 14) / inner;
    fpk_pool_run(CTX(ctx)->pool, rows, grain, binary_task, &j);
    return FPK_OK;
}

/* ---- fused three-operand ops ---------------------------------------------------------------- */

typedef struct {
    const float *a, *b, *c;
    float *y;
    int op;
    int ndim;
    int64_t shape[FPK_MAX_DIMS], sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS], sc[FPK_MAX_DIMS];
} ternary_job;

static void ternary_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    ternary_job *j = arg;
    int nd = j->ndim;
    int64_t inner = j->shape[nd - 1], ia = j->sa[nd - 1], ib = j->sb[nd - 1], ic = j->sc[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t oa = 0, ob = 0, oc = 0, rem = r;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t k = rem % j->shape[d];
            rem /= j->shape[d];
            oa += k * j->sa[d];
            ob += k * j->sb[d];
            oc += k * j->sc[d];
        }
        const float *a = j->a + oa, *b = j->b + ob, *c = j->c + oc;
        float *y = j->y + r * inner;
        /* the unfused ops' f32 steps in their order (no contraction to fma on this target) */
        if (j->op == FPK_TERNARY_MODULATE)
            for (int64_t i = 0; i < inner; i++) y[i] = a[i * ia] * (1.0f + b[i * ib]) + c[i * ic];
        else
            for (int64_t i = 0; i < inner; i++) y[i] = a[i * ia] + c[i * ic] * b[i * ib];
    }
}

static fpk_status cpu_ternary(void *ctx, void *stream, fpk_ternary_op op, fpk_tensor_t a, fpk_tensor_t b,
                              fpk_tensor_t c, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&a, &b, &c, &out};
    FPK_CPU_WIDE(ctx, io, 3, cpu_ternary(ctx, stream, op, a, b, c, out));
    REQ("ternary", a);
    REQ("ternary", b);
    REQ("ternary", c);
    REQ("ternary", out);
    if (out->numel == 0) return FPK_OK;
    int nd = out->ndim;
    ternary_job j = {.a = CF(a), .b = CF(b), .c = CF(c), .y = F(out), .op = (int)op, .ndim = nd > 0 ? nd : 1};
    if (nd == 0) {
        j.shape[0] = 1;
    } else {
        memcpy(j.shape, out->shape, sizeof(int64_t) * (size_t)nd);
        bcast_strides(a, nd, out->shape, j.sa);
        bcast_strides(b, nd, out->shape, j.sb);
        bcast_strides(c, nd, out->shape, j.sc);
    }
    int64_t inner = j.shape[j.ndim - 1];
    int64_t rows = out->numel / inner;
    int64_t grain = inner >= (1 << 14) ? 1 : (1 << 14) / inner;
    fpk_pool_run(CTX(ctx)->pool, rows, grain, ternary_task, &j);
    return FPK_OK;
}

/* ---- softmax and norms ---------------------------------------------------------------------- */

typedef struct {
    float *x;
    int64_t n;
    float scale;
} softmax_job;


static void softmax_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    softmax_job *j = arg;
    for (int64_t r = rb; r < re; r++) {
        float *x = j->x + r * j->n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < j->n; i++) mx = x[i] > mx ? x[i] : mx;
        if (mx == -INFINITY) {
            memset(x, 0, (size_t)j->n * sizeof(float));
            continue;
        }
        double sum = exp_row(x, j->n, mx, j->scale);
        scale_row(x, j->n, (float)(1.0 / sum));
    }
}

void fpk_cpu_softmax_rows(fpk_cpu_ctx *c, float *x, int64_t rows, int64_t n, float scale) {
    softmax_job j = {.x = x, .n = n, .scale = scale};
    fpk_pool_run(c->pool, rows, n >= 4096 ? 1 : 4096 / (n ? n : 1), softmax_task, &j);
}

static fpk_status cpu_softmax(void *ctx, void *stream, float scale, fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &out};
    FPK_CPU_WIDE(ctx, io, 1, cpu_softmax(ctx, stream, scale, x, out));
    REQ("softmax", x);
    REQ("softmax", out);
    int64_t n = x->shape[x->ndim - 1];
    if (x->numel == 0) return FPK_OK;
    if (F(out) != F(x)) memcpy(F(out), CF(x), (size_t)x->numel * sizeof(float));
    /* scale > 0 keeps the max; a negative scale flips it, so pre-scale instead */
    float s = scale != 0 ? scale : 1.0f;
    if (s < 0) {
        unary_job u = {.x = F(out), .y = F(out), .op = -1, .a = s, .b = 0};
        fpk_pool_run(CTX(ctx)->pool, x->numel, 1 << 15, unary_task, &u);
        s = 1.0f;
    }
    fpk_cpu_softmax_rows(CTX(ctx), F(out), x->numel / n, n, s);
    return FPK_OK;
}

typedef struct {
    const float *x, *w, *b;
    float *y;
    int64_t n;      /* row length (layer/rms) or elements per channel (group) */
    int64_t cpg;    /* channels per group */
    int64_t groups; /* group norm: groups per sample */
    float eps;
    int rms;
} norm_job;

static void layer_norm_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    norm_job *j = arg;
    int64_t n = j->n;
    for (int64_t r = rb; r < re; r++) {
        const float *x = j->x + r * n;
        float *y = j->y + r * n;
        double mean = 0, var = 0;
        if (!j->rms) {
            for (int64_t i = 0; i < n; i++) mean += x[i];
            mean /= (double)n;
        }
        for (int64_t i = 0; i < n; i++) {
            double d = x[i] - mean;
            var += d * d;
        }
        var /= (double)n;
        float inv = (float)(1.0 / sqrt(var + j->eps));
        float m = (float)mean;
        for (int64_t i = 0; i < n; i++) {
            float v = (x[i] - m) * inv;
            if (j->w) v *= j->w[i];
            if (j->b) v += j->b[i];
            y[i] = v;
        }
    }
}

static fpk_status cpu_layer_norm(void *ctx, void *stream, float eps, fpk_tensor_t x, fpk_tensor_t w,
                                 fpk_tensor_t b, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &w, &b, &out};
    FPK_CPU_WIDE(ctx, io, 3, cpu_layer_norm(ctx, stream, eps, x, w, b, out));
    const char *op = "layer norm";
    REQ(op, x);
    REQ(op, w);
    REQ(op, b);
    REQ(op, out);
    int64_t n = x->shape[x->ndim - 1];
    if (x->numel == 0) return FPK_OK;
    norm_job j = {.x = CF(x), .w = w ? CF(w) : NULL, .b = b ? CF(b) : NULL, .y = F(out), .n = n, .eps = eps};
    fpk_pool_run(CTX(ctx)->pool, x->numel / n, n >= 2048 ? 1 : 2048 / n, layer_norm_task, &j);
    return FPK_OK;
}

static fpk_status cpu_rms_norm(void *ctx, void *stream, float eps, fpk_tensor_t x, fpk_tensor_t w,
                               fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &w, &out};
    FPK_CPU_WIDE(ctx, io, 2, cpu_rms_norm(ctx, stream, eps, x, w, out));
    const char *op = "rms norm";
    REQ(op, x);
    REQ(op, w);
    REQ(op, out);
    int64_t n = x->shape[x->ndim - 1];
    if (x->numel == 0) return FPK_OK;
    norm_job j = {.x = CF(x), .w = w ? CF(w) : NULL, .y = F(out), .n = n, .eps = eps, .rms = 1};
    fpk_pool_run(CTX(ctx)->pool, x->numel / n, n >= 2048 ? 1 : 2048 / n, layer_norm_task, &j);
    return FPK_OK;
}

static void group_norm_task(void *arg, int64_t gb, int64_t ge, int th) {
    (void)th;
    norm_job *j = arg;
    int64_t inner = j->n, cpg = j->cpg;
    for (int64_t g = gb; g < ge; g++) { /* g indexes (sample, group) */
        int64_t c0 = (g % j->groups) * cpg;
        const float *x = j->x + g * cpg * inner;
        float *y = j->y + g * cpg * inner;
        int64_t cnt = cpg * inner;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < cnt; i++) mean += x[i];
        mean /= (double)cnt;
        for (int64_t i = 0; i < cnt; i++) {
            double d = x[i] - mean;
            var += d * d;
        }
        var /= (double)cnt;
        float inv = (float)(1.0 / sqrt(var + j->eps));
        float m = (float)mean;
        for (int64_t c = 0; c < cpg; c++) {
            /* (x - mean) first: folding the mean into the shift loses digits when the
             * variance is tiny next to the mean (flat image regions) */
            float sc = inv * (j->w ? j->w[c0 + c] : 1.0f);
            float sh = j->b ? j->b[c0 + c] : 0.0f;
            const float *xc = x + c * inner;
            float *yc = y + c * inner;
            for (int64_t i = 0; i < inner; i++) yc[i] = (xc[i] - m) * sc + sh;
        }
    }
}

static fpk_status cpu_group_norm(void *ctx, void *stream, int64_t groups, float eps, fpk_tensor_t x,
                                 fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &w, &b, &out};
    FPK_CPU_WIDE(ctx, io, 3, cpu_group_norm(ctx, stream, groups, eps, x, w, b, out));
    const char *op = "group norm";
    REQ(op, x);
    REQ(op, w);
    REQ(op, b);
    REQ(op, out);
    if (x->numel == 0) return FPK_OK;
    int64_t N = x->shape[0], C = x->shape[1];
    norm_job j = {.x = CF(x), .w = w ? CF(w) : NULL, .b = b ? CF(b) : NULL, .y = F(out),
                  .n = x->numel / (N * C), .cpg = C / groups, .groups = groups, .eps = eps};
    fpk_pool_run(CTX(ctx)->pool, N * groups, 1, group_norm_task, &j);
    return FPK_OK;
}

/* ---- rope ----------------------------------------------------------------------------------- */

typedef struct {
    const float *x, *cos, *sin;
    float *y;
    int nd; /* leading dims (x's rank - 1) */
    int64_t D;
    int halves; /* FPK_ROPE_HALVES: pairs (i, i + D/2) */
    int norm;   /* rms norm of each row first (rms_norm_rope), weight w or none */
    const float *w;
    float eps;
    int64_t shape[FPK_MAX_DIMS], sc[FPK_MAX_DIMS], ss[FPK_MAX_DIMS];
} rope_job;

/* One row of rms_norm_rope: x·inv·w in f32 (inv = 1/sqrt(mean(x²) + eps), the sum in double as
 * rms norm's), rotated in place of rope's plain x (y may be x). */
static void rope_norm_row(const rope_job *j, const float *x, const float *cs, const float *sn, float *y) {
    int64_t D = j->D;
    double ss = 0;
    for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)D + j->eps));
    int64_t h = j->halves ? D / 2 : 1, np = D / 2;
    for (int64_t p = 0; p < np; p++) {
        int64_t i0 = j->halves ? p : 2 * p, i1 = i0 + h;
        float x0 = x[i0] * inv, x1 = x[i1] * inv;
        if (j->w) {
            x0 *= j->w[i0];
            x1 *= j->w[i1];
        }
        y[i0] = x0 * cs[i0] - x1 * sn[i0];
        y[i1] = x1 * cs[i1] + x0 * sn[i1];
    }
}

static void rope_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    rope_job *j = arg;
    int64_t D = j->D;
    for (int64_t r = rb; r < re; r++) {
        int64_t oc = 0, os = 0, rem = r;
        for (int d = j->nd - 1; d >= 0; d--) {
            int64_t c = rem % j->shape[d];
            rem /= j->shape[d];
            oc += c * j->sc[d];
            os += c * j->ss[d];
        }
        const float *x = j->x + r * D, *cs = j->cos + oc, *sn = j->sin + os;
        float *y = j->y + r * D;
        if (j->norm) {
            rope_norm_row(j, x, cs, sn, y);
            continue;
        }
        if (j->halves) {
            int64_t h = D / 2;
            for (int64_t i = 0; i < h; i++) {
                float x0 = x[i], x1 = x[i + h];
                y[i] = x0 * cs[i] - x1 * sn[i];
                y[i + h] = x1 * cs[i + h] + x0 * sn[i + h];
            }
            continue;
        }
        for (int64_t i = 0; i < D; i += 2) {
            float x0 = x[i], x1 = x[i + 1];
            y[i] = x0 * cs[i] - x1 * sn[i];
            y[i + 1] = x1 * cs[i + 1] + x0 * sn[i + 1];
        }
    }
}

static fpk_status rope_run(void *ctx, const char *op, fpk_rope_mode mode, int norm, float eps,
                           fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t cos, fpk_tensor_t sin,
                           fpk_tensor_t out) {
    REQ(op, x);
    REQ(op, w);
    REQ(op, cos);
    REQ(op, sin);
    REQ(op, out);
    if (x->numel == 0) return FPK_OK;
    rope_job j = {.x = CF(x), .cos = CF(cos), .sin = CF(sin), .y = F(out), .nd = x->ndim - 1,
                  .D = x->shape[x->ndim - 1], .halves = mode == FPK_ROPE_HALVES, .norm = norm,
                  .w = w ? CF(w) : NULL, .eps = eps};
    int64_t sc[FPK_MAX_DIMS], ss[FPK_MAX_DIMS];
    bcast_strides(cos, x->ndim, x->shape, sc);
    bcast_strides(sin, x->ndim, x->shape, ss);
    for (int d = 0; d < j.nd; d++) {
        j.shape[d] = x->shape[d];
        j.sc[d] = sc[d];
        j.ss[d] = ss[d];
    }
    fpk_pool_run(CTX(ctx)->pool, x->numel / j.D, 4096 / j.D + 1, rope_task, &j);
    return FPK_OK;
}

static fpk_status cpu_rope(void *ctx, void *stream, fpk_rope_mode mode, fpk_tensor_t x, fpk_tensor_t cos,
                           fpk_tensor_t sin, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &cos, &sin, &out};
    FPK_CPU_WIDE(ctx, io, 3, cpu_rope(ctx, stream, mode, x, cos, sin, out));
    return rope_run(ctx, "rope", mode, 0, 0, x, NULL, cos, sin, out);
}

static fpk_status cpu_rms_norm_rope(void *ctx, void *stream, fpk_rope_mode mode, float eps, fpk_tensor_t x,
                                    fpk_tensor_t w, fpk_tensor_t cos, fpk_tensor_t sin, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &w, &cos, &sin, &out};
    FPK_CPU_WIDE(ctx, io, 4, cpu_rms_norm_rope(ctx, stream, mode, eps, x, w, cos, sin, out));
    return rope_run(ctx, "rms norm rope", mode, 1, eps, x, w, cos, sin, out);
}

/* ---- data movement (any dtype, by element size) ---------------------------------------------- */

typedef struct {
    const char *src;
    char *dst;
    size_t es;
    int nd;
    int64_t oshape[FPK_MAX_DIMS]; /* output shape */
    int64_t sst[FPK_MAX_DIMS];    /* source stride (elements) per output dim */
    int64_t before[FPK_MAX_DIMS], ishape[FPK_MAX_DIMS];
    int64_t scale[FPK_MAX_DIMS];
    int mode;
} move_job;

/* permute: rows of the output's last dim; source offset from strides */
static void permute_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    move_job *j = arg;
    int nd = j->nd;
    int64_t inner = j->oshape[nd - 1], si = j->sst[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t off = 0, rem = r;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t c = rem % j->oshape[d];
            rem /= j->oshape[d];
            off += c * j->sst[d];
        }
        char *y = j->dst + (size_t)(r * inner) * j->es;
        const char *x = j->src + (size_t)off * j->es;
        if (si == 1) {
            memcpy(y, x, (size_t)inner * j->es);
        } else if (j->es == 4) {
            for (int64_t i = 0; i < inner; i++) ((uint32_t *)y)[i] = *(const uint32_t *)(x + (size_t)(i * si) * 4);
        } else if (j->es == 2) {
            for (int64_t i = 0; i < inner; i++) ((uint16_t *)y)[i] = *(const uint16_t *)(x + (size_t)(i * si) * 2);
        } else {
            for (int64_t i = 0; i < inner; i++) memcpy(y + (size_t)i * j->es, x + (size_t)(i * si) * j->es, j->es);
        }
    }
}

static fpk_status cpu_permute(void *ctx, void *stream, const int *perm, fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    if (out->numel == 0) return FPK_OK;
    move_job j = {.src = fpk_tensor_data(x), .dst = fpk_tensor_data(out), .es = fpk_dtype_size(x->dtype)};
    int64_t xst[FPK_MAX_DIMS], s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        xst[d] = s;
        s *= x->shape[d];
    }
    /* drop size-1 dims, then merge output dims that stay contiguous in the source */
    int m = 0;
    for (int i = 0; i < out->ndim; i++) {
        if (out->shape[i] == 1) continue;
        int64_t st = xst[perm[i]];
        if (m > 0 && j.sst[m - 1] == st * out->shape[i]) {
            j.oshape[m - 1] *= out->shape[i];
            j.sst[m - 1] = st;
            continue;
        }
        j.oshape[m] = out->shape[i];
        j.sst[m] = st;
        m++;
    }
    if (m == 0) {
        j.oshape[0] = 1;
        j.sst[0] = 1;
        m = 1;
    }
    j.nd = m;
    int64_t inner = j.oshape[m - 1];
    fpk_pool_run(CTX(ctx)->pool, out->numel / inner, inner >= 4096 ? 1 : 4096 / inner, permute_task, &j);
    return FPK_OK;
}

static fpk_status cpu_slice(void *ctx, void *stream, int dim, int64_t start, int64_t step,
                            fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    if (out->numel == 0) return FPK_OK;
    /* a slice is a strided view copied out: reuse permute's strided copy */
    move_job j = {.src = (const char *)fpk_tensor_data(x), .dst = fpk_tensor_data(out),
                  .es = fpk_dtype_size(x->dtype)};
    int64_t xst[FPK_MAX_DIMS], s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        xst[d] = s;
        s *= x->shape[d];
    }
    j.src += (size_t)(start * xst[dim]) * j.es;
    int m = 0;
    for (int i = 0; i < out->ndim; i++) {
        if (out->shape[i] == 1) continue;
        int64_t st = xst[i] * (i == dim ? step : 1);
        if (m > 0 && j.sst[m - 1] == st * out->shape[i]) {
            j.oshape[m - 1] *= out->shape[i];
            j.sst[m - 1] = st;
            continue;
        }
        j.oshape[m] = out->shape[i];
        j.sst[m] = st;
        m++;
    }
    if (m == 0) {
        j.oshape[0] = 1;
        j.sst[0] = 1;
        m = 1;
    }
    j.nd = m;
    int64_t inner = j.oshape[m - 1];
    fpk_pool_run(CTX(ctx)->pool, out->numel / inner, inner >= 4096 ? 1 : 4096 / inner, permute_task, &j);
    return FPK_OK;
}

static fpk_status cpu_concat(void *ctx, void *stream, int dim, int n, const fpk_tensor_t *in,
                             fpk_tensor_t out) {
    (void)ctx;
    (void)stream;
    size_t es = fpk_dtype_size(out->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= out->shape[d];
    for (int d = dim + 1; d < out->ndim; d++) inner *= out->shape[d];
    size_t orow = (size_t)(out->shape[dim] * inner) * es;
    char *y = fpk_tensor_data(out);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t irow = (size_t)(in[i]->shape[dim] * inner) * es;
        const char *x = fpk_tensor_data(in[i]);
        for (int64_t o = 0; o < outer; o++) memcpy(y + (size_t)o * orow + off, x + (size_t)o * irow, irow);
        off += irow;
    }
    return FPK_OK;
}

/* pad and upsample: rows of the output's last dim, each from one source row */
static void pad_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    move_job *j = arg;
    int nd = j->nd;
    size_t es = j->es;
    int64_t W = j->oshape[nd - 1], iw = j->ishape[nd - 1], bw = j->before[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t off = 0, rem = r, st = 1;
        int zero = 0;
        int64_t ist[FPK_MAX_DIMS];
        for (int d = nd - 1; d >= 0; d--) {
            ist[d] = st;
            st *= j->ishape[d];
        }
        for (int d = nd - 2; d >= 0; d--) {
            int64_t c = rem % j->oshape[d] - j->before[d];
            rem /= j->oshape[d];
            if (c < 0 || c >= j->ishape[d]) {
                if (j->mode == FPK_PAD_ZERO) zero = 1;
                c = c < 0 ? 0 : j->ishape[d] - 1;
            }
            off += c * ist[d];
        }
        char *y = j->dst + (size_t)(r * W) * es;
        if (zero) {
            memset(y, 0, (size_t)W * es);
            continue;
        }
        const char *x = j->src + (size_t)off * es;
        if (j->mode == FPK_PAD_ZERO) {
            memset(y, 0, (size_t)bw * es);
            memset(y + (size_t)(bw + iw) * es, 0, (size_t)(W - bw - iw) * es);
        } else {
            for (int64_t i = 0; i < bw; i++) memcpy(y + (size_t)i * es, x, es);
            for (int64_t i = bw + iw; i < W; i++) memcpy(y + (size_t)i * es, x + (size_t)(iw - 1) * es, es);
        }
        memcpy(y + (size_t)bw * es, x, (size_t)iw * es);
    }
}

static fpk_status cpu_pad(void *ctx, void *stream, fpk_pad_mode mode, const int64_t *before,
                          const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    (void)after;
    if (out->numel == 0) return FPK_OK;
    move_job j = {.src = fpk_tensor_data(x), .dst = fpk_tensor_data(out), .es = fpk_dtype_size(x->dtype),
                  .nd = x->ndim, .mode = (int)mode};
    if (x->ndim == 0) {
        memcpy(j.dst, j.src, j.es);
        return FPK_OK;
    }
    for (int d = 0; d < x->ndim; d++) {
        j.oshape[d] = out->shape[d];
        j.ishape[d] = x->shape[d];
        j.before[d] = before[d];
    }
    if (x->numel == 0) { /* zero padding of an empty tensor */
        memset(j.dst, 0, (size_t)out->numel * j.es);
        return FPK_OK;
    }
    int64_t W = out->shape[out->ndim - 1];
    fpk_pool_run(CTX(ctx)->pool, out->numel / W, W >= 4096 ? 1 : 4096 / W, pad_task, &j);
    return FPK_OK;
}

static void upsample_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    move_job *j = arg;
    int nd = j->nd;
    size_t es = j->es;
    int64_t W = j->oshape[nd - 1], iw = j->ishape[nd - 1], f = j->scale[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t off = 0, rem = r, st = iw;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t c = (rem % j->oshape[d]) / j->scale[d];
            rem /= j->oshape[d];
            off += c * st;
            st *= j->ishape[d];
        }
        char *y = j->dst + (size_t)(r * W) * es;
        const char *x = j->src + (size_t)off * es;
        if (f == 1) {
            memcpy(y, x, (size_t)W * es);
        } else if (es == 4) {
            for (int64_t i = 0; i < W; i++) ((uint32_t *)y)[i] = ((const uint32_t *)x)[i / f];
        } else {
            for (int64_t i = 0; i < W; i++) memcpy(y + (size_t)i * es, x + (size_t)(i / f) * es, es);
        }
    }
}

/* runs an upsample task over the output's rows: scale (and before, NULL for none) give the last
 * three dims' factors and leading pads */
static fpk_status run_upsample(void *ctx, const int64_t *scale, const int64_t *before, fpk_tensor_t x,
                               fpk_tensor_t out, fpk_pool_fn task) {
    if (out->numel == 0) return FPK_OK;
    move_job j = {.src = fpk_tensor_data(x), .dst = fpk_tensor_data(out), .es = fpk_dtype_size(x->dtype),
                  .nd = x->ndim};
    for (int d = 0; d < x->ndim; d++) {
        int i = d - (x->ndim - 3);
        j.oshape[d] = out->shape[d];
        j.ishape[d] = x->shape[d];
        j.scale[d] = i >= 0 ? scale[i] : 1;
        j.before[d] = i >= 0 && before ? before[i] : 0;
    }
    int64_t W = out->shape[out->ndim - 1];
    fpk_pool_run(CTX(ctx)->pool, out->numel / W, W >= 4096 ? 1 : 4096 / W, task, &j);
    return FPK_OK;
}

static fpk_status cpu_upsample_nearest3d(void *ctx, void *stream, const int64_t *scale,
                                         fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    return run_upsample(ctx, scale, NULL, x, out, upsample_task);
}

/* upsample then replicate pad (the last three dims): rows of the output's last dim, each from
 * one source row; out coordinate o → clamp(o − before, 0, n·scale − 1) / scale */
static void upsample_pad_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    move_job *j = arg;
    int nd = j->nd;
    size_t es = j->es;
    int64_t W = j->oshape[nd - 1], iw = j->ishape[nd - 1], f = j->scale[nd - 1], bw = j->before[nd - 1];
    for (int64_t r = rb; r < re; r++) {
        int64_t off = 0, rem = r, st = iw;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t c = rem % j->oshape[d] - j->before[d], up = j->ishape[d] * j->scale[d];
            rem /= j->oshape[d];
            c = (c < 0 ? 0 : c >= up ? up - 1 : c) / j->scale[d];
            off += c * st;
            st *= j->ishape[d];
        }
        char *y = j->dst + (size_t)(r * W) * es;
        const char *x = j->src + (size_t)off * es;
        for (int64_t i = 0; i < W; i++) {
            int64_t c = i - bw;
            c = (c < 0 ? 0 : c >= iw * f ? iw * f - 1 : c) / f;
            if (es == 4)
                ((uint32_t *)y)[i] = ((const uint32_t *)x)[c];
            else if (es == 2)
                ((uint16_t *)y)[i] = ((const uint16_t *)x)[c];
            else
                memcpy(y + (size_t)i * es, x + (size_t)c * es, es);
        }
    }
}

static fpk_status cpu_upsample_pad(void *ctx, void *stream, const int64_t *scale, const int64_t *before,
                                   const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    (void)after;
    return run_upsample(ctx, scale, before, x, out, upsample_pad_task);
}

typedef struct {
    const float *x;
    float *y;
    int64_t T, H, W, oT, oH, oW, k[3], s[3];
} pool_job;

static void avg_pool_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    pool_job *j = arg;
    float inv = 1.0f / (float)(j->k[0] * j->k[1] * j->k[2]);
    for (int64_t r = rb; r < re; r++) { /* r = (plane, ot, oh) */
        int64_t oh = r % j->oH, ot = (r / j->oH) % j->oT, pl = r / (j->oH * j->oT);
        const float *x = j->x + pl * j->T * j->H * j->W;
        float *y = j->y + r * j->oW;
        for (int64_t ow = 0; ow < j->oW; ow++) {
            float acc = 0;
            for (int64_t a = 0; a < j->k[0]; a++)
                for (int64_t b = 0; b < j->k[1]; b++) {
                    const float *row = x + ((ot * j->s[0] + a) * j->H + oh * j->s[1] + b) * j->W + ow * j->s[2];
                    for (int64_t c = 0; c < j->k[2]; c++) acc += row[c];
                }
            y[ow] = acc * inv;
        }
    }
}

static fpk_status cpu_avg_pool3d(void *ctx, void *stream, const int64_t *kernel, const int64_t *stride,
                                 fpk_tensor_t x, fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &out};
    FPK_CPU_WIDE(ctx, io, 1, cpu_avg_pool3d(ctx, stream, kernel, stride, x, out));
    const char *op = "avg pool3d";
    REQ(op, x);
    REQ(op, out);
    if (out->numel == 0) return FPK_OK;
    int n = x->ndim;
    pool_job j = {.x = CF(x), .y = F(out), .T = x->shape[n - 3], .H = x->shape[n - 2], .W = x->shape[n - 1],
                  .oT = out->shape[n - 3], .oH = out->shape[n - 2], .oW = out->shape[n - 1]};
    for (int i = 0; i < 3; i++) {
        j.k[i] = kernel[i];
        j.s[i] = stride[i];
    }
    fpk_pool_run(CTX(ctx)->pool, out->numel / j.oW, 64, avg_pool_task, &j);
    return FPK_OK;
}

typedef struct {
    const float *x;
    float *y;
    int64_t n, inner; /* reduced length; stride between its elements */
    int op;
} reduce_job;

/* r indexes (outer, inner) pairs of the output */
static void reduce_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    reduce_job *j = arg;
    for (int64_t r = rb; r < re; r++) {
        int64_t o = r / j->inner, i = r % j->inner;
        const float *x = j->x + o * j->n * j->inner + i;
        if (j->op == FPK_REDUCE_MAX) {
            float m = -INFINITY;
            for (int64_t k = 0; k < j->n; k++) {
                float v = x[k * j->inner];
                m = v > m || v != v ? v : m;
            }
            j->y[r] = m;
            continue;
        }
        double acc = 0;
        for (int64_t k = 0; k < j->n; k++) acc += x[k * j->inner];
        j->y[r] = (float)(j->op == FPK_REDUCE_MEAN ? acc / (double)j->n : acc);
    }
}

static fpk_status cpu_reduce(void *ctx, void *stream, fpk_reduce_op op, int dim, fpk_tensor_t x,
                             fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&x, &out};
    FPK_CPU_WIDE(ctx, io, 1, cpu_reduce(ctx, stream, op, dim, x, out));
    REQ("reduce", x);
    REQ("reduce", out);
    if (out->numel == 0) return FPK_OK;
    int64_t inner = 1;
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    reduce_job j = {.x = CF(x), .y = F(out), .n = x->shape[dim], .inner = inner, .op = (int)op};
    fpk_pool_run(CTX(ctx)->pool, out->numel, 4096 / (j.n ? j.n : 1) + 1, reduce_task, &j);
    return FPK_OK;
}

static fpk_status cpu_embedding(void *ctx, void *stream, fpk_tensor_t table, fpk_tensor_t ids,
                                fpk_tensor_t out) {
    (void)ctx;
    (void)stream;
    int64_t V = table->shape[0], D = table->shape[1];
    size_t row = (size_t)D * fpk_dtype_size(table->dtype);
    const int32_t *id = fpk_tensor_data(ids);
    for (int64_t i = 0; i < ids->numel; i++)
        if (id[i] < 0 || id[i] >= V)
            return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "embedding: id %d at %lld outside [0, %lld)",
                                 id[i], (long long)i, (long long)V);
    if (out->dtype != table->dtype) { /* a half table into f32 rows (the core allows floats only) */
        size_t orow = (size_t)D * fpk_dtype_size(out->dtype);
        for (int64_t i = 0; i < ids->numel; i++)
            fpk_convert((char *)fpk_tensor_data(out) + (size_t)i * orow, out->dtype,
                        (const char *)fpk_tensor_data(table) + (size_t)id[i] * row, table->dtype, (size_t)D);
        return FPK_OK;
    }
    for (int64_t i = 0; i < ids->numel; i++)
        memcpy((char *)fpk_tensor_data(out) + (size_t)i * row, (const char *)fpk_tensor_data(table) + (size_t)id[i] * row, row);
    return FPK_OK;
}

/* ---- table ------------------------------------------------------------------------------ */

static fpk_status cpu_conv3d_entry(void *ctx, void *stream, fpk_conv_tier tier,
                                   const fpk_conv3d_params *p, fpk_tensor_t x, fpk_tensor_t w,
                                   fpk_tensor_t bias, fpk_tensor_t out) {
    if (tier != FPK_CONV_TIER_CPU || (CTX(ctx)->flags & FPK_BACKEND_FLAG_TEST_HOST_BOUNCE))
        return fpk_set_error(FPK_ERR_UNAVAILABLE, "conv3d: cpu backend has no tier %d", (int)tier);
    return fpk_cpu_conv3d(ctx, stream, tier, p, x, w, bias, out);
}

static const struct fpk_backend_iface cpu_iface = {
    .api_version = FPK_API_VERSION,
    .name = "cpu",
    .free = cpu_free,
    .get_props = cpu_get_props,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .copy_h2d = cpu_memcpy,
    .copy_d2h = cpu_memcpy,
    .copy_d2d = cpu_memcpy,
    .host_convert = cpu_host_convert,
    .fill = cpu_fill,
    .gemm = cpu_gemm,
    .conv3d = cpu_conv3d_entry,
    .group_norm = cpu_group_norm,
    .group_norm_act = fpk_cpu_group_norm_act,
    .layer_norm = cpu_layer_norm,
    .rms_norm = cpu_rms_norm,
    .unary = cpu_unary,
    .affine = cpu_affine,
    .binary = cpu_binary,
    .softmax = cpu_softmax,
    .attention = fpk_cpu_attention,
    .rope = cpu_rope,
    .rms_norm_rope = cpu_rms_norm_rope,
    .gemm_q = cpu_gemm_q,
    .concat = cpu_concat,
    .slice = cpu_slice,
    .permute = cpu_permute,
    .pad = cpu_pad,
    .upsample_nearest3d = cpu_upsample_nearest3d,
    .upsample_pad = cpu_upsample_pad,
    .avg_pool3d = cpu_avg_pool3d,
    .reduce = cpu_reduce,
    .copy = cpu_copy,
    .embedding = cpu_embedding,
    .ternary = cpu_ternary,
};

static int online_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void cpu_model_name(char *buf, size_t n) {
    snprintf(buf, n, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

fpk_status fpk_cpu_create(const fpk_backend_config *config, const struct fpk_backend_iface **iface,
                          void **ctx) {
    fpk_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return fpk_set_oom(sizeof *c, 0, "host allocation of cpu backend");
    c->threads = config->threads > 0 ? config->threads : online_cpus();
    c->flags = config->flags;
    c->pool = fpk_pool_new(c->threads);
    if (!c->pool) {
        int n = c->threads;
        free(c);
        return fpk_set_error(FPK_ERR_INTERNAL, "cpu backend: cannot start %d threads", n);
    }
    c->threads = fpk_pool_threads(c->pool);
    openblas_set_num_threads(c->threads);
    cpu_model_name(c->device_name, sizeof c->device_name);
    *iface = &cpu_iface;
    *ctx = c;
    return FPK_OK;
}
