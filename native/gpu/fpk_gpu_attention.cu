/*
 * fpk_gpu_attention.cu — scaled dot-product attention, three tiers (fpk_attention_tier):
 *
 * vendor   cuDNN 9's fused SDPA (fpk_gpu_vendor_sdpa.cu; CUDA only — on HIP it is unavailable):
 *          bf16/f16 q, k, v (f32 ones are declined: the f32 parity runs go to flash; the result
 *          converted to out's dtype), head dims multiples of 8 that cuDNN takes, 16-byte aligned
 *          rows; a mask only when it is key padding: broadcast over heads and queries
 *          ([B, 1, 1, Lk]; other shapes are declined at once), each batch entry attending to its
 *          first n >= 1 keys (checked by a small kernel and one stream sync), handed to cuDNN as
 *          sequence lengths. What it declines answers FPK_ERR_UNAVAILABLE (flash serves next).
 *
 * flash    One fused kernel (FlashAttention-2's scheme): a block owns a tile of queries of one
 *          head, streams the keys and values through shared memory in tiles, and keeps a running
 *          max and sum per query row (online softmax), so scores never reach device memory.
 *          f32 accumulation everywhere. Kernels:
 *          - matrix units (CUDA, sm_80 and later): bf16 or f16 q, k, v with head dims up to 128
 *            (multiples of 8, padded to 16 in shared memory), mma.sync m16n8k16 for S = Q Kᵀ and
 *            O += P V with P kept in registers, ldmatrix.trans for V. 4 warps × 16 query rows.
 *          - matrix cores (HIP): the same scheme with AMD's matrix instructions, bf16 or f16 q, k,
 *            v, head dims multiples of 8 up to 128: MFMA 16x16x16 on CDNA2/3 (gfx90a, gfx940-942,
 *            wave64) and WMMA 16x16x16 on RDNA3 (gfx1100-1102, gfx1150/1151, wave32), each
 *            compiled only for those targets and where the compiler has the builtins
 *            (__has_builtin); every other target has the FMA kernel alone. COMPILE-CHECKED ONLY:
 *            no AMD GPU has run them (make native-hip-check builds them for gfx90a, gfx940 and
 *            gfx1100). So they are never trusted blindly: before a device first uses one for a
 *            dtype and head dim, the launcher runs it and the FMA kernel on a small problem with
 *            odd lengths and a mask (amd_self_check) and compares; a mismatch or an error turns
 *            the path off on that device for the process and the FMA kernel serves instead.
 *            fpk_gpu_cfg.flash_selfcheck_strict makes a disabled path fail the call with the
 *            reason (to see it on a new card); fpk_gpu_cfg.flash_fma skips them altogether.
 *          - FMA (every build, HIP included, and every dtype): f32 arithmetic on any dims up to
 *            256, for the f32 parity runs and where the matrix path does not apply.
 *          16-bit q, k, v come from the activation dtype chosen at Load.
 * chunked  Per batch, query group of a key head and chunk of queries, S = scale·Q Kᵀ for every
 *          key head in one strided batched GEMM (f32 scores), a masked row softmax into P (the
 *          values' dtype when 16-bit), then O = P V written in place. Scratch is one chunk of
 *          scores, at most fpk_gpu_cfg.attention_score_bytes (default 1 GiB) at any length.
 *
 * Both read q, k, v and write out through element strides (batch, position, head), so the
 * [B, H, L, D] and [B, L, H, D] layouts need no copies. The cpu tier answers FPK_ERR_UNAVAILABLE
 * here (the core serves it by a host round trip); FPK_ATTN_TIER_AUTO tries vendor, flash, then
 * chunked.
 */
#include "fpk_gpu_mma.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const void *elem(const void *p, int dt, int64_t i) { return (const char *)p + (size_t)i * fpk_dt_size(dt); }

static int64_t score_budget(void) { return fpk_gpu_cfg.attention_score_bytes; }

/* Element strides (batch, position, head) of a 4-d operand in the given layout. */
static void attn_strides(const fpk_gt *t, int layout, int64_t st[3]) {
    int64_t d1 = t->shape[1], d2 = t->shape[2], d3 = t->shape[3];
    st[0] = d1 * d2 * d3;
    if (layout == FPK_ATTN_BLHD) {
        st[1] = d2 * d3;
        st[2] = d3;
    } else {
        st[1] = d3;
        st[2] = d2 * d3;
    }
}

/* Mask strides over [B, H, Lq, Lk] (0 where broadcast). */
static void mask_strides(const fpk_gt *mask, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t mst[4]) {
    for (int i = 0; i < 4; i++) mst[i] = 0;
    if (!mask) return;
    int64_t full[4] = {B, H, Lq, Lk}, stride = 1;
    for (int i = 3; i >= 0; i--) {
        int im = mask->ndim - 4 + i;
        int64_t dd = im >= 0 ? mask->shape[im] : 1;
        mst[i] = (im < 0 || (dd == 1 && full[i] != 1)) ? 0 : stride;
        if (im >= 0) stride *= dd;
    }
}

/* ---- flash kernels ------------------------------------------------------------------------ */

struct flash_args {
    const void *q, *k, *v;
    void *o;
    const uint8_t *m;
    int64_t qs[3], ks[3], vs[3], os[3], ms[4];
    int Lq, Lk, rep, D, Dv;
    int qdt, kdt, vdt, odt;
    float scale_log2; /* scale · log2(e): the kernels use exp2 */
};

#define FLASH_LOG2E 1.4426950408889634f

/* -- FMA kernel: BQ = 16 query rows a block, 8 threads a row, keys in tiles of bk ------------ */

#define FMA_BQ 16
#define FMA_MAXV 32 /* output columns a thread holds: Dv <= 8 * FMA_MAXV = 256 */

__global__ void __launch_bounds__(128) k_flash_fma(flash_args a, int bk) {
    extern __shared__ float sm[];
    const int D = a.D, Dv = a.Dv, ldk = D + 1;
    float *Qs = sm;                 /* [BQ][D] */
    float *Ks = Qs + FMA_BQ * D;    /* [bk][D + 1] */
    float *Vs = Ks + bk * ldk;      /* [bk][Dv] */
    const int tid = threadIdx.x, r = tid >> 3, c = tid & 7;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.rep;
    const int q0 = blockIdx.x * FMA_BQ, row = q0 + r;
    const bool live = row < a.Lq;
    for (int i = tid; i < FMA_BQ * D; i += blockDim.x) {
        int rr = i / D, d = i % D;
        float x = 0.f;
        if (q0 + rr < a.Lq)
            x = fpk_ld(a.q, a.qdt, b * a.qs[0] + (int64_t)(q0 + rr) * a.qs[1] + h * a.qs[2] + d);
        Qs[i] = x * a.scale_log2;
    }
    float o[FMA_MAXV];
#pragma unroll
    for (int i = 0; i < FMA_MAXV; i++) o[i] = 0.f;
    float mrow = -INFINITY, lsum = 0.f;
    const uint8_t *mr = a.m ? a.m + b * a.ms[0] + h * a.ms[1] + (int64_t)(live ? row : 0) * a.ms[2] : nullptr;
    for (int k0 = 0; k0 < a.Lk; k0 += bk) {
        __syncthreads();
        for (int i = tid; i < bk * D; i += blockDim.x) {
            int j = i / D, d = i % D, key = k0 + j;
            Ks[j * ldk + d] = key < a.Lk ? fpk_ld(a.k, a.kdt, b * a.ks[0] + (int64_t)key * a.ks[1] + hk * a.ks[2] + d) : 0.f;
        }
        for (int i = tid; i < bk * Dv; i += blockDim.x) {
            int j = i / Dv, d = i % Dv, key = k0 + j;
            Vs[i] = key < a.Lk ? fpk_ld(a.v, a.vdt, b * a.vs[0] + (int64_t)key * a.vs[1] + hk * a.vs[2] + d) : 0.f;
        }
        __syncthreads();
        /* scores of keys c, c + 8, ... of this tile (at most 4: bk <= 32) */
        float s[4], mx = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            int j = c + 8 * jj, key = k0 + j;
            float x = -INFINITY;
            if (j < bk && key < a.Lk && (!mr || mr[(int64_t)key * a.ms[3]])) {
                x = 0.f;
                const float *qr = Qs + r * D, *kr = Ks + j * ldk;
                for (int d = 0; d < D; d++) x += qr[d] * kr[d];
            }
            s[jj] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, FPK_SHFL_XOR(mx, 1, 8));
        mx = fmaxf(mx, FPK_SHFL_XOR(mx, 2, 8));
        mx = fmaxf(mx, FPK_SHFL_XOR(mx, 4, 8));
        float mnew = fmaxf(mrow, mx);
        float muse = mnew == -INFINITY ? 0.f : mnew;
        float alpha = exp2f(mrow - muse), add = 0.f;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            s[jj] = exp2f(s[jj] - muse);
            add += s[jj];
        }
        lsum = lsum * alpha + add; /* this thread's share; summed over the 8 at the end */
        mrow = mnew;
