/*
 * fpk_cpu_conv.c — conv3d on the cpu: im2col per output time slice and band of output rows
 * (scratch bounded by FPK_CPU_COL_BUDGET bytes), then one SGEMM per band; 1×1×1 convs are a plain GEMM.
 * An f16/bf16 weight is widened to f32 into scratch of at most FPK_CPU_WEIGHT_BUDGET bytes.
 */
#include "fpk_cpu.h"
#include "fpk_scratch.h"

#include <cblas.h>
#include <string.h>

/* Scratch bounds: FPK_CPU_COL_BUDGET and FPK_CPU_WEIGHT_BUDGET (fpk_scratch.h). */

typedef struct {
    const float *x; /* x[n, g*Cg] for this (n, g): [Cg, T, H, W] */
    float *col;     /* [K, rows*Wo] */
    int64_t Cg, T, H, W;
    int64_t kT, kH, kW;
    int64_t sT, sH, sW, pT, pH, pW;
    int64_t to, h0, rows, Wo;
} im2col_job;

static void im2col_task(void *arg, int64_t kb, int64_t ke, int th) {
    (void)th;
    im2col_job *j = arg;
    int64_t ncol = j->rows * j->Wo;
    for (int64_t k = kb; k < ke; k++) {
        int64_t kw = k % j->kW, kh = (k / j->kW) % j->kH, kt = (k / (j->kW * j->kH)) % j->kT;
        int64_t ci = k / (j->kW * j->kH * j->kT);
        float *dst = j->col + k * ncol;
        int64_t t = j->to * j->sT - j->pT + kt;
        if (t < 0 || t >= j->T) {
            memset(dst, 0, (size_t)ncol * sizeof(float));
            continue;
        }
        const float *plane = j->x + (ci * j->T + t) * j->H * j->W;
        for (int64_t r = 0; r < j->rows; r++) {
            float *d = dst + r * j->Wo;
            int64_t h = (j->h0 + r) * j->sH - j->pH + kh;
            if (h < 0 || h >= j->H) {
                memset(d, 0, (size_t)j->Wo * sizeof(float));
                continue;
            }
            const float *src = plane + h * j->W;
            /* ow range with 0 <= ow*sW - pW + kw < W */
            int64_t off = kw - j->pW;
            int64_t lo = off >= 0 ? 0 : (-off + j->sW - 1) / j->sW;
            int64_t hi = (j->W - 1 - off) >= 0 ? (j->W - 1 - off) / j->sW + 1 : 0;
            if (hi > j->Wo) hi = j->Wo;
            if (lo > hi) lo = hi;
            for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
            if (j->sW == 1) {
                memcpy(d + lo, src + lo + off, (size_t)(hi - lo) * sizeof(float));
            } else {
                for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * j->sW + off];
            }
            for (int64_t ow = hi; ow < j->Wo; ow++) d[ow] = 0;
        }
    }
}

/* The f32 rows [r0, r0 + nr) of group g's weight [Cog, K]: the tensor's own rows when it is
 * f32, else widened into panel (once per group when the panel holds all Cog rows). */
typedef struct {
    fpk_cpu_ctx *c;
    fpk_tensor_t w;
    int64_t Cog, K;
    float *panel;     /* NULL for an f32 weight */
    int64_t rows;     /* panel rows */
    int64_t g_loaded; /* group whose rows [0, Cog) the panel holds whole, -1 if none */
} weight_rows;

static const float *weight_get(weight_rows *wr, int64_t g, int64_t r0, int64_t nr) {
    if (!wr->panel) return (const float *)fpk_tensor_data(wr->w) + (g * wr->Cog + r0) * wr->K;
    if (wr->rows >= wr->Cog) {
        if (wr->g_loaded != g) {
            fpk_cpu_widen_2d(wr->c, wr->panel, wr->K, (const uint16_t *)fpk_tensor_data(wr->w) + g * wr->Cog * wr->K,
                             wr->K, wr->w->dtype, wr->Cog, wr->K);
            wr->g_loaded = g;
        }
        return wr->panel + r0 * wr->K;
    }
    fpk_cpu_widen_2d(wr->c, wr->panel, wr->K, (const uint16_t *)fpk_tensor_data(wr->w) + (g * wr->Cog + r0) * wr->K,
                     wr->K, wr->w->dtype, nr, wr->K);
    return wr->panel;
}

