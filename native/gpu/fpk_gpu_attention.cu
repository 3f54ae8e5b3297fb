/*
 * fpk_gpu_attention.cu — scaled dot-product attention as chunked batched GEMM + softmax: per
 * batch, per query group of a key head (grouped-query attention) and per chunk of queries,
 * S = scale·Q Kᵀ over every key head at once (one strided batched GEMM, f32 scores), a masked
 * row softmax into P (the values' dtype when they are 16-bit, so the second GEMM runs on the
 * matrix units), then O = P V written in place into the output. Scratch is one chunk of scores:
 * bounded by FRAMEPACK_GPU_ATTENTION_MIB (default 1024 MiB) whatever the sequence length.
 */
#include "fpk_gpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const void *elem(const void *p, int dt, int64_t i) { return (const char *)p + (size_t)i * fpk_dt_size(dt); }

static int64_t score_budget(void) {
    const char *e = getenv("FRAMEPACK_GPU_ATTENTION_MIB");
    long long mib = e ? atoll(e) : 0;
    if (mib <= 0) mib = 1024;
    return (int64_t)mib << 20;
}

extern "C" fpk_status fpk_gpu_attention(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf,
                                        const fpk_attention_params *p, const fpk_gt *q, const fpk_gt *k,
                                        const fpk_gt *v, const fpk_gt *mask, const fpk_gt *out) {
    cudaStream_t st = fpk_stream(c, s);
    int64_t B = q->shape[0], H = q->shape[1], Lq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Lk = k->shape[2], Dv = v->shape[3];
    if (out->numel == 0) return FPK_OK;
    if (Lk == 0) {
        FPK_CUDA(cudaMemsetAsync(out->data, 0, (size_t)out->numel * fpk_dt_size(out->dtype), st), "attention");
        return FPK_OK;
    }
    float scale = p->scale != 0 ? p->scale : (float)(1.0 / sqrt((double)(D ? D : 1)));
    int64_t rep = H / Hkv;
    /* FRAMEPACK_GPU_HALF_COMPUTE: f32 q, k, v go through the matrix units in bf16 (as PyTorch's
     * bf16 attention), scores and softmax staying f32 */
    fpk_gt qh, kh, vh;
    fpk_scratch sq(sf), sk(sf), sv(sf);
    if (c->half_compute && q->dtype == FPK_F32 && k->dtype == FPK_F32 && v->dtype == FPK_F32) {
        const fpk_gt *src[3] = {q, k, v};
        fpk_gt *dst[3] = {&qh, &kh, &vh};
        fpk_scratch *scr[3] = {&sq, &sk, &sv};
        for (int i = 0; i < 3; i++) {
            *dst[i] = *src[i];
            FPK_TRY(scr[i]->alloc((size_t)src[i]->numel * 2));
            FPK_TRY(fpk_gpu_convert(st, scr[i]->ptr, FPK_BF16, src[i]->data, FPK_F32, src[i]->numel));
            dst[i]->data = scr[i]->ptr;
            dst[i]->dtype = FPK_BF16;
        }
        q = &qh;
        k = &kh;
        v = &vh;
    }
    int pdt = (v->dtype == FPK_F16 || v->dtype == FPK_BF16) ? v->dtype : FPK_F32;
    int64_t row_bytes = Lk * 4 + (pdt != FPK_F32 ? Lk * 2 : 0);
    int64_t chunk = p->query_chunk > 0 ? p->query_chunk : score_budget() / (Hkv * row_bytes);
    if (chunk < 1) chunk = 1;
    if (chunk > Lq) chunk = Lq;
    fpk_scratch ss(sf), sp(sf);
    FPK_TRY(ss.alloc((size_t)(Hkv * chunk * Lk) * 4));
    float *S = (float *)ss.ptr;
    void *P = S;
    if (pdt != FPK_F32) {
        FPK_TRY(sp.alloc((size_t)(Hkv * chunk * Lk) * 2));
        P = sp.ptr;
    }
    /* mask strides over [B, H, Lq, Lk] (0 where broadcast) */
    int64_t mst[4] = {0, 0, 0, 0};
    if (mask) {
        int64_t full[4] = {B, H, Lq, Lk}, stride = 1;
        for (int i = 3; i >= 0; i--) {
            int im = mask->ndim - 4 + i;
            int64_t dd = im >= 0 ? mask->shape[im] : 1;
            mst[i] = (im < 0 || (dd == 1 && full[i] != 1)) ? 0 : stride;
            if (im >= 0) stride *= dd;
        }
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < rep; r++)
            for (int64_t q0 = 0; q0 < Lq; q0 += chunk) {
                int64_t n = Lq - q0 < chunk ? Lq - q0 : chunk;
                fpk_gemm_desc g;
                memset(&g, 0, sizeof g);
                g.trans_b = 1;
                g.M = n;
                g.N = Lk;
                g.K = D;
                g.batch = Hkv;
                g.alpha = scale;
                g.a = elem(q->data, q->dtype, ((b * H + r) * Lq + q0) * D);
                g.adt = q->dtype;
                g.lda = D;
                g.stride_a = rep * Lq * D;
                g.b = elem(k->data, k->dtype, b * Hkv * Lk * D);
                g.bdt = k->dtype;
                g.ldb = D;
                g.stride_b = Lk * D;
                g.c = S;
                g.cdt = FPK_F32;
                g.ldc = Lk;
                g.stride_c = n * Lk;
                FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &g));
                const uint8_t *m = nullptr;
                if (mask) m = (const uint8_t *)mask->data + b * mst[0] + r * mst[1] + q0 * mst[2];
                FPK_TRY(fpk_gpu_softmax_rows(st, S, P, pdt, Hkv * n, Lk, 1.0f, m, n, rep * mst[1], mst[2], mst[3]));
                memset(&g, 0, sizeof g);
                g.M = n;
                g.N = Dv;
                g.K = Lk;
                g.batch = Hkv;
                g.alpha = 1.0f;
                g.a = P;
                g.adt = pdt;
                g.lda = Lk;
                g.stride_a = n * Lk;
                g.b = elem(v->data, v->dtype, b * Hkv * Lk * Dv);
                g.bdt = v->dtype;
                g.ldb = Dv;
                g.stride_b = Lk * Dv;
                g.c = (void *)elem(out->data, out->dtype, ((b * H + r) * Lq + q0) * Dv);
                g.cdt = out->dtype;
                g.ldc = Dv;
                g.stride_c = rep * Lq * Dv;
                FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &g));
            }
    return FPK_OK;
}
