/*
 * fpk_cpu_attention.c — scaled dot-product attention, two tiers:
 *   flash    (FPK_ATTN_TIER_FLASH, _CPU, _AUTO): per (batch, head, tile of queries) the keys
 *            stream through in tiles with an online softmax (running max and sum, f32), so the
 *            score matrix never exists: each pool thread holds one tile of queries, one tile of
 *            transposed keys, one tile of scores and its output rows, O((BQ + BK)·D) floats;
 *            the tile products run in 4 × 16 register blocks (8-lane vectors, AVX2 clone).
 *   chunked  (FPK_ATTN_TIER_CHUNKED): per (batch, head, chunk) S = q kᵀ (SGEMM), mask, row
 *            softmax, out = S v (SGEMM). Scratch is one chunk of scores.
 * Both read [B, H, L, D] or [B, L, H, D] operands through strides (fpk_attention_layout).
 */
#include "fpk_cpu.h"
#include "fpk_scratch.h"
#include "fpk_cpu_vexp.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Scores kept per chunk (floats) when the caller gives no chunk size. */
#define SCORE_BUDGET FPK_CPU_SCORE_BUDGET /* fpk_scratch.h */

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

/* Element strides (batch, position, head) of a 4-d attention operand in the given layout. */
static void attn_strides(const fpk_tensor_t t, int layout, int64_t st[3]) {
    int64_t d1 = t->shape[1], d2 = t->shape[2], d3 = t->shape[3];
    st[0] = d1 * d2 * d3;
    if (layout == FPK_ATTN_BLHD) { /* [B, L, H, D] */
        st[1] = d2 * d3;
        st[2] = d3;
    } else { /* [B, H, L, D] */
        st[1] = d3;
        st[2] = d2 * d3;
    }
}

/* Mask strides over [B, H, Lq, Lk] (0 where broadcast). */
static void mask_strides(fpk_tensor_t mask, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t mst[4]) {
    for (int i = 0; i < 4; i++) mst[i] = 0;
    if (!mask) return;
    int64_t full[4] = {B, H, Lq, Lk}, stride = 1;
    for (int i = 3; i >= 0; i--) {
        int im = mask->ndim - 4 + i;
        int64_t d = im >= 0 ? mask->shape[im] : 1;
        mst[i] = (im < 0 || (d == 1 && full[i] != 1)) ? 0 : stride;
        if (im >= 0) stride *= d;
    }
}

/* ---- flash tier ------------------------------------------------------------------------------ */

#define FLASH_BQ 32 /* queries per tile */
#define FLASH_BK 64 /* keys per tile */

typedef struct {
    const float *q, *k, *v;
    float *o;
    const uint8_t *m;
    int64_t H, rep, Lq, Lk, D, Dv, nqt;
    int64_t qs[3], ks[3], vs[3], os[3], mst[4];
    float scale;
    float *scratch;
    int64_t per_thread; /* floats of scratch per thread */
} flash_job;