fpk_status fpk_cpu_conv3d(void *ctx, void *stream, fpk_conv_tier tier, const fpk_conv3d_params *p,
                          fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    (void)stream;
    if (fpk_conv_has_view(p)) /* the core pads (and upsamples) for it: the same sums */
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "conv3d: the cpu backend reads no input view");
    fpk_tensor_t *io[] = {&x, &bias, &out};
    FPK_CPU_WIDE(ctx, io, 2, fpk_cpu_conv3d(ctx, stream, tier, p, x, w, bias, out));
    (void)tier;
    fpk_cpu_ctx *c = ctx;
    const char *op = "conv3d";
    fpk_status st;
    if ((st = fpk_cpu_require_f32(op, x, "x")) != FPK_OK) return st;
    if (!fpk_cpu_is_half(w) && (st = fpk_cpu_require_f32(op, w, "w")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, bias, "bias")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, out, "out")) != FPK_OK) return st;
    int64_t N = x->shape[0], Cin = x->shape[1], T = x->shape[2], H = x->shape[3], W = x->shape[4];
    int64_t Cout = w->shape[0], kT = w->shape[2], kH = w->shape[3], kW = w->shape[4];
    int64_t To = out->shape[2], Ho = out->shape[3], Wo = out->shape[4];
    int64_t G = p->groups ? p->groups : 1, Cg = Cin / G, Cog = Cout / G;
    int64_t sT = p->stride[0] ? p->stride[0] : 1, sH = p->stride[1] ? p->stride[1] : 1,
            sW = p->stride[2] ? p->stride[2] : 1;
    int64_t K = Cg * kT * kH * kW;
    const float *xd = fpk_tensor_data(x);
    float *yd = fpk_tensor_data(out);
    int64_t ospatial = To * Ho * Wo, ispatial = T * H * W;
    if (out->numel == 0) return FPK_OK;
    if (K == 0 || Cog == 0) {
        memset(yd, 0, (size_t)out->numel * sizeof(float));
        if (bias) fpk_cpu_add_channel_bias(c, yd, fpk_tensor_data(bias), N, Cout, ospatial);
        return FPK_OK;
    }
    int pointwise = kT == 1 && kH == 1 && kW == 1 && sT == 1 && sH == 1 && sW == 1 && p->padding[0] == 0 &&
                    p->padding[1] == 0 && p->padding[2] == 0;
    float *col = NULL;
    size_t colbytes = 0;
    int64_t rows = 1;
    if (!pointwise) {
        rows = fpk_cpu_conv_band_rows(K, Wo, Ho);
        colbytes = (size_t)K * (size_t)rows * (size_t)Wo * sizeof(float);
        st = fpk_cpu_scratch(x, colbytes, (void **)&col);
        while (st == FPK_ERR_OUT_OF_MEMORY && rows > 1) { /* narrower bands under memory pressure */
            rows = (rows + 1) / 2;
            colbytes = (size_t)K * (size_t)rows * (size_t)Wo * sizeof(float);
            st = fpk_cpu_scratch(x, colbytes, (void **)&col);
        }
        if (st != FPK_OK) return st;
        fpk_clear_error();
    }
    /* an f16/bf16 weight is widened into a panel of output channels (a whole group when it fits) */
    weight_rows wr = {.c = c, .w = w, .Cog = Cog, .K = K, .rows = Cog, .g_loaded = -1};
    size_t pbytes = 0;
    if (fpk_cpu_is_half(w)) {
        st = fpk_cpu_panel_alloc(x, K, (int64_t)(FPK_CPU_WEIGHT_BUDGET / ((size_t)K * sizeof(float))), &wr.rows,
                                 &wr.panel, &pbytes);
        if (st != FPK_OK) {
            fpk_cpu_scratch_free(x, col, colbytes);
            return st;
        }
    }
    im2col_job j = {.col = col, .Cg = Cg, .T = T, .H = H, .W = W, .kT = kT, .kH = kH, .kW = kW,
                    .sT = sT, .sH = sH, .sW = sW, .pT = p->padding[0], .pH = p->padding[1],
                    .pW = p->padding[2], .Wo = Wo};
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < N; n++) {
            const float *xg = xd + (n * Cin + g * Cg) * ispatial;
            float *yg = yd + (n * Cout + g * Cog) * ospatial;
            if (pointwise) { /* out[n, g] = W_g [Cog, Cg] @ x[n, g] [Cg, THW] */
                for (int64_t r0 = 0; r0 < Cog; r0 += wr.rows) {
                    int64_t nr = Cog - r0 < wr.rows ? Cog - r0 : wr.rows;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)nr, (blasint)ospatial,
                                (blasint)K, 1.0f, weight_get(&wr, g, r0, nr), (blasint)K, xg,
                                (blasint)ospatial, 0.0f, yg + r0 * ospatial, (blasint)ospatial);
                }
                continue;
            }
            j.x = xg;
            for (int64_t to = 0; to < To; to++)
                for (int64_t h0 = 0; h0 < Ho; h0 += rows) {
                    j.to = to;
                    j.h0 = h0;
                    j.rows = Ho - h0 < rows ? Ho - h0 : rows;
                    int64_t ncol = j.rows * Wo;
                    fpk_pool_run(c->pool, K, ncol >= 1024 ? 1 : 1024 / ncol + 1, im2col_task, &j);
                    for (int64_t r0 = 0; r0 < Cog; r0 += wr.rows) {
                        int64_t nr = Cog - r0 < wr.rows ? Cog - r0 : wr.rows;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)nr, (blasint)ncol,
                                    (blasint)K, 1.0f, weight_get(&wr, g, r0, nr), (blasint)K, col,
                                    (blasint)ncol, 0.0f, yg + r0 * ospatial + to * Ho * Wo + h0 * Wo,
                                    (blasint)ospatial);
                    }
                }
        }
    fpk_cpu_scratch_free(x, col, colbytes);
    fpk_cpu_scratch_free(x, wr.panel, pbytes);
    if (bias) fpk_cpu_add_channel_bias(c, yd, fpk_tensor_data(bias), N, Cout, ospatial);
    return FPK_OK;
}