#pragma unroll
        for (int i = 0; i < FMA_MAXV; i++) o[i] *= alpha;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            for (int cc = 0; cc < 8; cc++) {
                float pj = FPK_SHFL(s[jj], cc, 8);
                int j = cc + 8 * jj;
                if (j >= bk) continue;
                const float *vr = Vs + j * Dv;
#pragma unroll
                for (int i = 0; i < FMA_MAXV; i++) {
                    int x = c + 8 * i;
                    if (x < Dv) o[i] += pj * vr[x];
                }
            }
        }
    }
    lsum += FPK_SHFL_XOR(lsum, 1, 8);
    lsum += FPK_SHFL_XOR(lsum, 2, 8);
    lsum += FPK_SHFL_XOR(lsum, 4, 8);
    if (!live) return;
    float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    int64_t ob = b * a.os[0] + (int64_t)row * a.os[1] + h * a.os[2];
#pragma unroll
    for (int i = 0; i < FMA_MAXV; i++) {
        int x = c + 8 * i;
        if (x < Dv) fpk_st(a.o, a.odt, ob + x, o[i] * inv);
    }
}

/* -- matrix-unit kernel (CUDA sm_80+): 4 warps × 16 query rows, keys in tiles of 64 ---------- */

#if !defined(FPK_HIP)
#define FPK_FLASH_MMA 1
#define MMA_BK 64

/* Two floats as a packed pair of 16-bit values, lo in the low half (round to nearest even). */
__device__ __forceinline__ uint32_t pack2(float lo, float hi, bool bf16) {
    uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (bf16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    (void)lo, (void)hi, (void)bf16;
#endif
    return r;
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    (void)r, (void)p;
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    (void)r, (void)p;
#endif
}

/* 2^x in one instruction (MUFU; -inf gives +0; flushes denormals). */
__device__ __forceinline__ float fast_exp2(float x) {
    float y = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
#else
    (void)x;
#endif
    return y;
}

/* HDP: the head dim padded to a multiple of 16 (D = Dv <= HDP, D a multiple of 8). NW warps of
 * 16 query rows each; ST stages of key/value tiles in shared memory (2: the next tile's copy
 * (cp.async) overlaps this tile's arithmetic). */
template <int HDP, int NW, int ST>
__global__ void __launch_bounds__(NW * 32) k_flash_mma(flash_args a) {
    constexpr int LDS = HDP + 8; /* shared row stride in 16-bit elements: conflict-free ldmatrix */
    constexpr int CH = HDP / 8;  /* 16-byte chunks per row */
    constexpr int NT = NW * 32;
    extern __shared__ __align__(16) uint16_t fsm[];
    uint16_t *Kb = fsm, *Vb = fsm + ST * MMA_BK * LDS;
    const bool bf16 = a.qdt == 2;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.rep;
    const int D = a.D;
    const int r0 = blockIdx.x * (16 * NW) + warp * 16 + g, r1 = r0 + 8;
    const uint16_t *qp = (const uint16_t *)a.q + b * a.qs[0] + h * a.qs[2];
    const uint16_t *kp = (const uint16_t *)a.k + b * a.ks[0] + hk * a.ks[2];
    const uint16_t *vp = (const uint16_t *)a.v + b * a.vs[0] + hk * a.vs[2];
    const int ntiles = (a.Lk + MMA_BK - 1) / MMA_BK;
    auto load = [&](int tile, int buf) {
        const int k0 = tile * MMA_BK;
        uint16_t *ks = Kb + buf * MMA_BK * LDS, *vs = Vb + buf * MMA_BK * LDS;
        for (int i = tid; i < MMA_BK * CH; i += NT) {
            int j = i / CH, col = (i % CH) * 8, key = k0 + j;
            bool ok = key < a.Lk && col < D;
            cp_async16(ks + j * LDS + col, ok ? kp + (int64_t)key * a.ks[1] + col : kp, ok);
            cp_async16(vs + j * LDS + col, ok ? vp + (int64_t)key * a.vs[1] + col : vp, ok);
        }
        cp_async_commit();
    };
    load(0, 0);
    /* Q fragments, in registers for the whole key loop */
    uint32_t qf[HDP / 16][4];
#pragma unroll
    for (int kk = 0; kk < HDP / 16; kk++) {
        int c0 = kk * 16 + 2 * t4, c1 = c0 + 8;
        qf[kk][0] = (r0 < a.Lq && c0 < D) ? *(const uint32_t *)(qp + (int64_t)r0 * a.qs[1] + c0) : 0u;
        qf[kk][1] = (r1 < a.Lq && c0 < D) ? *(const uint32_t *)(qp + (int64_t)r1 * a.qs[1] + c0) : 0u;
        qf[kk][2] = (r0 < a.Lq && c1 < D) ? *(const uint32_t *)(qp + (int64_t)r0 * a.qs[1] + c1) : 0u;
        qf[kk][3] = (r1 < a.Lq && c1 < D) ? *(const uint32_t *)(qp + (int64_t)r1 * a.qs[1] + c1) : 0u;
    }
    float o[HDP / 8][4];
#pragma unroll
    for (int n = 0; n < HDP / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const uint8_t *mr0 = nullptr, *mr1 = nullptr;
    if (a.m) {
        const uint8_t *mb = a.m + b * a.ms[0] + h * a.ms[1];
        mr0 = mb + (int64_t)(r0 < a.Lq ? r0 : 0) * a.ms[2];
        mr1 = mb + (int64_t)(r1 < a.Lq ? r1 : 0) * a.ms[2];
    }
    const int mi = lane >> 3; /* which 8×8 matrix this lane addresses in ldmatrix.x4 */
    for (int t = 0; t < ntiles; t++) {
        int buf = 0;
        if (ST == 2) {
            buf = t & 1;
            if (t + 1 < ntiles) load(t + 1, (t + 1) & 1);
            else cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Ks = Kb + buf * MMA_BK * LDS, *Vs = Vb + buf * MMA_BK * LDS;
        const int k0 = t * MMA_BK;
        float s[MMA_BK / 8][4];
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HDP / 16; kk++)
#pragma unroll
            for (int n = 0; n < MMA_BK / 8; n += 2) {
                uint32_t kb[4];
                ldmatrix_x4(kb, Ks + ((n + (mi >> 1)) * 8 + (lane & 7)) * LDS + kk * 16 + (mi & 1) * 8);
                mma16816(s[n], qf[kk], kb[0], kb[1], bf16);
                mma16816(s[n + 1], qf[kk], kb[2], kb[3], bf16);
            }
        /* running max in raw score units (scale > 0), exponents as one FMA: 2^(s·c − m·c) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        if (!a.m && k0 + MMA_BK <= a.Lk) { /* a full tile without a mask: no per-score checks */
#pragma unroll
            for (int n = 0; n < MMA_BK / 8; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
            }
        } else {
#pragma unroll
            for (int n = 0; n < MMA_BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + n * 8 + 2 * t4 + (e & 1);
                    bool ok = key < a.Lk;
                    if (ok && a.m) ok = (e < 2 ? mr0 : mr1)[(int64_t)key * a.ms[3]] != 0;
                    float x = ok ? s[n][e] : -INFINITY;
                    s[n][e] = x;
                    if (e < 2) mx0 = fmaxf(mx0, x);
                    else mx1 = fmaxf(mx1, x);
                }
        }
        mx0 = fmaxf(mx0, FPK_SHFL_XOR(mx0, 1, 32));
        mx0 = fmaxf(mx0, FPK_SHFL_XOR(mx0, 2, 32));
        mx1 = fmaxf(mx1, FPK_SHFL_XOR(mx1, 1, 32));
        mx1 = fmaxf(mx1, FPK_SHFL_XOR(mx1, 2, 32));
        const float c = a.scale_log2;
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        float u0 = n0 == -INFINITY ? 0.f : n0 * c, u1 = n1 == -INFINITY ? 0.f : n1 * c;
        float al0 = fast_exp2(m0 * c - u0), al1 = fast_exp2(m1 * c - u1);
        m0 = n0;
        m1 = n1;
        float add0 = 0.f, add1 = 0.f;
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++) {
            s[n][0] = fast_exp2(fmaf(s[n][0], c, -u0));
            s[n][1] = fast_exp2(fmaf(s[n][1], c, -u0));
            s[n][2] = fast_exp2(fmaf(s[n][2], c, -u1));
            s[n][3] = fast_exp2(fmaf(s[n][3], c, -u1));
            add0 += s[n][0] + s[n][1];
            add1 += s[n][2] + s[n][3];
        }
        l0 = l0 * al0 + add0;
        l1 = l1 * al1 + add1;
#pragma unroll
        for (int n = 0; n < HDP / 8; n++) {
            o[n][0] *= al0;
            o[n][1] *= al0;
            o[n][2] *= al1;
            o[n][3] *= al1;
        }
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; kk++) {
            uint32_t pa[4];
            pa[0] = pack2(s[2 * kk][0], s[2 * kk][1], bf16);
            pa[1] = pack2(s[2 * kk][2], s[2 * kk][3], bf16);
            pa[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], bf16);
            pa[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], bf16);
            const int key = kk * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
            for (int n = 0; n < HDP / 8; n += 2) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, Vs + key * LDS + (n + (mi >> 1)) * 8);
                mma16816(o[n], pa, vb[0], vb[1], bf16);
                mma16816(o[n + 1], pa, vb[2], vb[3], bf16);
            }
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
        if (ST == 1 && t + 1 < ntiles) load(t + 1, 0);
    }
    l0 += FPK_SHFL_XOR(l0, 1, 32);
    l0 += FPK_SHFL_XOR(l0, 2, 32);
    l1 += FPK_SHFL_XOR(l1, 1, 32);
    l1 += FPK_SHFL_XOR(l1, 2, 32);
    float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const int64_t ob = b * a.os[0] + h * a.os[2];