/* S[i][j] = Σ_d Q[i][d]·Kt[d][j] for the BQ × BK tile (Q rows padded with zeros to BQ): blocks
 * of 4 rows × 16 keys held in eight 8-lane accumulators, one pass over d. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void flash_scores(float *restrict S, const float *restrict Q, const float *restrict kt, int64_t D) {
    for (int i = 0; i < FLASH_BQ; i += 4)
        for (int j = 0; j < FLASH_BK; j += 16) {
            fpk_v8f a00 = FPK_V8F(0.0f), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                    a31 = a00;
            const float *q0 = Q + i * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
            for (int64_t d = 0; d < D; d++) {
                fpk_v8f k0, k1;
                memcpy(&k0, kt + d * FLASH_BK + j, sizeof k0);
                memcpy(&k1, kt + d * FLASH_BK + j + 8, sizeof k1);
                fpk_v8f b0 = FPK_V8F(q0[d]), b1 = FPK_V8F(q1[d]), b2 = FPK_V8F(q2[d]), b3 = FPK_V8F(q3[d]);
                a00 += b0 * k0, a01 += b0 * k1;
                a10 += b1 * k0, a11 += b1 * k1;
                a20 += b2 * k0, a21 += b2 * k1;
                a30 += b3 * k0, a31 += b3 * k1;
            }
            float *s = S + i * FLASH_BK + j;
            memcpy(s, &a00, 32), memcpy(s + 8, &a01, 32);
            memcpy(s + FLASH_BK, &a10, 32), memcpy(s + FLASH_BK + 8, &a11, 32);
            memcpy(s + 2 * FLASH_BK, &a20, 32), memcpy(s + 2 * FLASH_BK + 8, &a21, 32);
            memcpy(s + 3 * FLASH_BK, &a30, 32), memcpy(s + 3 * FLASH_BK + 8, &a31, 32);
        }
}

/* O[i][x] += Σ_j P[i][j]·V[j][x] over nk keys (V rows vl apart), rows < nrows (a multiple of
 * 4): blocks of 4 rows × 16 columns in eight accumulators, a scalar tail for Dv % 16. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void flash_pv(float *restrict O, const float *restrict P, const float *restrict V, int64_t vl, int64_t nk,
                     int64_t Dv, int nrows) {
    int64_t xv = Dv / 16 * 16;
    for (int i = 0; i < nrows; i += 4) {
        const float *p0 = P + i * FLASH_BK, *p1 = p0 + FLASH_BK, *p2 = p1 + FLASH_BK, *p3 = p2 + FLASH_BK;
        float *o0 = O + i * Dv, *o1 = o0 + Dv, *o2 = o1 + Dv, *o3 = o2 + Dv;
        for (int64_t x = 0; x < xv; x += 16) {
            fpk_v8f a00, a01, a10, a11, a20, a21, a30, a31;
            memcpy(&a00, o0 + x, 32), memcpy(&a01, o0 + x + 8, 32);
            memcpy(&a10, o1 + x, 32), memcpy(&a11, o1 + x + 8, 32);
            memcpy(&a20, o2 + x, 32), memcpy(&a21, o2 + x + 8, 32);
            memcpy(&a30, o3 + x, 32), memcpy(&a31, o3 + x + 8, 32);
            for (int64_t j = 0; j < nk; j++) {
                fpk_v8f v0, v1;
                memcpy(&v0, V + j * vl + x, 32);
                memcpy(&v1, V + j * vl + x + 8, 32);
                fpk_v8f b0 = FPK_V8F(p0[j]), b1 = FPK_V8F(p1[j]), b2 = FPK_V8F(p2[j]), b3 = FPK_V8F(p3[j]);
                a00 += b0 * v0, a01 += b0 * v1;
                a10 += b1 * v0, a11 += b1 * v1;
                a20 += b2 * v0, a21 += b2 * v1;
                a30 += b3 * v0, a31 += b3 * v1;
            }
            memcpy(o0 + x, &a00, 32), memcpy(o0 + x + 8, &a01, 32);
            memcpy(o1 + x, &a10, 32), memcpy(o1 + x + 8, &a11, 32);
            memcpy(o2 + x, &a20, 32), memcpy(o2 + x + 8, &a21, 32);
            memcpy(o3 + x, &a30, 32), memcpy(o3 + x + 8, &a31, 32);
        }
        for (int r = 0; r < 4; r++)
            for (int64_t x = xv; x < Dv; x++) {
                float acc = O[(i + r) * Dv + x];
                for (int64_t j = 0; j < nk; j++) acc += P[(i + r) * FLASH_BK + j] * V[j * vl + x];
                O[(i + r) * Dv + x] = acc;
            }
    }
}

/* The online softmax step for one tile of scores S [nrows][BK] (nk keys valid): masks (mask rows
 * mq + i·mq_q, keys m_k apart; rows past nq unmasked), raises each row's running max mx, turns
 * the scores into exp(s − max) in place (8-lane exp), adds them to sum and rescales the output
 * rows O by exp(old max − new max). A row with every key so far masked stays at zero. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void flash_softmax(float *S, const uint8_t *mq, int64_t mq_q, int64_t m_k, int64_t nq, int nrows, int64_t nk,
                          float *mx, float *sum, float *O, int64_t Dv) {
    for (int i = 0; i < nrows; i++) {
        float *si = S + i * FLASH_BK;
        const uint8_t *mr = mq && i < nq ? mq + i * mq_q : NULL;
        for (int64_t jj = nk; jj < FLASH_BK; jj++) si[jj] = -INFINITY;
        float m = mx[i];
        for (int64_t jj = 0; jj < nk; jj++) {
            if (mr && !mr[jj * m_k]) si[jj] = -INFINITY;
            if (si[jj] > m) m = si[jj];
        }
        if (m == -INFINITY) { /* every key so far masked: nothing to add */
            for (int jj = 0; jj < FLASH_BK; jj++) si[jj] = 0.0f;
            continue;
        }
        float alpha = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);
        const fpk_v8f vm = FPK_V8F(m);
        fpk_v8f acc = FPK_V8F(0.0f);
        for (int jj = 0; jj < FLASH_BK; jj += 8) {
            fpk_v8f v;
            memcpy(&v, si + jj, sizeof v);
            v = v - vm;
            fpk_v8f e = FPK_V8_SELECT(v < FPK_V8F(-87.0f), FPK_V8F(0.0f), FPK_V8_EXP(v));
            memcpy(si + jj, &e, sizeof e);
            acc += e;
        }
        float add = 0.0f;
        for (int l = 0; l < 8; l++) add += acc[l];
        sum[i] = sum[i] * alpha + add;
        mx[i] = m;
        if (alpha != 1.0f) {
            float *oi = O + i * Dv;
            for (int64_t x = 0; x < Dv; x++) oi[x] *= alpha;
        }
    }
}

