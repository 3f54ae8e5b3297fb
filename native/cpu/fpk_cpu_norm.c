/*
 * fpk_cpu_norm.c — group norm with an activation in one pass over the output (SiLU after the
 * resnets' and the coders' norms): per (sample, group) the statistics in f64 (as the plain
 * group norm), then each channel row normalised, activated and stored once. x and out may be
 * f32, f16 or bf16; 16-bit rows go through an f32 buffer of BUF floats.
 */
#include "fpk_cpu.h"

#include <math.h>
#include <string.h>

#define BUF 1024

typedef struct {
    const void *x;
    void *y;
    int xdt, ydt;
    const void *w, *b;
    int wdt, bdt;
    int64_t inner, cpg, groups;
    float eps;
    int act;
} gna_job;

static inline float ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case FPK_F16: return fpk_f16_to_f32(((const uint16_t *)p)[i]);
    case FPK_BF16: return fpk_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Converts n floats of src to dt into dst + i0 elements. */
static void st_row(void *dst, int dt, int64_t i0, const float *src, int64_t n) {
    switch (dt) {
    case FPK_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i0 + i] = fpk_f32_to_f16(src[i]);
        break;
    case FPK_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i0 + i] = fpk_f32_to_bf16(src[i]);
        break;
    default: memcpy((float *)dst + i0, src, (size_t)n * sizeof(float));
    }
}

/* y = (x - m)·sc + sh, then the activation, for n elements from x's element i0 into buf. */
static void norm_row(float *buf, const void *x, int xdt, int64_t i0, int64_t n, float m, float sc, float sh, int act) {
    if (xdt == FPK_F32) {
        const float *xs = (const float *)x + i0;
        for (int64_t i = 0; i < n; i++) buf[i] = (xs[i] - m) * sc + sh;
    } else {
        for (int64_t i = 0; i < n; i++) buf[i] = (ld(x, xdt, i0 + i) - m) * sc + sh;
    }
    if (act == FPK_NORM_ACT_SILU) fpk_cpu_silu_row(buf, buf, n);
}

static void gna_task(void *arg, int64_t gb, int64_t ge, int th) {
    (void)th;
    gna_job *j = arg;
    int64_t inner = j->inner, cpg = j->cpg, cnt = cpg * inner;
    float buf[BUF];
    for (int64_t g = gb; g < ge; g++) { /* g indexes (sample, group) */
        int64_t c0 = (g % j->groups) * cpg, base = g * cnt;
        double mean = 0, var = 0;
        if (j->xdt == FPK_F32) {
            const float *x = (const float *)j->x + base;
            for (int64_t i = 0; i < cnt; i++) mean += x[i];
            mean /= (double)cnt;
            for (int64_t i = 0; i < cnt; i++) {
                double d = x[i] - mean;
                var += d * d;
            }
        } else {
            for (int64_t i = 0; i < cnt; i++) mean += ld(j->x, j->xdt, base + i);
            mean /= (double)cnt;
            for (int64_t i = 0; i < cnt; i++) {
                double d = ld(j->x, j->xdt, base + i) - mean;
                var += d * d;
            }
        }
        var /= (double)cnt;
        float inv = (float)(1.0 / sqrt(var + j->eps));
        float m = (float)mean;
        for (int64_t c = 0; c < cpg; c++) {
            /* (x - mean) first, as the plain group norm (flat regions keep their digits) */
            float sc = inv * (j->w ? ld(j->w, j->wdt, c0 + c) : 1.0f);
            float sh = j->b ? ld(j->b, j->bdt, c0 + c) : 0.0f;
            int64_t row = base + c * inner;
            if (j->ydt == FPK_F32) { /* straight into the output row */
                float *y = (float *)j->y + row;
                for (int64_t i = 0; i < inner; i += BUF * 64) {
                    int64_t n = inner - i < BUF * 64 ? inner - i : BUF * 64;
                    norm_row(y + i, j->x, j->xdt, row + i, n, m, sc, sh, j->act);
                }
                continue;
            }
            for (int64_t i = 0; i < inner; i += BUF) {
                int64_t n = inner - i < BUF ? inner - i : BUF;
                norm_row(buf, j->x, j->xdt, row + i, n, m, sc, sh, j->act);
                st_row(j->y, j->ydt, row + i, buf, n);
            }
        }
    }
}

static int float_dt(fpk_tensor_t t) { return !t || t->dtype == FPK_F32 || t->dtype == FPK_F16 || t->dtype == FPK_BF16; }

fpk_status fpk_cpu_group_norm_act(void *ctx, void *stream, int64_t groups, float eps, fpk_norm_act act,
                                  fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    (void)stream;
    if (!float_dt(x) || !float_dt(w) || !float_dt(b) || !float_dt(out))
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "group norm act: cpu backend takes f32, f16 or bf16 tensors");
    if (x->numel == 0) return FPK_OK;
    int64_t N = x->shape[0], C = x->shape[1];
    gna_job j = {.x = fpk_tensor_data(x), .y = fpk_tensor_data(out), .xdt = x->dtype, .ydt = out->dtype,
                 .w = w ? fpk_tensor_data(w) : NULL, .b = b ? fpk_tensor_data(b) : NULL,
                 .wdt = w ? w->dtype : FPK_F32, .bdt = b ? b->dtype : FPK_F32,
                 .inner = x->numel / (N * C), .cpg = C / groups, .groups = groups, .eps = eps, .act = act};
    fpk_pool_run(((fpk_cpu_ctx *)ctx)->pool, N * groups, 1, gna_task, &j);
    return FPK_OK;
}