#pragma unroll
    for (int n = 0; n < HDP / 8; n++) {
        int col = n * 8 + 2 * t4;
        if (col >= a.Dv) continue;
        if (r0 < a.Lq) {
            int64_t at = ob + (int64_t)r0 * a.os[1] + col;
            fpk_st(a.o, a.odt, at, o[n][0] * i0);
            fpk_st(a.o, a.odt, at + 1, o[n][1] * i0);
        }
        if (r1 < a.Lq) {
            int64_t at = ob + (int64_t)r1 * a.os[1] + col;
            fpk_st(a.o, a.odt, at, o[n][2] * i1);
            fpk_st(a.o, a.odt, at + 1, o[n][3] * i1);
        }
    }
}

/* Launches k_flash_mma<HDP, NW, ST> with its dynamic shared memory (opted in once). */
template <int HDP, int NW, int ST>
static fpk_status launch_mma(const flash_args &a, dim3 grid, cudaStream_t st) {
    constexpr size_t smem = (size_t)2 * ST * MMA_BK * (HDP + 8) * 2;
    static bool opted;
    if (!opted) {
        FPK_CUDA(cudaFuncSetAttribute(k_flash_mma<HDP, NW, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "attention (flash): shared memory");
        opted = true;
    }
    grid.x = (unsigned)((a.Lq + 16 * NW - 1) / (16 * NW));
    k_flash_mma<HDP, NW, ST><<<grid, NW * 32, smem, st>>>(a);
    return fpk_gpu_launched("attention (flash, matrix units)");
}

/* Variant of the matrix kernel for head dim 128 (benchmarks): fpk_gpu_cfg.flash_warps (4 or 8,
 * default 8) and flash_stages (1 or 2, default 2); other head dims run 4 warps, 2
 * stages. On an H100 at the transformer's 18,083 tokens × 24 heads (2026-11-25): 4/1 28.0 ms,
 * 4/2 28.9 ms, 8/1 27.8 ms, 8/2 24.9 ms a call (PyTorch SDPA 6.6 ms); with the exponent as one
 * FMA + ex2 and no per-score checks on full unmasked tiles, 8/2 20.1 ms (200 TFLOP/s, 244
 * registers, one block per multiprocessor). Forcing 2 blocks (128 registers) gave 21.7 ms and 4
 * warps × 3 blocks (168 registers) 20.9 ms: occupancy is not what holds it back. */

#endif /* !FPK_HIP */

/* fpk_gpu_cfg.flash_fma: the FMA kernel even where a matrix kernel applies (tests; on HIP it
 * also skips the matrix kernels' self-check). */
static int force_fma(void) { return fpk_gpu_cfg.flash_fma; }

static int aligned16(const void *p, const int64_t st[3]) {
    return ((uintptr_t)p & 15) == 0 && st[0] % 8 == 0 && st[1] % 8 == 0 && st[2] % 8 == 0;
}

/* Whether a call fits the matrix kernels (mma.sync on CUDA, MFMA/WMMA on AMD): q, k, v of one
 * 16-bit dtype, head dims equal, a multiple of 8 up to 128, 16-byte aligned rows, a positive
 * scale, and the FMA kernel not forced. */
static bool matrix_eligible(const flash_args &a) {
    bool half = (a.qdt == FPK_BF16 || a.qdt == FPK_F16) && a.kdt == a.qdt && a.vdt == a.qdt;
    return half && !force_fma() && a.scale_log2 > 0 && a.D == a.Dv && a.D % 8 == 0 && a.D >= 8 && a.D <= 128 &&
           aligned16(a.q, a.qs) && aligned16(a.k, a.ks) && aligned16(a.v, a.vs);
}

/* Launches the FMA kernel with keys per tile so its tiles fit 48 KiB of shared memory. */
static fpk_status launch_fma(const flash_args &a, dim3 grid, cudaStream_t st) {
    const int64_t D = a.D, Dv = a.Dv;
    int bk = 32;
    while (bk > 8 && (size_t)(FMA_BQ * D + bk * (D + 1) + bk * Dv) * 4 > 48 * 1024) bk /= 2;
    size_t smem = (size_t)(FMA_BQ * D + bk * (D + 1) + bk * Dv) * 4;
    if (smem > 48 * 1024)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: head dims %lld/%lld too large for the flash tier",
                                 (long long)D, (long long)Dv);
    grid.x = (unsigned)((a.Lq + FMA_BQ - 1) / FMA_BQ);
    k_flash_fma<<<grid, 128, smem, st>>>(a, bk);
    return fpk_gpu_launched("attention (flash, fma)");
}

/* -- matrix-core kernels (HIP): MFMA on CDNA2/3, WMMA on RDNA3 ------------------------------
 *
 * Compile-checked only: no AMD GPU has run them. Each is self-checked against the FMA kernel on
 * the device before its first use (amd_matrix_path below) and disabled for the process when the
 * check fails, so a wrong fragment layout gives the FMA kernel's result, not a wrong one.
 *
 * One wave owns 16 query rows and computes everything transposed, Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ,
 * because then the accumulator of Sᵀ is already the B operand Pᵀ needs and each lane's query
 * row is its own (lane % 16): row max, sum and the rescale need no exchange but between the lane
 * groups (g = lane / 16) that share a query. Per 16 × 16 × 16 step:
 *   MFMA (wave64, __builtin_amdgcn_mfma_f32_16x16x16{f16,bf16_1k}): A row lane % 16 with k
 *        4g..4g+3, B column lane % 16 with k 4g..4g+3, D column lane % 16 with rows 4g + e.
 *   WMMA (wave32, __builtin_amdgcn_wmma_f32_16x16x16_{f16,bf16}_w32): A row lane % 16 with k
 *        0..15, B column lane % 16 with k 0..15 (lanes 16..31 repeat 0..15), D column lane % 16
 *        with rows 2e + g; a P column takes the other half of its keys from lane ^ 16.
 * The block's queries sit in shared memory for the whole key loop; keys and values go through
 * it in tiles (64 keys for MFMA, 32 for WMMA: Debian's LLVM 15 gives gfx11 kernels 128 VGPRs),
 * K row-major and V transposed so a lane's keys are contiguous, with the tile's mask as bytes
 * when there is a mask or the tile is partial. Softmax as k_flash_mma: max in raw score units,
 * 2^(s·c − m·c), f32. scripts/amdflashemu runs this device code on the host. */

#if defined(FPK_HIP)
#define AMD_NW 4 /* waves per block, 16 query rows each */
#if defined(FPK_AMD_MFMA) || defined(FPK_AMD_WMMA)
/* 2^x as one v_exp_f32 (LLVM's exp2 intrinsic; -inf gives +0), as k_flash_mma's ex2.approx. */
__device__ __forceinline__ float amd_exp2(float x) { return __builtin_exp2f(x); }