static void flash_task(void *arg, int64_t begin, int64_t end, int th) {
    const flash_job *j = arg;
    const int64_t D = j->D, Dv = j->Dv;
    float *kt = j->scratch + (int64_t)th * j->per_thread; /* [D][BK] */
    float *qt = kt + D * FLASH_BK;                        /* [BQ][D], scaled, zero rows past Lq */
    float *ot = qt + FLASH_BQ * D;                        /* [BQ][Dv] */
    float *s = ot + FLASH_BQ * Dv;                        /* [BQ][BK] */
    float mx[FLASH_BQ], sum[FLASH_BQ];
    for (int64_t it = begin; it < end; it++) {
        int64_t qtile = it % j->nqt, bh = it / j->nqt, h = bh % j->H, b = bh / j->H, hk = h / j->rep;
        int64_t q0 = qtile * FLASH_BQ, nq = j->Lq - q0 < FLASH_BQ ? j->Lq - q0 : FLASH_BQ;
        int nrows = (int)((nq + 3) / 4 * 4);
        const float *qb = j->q + b * j->qs[0] + h * j->qs[2];
        const float *kb = j->k + b * j->ks[0] + hk * j->ks[2];
        const float *vb = j->v + b * j->vs[0] + hk * j->vs[2];
        for (int64_t i = 0; i < FLASH_BQ; i++) {
            const float *src = qb + (q0 + i) * j->qs[1];
            for (int64_t d = 0; d < D; d++) qt[i * D + d] = i < nq ? src[d] * j->scale : 0.0f;
            for (int64_t x = 0; x < Dv; x++) ot[i * Dv + x] = 0.0f;
            mx[i] = -INFINITY;
            sum[i] = 0.0f;
        }
        const uint8_t *mb = j->m ? j->m + b * j->mst[0] + h * j->mst[1] : NULL;
        for (int64_t k0 = 0; k0 < j->Lk; k0 += FLASH_BK) {
            int64_t nk = j->Lk - k0 < FLASH_BK ? j->Lk - k0 : FLASH_BK;
            for (int64_t jj = 0; jj < FLASH_BK; jj++) {
                if (jj < nk) {
                    const float *kr = kb + (k0 + jj) * j->ks[1];
                    for (int64_t d = 0; d < D; d++) kt[d * FLASH_BK + jj] = kr[d];
                } else
                    for (int64_t d = 0; d < D; d++) kt[d * FLASH_BK + jj] = 0.0f;
            }
            flash_scores(s, qt, kt, D);
            const uint8_t *mq = mb ? mb + q0 * j->mst[2] + k0 * j->mst[3] : NULL;
            flash_softmax(s, mq, j->mst[2], j->mst[3], nq, nrows, nk, mx, sum, ot, Dv);
            flash_pv(ot, s, vb + k0 * j->vs[1], j->vs[1], nk, Dv, nrows);
        }
        for (int64_t i = 0; i < nq; i++) {
            float *dst = j->o + b * j->os[0] + (q0 + i) * j->os[1] + h * j->os[2];
            float inv = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
            for (int64_t x = 0; x < Dv; x++) dst[x] = ot[i * Dv + x] * inv;
        }
    }
}

