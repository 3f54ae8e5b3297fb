/*
 * fpk_cpu_attention.c — scaled dot-product attention in query chunks: per (batch, head, chunk)
 * S = q kᵀ (SGEMM), mask, row softmax, out = S v (SGEMM). Scratch is one chunk of scores.
 */
#include "fpk_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Scores kept per chunk (floats) when the caller gives no chunk size. */
#define SCORE_BUDGET ((int64_t)4 << 20)

typedef struct {
    float *s;
    const uint8_t *m;
    int64_t Lk, ms_q, ms_k; /* mask strides for query and key (0 when broadcast) */
} mask_job;

static void mask_task(void *arg, int64_t rb, int64_t re, int th) {
    (void)th;
    mask_job *j = arg;
    for (int64_t r = rb; r < re; r++) {
        float *s = j->s + r * j->Lk;
        const uint8_t *m = j->m + r * j->ms_q;
        if (j->ms_k == 0) {
            if (!m[0])
                for (int64_t i = 0; i < j->Lk; i++) s[i] = -INFINITY;
            continue;
        }
        for (int64_t i = 0; i < j->Lk; i++)
            if (!m[i]) s[i] = -INFINITY;
    }
}

fpk_status fpk_cpu_attention(void *ctx, void *stream, const fpk_attention_params *p,
                             fpk_tensor_t q, fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask,
                             fpk_tensor_t out) {
    (void)stream;
    fpk_cpu_ctx *c = ctx;
    const char *op = "attention";
    fpk_status st;
    if ((st = fpk_cpu_require_f32(op, q, "q")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, k, "k")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, v, "v")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, out, "out")) != FPK_OK) return st;
    int64_t B = q->shape[0], H = q->shape[1], Lq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Lk = k->shape[2], Dv = v->shape[3];
    if (out->numel == 0) return FPK_OK;
    float *od = fpk_tensor_data(out);
    if (Lk == 0) {
        memset(od, 0, (size_t)out->numel * sizeof(float));
        return FPK_OK;
    }
    float scale = p->scale != 0 ? p->scale : (float)(1.0 / sqrt((double)(D ? D : 1)));
    int64_t chunk = p->query_chunk > 0 ? p->query_chunk : SCORE_BUDGET / Lk;
    if (chunk < 1) chunk = 1;
    if (chunk > Lq) chunk = Lq;
    size_t sbytes = (size_t)chunk * (size_t)Lk * sizeof(float);
    float *s = NULL;
    st = fpk_cpu_scratch(q, sbytes, (void **)&s);
    /* with the default chunk, shrink it under memory pressure instead of failing */
    while (st == FPK_ERR_OUT_OF_MEMORY && p->query_chunk == 0 && chunk > 1) {
        chunk /= 2;
        sbytes = (size_t)chunk * (size_t)Lk * sizeof(float);
        st = fpk_cpu_scratch(q, sbytes, (void **)&s);
    }
    if (st != FPK_OK) return st;
    fpk_clear_error();
    /* mask strides over [B, H, Lq, Lk] */
    int64_t mst[4] = {0, 0, 0, 0};
    if (mask) {
        int64_t full[4] = {B, H, Lq, Lk}, stride = 1;
        for (int i = 3; i >= 0; i--) {
            int im = mask->ndim - 4 + i;
            int64_t d = im >= 0 ? mask->shape[im] : 1;
            mst[i] = (im < 0 || (d == 1 && full[i] != 1)) ? 0 : stride;
            if (im >= 0) stride *= d;
        }
    }
    const float *qd = fpk_tensor_data(q), *kd = fpk_tensor_data(k), *vd = fpk_tensor_data(v);
    int64_t rep = H / Hkv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / rep;
            const float *kh = kd + (b * Hkv + hk) * Lk * D, *vh = vd + (b * Hkv + hk) * Lk * Dv;
            for (int64_t q0 = 0; q0 < Lq; q0 += chunk) {
                int64_t n = Lq - q0 < chunk ? Lq - q0 : chunk;
                const float *qh = qd + ((b * H + h) * Lq + q0) * D;
                if (D == 0)
                    memset(s, 0, (size_t)(n * Lk) * sizeof(float));
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n, (blasint)Lk,
                                (blasint)D, scale, qh, (blasint)D, kh, (blasint)D, 0.0f, s, (blasint)Lk);
                if (mask) {
                    mask_job mj = {.s = s,
                                   .m = (const uint8_t *)fpk_tensor_data(mask) + b * mst[0] + h * mst[1] +
                                        q0 * mst[2],
                                   .Lk = Lk, .ms_q = mst[2], .ms_k = mst[3]};
                    fpk_pool_run(c->pool, n, 4096 / Lk + 1, mask_task, &mj);
                }
                fpk_cpu_softmax_rows(c, s, n, Lk, 1.0f);
                float *oh = od + ((b * H + h) * Lq + q0) * Dv;
                if (Dv > 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)Dv,
                                (blasint)Lk, 1.0f, s, (blasint)Lk, vh, (blasint)Dv, 0.0f, oh, (blasint)Dv);
            }
        }
    fpk_cpu_scratch_free(q, s, sbytes);
    return FPK_OK;
}