/* One float as the 16 bits of q's dtype (round to nearest even, as fpk_st). */
__device__ __forceinline__ short amd_bits(float x, bool bf16) { return (short)(bf16 ? fpk_f32_bf16(x) : fpk_f32_f16(x)); }
#endif

#if defined(FPK_AMD_MFMA)
struct amd_mfma {
    static constexpr int WAVE = 64, NE = 4, BK = 64; /* lanes, accumulator elements a lane, keys a tile */
    typedef amd_v4s ab;
    typedef amd_v4f acc;
    /* Index (row of D, k of A and B) of element e in lane group g. */
    static __device__ __forceinline__ int idx(int g, int e) { return 4 * g + e; }
    /* This lane's operand from a row of 16 16-bit values (16-byte aligned). */
    static __device__ __forceinline__ ab row(const uint16_t *p, int g) {
        return __builtin_bit_cast(ab, *(const amd_u2 *)(p + 4 * g));
    }
    static __device__ __forceinline__ acc mma(ab a, ab b, acc c, bool bf16) {
        return amd_mfma16(a, b, c, bf16);
    }
    /* Pᵀ's B operand from this lane's probabilities (keys 4g + e): its own, no exchange. */
    static __device__ __forceinline__ ab probs(acc p, int g, bool bf16) {
        (void)g;
        ab r;
#pragma unroll
        for (int e = 0; e < 4; e++) r[e] = amd_bits(p[e], bf16);
        return r;
    }
};
#endif

#if defined(FPK_AMD_WMMA)
struct amd_wmma {
    static constexpr int WAVE = 32, NE = 8, BK = 32; /* 32 keys a tile: LLVM 15 gives gfx11 128 VGPRs */
    typedef amd_v16s ab;
    typedef amd_v8f acc;
    static __device__ __forceinline__ int idx(int g, int e) { return 2 * e + g; }
    static __device__ __forceinline__ ab row(const uint16_t *p, int g) {
        (void)g;
        amd_u4 lo = *(const amd_u4 *)p, hi = *(const amd_u4 *)(p + 8);
        return __builtin_bit_cast(ab, (amd_u8)__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7));
    }
    static __device__ __forceinline__ acc mma(ab a, ab b, acc c, bool bf16) {
        return amd_wmma16(a, b, c, bf16);
    }
    /* Pᵀ's B operand: all 16 keys of this lane's query; keys 2e + g are this lane's, keys
     * 2e + 1 − g those of lane ^ 16 (same query). */
    static __device__ __forceinline__ ab probs(acc p, int g, bool bf16) {
        ab r;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float mine = p[e], other = FPK_SHFL_XOR(mine, 16, 32);
            r[2 * e] = amd_bits(g ? other : mine, bf16);
            r[2 * e + 1] = amd_bits(g ? mine : other, bf16);
        }
        return r;
    }
};
#endif

#if defined(FPK_AMD_MFMA) || defined(FPK_AMD_WMMA)
/* HDP: the head dim padded to a multiple of 16 (D = Dv <= HDP, D a multiple of 8). */
template <class MM, int HDP>
__device__ __forceinline__ void flash_amd_body(const flash_args &a) {
    constexpr int BK = MM::BK, BQ = 16 * AMD_NW;
    constexpr int LDK = HDP + 8, LDV = BK + 8; /* shared row strides, 16-bit elements */
    constexpr int CH = HDP / 8, NT = AMD_NW * MM::WAVE;
    __shared__ __attribute__((aligned(16))) uint16_t Qs[BQ * LDK]; /* [query][d] */
    __shared__ __attribute__((aligned(16))) uint16_t Ks[BK * LDK]; /* [key][d] */
    __shared__ __attribute__((aligned(16))) uint16_t Vt[HDP * LDV]; /* [d][key] */
    __shared__ uint8_t Ms[BQ * BK];                                 /* [query][key]: attend */
    const bool bf16 = a.qdt == 2;
    const int tid = threadIdx.x, wave = tid / MM::WAVE, lane = tid % MM::WAVE, lq = lane & 15, g = lane >> 4;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.rep, D = a.D;
    const int q0 = blockIdx.x * BQ, qr = wave * 16 + lq, row = q0 + qr; /* this lane's query */
    const uint16_t *qp = (const uint16_t *)a.q + b * a.qs[0] + h * a.qs[2];
    const uint16_t *kp = (const uint16_t *)a.k + b * a.ks[0] + hk * a.ks[2];
    const uint16_t *vp = (const uint16_t *)a.v + b * a.vs[0] + hk * a.vs[2];
    const uint8_t *mb = a.m ? a.m + b * a.ms[0] + h * a.ms[1] : nullptr;
    for (int i = tid; i < BQ * CH; i += NT) { /* the block's queries, zero past Lq and D */
        int r = i / CH, col = (i % CH) * 8;
        amd_u4 x = {0u, 0u, 0u, 0u};
        if (q0 + r < a.Lq && col < D) x = *(const amd_u4 *)(qp + (int64_t)(q0 + r) * a.qs[1] + col);
        *(amd_u4 *)(Qs + r * LDK + col) = x;
    }
    typename MM::acc o[HDP / 16]; /* Oᵀ: column lq (this query), rows n·16 + idx(g, e) */
#pragma unroll
    for (int n = 0; n < HDP / 16; n++)
#pragma unroll
        for (int e = 0; e < MM::NE; e++) o[n][e] = 0.f;
    float m = -INFINITY, l = 0.f; /* l: this lane group's share of the row sum */
    const float c = a.scale_log2;
    for (int k0 = 0; k0 < a.Lk; k0 += BK) {
        const bool full = !mb && k0 + BK <= a.Lk; /* no per-score checks (same in every thread) */
        __syncthreads(); /* every wave is done with the previous tile */
        for (int i = tid; i < BK * CH; i += NT) {
            int j = i / CH, col = (i % CH) * 8, key = k0 + j;
            amd_u4 kv = {0u, 0u, 0u, 0u}, vv = {0u, 0u, 0u, 0u};
            if (key < a.Lk && col < D) {
                kv = *(const amd_u4 *)(kp + (int64_t)key * a.ks[1] + col);
                vv = *(const amd_u4 *)(vp + (int64_t)key * a.vs[1] + col);
            }
            *(amd_u4 *)(Ks + j * LDK + col) = kv;
            amd_us8 ve = __builtin_bit_cast(amd_us8, vv);
#pragma unroll
            for (int t = 0; t < 8; t++) Vt[(col + t) * LDV + j] = ve[t];
        }
        if (!full)
            for (int i = tid; i < BQ * BK; i += NT) {
                int r = i / BK, j = i % BK, key = k0 + j;
                bool ok = key < a.Lk;
                if (ok && mb) ok = mb[(int64_t)(q0 + r < a.Lq ? q0 + r : 0) * a.ms[2] + (int64_t)key * a.ms[3]] != 0;
                Ms[i] = ok;
            }
        __syncthreads();
        typename MM::acc s[BK / 16]; /* Sᵀ per 16 keys: column lq, keys idx(g, e) */
#pragma unroll
        for (int kb = 0; kb < BK / 16; kb++) {
#pragma unroll
            for (int e = 0; e < MM::NE; e++) s[kb][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HDP / 16; kk++)
                s[kb] = MM::mma(MM::row(Ks + (kb * 16 + lq) * LDK + kk * 16, g), MM::row(Qs + qr * LDK + kk * 16, g),
                                s[kb], bf16);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int kb = 0; kb < BK / 16; kb++)
#pragma unroll
            for (int e = 0; e < MM::NE; e++) {
                float x = s[kb][e];
                if (!full) {
                    x = Ms[qr * BK + kb * 16 + MM::idx(g, e)] ? x : -INFINITY;
                    s[kb][e] = x;
                }
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, FPK_SHFL_XOR(mx, 16, MM::WAVE));
        if (MM::WAVE == 64) mx = fmaxf(mx, FPK_SHFL_XOR(mx, 32, MM::WAVE));
        /* running max in raw score units (scale > 0), exponents as one FMA: 2^(s·c − m·c) */
        float mn = fmaxf(m, mx);
        float u = mn == -INFINITY ? 0.f : mn * c, al = amd_exp2(m * c - u);
        m = mn;
        float add = 0.f;
#pragma unroll
        for (int kb = 0; kb < BK / 16; kb++)
#pragma unroll
            for (int e = 0; e < MM::NE; e++) {
                float p = amd_exp2(fmaf(s[kb][e], c, -u));
                s[kb][e] = p;
                add += p;
            }
        l = l * al + add;
#pragma unroll
        for (int n = 0; n < HDP / 16; n++)
#pragma unroll
            for (int e = 0; e < MM::NE; e++) o[n][e] *= al;
#pragma unroll
        for (int kb = 0; kb < BK / 16; kb++) {
            typename MM::ab pb = MM::probs(s[kb], g, bf16);
#pragma unroll
            for (int n = 0; n < HDP / 16; n++)
                o[n] = MM::mma(MM::row(Vt + (n * 16 + lq) * LDV + kb * 16, g), pb, o[n], bf16);
        }
    }
    l += FPK_SHFL_XOR(l, 16, MM::WAVE);
    if (MM::WAVE == 64) l += FPK_SHFL_XOR(l, 32, MM::WAVE);
    if (row >= a.Lq) return;
    float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t ob = b * a.os[0] + (int64_t)row * a.os[1] + h * a.os[2];
#pragma unroll
    for (int n = 0; n < HDP / 16; n++)
#pragma unroll
        for (int e = 0; e < MM::NE; e++) {
            int col = n * 16 + MM::idx(g, e);
            if (col < a.Dv) fpk_st(a.o, a.odt, ob + col, o[n][e] * inv);
        }
}
#endif