static fpk_status cpu_flash(fpk_cpu_ctx *c, const fpk_attention_params *p, fpk_tensor_t q, fpk_tensor_t k,
                            fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out, int64_t B, int64_t H,
                            int64_t Lq, int64_t D, int64_t Hkv, int64_t Lk, int64_t Dv, float scale) {
    flash_job j = {.q = fpk_tensor_data(q), .k = fpk_tensor_data(k), .v = fpk_tensor_data(v),
                   .o = fpk_tensor_data(out), .m = mask ? fpk_tensor_data(mask) : NULL,
                   .H = H, .rep = H / Hkv, .Lq = Lq, .Lk = Lk, .D = D, .Dv = Dv,
                   .nqt = (Lq + FLASH_BQ - 1) / FLASH_BQ, .scale = scale};
    attn_strides(q, p->layout, j.qs);
    attn_strides(k, p->layout, j.ks);
    attn_strides(v, p->layout, j.vs);
    attn_strides(out, p->layout, j.os);
    mask_strides(mask, B, H, Lq, Lk, j.mst);
    int64_t items = B * H * j.nqt;
    int64_t threads = fpk_pool_threads(c->pool);
    if (threads > items) threads = items;
    if (threads < 1) threads = 1;
    j.per_thread = D * FLASH_BK + FLASH_BQ * D + FLASH_BQ * Dv + FLASH_BQ * FLASH_BK;
    j.per_thread = (j.per_thread + 15) & ~(int64_t)15; /* 64-byte apart */
    size_t bytes = (size_t)(j.per_thread * fpk_pool_threads(c->pool)) * sizeof(float);
    fpk_status st = fpk_cpu_scratch(q, bytes, (void **)&j.scratch);
    if (st != FPK_OK) return st;
    fpk_pool_run(c->pool, items, 1, flash_task, &j);
    fpk_cpu_scratch_free(q, j.scratch, bytes);
    return FPK_OK;
}

/* ---- chunked tier ---------------------------------------------------------------------------- */