/* The matrix kernel of PATH for head dims padded to HDP; on a target without that path (and in
 * the host pass) the body is empty: amd_matrix_path never launches it there. */
template <int PATH, int HDP>
__global__ void __launch_bounds__(AMD_NW *(PATH == AMD_PATH_MFMA ? 64 : 32)) k_flash_amd(flash_args a) {
    (void)a;
#if defined(FPK_AMD_MFMA)
    if constexpr (PATH == AMD_PATH_MFMA) flash_amd_body<amd_mfma, HDP>(a);
#endif
#if defined(FPK_AMD_WMMA)
    if constexpr (PATH == AMD_PATH_WMMA) flash_amd_body<amd_wmma, HDP>(a);
#endif
}

/* The path the device's code object has (the arch it was compiled for decides) and its wave size. */
__global__ void k_flash_amd_path(int *out) {
    int path = AMD_PATH_NONE;
#if defined(FPK_AMD_MFMA)
    path = AMD_PATH_MFMA;
#elif defined(FPK_AMD_WMMA)
    path = AMD_PATH_WMMA;
#endif
    out[0] = path;
    out[1] = warpSize;
}

template <int PATH, int HDP> static fpk_status launch_amd_hdp(const flash_args &a, dim3 grid, cudaStream_t st) {
    grid.x = (unsigned)((a.Lq + 16 * AMD_NW - 1) / (16 * AMD_NW));
    k_flash_amd<PATH, HDP><<<grid, AMD_NW * (PATH == AMD_PATH_MFMA ? 64 : 32), 0, st>>>(a);
    return fpk_gpu_launched(PATH == AMD_PATH_MFMA ? "attention (flash, mfma)" : "attention (flash, wmma)");
}

template <int PATH> static fpk_status launch_amd_path(const flash_args &a, dim3 grid, cudaStream_t st) {
    switch ((a.D + 15) / 16 * 16) {
    case 16: return launch_amd_hdp<PATH, 16>(a, grid, st);
    case 32: return launch_amd_hdp<PATH, 32>(a, grid, st);
    case 48: return launch_amd_hdp<PATH, 48>(a, grid, st);
    case 64: return launch_amd_hdp<PATH, 64>(a, grid, st);
    case 80: return launch_amd_hdp<PATH, 80>(a, grid, st);
    case 96: return launch_amd_hdp<PATH, 96>(a, grid, st);
    case 112: return launch_amd_hdp<PATH, 112>(a, grid, st);
    default: return launch_amd_hdp<PATH, 128>(a, grid, st);
    }
}

static fpk_status launch_amd(int path, const flash_args &a, dim3 grid, cudaStream_t st) {
    if (path == AMD_PATH_MFMA) return launch_amd_path<AMD_PATH_MFMA>(a, grid, st);
    return launch_amd_path<AMD_PATH_WMMA>(a, grid, st);
}

static const char *amd_path_name(int path) { return path == AMD_PATH_MFMA ? "mfma" : path == AMD_PATH_WMMA ? "wmma" : "none"; }

/* What the process decided per device: the path its code object has (probed once), whether it
 * is disabled (a failed or erroring self-check: the FMA kernel serves every call after), and
 * the self-checks passed per dtype (f16, bf16) and head dim (D / 8). */
#define AMD_MAX_DEVICES 64
struct amd_device_state {
    int probed;
    int path;
    int disabled;
    char why[320]; /* why the path is off (probe or failed check), for fpk_gpu_cfg.flash_selfcheck_strict */
    unsigned char passed[2][17];
};
static amd_device_state amd_devices[AMD_MAX_DEVICES];
static pthread_mutex_t amd_devices_mu = PTHREAD_MUTEX_INITIALIZER; /* protects amd_devices */

/* fpk_gpu_cfg.flash_selfcheck_strict: a matrix path that fails its self-check fails the call
 * with the reason (the first one, and every call after that it would have served) instead of
 * falling back to the FMA kernel, so a test run on a new AMD card shows it. */
static int amd_strict(void) { return fpk_gpu_cfg.flash_selfcheck_strict; }

/* Runs the matrix kernel of path and the FMA kernel on one small deterministic problem of the
 * call's dtype and head dim — B 2, H 2 over one key head (grouped), Lq 37 and Lk 83 (partial
 * query blocks and key tiles), a mask of key padding with holes, a causal band and one fully
 * masked row, f32 output prefilled with NaN — and compares: *ok when the relative L2 distance
 * is at most 1e-2. why says what failed. Errors: a lost device, or scratch out of memory (then
 * nothing is decided and the call runs the FMA kernel). */
static fpk_status amd_self_check(cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, int dt, int D, bool *ok,
                                 char *why, size_t nwhy) {
    const int B = 2, H = 2, Lq = 37, Lk = 83;
    const int64_t nq = (int64_t)B * Lq * H * D, nk = (int64_t)B * Lk * D, nm = (int64_t)B * Lq * Lk;
    *ok = false;
    /* one scratch block: f32 q, k, v staging; 16-bit q, k, v; mask; two f32 outputs */
    auto up = [](int64_t bytes) { return (size_t)((bytes + 255) / 256 * 256); };
    size_t off_q32 = 0, off_k32 = off_q32 + up(nq * 4), off_v32 = off_k32 + up(nk * 4);
    size_t off_q = off_v32 + up(nk * 4), off_k = off_q + up(nq * 2), off_v = off_k + up(nk * 2);
    size_t off_m = off_v + up(nk * 2), off_o1 = off_m + up(nm), off_o2 = off_o1 + up(nq * 4);
    size_t total = off_o2 + up(nq * 4);
    float *host = (float *)malloc((size_t)(nq + 2 * nk + 2 * nq) * sizeof(float) + (size_t)nm);
    if (!host) return fpk_gpu_set_oom((uint64_t)(nq + 2 * nk + 2 * nq) * 4 + nm, 0, "host attention self-check");
    float *hq = host, *hk = hq + nq, *hv = hk + nk, *ho1 = hv + nk, *ho2 = ho1 + nq;
    uint8_t *hm = (uint8_t *)(ho2 + nq);
    uint32_t seed = 0x2545f491u + (uint32_t)D * 977u + (uint32_t)dt;
    for (int64_t i = 0; i < nq + 2 * nk; i++) { /* multiples of 1/64 in [-1, 1]: exact in f16 and bf16 */
        seed = seed * 1664525u + 1013904223u;
        host[i] = (float)((int)(seed >> 25) - 64) / 64.f;
    }
    for (int b = 0; b < B; b++)
        for (int qi = 0; qi < Lq; qi++)
            for (int j = 0; j < Lk; j++) {
                bool on = b == 0 ? j < 61 && j % 7 != 3 : j <= qi + 40 && j < 77 && qi != 5;
                hm[((int64_t)b * Lq + qi) * Lk + j] = on ? 1 : 0;
            }
    fpk_scratch sc(sf);
    fpk_status s = sc.alloc(total);
    if (s != FPK_OK) {
        free(host);
        return s;
    }
    char *base = (char *)sc.ptr;
    flash_args a;
    memset(&a, 0, sizeof a);
    a.q = base + off_q, a.k = base + off_k, a.v = base + off_v;
    a.m = (const uint8_t *)(base + off_m);
    a.qs[0] = (int64_t)Lq * H * D, a.qs[1] = (int64_t)H * D, a.qs[2] = D;
    a.ks[0] = a.vs[0] = (int64_t)Lk * D, a.ks[1] = a.vs[1] = D, a.ks[2] = a.vs[2] = D;
    a.os[0] = a.qs[0], a.os[1] = a.qs[1], a.os[2] = a.qs[2];
    a.ms[0] = (int64_t)Lq * Lk, a.ms[1] = 0, a.ms[2] = Lk, a.ms[3] = 1;
    a.Lq = Lq, a.Lk = Lk, a.rep = H, a.D = D, a.Dv = D;
    a.qdt = a.kdt = a.vdt = dt;
    a.odt = FPK_F32;
    a.scale_log2 = (float)(2.0 / sqrt((double)D)) * FLASH_LOG2E; /* sharper than 1/sqrt(D): score errors show */
    dim3 grid;
    grid.y = (unsigned)H;
    grid.z = (unsigned)B;
    const char *step = "upload";
    cudaError_t e = cudaMemcpyAsync(base + off_q32, hq, (size_t)nq * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(base + off_k32, hk, (size_t)nk * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(base + off_v32, hv, (size_t)nk * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(base + off_m, hm, (size_t)nm, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(base + off_o1, 0xff, (size_t)nq * 4, st); /* NaN */
    if (e == cudaSuccess) e = cudaMemsetAsync(base + off_o2, 0xff, (size_t)nq * 4, st);
    if (e == cudaSuccess) {
        step = "convert";
        s = fpk_gpu_convert(st, (void *)a.q, dt, base + off_q32, FPK_F32, nq);
        if (s == FPK_OK) s = fpk_gpu_convert(st, (void *)a.k, dt, base + off_k32, FPK_F32, nk);
        if (s == FPK_OK) s = fpk_gpu_convert(st, (void *)a.v, dt, base + off_v32, FPK_F32, nk);
        if (s == FPK_OK) {
            step = "fma kernel";
            a.o = base + off_o1;
            s = launch_fma(a, grid, st);
        }
        if (s == FPK_OK) {
            step = "matrix kernel";
            a.o = base + off_o2;
            s = launch_amd(path, a, grid, st);
        }
        if (s != FPK_OK) { /* the launch helpers took the runtime error and set the last error */
            snprintf(why, nwhy, "self-check %s: status %d", step, (int)s);
            free(host);
            return s == FPK_ERR_DEVICE_LOST ? s : FPK_OK;
        }
    }
    if (e == cudaSuccess) {
        step = "download";
        e = cudaMemcpyAsync(ho1, base + off_o1, (size_t)nq * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(ho2, base + off_o2, (size_t)nq * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "attention self-check (%s)", step);
        free(host);
        return fpk_gpu_check_error(e, what, why, nwhy);
    }
    double rel = fpk_rel_l2_host(ho2, ho1, nq);
    free(host);
    *ok = rel <= 1e-2; /* NaN (an output the kernel never wrote) fails too */
    if (!*ok)
        snprintf(why, nwhy, "%s kernel differs from the fma kernel on the self-check (%s, head dim %d): relative L2 %g > 1e-2",
                 amd_path_name(path), dt == FPK_BF16 ? "bf16" : "f16", D, rel);
    return FPK_OK;
}

/* The matrix path for this call (AMD_PATH_NONE: the FMA kernel). The first call that could use
 * one on a device probes which path the device's code object has; the first call of each dtype
 * and head dim self-checks it (amd_self_check, one stream sync); a failure disables the path on
 * that device for the process. */
static fpk_status amd_matrix_path(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const flash_args &a,
                                  int *path) {
    *path = AMD_PATH_NONE;
    if (!matrix_eligible(a) || c->device < 0 || c->device >= AMD_MAX_DEVICES) return FPK_OK;
    pthread_mutex_lock(&amd_devices_mu);
    amd_device_state *d = &amd_devices[c->device];
    fpk_status s = FPK_OK;
    if (!d->probed) {
        fpk_scratch sc(sf);
        s = sc.alloc(2 * sizeof(int));
        int got[2] = {0, 0};
        if (s == FPK_OK) {
            k_flash_amd_path<<<1, 1, 0, st>>>((int *)sc.ptr);
            cudaError_t e = cudaGetLastError();
            if (e == cudaSuccess) e = cudaMemcpyAsync(got, sc.ptr, sizeof got, cudaMemcpyDeviceToHost, st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(st);
            if (e != cudaSuccess) {
                s = fpk_gpu_check_error(e, "attention: matrix path probe", d->why, sizeof d->why);
                d->disabled = 1;
            }
        }
        if (s == FPK_OK) { /* an allocation failure leaves the probe for a later call */
            d->probed = 1;
            d->path = got[0];
            if ((d->path == AMD_PATH_MFMA && got[1] != 64) || (d->path == AMD_PATH_WMMA && got[1] != 32)) {
                snprintf(d->why, sizeof d->why, "%s kernel built for wave size %d", amd_path_name(d->path), got[1]);
                d->disabled = 1;
            }
            if (d->path == AMD_PATH_NONE && !d->disabled)
                snprintf(d->why, sizeof d->why, "no matrix path compiled for %s", c->arch);
        }
    }
    if (s != FPK_OK || !d->probed || d->path == AMD_PATH_NONE) {
        pthread_mutex_unlock(&amd_devices_mu);
        if (s == FPK_ERR_OUT_OF_MEMORY) s = FPK_OK;
        return s;
    }
    int bf = a.qdt == FPK_BF16;
    if (!d->disabled && !d->passed[bf][a.D / 8]) {
        bool ok = false;
        char why[256] = "";
        s = amd_self_check(st, sf, d->path, a.qdt, a.D, &ok, why, sizeof why);
        if (s == FPK_OK && ok) {
            d->passed[bf][a.D / 8] = 1;
        } else if (s == FPK_OK) {
            snprintf(d->why, sizeof d->why, "%s on %s: %s", amd_path_name(d->path), c->arch, why);
            d->disabled = 1;
        }
    }
    int use = d->disabled ? AMD_PATH_NONE : d->path;
    int refused = d->disabled && d->path != AMD_PATH_NONE;
    char why[320];
    snprintf(why, sizeof why, "%s", d->why);
    pthread_mutex_unlock(&amd_devices_mu);
    if (s == FPK_ERR_OUT_OF_MEMORY) return FPK_OK; /* no room to check now: the FMA kernel, checked later */
    FPK_TRY(s);
    if (refused && amd_strict())
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "attention: flash matrix path disabled by its self-check: %s", why);
    *path = use;
    return FPK_OK;
}
#endif /* FPK_HIP */

static fpk_status flash(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int layout, float scale,
                        const fpk_gt *q, const fpk_gt *k, const fpk_gt *v, const fpk_gt *mask, const fpk_gt *out,
                        int64_t B, int64_t H, int64_t Lq, int64_t D, int64_t Hkv, int64_t Lk, int64_t Dv) {
    if (Lq > INT32_MAX / 2 || Lk > INT32_MAX / 2 || H > 65535 || B > 65535 || D > 256 || Dv > 8 * FMA_MAXV)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: flash tier takes head dims up to 256 and "
                                 "up to 65535 heads and batches (D %lld, Dv %lld)", (long long)D, (long long)Dv);
    flash_args a;
    memset(&a, 0, sizeof a);
    a.Lq = (int)Lq;
    a.Lk = (int)Lk;
    a.rep = (int)(H / Hkv);
    a.D = (int)D;
    a.Dv = (int)Dv;
    a.scale_log2 = scale * FLASH_LOG2E;
    a.m = mask ? (const uint8_t *)mask->data : nullptr;
    mask_strides(mask, B, H, Lq, Lk, a.ms);
    attn_strides(q, layout, a.qs);
    attn_strides(k, layout, a.ks);
    attn_strides(v, layout, a.vs);
    attn_strides(out, layout, a.os);
    a.o = out->data;
    a.odt = out->dtype;
    a.q = q->data;
    a.k = k->data;
    a.v = v->data;
    a.qdt = q->dtype;
    a.kdt = k->dtype;
    a.vdt = v->dtype;
    dim3 grid;
    grid.y = (unsigned)H;
    grid.z = (unsigned)B;
#ifdef FPK_FLASH_MMA
    if (matrix_eligible(a) && fpk_gpu_mma_device(c)) {
        int hdp = (int)((D + 15) / 16 * 16);
        if (hdp == 128) {
            int nw = fpk_gpu_cfg.flash_warps, stages = fpk_gpu_cfg.flash_stages;
            if (nw == 8 && stages == 2) return launch_mma<128, 8, 2>(a, grid, st);
            if (nw == 8) return launch_mma<128, 8, 1>(a, grid, st);
            if (stages == 1) return launch_mma<128, 4, 1>(a, grid, st);
            return launch_mma<128, 4, 2>(a, grid, st);
        }
        switch (hdp) {
        case 16: return launch_mma<16, 4, 2>(a, grid, st);
        case 32: return launch_mma<32, 4, 2>(a, grid, st);
        case 48: return launch_mma<48, 4, 2>(a, grid, st);
        case 64: return launch_mma<64, 4, 2>(a, grid, st);
        case 80: return launch_mma<80, 4, 2>(a, grid, st);
        case 96: return launch_mma<96, 4, 2>(a, grid, st);
        default: return launch_mma<112, 4, 2>(a, grid, st);
        }
    }
#endif
#if defined(FPK_HIP)
    {
        int path = AMD_PATH_NONE;
        FPK_TRY(amd_matrix_path(c, st, sf, a, &path));
        if (path != AMD_PATH_NONE) return launch_amd(path, a, grid, st);
    }
#endif
    return launch_fma(a, grid, st);
}

/* ---- vendor tier (cuDNN's fused SDPA, fpk_gpu_vendor_sdpa.cu) ------------------------------ */

#ifdef FPK_VENDOR_CUDA
/* One block per mask row (b, h, q) of the broadcast mask: the row's count of nonzero keys and
 * whether they are exactly the first `count` keys. lens: [0, B) the least count per batch entry,
 * [B, 2B) the largest, [2B, 3B) filled with Lq (seq_len_q), [3B] set when a row is no prefix. */
__global__ void k_mask_lengths(const uint8_t *m, int64_t ms0, int64_t ms1, int64_t ms2, int64_t ms3, int hm, int qm,
                               int Lk, int B, int Lq, int *lens) {
    const int row = blockIdx.x, q = row % qm, h = (row / qm) % hm, b = row / (qm * hm);
    const uint8_t *r = m + b * ms0 + h * ms1 + (int64_t)q * ms2;
    int count = 0, first_zero = Lk;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
        if (r[(int64_t)j * ms3]) count++;
        else first_zero = min(first_zero, j);
    }
    __shared__ int sc[128], sz[128];
    sc[threadIdx.x] = count;
    sz[threadIdx.x] = first_zero;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            sc[threadIdx.x] += sc[threadIdx.x + w];
            sz[threadIdx.x] = min(sz[threadIdx.x], sz[threadIdx.x + w]);
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    count = sc[0];
    if (count != sz[0]) atomicOr(&lens[3 * B], 1);
    if (row == 0)
        for (int bb = 0; bb < B; bb++) lens[2 * B + bb] = Lq;
    /* a mask broadcast over the batch (ms0 0) gives every batch entry the same length */
    for (int bb = ms0 ? b : 0; bb < (ms0 ? b + 1 : B); bb++) {
        atomicMin(&lens[bb], count);
        atomicMax(&lens[B + bb], count);
    }
}

/* One block per query row (b, q) of a mask broadcast over heads: rows[b*Lq + q] = the row's count of
 * nonzero keys when they are exactly the first `count` keys, else -1; the last row's count is the
 * batch entry's key length (lens[b]), and lens[B + b] = Lq. For causal masks (the caller's word,
 * checked on the host from rows: row q must hold min(q + 1, n) keys). */
__global__ void k_mask_rows(const uint8_t *m, int64_t ms0, int64_t ms2, int64_t ms3, int Lq, int Lk, int B, int *rows,
                            int *lens) {
    const int row = blockIdx.x, q = row % Lq, b = row / Lq;
    const uint8_t *r = m + b * ms0 + (int64_t)q * ms2;
    int count = 0, first_zero = Lk;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
        if (r[(int64_t)j * ms3]) count++;
        else first_zero = min(first_zero, j);
    }
    __shared__ int sc[128], sz[128];
    sc[threadIdx.x] = count;
    sz[threadIdx.x] = first_zero;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            sc[threadIdx.x] += sc[threadIdx.x + w];
            sz[threadIdx.x] = min(sz[threadIdx.x], sz[threadIdx.x + w]);
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    rows[row] = sc[0] == sz[0] ? sc[0] : -1;
    if (q == Lq - 1)
        for (int bb = ms0 ? b : 0; bb < (ms0 ? b + 1 : B); bb++) {
            lens[bb] = sc[0];
            lens[B + bb] = Lq;
        }
}

/* Checks a causal + key-padding mask ([B or 1, 1, Lq, Lk]) on the device and, when it is one,
 * sets sd's causal flag and (when some entry attends to fewer than Lk keys) its sequence
 * lengths in sm. FPK_ERR_UNAVAILABLE when the mask is something else. One sync, as the
 * key-padding check. */
static fpk_status vendor_causal(cudaStream_t st, fpk_scratch &sm, const fpk_gt *mask, const int64_t mst[4], int64_t B,
                                int64_t Lq, int64_t Lk, fpk_sdpa_desc *sd) {
    int bm = mst[0] ? (int)B : 1;
    if ((int64_t)bm * Lq > INT32_MAX / 2)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier: causal mask too large to check");
    size_t nrows = (size_t)bm * (size_t)Lq;
    FPK_TRY(sm.alloc((nrows + 2 * (size_t)B) * sizeof(int)));
    int *rows = (int *)sm.ptr, *lens = rows + nrows;
    k_mask_rows<<<(unsigned)nrows, 128, 0, st>>>((const uint8_t *)mask->data, mst[0], mst[2], mst[3], (int)Lq, (int)Lk,
                                                 (int)B, rows, lens);
    FPK_TRY(fpk_gpu_launched("attention: causal mask rows"));
    int *host = (int *)malloc(nrows * sizeof(int));
    if (!host) return fpk_gpu_set_oom(nrows * sizeof(int), 0, "host causal mask rows");
    cudaError_t e = cudaMemcpyAsync(host, rows, nrows * sizeof(int), cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        free(host);
        return fpk_gpu_error(e, "attention: causal mask rows");
    }
    bool ok = true, padded = false;
    for (int b = 0; b < bm && ok; b++) {
        const int *r = host + (size_t)b * Lq;
        int64_t n = r[Lq - 1];
        ok = n >= 1;
        padded |= n < Lk;
        for (int64_t qi = 0; qi < Lq && ok; qi++) ok = r[qi] == (qi + 1 < n ? qi + 1 : n);
    }
    free(host);
    if (!ok)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier: the mask called causal is not causal "
                                 "AND key padding (row q attends to its first min(q + 1, n) keys)");
    sd->causal = 1;
    if (padded) {
        sd->seq_kv = lens;
        sd->seq_q = lens + B;
    }
    return FPK_OK;
}

/* The vendor tier: q, k, v of one 16-bit dtype (the activation dtype a GPU model loads with;
 * f32 ones are declined, so the f32 parity runs stay f32 on flash), 16-byte aligned
 * rows; a mask only when it is a key-padding mask broadcast over heads and queries (each batch
 * entry attends to its first n >= 1 keys: FramePack's text lengths), which cuDNN takes as
 * sequence lengths. Anything else is FPK_ERR_UNAVAILABLE, and the chain goes on to flash. */
static fpk_status vendor(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int layout, float scale,
                         int causal, const fpk_gt *q, const fpk_gt *k, const fpk_gt *v, const fpk_gt *mask,
                         const fpk_gt *out, int64_t B, int64_t H, int64_t Lq, int64_t D, int64_t Hkv, int64_t Lk,
                         int64_t Dv) {
    if (!fpk_vendor_has_sdpa(c))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier needs cuDNN 9 (%s)",
                                 fpk_vendor_has_dnn(c) ? "the loaded cuDNN is older or lacks the graph API" : "not loaded");
    int dt = q->dtype;
    bool half = (dt == FPK_BF16 || dt == FPK_F16) && k->dtype == dt && v->dtype == dt;
    if (!half)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier takes bf16 or f16 q, k, v of one "
                                 "dtype, got dtypes %d/%d/%d", q->dtype, k->dtype, v->dtype);
    if (Lq > INT32_MAX || Lk > INT32_MAX || B > INT32_MAX || D % 8 || Dv % 8)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier takes head dims that are multiples of 8 "
                                 "(D %lld, Dv %lld)", (long long)D, (long long)Dv);
    if (mask && (mask->dtype != FPK_U8 || Lk > INT32_MAX))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier takes u8 masks");
    fpk_sdpa_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.B = B, sd.H = H, sd.Hkv = Hkv, sd.Lq = Lq, sd.Lk = Lk, sd.D = D, sd.Dv = Dv;
    sd.scale = scale;
    sd.dt = dt;
    attn_strides(q, layout, sd.qs);
    attn_strides(k, layout, sd.ks);
    attn_strides(v, layout, sd.vs);
    attn_strides(out, layout, sd.os);
    /* 16-byte rows: pointers, and every stride a multiple of 8 elements */
    int64_t all[12] = {sd.qs[0], sd.qs[1], sd.qs[2], sd.ks[0], sd.ks[1], sd.ks[2],
                       sd.vs[0], sd.vs[1], sd.vs[2], sd.os[0], sd.os[1], sd.os[2]};
    const void *ptr[4] = {q->data, k->data, v->data, out->data};
    bool aligned = true;
    for (int i = 0; i < 12; i++) aligned &= all[i] % 8 == 0;
    for (int i = 0; i < 4; i++) aligned &= ((uintptr_t)ptr[i] & 15) == 0;
    if (!aligned) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier needs 16-byte aligned rows");
    fpk_scratch sm(sf);
    int64_t cst[4];
    mask_strides(mask, B, H, Lq, Lk, cst);
    if (mask && causal && cst[2] && !cst[1]) { /* the caller's causal mask, checked */
        FPK_TRY(vendor_causal(st, sm, mask, cst, B, Lq, Lk, &sd));
    } else if (mask) {
        int64_t mst[4];
        mask_strides(mask, B, H, Lq, Lk, mst);
        /* a mask that varies along heads or queries (Llama's and CLIP's causal masks, the
         * refiner's [1, 1, L, L]) is declined from its shape alone: no device check, no sync */
        if (mst[1] || mst[2])
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier takes key-padding masks "
                                     "broadcast over heads and queries ([B, 1, 1, Lk]) only");
        int hm = mst[1] ? (int)H : 1, qm = mst[2] ? (int)Lq : 1, bm = mst[0] ? (int)B : 1;
        if ((int64_t)bm * hm * qm > INT32_MAX)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier: mask too large to check");
        FPK_TRY(sm.alloc((size_t)(3 * B + 1) * sizeof(int)));
        int *lens = (int *)sm.ptr;
        /* least counts start at 0x7f7f7f7f, largest at -1, the flag at 0 */
        FPK_CUDA(cudaMemsetAsync(lens, 0x7f, (size_t)B * sizeof(int), st), "attention: mask lengths");
        FPK_CUDA(cudaMemsetAsync(lens + B, 0xff, (size_t)B * sizeof(int), st), "attention: mask lengths");
        FPK_CUDA(cudaMemsetAsync(lens + 2 * B, 0, (size_t)(B + 1) * sizeof(int), st), "attention: mask lengths");
        k_mask_lengths<<<bm * hm * qm, 128, 0, st>>>((const uint8_t *)mask->data, mst[0], mst[1], mst[2], mst[3], hm,
                                                     qm, (int)Lk, (int)B, (int)Lq, lens);
        FPK_TRY(fpk_gpu_launched("attention: mask lengths"));
        int *host = (int *)malloc((size_t)(3 * B + 1) * sizeof(int));
        if (!host) return fpk_gpu_set_oom((3 * B + 1) * sizeof(int), 0, "host mask lengths");
        cudaError_t e = cudaMemcpyAsync(host, lens, (size_t)(3 * B + 1) * sizeof(int), cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) {
            free(host);
            return fpk_gpu_error(e, "attention: mask lengths");
        }
        bool padding = host[3 * B] == 0;
        for (int64_t b = 0; b < B && padding; b++) padding = host[b] == host[B + b] && host[b] >= 1;
        free(host);
        if (!padding)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier takes key-padding masks only "
                                     "(the same first n >= 1 keys for every row of a batch entry)");
        sd.seq_kv = lens + B;
        sd.seq_q = lens + 2 * B;
    }
    fpk_scratch so(sf);
    sd.q = q->data, sd.k = k->data, sd.v = v->data;
    sd.o = out->data;
    if (out->dtype != sd.dt) { /* written in the compute dtype with out's strides, then converted */
        FPK_TRY(so.alloc((size_t)out->numel * 2));
        sd.o = so.ptr;
    }
    FPK_TRY(fpk_vendor_sdpa(c, st, sf, &sd));
    if (sd.o != out->data) FPK_TRY(fpk_gpu_convert(st, out->data, out->dtype, sd.o, sd.dt, out->numel));
    return FPK_OK;
}
#else
static fpk_status vendor(fpk_gpu_ctx *, cudaStream_t, const fpk_gpu_scratch_fn *, int, float, int, const fpk_gt *,
                         const fpk_gt *, const fpk_gt *, const fpk_gt *, const fpk_gt *, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t) {
    return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: no vendor fused attention on ROCm");
}
#endif