static fpk_status cpu_chunked(fpk_cpu_ctx *c, const fpk_attention_params *p, fpk_tensor_t q, fpk_tensor_t k,
                              fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out, int64_t B, int64_t H,
                              int64_t Lq, int64_t D, int64_t Hkv, int64_t Lk, int64_t Dv, float scale) {
    fpk_status st;
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
    int64_t mst[4], qs[3], ks[3], vs[3], os[3];
    mask_strides(mask, B, H, Lq, Lk, mst);
    attn_strides(q, p->layout, qs);
    attn_strides(k, p->layout, ks);
    attn_strides(v, p->layout, vs);
    attn_strides(out, p->layout, os);
    float *od = fpk_tensor_data(out);
    const float *qd = fpk_tensor_data(q), *kd = fpk_tensor_data(k), *vd = fpk_tensor_data(v);
    int64_t rep = H / Hkv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / rep;
            const float *kh = kd + b * ks[0] + hk * ks[2], *vh = vd + b * vs[0] + hk * vs[2];
            for (int64_t q0 = 0; q0 < Lq; q0 += chunk) {
                int64_t n = Lq - q0 < chunk ? Lq - q0 : chunk;
                const float *qh = qd + b * qs[0] + h * qs[2] + q0 * qs[1];
                if (D == 0)
                    memset(s, 0, (size_t)(n * Lk) * sizeof(float));
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n, (blasint)Lk,
                                (blasint)D, scale, qh, (blasint)qs[1], kh, (blasint)ks[1], 0.0f, s, (blasint)Lk);
                if (mask) {
                    mask_job mj = {.s = s,
                                   .m = (const uint8_t *)fpk_tensor_data(mask) + b * mst[0] + h * mst[1] +
                                        q0 * mst[2],
                                   .Lk = Lk, .ms_q = mst[2], .ms_k = mst[3]};
                    fpk_pool_run(c->pool, n, 4096 / Lk + 1, mask_task, &mj);
                }
                fpk_cpu_softmax_rows(c, s, n, Lk, 1.0f);
                float *oh = od + b * os[0] + h * os[2] + q0 * os[1];
                if (Dv > 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)Dv,
                                (blasint)Lk, 1.0f, s, (blasint)Lk, vh, (blasint)vs[1], 0.0f, oh, (blasint)os[1]);
            }
        }
    fpk_cpu_scratch_free(q, s, sbytes);
    return FPK_OK;
}

fpk_status fpk_cpu_attention(void *ctx, void *stream, const fpk_attention_params *p,
                             fpk_tensor_t q, fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask,
                             fpk_tensor_t out) {
    (void)stream;
    fpk_tensor_t *io[] = {&q, &k, &v, &out};
    FPK_CPU_WIDE(ctx, io, 3, fpk_cpu_attention(ctx, stream, p, q, k, v, mask, out));
    fpk_cpu_ctx *c = ctx;
    const char *op = "attention";
    fpk_status st;
    if (p->tier == FPK_ATTN_TIER_VENDOR)
        return fpk_set_error(FPK_ERR_UNAVAILABLE, "%s: the cpu backend has no vendor attention", op);
    if (p->tier == FPK_ATTN_TIER_CPU && (c->flags & FPK_BACKEND_FLAG_TEST_HOST_BOUNCE))
        return fpk_set_error(FPK_ERR_UNAVAILABLE, "%s: cpu tier refused (test host bounce)", op);
    if ((st = fpk_cpu_require_f32(op, q, "q")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, k, "k")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, v, "v")) != FPK_OK) return st;
    if ((st = fpk_cpu_require_f32(op, out, "out")) != FPK_OK) return st;
    int blhd = p->layout == FPK_ATTN_BLHD;
    int64_t B = q->shape[0], H = q->shape[blhd ? 2 : 1], Lq = q->shape[blhd ? 1 : 2], D = q->shape[3];
    int64_t Hkv = k->shape[blhd ? 2 : 1], Lk = k->shape[blhd ? 1 : 2], Dv = v->shape[3];
    if (out->numel == 0) return FPK_OK;
    float *od = fpk_tensor_data(out);
    if (Lk == 0) {
        memset(od, 0, (size_t)out->numel * sizeof(float));
        return FPK_OK;
    }
    float scale = p->scale != 0 ? p->scale : (float)(1.0 / sqrt((double)(D ? D : 1)));
    if (p->tier == FPK_ATTN_TIER_CHUNKED)
        return cpu_chunked(c, p, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv, scale);
    return cpu_flash(c, p, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv, scale);
}