/* ---- chunked tier --------------------------------------------------------------------------- */

static fpk_status chunked(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_attention_params *p,
                          float scale, const fpk_gt *q, const fpk_gt *k, const fpk_gt *v, const fpk_gt *mask,
                          const fpk_gt *out, int64_t B, int64_t H, int64_t Lq, int64_t D, int64_t Hkv, int64_t Lk,
                          int64_t Dv) {
    int64_t rep = H / Hkv;
    int64_t qs[3], ks[3], vs[3], os[3], mst[4];
    attn_strides(q, p->layout, qs);
    attn_strides(k, p->layout, ks);
    attn_strides(v, p->layout, vs);
    attn_strides(out, p->layout, os);
    mask_strides(mask, B, H, Lq, Lk, mst);
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
                g.a = elem(q->data, q->dtype, b * qs[0] + r * qs[2] + q0 * qs[1]);
                g.adt = q->dtype;
                g.lda = qs[1];
                g.stride_a = rep * qs[2];
                g.b = elem(k->data, k->dtype, b * ks[0]);
                g.bdt = k->dtype;
                g.ldb = ks[1];
                g.stride_b = ks[2];
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
                g.b = elem(v->data, v->dtype, b * vs[0]);
                g.bdt = v->dtype;
                g.ldb = vs[1];
                g.stride_b = vs[2];
                g.c = (void *)elem(out->data, out->dtype, b * os[0] + r * os[2] + q0 * os[1]);
                g.cdt = out->dtype;
                g.ldc = os[1];
                g.stride_c = rep * os[2];
                FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &g));
            }
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_attention(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf,
                                        const fpk_attention_params *p, const fpk_gt *q, const fpk_gt *k,
                                        const fpk_gt *v, const fpk_gt *mask, const fpk_gt *out) {
    if (p->tier == FPK_ATTN_TIER_CPU)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: the cpu tier is the core's host round trip");
    cudaStream_t st = fpk_stream(c, s);
    int blhd = p->layout == FPK_ATTN_BLHD;
    int64_t B = q->shape[0], H = q->shape[blhd ? 2 : 1], Lq = q->shape[blhd ? 1 : 2], D = q->shape[3];
    int64_t Hkv = k->shape[blhd ? 2 : 1], Lk = k->shape[blhd ? 1 : 2], Dv = v->shape[3];
    if (out->numel == 0) return FPK_OK;
    if (Lk == 0) {
        FPK_CUDA(cudaMemsetAsync(out->data, 0, (size_t)out->numel * fpk_dt_size(out->dtype), st), "attention");
        return FPK_OK;
    }
    float scale = p->scale != 0 ? p->scale : (float)(1.0 / sqrt((double)(D ? D : 1)));
    if (p->tier == FPK_ATTN_TIER_VENDOR || p->tier == FPK_ATTN_TIER_AUTO) {
        fpk_status r = D ? vendor(c, st, sf, p->layout, scale, p->causal, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv)
                         : fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "attention: vendor tier: head dim 0");
        if (r != FPK_ERR_UNAVAILABLE || p->tier == FPK_ATTN_TIER_VENDOR) return r;
    }
    if (p->tier == FPK_ATTN_TIER_CHUNKED || D == 0)
        return chunked(c, st, sf, p, scale, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv);
    fpk_status r = flash(c, st, sf, p->layout, scale, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv);
    if (r == FPK_ERR_UNAVAILABLE && p->tier == FPK_ATTN_TIER_AUTO)
        return chunked(c, st, sf, p, scale, q, k, v, mask, out, B, H, Lq, D, Hkv, Lk, Dv);
    return r;
}
