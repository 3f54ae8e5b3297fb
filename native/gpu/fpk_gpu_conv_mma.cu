/*
 * fpk_gpu_conv_mma.cu — conv3d on the matrix units, channels-last (issue 18): the own-kernel
 * tier's fast path for 16-bit convs (fpk_gpu_conv_ndhwc_mma; the caller transposes NCDHW to
 * NDHWC around it, as the vendor tier's slab pipeline does, and adds the bias).
 *
 * An implicit GEMM: rows are the output positions (M = N·To·Ho·Wo), columns the output channels
 * (K), the reduction runs over the taps and input channels, tap-major with C innermost, so a row's
 * piece of the reduction is a contiguous run of x at the row's window origin plus the tap's
 * offset (x is already padded: no bounds checks along the reduction, only at the M and K edges),
 * and the weights [K][kT][kH][kW][C] are the column operand as they lie. f32 accumulation, each
 * output rounded once to the dtype.
 *
 * One kernel body, convmma_body, templated on a matrix-instruction policy:
 *   cmma_sync  NVIDIA mma.sync m16n8k16 (sm_80 and later): 4 warps as 2 × 2, a warp 64 rows ×
 *              64 channels (the default), or 8 warps as 2 × 4 of 64 × 32; the tiles come in
 *              with cp.async (x through L1, whose neighbouring taps overlap; w through L2
 *              only), ST stages (default 3).
 *   cmma_mfma  AMD MFMA 16x16x16 (CDNA2/3, wave64): 4 waves as 2 × 2, a wave 64 × 64.
 *   cmma_wmma  AMD WMMA 16x16x16 (RDNA3, wave32): 64 channels a block, 8 waves as 4 × 2, a
 *              wave 32 × 32.
 *              On AMD a tile goes global → registers → shared memory, two stages: the next
 *              tile's loads are issued before this tile's products and stored after them.
 * A block computes 128 rows × 128 channels (WMMA: 64) in steps of 32 along the reduction; each
 * thread brings in two 16-byte pieces of each operand a step (WMMA: one of w). Shared memory
 * holds a step's A tile [128 rows][32] and B tile [128 channels][32] at a row stride of 40
 * elements (80 bytes: rows stay 16-byte aligned, and mma.sync's fragment loads hit 32 different
 * banks); fragments are read with plain loads (scripts/convmmaemu runs this body on the host,
 * every policy, against a float64 conv). The AMD paths compute
 * Dᵀ = W·Xᵀ (the weights as the instruction's A operand), so a lane's accumulator holds one
 * position and consecutive channels: MFMA stores pairs, as mma.sync does.
 *
 * Never trusted blindly: none of the paths had run on hardware when written. Before a device
 * first uses its path for a dtype, the launcher runs it and a plain f32 kernel on a small conv
 * with partial M and K tiles, taps straddling reduction steps and a stride of 2, NaN-prefilled
 * output and guard elements around it, and compares (relative L2 ≤ 1e-2, guards untouched). A mismatch or an error turns the path off on that device for the
 * process (FPK_ERR_UNAVAILABLE: k_conv3d serves). fpk_gpu_cfg.conv_selfcheck_strict makes such
 * calls fail with the reason instead; fpk_gpu_cfg.conv_fma declines every call.
 */
#include "fpk_gpu_mma.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* One 16-byte piece of global memory (scripts/convmmaemu replaces it with a checked load). */
__device__ __forceinline__ uint4 convmma_ld16(const uint16_t *p) { return *(const uint4 *)p; }

/* ---- the kernel body (scripts/convmmaemu cuts from here to the end marker) ----------------- */
#define CMMA_BM 128 /* rows (output positions) a block; its columns (output channels) are the policy's BN */
#define CMMA_BK 32  /* reduction elements a step */
#define CMMA_LDS 40 /* shared row stride in 16-bit elements: BK + 8 */
#define CMMA_NT 256 /* threads a block of the AMD paths (CUDA: 256 or 128) */
#define CMMA_BN_WMMA 64 /* columns a block of the WMMA path (the others: 128) */
/* 16-bit elements of one stage (A and B tiles) for BN columns */
#define CMMA_STAGE(BN) ((CMMA_BM + (BN)) * CMMA_LDS)

struct convmma_args {
    const uint16_t *x, *w;
    uint16_t *y;
    int64_t xs_n, xs_t, xs_h; /* x's element strides: batch, frame, row (a column is C) */
    int M, K, R, C;           /* rows N·To·Ho·Wo, output channels, reduction kT·kH·kW·C, input channels */
    int kH, kW, To, Ho, Wo, sT, sH, sW;
    int tiles_n; /* blocks along K: block b computes row tile b / tiles_n, channel tile b % tiles_n */
};

/* The window origin of output row m in x (elements). */
__device__ __forceinline__ int64_t convmma_origin(const convmma_args &a, int m) {
    int wo = m % a.Wo, q = m / a.Wo;
    int ho = q % a.Ho;
    q /= a.Ho;
    int to = q % a.To, n = q / a.To;
    return n * a.xs_n + (int64_t)to * a.sT * a.xs_t + (int64_t)ho * a.sH * a.xs_h + (int64_t)wo * a.sW * a.C;
}

template <bool BF> __device__ __forceinline__ uint16_t convmma_round(float v) {
    return BF ? fpk_f32_bf16(v) : fpk_f32_f16(v);
}
template <bool BF> __device__ __forceinline__ float convmma_value(uint16_t h) {
    return BF ? fpk_bf16_f32(h) : fpk_f16_f32(h);
}

/* acc += the products of one stage: As [BM][LDS] and Bs [BN][LDS] in shared memory. */
template <class MM, bool BF, int MT, int NTL>
__device__ __forceinline__ void convmma_step(typename MM::acc (&acc)[MT][NTL], const uint16_t *As, const uint16_t *Bs,
                                             int wm0, int wn0, int lane) {
#pragma unroll
    for (int ks = 0; ks < CMMA_BK; ks += 16) {
        typename MM::bfrag b[NTL];
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) b[nt] = MM::load_b(Bs + (wn0 + nt * MM::IN) * CMMA_LDS + ks, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            typename MM::afrag f = MM::load_a(As + (wm0 + mt * 16) * CMMA_LDS + ks, lane);
#pragma unroll
            for (int nt = 0; nt < NTL; nt++) MM::template mma<BF>(acc[mt][nt], f, b[nt]);
        }
    }
}

/* One block of y = conv(x, w): sm is ST stages of shared memory (ST × CMMA_STAGE(MM::BN)
 * elements, 16-byte aligned). */
template <class MM, int ST, bool BF> __device__ __forceinline__ void convmma_body(const convmma_args &a, uint16_t *sm) {
    constexpr int BN = MM::BN, WM = CMMA_BM / MM::WARPS_M, WN = BN / MM::WARPS_N;
    constexpr int MT = WM / 16, NTL = WN / MM::IN, STAGE = CMMA_STAGE(BN);
    constexpr int NT = MM::WARPS_M * MM::WARPS_N * MM::WAVE, RP = NT / 4; /* threads, rows a pass loads */
    constexpr int AI = CMMA_BM / RP, BI = BN / RP; /* 16-byte pieces a thread loads a step */
    static_assert(CMMA_BM % RP == 0 && BN % RP == 0, "the loader's passes cover the tiles");
    static_assert(ST >= 2, "two stages at least");
    const int tid = threadIdx.x, lane = tid % MM::WAVE, warp = tid / MM::WAVE;
    const int wm0 = (warp / MM::WARPS_N) * WM, wn0 = (warp % MM::WARPS_N) * WN;
    const int m0 = (int)(blockIdx.x / (unsigned)a.tiles_n) * CMMA_BM, n0 = (int)(blockIdx.x % (unsigned)a.tiles_n) * BN;
    const int nsteps = (a.R + CMMA_BK - 1) / CMMA_BK;

    /* the loader: rows lr, lr + RP, ... of both tiles, 8 elements at 8·lc of each step */
    const int lr = tid / 4, lc = tid % 4;
    int64_t xrow[AI];
    const uint16_t *wrow[BI];
    bool wok[BI];
#pragma unroll
    for (int i = 0; i < AI; i++) {
        int m = m0 + lr + RP * i;
        xrow[i] = m < a.M ? convmma_origin(a, m) : -1;
    }
#pragma unroll
    for (int i = 0; i < BI; i++) {
        int n = n0 + lr + RP * i;
        wok[i] = n < a.K;
        wrow[i] = a.w + (int64_t)(wok[i] ? n : 0) * a.R;
    }
    /* the reduction index this thread loads next, kk = tap·C + c, and the tap's offset in x */
    int kk = 8 * lc, c = kk % a.C, tap = kk / a.C;
    int kw = tap % a.kW, kh = (tap / a.kW) % a.kH, kt = tap / (a.kW * a.kH);
    int64_t toff = kt * a.xs_t + kh * a.xs_h + (int64_t)kw * a.C;
    auto advance = [&]() {
        kk += CMMA_BK;
        c += CMMA_BK;
        while (c >= a.C) {
            c -= a.C;
            if (++kw == a.kW) {
                kw = 0;
                if (++kh == a.kH) {
                    kh = 0;
                    ++kt;
                }
            }
            toff = kt * a.xs_t + kh * a.xs_h + (int64_t)kw * a.C;
        }
    };

    typename MM::acc acc[MT][NTL];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTL; nt++)
#pragma unroll
            for (int e = 0; e < MM::NE; e++) acc[mt][nt][e] = 0.f;

    if constexpr (MM::ASYNC) {
        /* copies straight into shared memory; stage s holds step s mod ST */
        auto load = [&](int buf) {
            uint16_t *As = sm + buf * STAGE, *Bs = As + CMMA_BM * CMMA_LDS;
            const bool in = kk < a.R;
#pragma unroll
            for (int i = 0; i < AI; i++) {
                const bool ok = in && xrow[i] >= 0;
                MM::copy16_x(As + (lr + RP * i) * CMMA_LDS + 8 * lc, ok ? a.x + xrow[i] + toff + c : a.x, ok);
            }
#pragma unroll
            for (int i = 0; i < BI; i++) {
                const bool ok = in && wok[i];
                MM::copy16_w(Bs + (lr + RP * i) * CMMA_LDS + 8 * lc, ok ? wrow[i] + kk : a.w, ok);
            }
            advance();
        };
#pragma unroll
        for (int s = 0; s < ST - 1; s++) {
            if (s < nsteps) load(s);
            MM::commit();
        }
        for (int t = 0; t < nsteps; t++) {
            MM::template wait<ST - 2>(); /* this thread's copies of step t have landed */
            __syncthreads();             /* everyone's have, and everyone is done with step t - 1's stage */
            if (t + ST - 1 < nsteps) load((t + ST - 1) % ST);
            MM::commit();
            const uint16_t *As = sm + (t % ST) * STAGE;
            convmma_step<MM, BF, MT, NTL>(acc, As, As + CMMA_BM * CMMA_LDS, wm0, wn0, lane);
        }
    } else {
        /* through registers: step t + 1's loads are in flight during step t's products */
        uint4 ra[AI], rb[BI];
        auto fetch = [&]() {
            const bool in = kk < a.R;
#pragma unroll
            for (int i = 0; i < AI; i++) {
                ra[i] = make_uint4(0u, 0u, 0u, 0u);
                if (in && xrow[i] >= 0) ra[i] = convmma_ld16(a.x + xrow[i] + toff + c);
            }
#pragma unroll
            for (int i = 0; i < BI; i++) {
                rb[i] = make_uint4(0u, 0u, 0u, 0u);
                if (in && wok[i]) rb[i] = convmma_ld16(wrow[i] + kk);
            }
            advance();
        };
        auto put = [&](int buf) {
            uint16_t *As = sm + buf * STAGE, *Bs = As + CMMA_BM * CMMA_LDS;
#pragma unroll
            for (int i = 0; i < AI; i++) *(uint4 *)(As + (lr + RP * i) * CMMA_LDS + 8 * lc) = ra[i];
#pragma unroll
            for (int i = 0; i < BI; i++) *(uint4 *)(Bs + (lr + RP * i) * CMMA_LDS + 8 * lc) = rb[i];
        };
        fetch();
        put(0);
        for (int t = 0; t < nsteps; t++) {
            __syncthreads(); /* step t's stage is written; everyone is done with step t - 1's */
            if (t + 1 < nsteps) fetch();
            const uint16_t *As = sm + (t & 1) * STAGE;
            convmma_step<MM, BF, MT, NTL>(acc, As, As + CMMA_BM * CMMA_LDS, wm0, wn0, lane);
            if (t + 1 < nsteps) put((t + 1) & 1);
        }
    }

    /* y[row][channel], rounded once; pairs of adjacent channels as one 32-bit store */
    const bool pairs = MM::PAIRS && (a.K & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTL; nt++)
#pragma unroll
            for (int e = 0; e < MM::NE; e++) {
                const int r = m0 + wm0 + mt * 16 + MM::row(lane, e), col = n0 + wn0 + nt * MM::IN + MM::col(lane, e);
                if (r >= a.M || col >= a.K) continue;
                uint16_t *p = a.y + (int64_t)r * a.K + col;
                if (!pairs) {
                    *p = convmma_round<BF>(acc[mt][nt][e]);
                } else if ((e & 1) == 0) {
                    *(uint32_t *)p = (uint32_t)convmma_round<BF>(acc[mt][nt][e]) |
                                     (uint32_t)convmma_round<BF>(acc[mt][nt][e + 1]) << 16;
                }
            }
}

/* Output i (row i / K, channel i % K) in f32, the plain way: the self-check's reference. */
template <bool BF> __device__ __forceinline__ float convmma_reference(const convmma_args &a, int64_t i) {
    const int m = (int)(i / a.K), n = (int)(i % a.K);
    const int64_t o = convmma_origin(a, m);
    const int taps = a.R / a.C;
    float s = 0.f;
    for (int tap = 0; tap < taps; tap++) {
        const int kw = tap % a.kW, kh = (tap / a.kW) % a.kH, kt = tap / (a.kW * a.kH);
        const uint16_t *xp = a.x + o + kt * a.xs_t + kh * a.xs_h + (int64_t)kw * a.C;
        const uint16_t *wp = a.w + (int64_t)n * a.R + (int64_t)tap * a.C;
        for (int c = 0; c < a.C; c++) s += convmma_value<BF>(xp[c]) * convmma_value<BF>(wp[c]);
    }
    return s;
}

/* -- policies: fragments, products and output positions of each matrix instruction ----------- */
#if !defined(FPK_HIP)
/* NVIDIA mma.sync m16n8k16 (sm_80+): 128 channels a block, NW warps as 2 (rows) × NW / 2
 * (channels): 8 warps of 64 × 32 (4 × 4 tiles of 16 × 8) or 4 of 64 × 64 (4 × 8). Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16",
 * g = lane / 4, t = lane % 4; a register holds 2 consecutive k, the lower one in its low half):
 * A = rows g, g + 8, g, g + 8 at k 2t, 2t, 2t + 8, 2t + 8; B = channel g at k 2t and 2t + 8;
 * C = (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). */
template <int NW> struct cmma_sync {
    static constexpr int BN = 128, WAVE = 32, IN = 8, WARPS_M = 2, WARPS_N = NW / 2, NE = 4;
    static constexpr bool ASYNC = true, PAIRS = true;
    struct afrag {
        uint32_t r[4];
    };
    struct bfrag {
        uint32_t r[2];
    };
    struct acc {
        float v[4];
        __device__ __forceinline__ float &operator[](int i) { return v[i]; }
    };
    static __device__ __forceinline__ afrag load_a(const uint16_t *p, int lane) {
        const uint16_t *p0 = p + (lane >> 2) * CMMA_LDS + 2 * (lane & 3), *p1 = p0 + 8 * CMMA_LDS;
        afrag f;
        f.r[0] = *(const uint32_t *)p0;
        f.r[1] = *(const uint32_t *)p1;
        f.r[2] = *(const uint32_t *)(p0 + 8);
        f.r[3] = *(const uint32_t *)(p1 + 8);
        return f;
    }
    static __device__ __forceinline__ bfrag load_b(const uint16_t *p, int lane) {
        const uint16_t *p0 = p + (lane >> 2) * CMMA_LDS + 2 * (lane & 3);
        bfrag f;
        f.r[0] = *(const uint32_t *)p0;
        f.r[1] = *(const uint32_t *)(p0 + 8);
        return f;
    }
    template <bool BF> static __device__ __forceinline__ void mma(acc &c, const afrag &a, const bfrag &b) {
        mma16816(c.v, a.r, b.r[0], b.r[1], BF);
    }
    static __device__ __forceinline__ int row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
    static __device__ __forceinline__ int col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }
    /* x through L1: a row's next taps along W are its neighbours' current ones (stride 1) */
    static __device__ __forceinline__ void copy16_x(uint16_t *dst, const uint16_t *src, bool pred) {
        cp_async16_ca(dst, src, pred);
    }
    static __device__ __forceinline__ void copy16_w(uint16_t *dst, const uint16_t *src, bool pred) {
        cp_async16(dst, src, pred);
    }
    static __device__ __forceinline__ void commit() { cp_async_commit(); }
    template <int N> static __device__ __forceinline__ void wait() { cp_async_wait<N>(); }
};
#endif

#if defined(FPK_AMD_MFMA)
/* AMD MFMA 16x16x16 (wave64): 128 channels a block, 4 waves as 2 × 2, each 64 × 64 as 4 × 4 tiles. D = W·Xᵀ: the A
 * operand is 16 channels' k 4g..4g+3 (g = lane / 16), B 16 positions' the same k; lane L's
 * accumulator holds position L % 16, channels 4g + e. */
struct cmma_mfma {
    static constexpr int BN = 128, WAVE = 64, IN = 16, WARPS_M = 2, WARPS_N = 2, NE = 4;
    static constexpr bool ASYNC = false, PAIRS = true;
    typedef amd_v4s afrag;
    typedef amd_v4s bfrag;
    typedef amd_v4f acc;
    static __device__ __forceinline__ amd_v4s load(const uint16_t *p, int lane) {
        return __builtin_bit_cast(amd_v4s, *(const amd_u2 *)(p + (lane & 15) * CMMA_LDS + 4 * (lane >> 4)));
    }
    static __device__ __forceinline__ afrag load_a(const uint16_t *p, int lane) { return load(p, lane); }
    static __device__ __forceinline__ bfrag load_b(const uint16_t *p, int lane) { return load(p, lane); }
    template <bool BF> static __device__ __forceinline__ void mma(acc &c, const afrag &a, const bfrag &b) {
        c = amd_mfma16(b, a, c, BF);
    }
    static __device__ __forceinline__ int row(int lane, int e) { return (void)e, lane & 15; }
    static __device__ __forceinline__ int col(int lane, int e) { return 4 * (lane >> 4) + e; }
};
#endif

#if defined(FPK_AMD_WMMA)
/* AMD WMMA 16x16x16 (wave32): 64 channels a block (Debian's LLVM 15 gives gfx11 kernels 128
 * VGPRs: 128 spilled), 8 waves as 4 × 2, each 32 × 32 as 2 × 2 tiles. D = W·Xᵀ: A is 16
 * channels' k 0..15, B 16 positions' k 0..15 (lanes 16..31 load what lanes 0..15 do); lane L's
 * accumulator holds position L % 16, channels 2e + L / 16. */
struct cmma_wmma {
    static constexpr int BN = CMMA_BN_WMMA, WAVE = 32, IN = 16, WARPS_M = 4, WARPS_N = 2, NE = 8;
    static constexpr bool ASYNC = false, PAIRS = false;
    typedef amd_v16s afrag;
    typedef amd_v16s bfrag;
    typedef amd_v8f acc;
    static __device__ __forceinline__ amd_v16s load(const uint16_t *p, int lane) {
        const uint16_t *q = p + (lane & 15) * CMMA_LDS;
        amd_u4 lo = *(const amd_u4 *)q, hi = *(const amd_u4 *)(q + 8);
        return __builtin_bit_cast(amd_v16s, (amd_u8)__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7));
    }
    static __device__ __forceinline__ afrag load_a(const uint16_t *p, int lane) { return load(p, lane); }
    static __device__ __forceinline__ bfrag load_b(const uint16_t *p, int lane) { return load(p, lane); }
    template <bool BF> static __device__ __forceinline__ void mma(acc &c, const afrag &a, const bfrag &b) {
        c = amd_wmma16(b, a, c, BF);
    }
    static __device__ __forceinline__ int row(int lane, int e) { return (void)e, lane & 15; }
    static __device__ __forceinline__ int col(int lane, int e) { return 2 * e + (lane >> 4); }
};
#endif
/* ---- end of the kernel body ----------------------------------------------------------------- */

/* The reference for the self-check: one thread per output, f32 out. */
template <bool BF> __global__ void __launch_bounds__(256) k_conv_ndhwc_reference(convmma_args a, float *out) {
    const int64_t total = (int64_t)a.M * a.K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = convmma_reference<BF>(a, i);
}

enum { CONV_PATH_NONE = 0, CONV_PATH_MFMA = 1, CONV_PATH_WMMA = 2, CONV_PATH_MMA_SYNC = 3 };

static const char *conv_path_name(int path) {
    return path == CONV_PATH_MFMA       ? "mfma"
           : path == CONV_PATH_WMMA     ? "wmma"
           : path == CONV_PATH_MMA_SYNC ? "mma.sync"
                                        : "none";
}

#if !defined(FPK_HIP)
template <int NW, int ST, bool BF> __global__ void __launch_bounds__(NW * 32, 2) k_conv_mma(convmma_args a) {
    extern __shared__ __align__(16) uint16_t cmma_smem[];
    convmma_body<cmma_sync<NW>, ST, BF>(a, cmma_smem);
}

/* Launches k_conv_mma<NW, ST, BF> with its dynamic shared memory (opted in once per device). */
template <int NW, int ST, bool BF>
static fpk_status launch_sync_st(int device, const convmma_args &a, unsigned blocks, cudaStream_t st) {
    constexpr size_t smem = (size_t)ST * CMMA_STAGE(cmma_sync<NW>::BN) * 2;
    static uint64_t opted; /* bit per device (the first 64) */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t bit = device >= 0 && device < 64 ? (uint64_t)1 << device : 0;
    pthread_mutex_lock(&mu);
    bool need = smem > 48 * 1024 && (!bit || !(opted & bit));
    cudaError_t e = need ? cudaFuncSetAttribute(k_conv_mma<NW, ST, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)
                         : cudaSuccess;
    if (e == cudaSuccess && need) opted |= bit;
    pthread_mutex_unlock(&mu);
    if (e != cudaSuccess) return fpk_gpu_error(e, "conv3d (matrix units): shared memory");
    k_conv_mma<NW, ST, BF><<<blocks, NW * 32, smem, st>>>(a);
    return fpk_gpu_launched("conv3d (matrix units, mma.sync)");
}

template <bool BF>
static fpk_status launch_sync(int device, int variant, const convmma_args &a, unsigned blocks, cudaStream_t st) {
    switch (variant) {
    case 0: return launch_sync_st<8, 2, BF>(device, a, blocks, st);
    case 1: return launch_sync_st<8, 3, BF>(device, a, blocks, st);
    case 2: return launch_sync_st<8, 4, BF>(device, a, blocks, st);
    case 3: return launch_sync_st<4, 2, BF>(device, a, blocks, st);
    case 4: return launch_sync_st<4, 3, BF>(device, a, blocks, st);
    default: return launch_sync_st<4, 4, BF>(device, a, blocks, st);
    }
}
#endif

/* The kernel variant a call runs, each self-checked on its own: on CUDA the warps a block
 * (fpk_gpu_cfg.conv_mma_warps: 4 of 64 × 64, the default, or 8 of 64 × 32) and the stages
 * (conv_mma_stages: 2, 3 (default) or 4 of 20 KiB), for benchmarks; one on AMD.
 * On an H100 (2026-11-28, the full-size VAE decode with the own tier forced) 4 warps took 3.34 s
 * and 8 warps 3.78 s (cuDNN 2.18 s). */
#define CONV_VARIANTS 6
static int conv_variant(void) {
#if !defined(FPK_HIP)
    int warps = fpk_gpu_cfg.conv_mma_warps, stages = fpk_gpu_cfg.conv_mma_stages;
    if (stages < 2 || stages > 4) stages = 3;
    return (warps == 4 ? 3 : 0) + stages - 2;
#else
    return 0;
#endif
}

#if defined(FPK_HIP)
/* The kernel of PATH; on a target without that path (and in the host pass) the body is empty:
 * conv_matrix_path never launches it there. */
template <int PATH, bool BF> __global__ void __launch_bounds__(CMMA_NT) k_conv_amd(convmma_args a) {
    (void)a;
#if defined(FPK_AMD_MFMA)
    if constexpr (PATH == CONV_PATH_MFMA) {
        __shared__ __attribute__((aligned(16))) uint16_t sm[2 * CMMA_STAGE(cmma_mfma::BN)];
        convmma_body<cmma_mfma, 2, BF>(a, sm);
    }
#endif
#if defined(FPK_AMD_WMMA)
    if constexpr (PATH == CONV_PATH_WMMA) {
        __shared__ __attribute__((aligned(16))) uint16_t sm[2 * CMMA_STAGE(cmma_wmma::BN)];
        convmma_body<cmma_wmma, 2, BF>(a, sm);
    }
#endif
}

/* The path the device's code object has (the arch it was compiled for decides) and its wave size. */
__global__ void k_conv_amd_path(int *out) {
    int path = CONV_PATH_NONE;
#if defined(FPK_AMD_MFMA)
    path = CONV_PATH_MFMA;
#elif defined(FPK_AMD_WMMA)
    path = CONV_PATH_WMMA;
#endif
    out[0] = path;
    out[1] = warpSize;
}
#endif

/* Launches the path's kernel (variant: conv_variant's) over the grid of blocks (row tiles ×
 * channel tiles). */
static fpk_status launch_path(int device, int path, int variant, bool bf16, convmma_args a, cudaStream_t st) {
    const int bn = path == CONV_PATH_WMMA ? CMMA_BN_WMMA : 128;
    a.tiles_n = (a.K + bn - 1) / bn;
    const int64_t blocks = (int64_t)((a.M + CMMA_BM - 1) / CMMA_BM) * a.tiles_n;
    (void)device, (void)variant;
#if !defined(FPK_HIP)
    if (path == CONV_PATH_MMA_SYNC)
        return bf16 ? launch_sync<true>(device, variant, a, (unsigned)blocks, st)
                    : launch_sync<false>(device, variant, a, (unsigned)blocks, st);
#else
    if (path == CONV_PATH_MFMA || path == CONV_PATH_WMMA) {
        if (path == CONV_PATH_MFMA) {
            if (bf16) k_conv_amd<CONV_PATH_MFMA, true><<<(unsigned)blocks, CMMA_NT, 0, st>>>(a);
            else k_conv_amd<CONV_PATH_MFMA, false><<<(unsigned)blocks, CMMA_NT, 0, st>>>(a);
        } else {
            if (bf16) k_conv_amd<CONV_PATH_WMMA, true><<<(unsigned)blocks, CMMA_NT, 0, st>>>(a);
            else k_conv_amd<CONV_PATH_WMMA, false><<<(unsigned)blocks, CMMA_NT, 0, st>>>(a);
        }
        return fpk_gpu_launched(path == CONV_PATH_MFMA ? "conv3d (matrix cores, mfma)" : "conv3d (matrix cores, wmma)");
    }
#endif
    return fpk_gpu_set_error(FPK_ERR_INTERNAL, "conv3d (matrix units): no %s kernel in this build", conv_path_name(path));
}

/* The kernel arguments for a conv the caller's checks passed (tiles_n: launch_path's). */
static convmma_args conv_args(int64_t N, int64_t C, int64_t Tp, int64_t Hp, int64_t Wp, const void *x, int64_t K,
                              int64_t kT, int64_t kH, int64_t kW, const void *w, int64_t sT, int64_t sH, int64_t sW,
                              int64_t To, int64_t Ho, int64_t Wo, void *y) {
    convmma_args a;
    memset(&a, 0, sizeof a);
    a.x = (const uint16_t *)x;
    a.w = (const uint16_t *)w;
    a.y = (uint16_t *)y;
    a.xs_h = Wp * C;
    a.xs_t = Hp * a.xs_h;
    a.xs_n = Tp * a.xs_t;
    a.M = (int)(N * To * Ho * Wo);
    a.K = (int)K;
    a.R = (int)(kT * kH * kW * C);
    a.C = (int)C;
    a.kH = (int)kH, a.kW = (int)kW;
    a.To = (int)To, a.Ho = (int)Ho, a.Wo = (int)Wo;
    a.sT = (int)sT, a.sH = (int)sH, a.sW = (int)sW;
    return a;
}

/* ---- per-device state and the self-check ------------------------------------------------- */

/* What the process decided per device: the path (probed once), whether it is disabled (a failed
 * or erroring self-check: every call after is declined), and the self-checks passed per dtype
 * (f16, bf16) and variant. */
#define CONV_MAX_DEVICES 64
struct conv_device_state {
    int probed;
    int path;
    int disabled;
    char why[320]; /* why the path is off, for fpk_gpu_cfg.conv_selfcheck_strict and the error */
    unsigned char passed[2][CONV_VARIANTS];
};
static conv_device_state conv_devices[CONV_MAX_DEVICES];
static pthread_mutex_t conv_devices_mu = PTHREAD_MUTEX_INITIALIZER; /* protects conv_devices */

static int conv_strict(void) { return fpk_gpu_cfg.conv_selfcheck_strict; }

/* The self-check's conv: N 2, C 48 (taps straddle the 32-wide reduction steps), 5 × 13 × 15
 * padded frames, K 136 (a partial channel tile), 3x3x3 taps, stride (1, 2, 2): To 3, Ho 6, Wo 7,
 * M 252 (a partial row tile). */
enum { SC_N = 2, SC_C = 48, SC_T = 5, SC_H = 13, SC_W = 15, SC_K = 136, SC_KS = 3, SC_ST = 1, SC_SS = 2 };
#define SC_GUARD 256 /* 16-bit elements before and after y that must stay untouched */

/* Runs the path's kernel and the reference kernel on the self-check's conv of dtype dt and
 * compares: *ok when the relative L2 distance is at most 1e-2, every output was written (y is
 * prefilled with NaN) and the guards around y are untouched. why says what failed. Errors: a
 * lost device, or scratch out of memory (then nothing is decided). */
static fpk_status conv_self_check(int device, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, int variant,
                                  int dt, bool *ok, char *why, size_t nwhy) {
    const int64_t To = (SC_T - SC_KS) / SC_ST + 1, Ho = (SC_H - SC_KS) / SC_SS + 1, Wo = (SC_W - SC_KS) / SC_SS + 1;
    const int64_t nx = (int64_t)SC_N * SC_T * SC_H * SC_W * SC_C, nw = (int64_t)SC_K * SC_KS * SC_KS * SC_KS * SC_C;
    const int64_t ny = (int64_t)SC_N * To * Ho * Wo * SC_K, nyg = ny + 2 * SC_GUARD;
    const bool bf16 = dt == FPK_BF16;
    *ok = false;
    auto up = [](int64_t bytes) { return (size_t)((bytes + 255) / 256 * 256); };
    size_t off_x32 = 0, off_w32 = off_x32 + up(nx * 4), off_x = off_w32 + up(nw * 4), off_w = off_x + up(nx * 2);
    size_t off_y = off_w + up(nw * 2), off_y32 = off_y + up(nyg * 2), off_r = off_y32 + up(ny * 4);
    size_t total = off_r + up(ny * 4);
    size_t host_bytes = (size_t)(nx + nw + 2 * ny) * 4 + (size_t)nyg * 2;
    float *host = (float *)malloc(host_bytes);
    if (!host) return fpk_gpu_set_oom(host_bytes, 0, "host conv3d self-check");
    float *hx = host, *hw = hx + nx, *hy = hw + nw, *hr = hy + ny;
    uint16_t *hg = (uint16_t *)(hr + ny);
    uint32_t seed = 0x9e3779b9u + (uint32_t)dt * 7919u;
    for (int64_t i = 0; i < nx + nw; i++) { /* multiples of 1/64 in [-1, 1]: exact in f16 and bf16 */
        seed = seed * 1664525u + 1013904223u;
        host[i] = (float)((int)(seed >> 25) - 64) / 64.f;
    }
    fpk_scratch sc(sf);
    fpk_status s = sc.alloc(total);
    if (s != FPK_OK) {
        free(host);
        return s;
    }
    char *base = (char *)sc.ptr;
    uint16_t *y = (uint16_t *)(base + off_y) + SC_GUARD;
    convmma_args a = conv_args(SC_N, SC_C, SC_T, SC_H, SC_W, base + off_x, SC_K, SC_KS, SC_KS, SC_KS, base + off_w, SC_ST,
                               SC_SS, SC_SS, To, Ho, Wo, y);
    const char *step = "upload";
    cudaError_t e = cudaMemcpyAsync(base + off_x32, hx, (size_t)nx * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(base + off_w32, hw, (size_t)nw * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(base + off_y, 0xff, (size_t)nyg * 2, st); /* NaN in f16 and bf16 */
    if (e == cudaSuccess) {
        step = "convert";
        s = fpk_gpu_convert(st, base + off_x, dt, base + off_x32, FPK_F32, nx);
        if (s == FPK_OK) s = fpk_gpu_convert(st, base + off_w, dt, base + off_w32, FPK_F32, nw);
        if (s == FPK_OK) {
            step = "reference kernel";
            if (bf16) k_conv_ndhwc_reference<true><<<(unsigned)((ny + 255) / 256), 256, 0, st>>>(a, (float *)(base + off_r));
            else k_conv_ndhwc_reference<false><<<(unsigned)((ny + 255) / 256), 256, 0, st>>>(a, (float *)(base + off_r));
            s = fpk_gpu_launched("conv3d self-check reference");
        }
        if (s == FPK_OK) {
            step = "matrix kernel";
            s = launch_path(device, path, variant, bf16, a, st);
        }
        if (s == FPK_OK) {
            step = "convert output";
            s = fpk_gpu_convert(st, base + off_y32, FPK_F32, y, dt, ny);
        }
        if (s != FPK_OK) { /* the helpers took the runtime error and set the last error */
            snprintf(why, nwhy, "self-check %s: status %d", step, (int)s);
            free(host);
            return s == FPK_ERR_DEVICE_LOST ? s : FPK_OK;
        }
    }
    if (e == cudaSuccess) {
        step = "download";
        e = cudaMemcpyAsync(hy, base + off_y32, (size_t)ny * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(hr, base + off_r, (size_t)ny * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(hg, base + off_y, (size_t)nyg * 2, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "conv3d self-check (%s)", step);
        free(host);
        return fpk_gpu_check_error(e, what, why, nwhy);
    }
    double rel = fpk_rel_l2_host(hy, hr, ny);
    int64_t touched = 0;
    for (int64_t i = 0; i < SC_GUARD; i++) touched += (hg[i] != 0xffffu) + (hg[SC_GUARD + ny + i] != 0xffffu);
    free(host);
    *ok = rel <= 1e-2 && touched == 0; /* NaN (an output never written) fails too */
    if (!*ok)
        snprintf(why, nwhy, "%s kernel (variant %d) differs from the reference on the self-check (%s): relative L2 %g "
                 "(at most 1e-2), %lld guard elements written", conv_path_name(path), variant, bf16 ? "bf16" : "f16", rel,
                 (long long)touched);
    return FPK_OK;
}

/* The device's matrix path, probed once per device (CUDA: compute capability 8.0 or later; HIP:
 * what the device's code object was compiled with). */
static fpk_status conv_probe(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, conv_device_state *d) {
#if !defined(FPK_HIP)
    (void)st, (void)sf;
    d->probed = 1;
    d->path = fpk_gpu_mma_device(c) ? CONV_PATH_MMA_SYNC : CONV_PATH_NONE;
    if (d->path == CONV_PATH_NONE)
        snprintf(d->why, sizeof d->why, "no mma.sync on %s (compute capability below 8.0)", c->arch);
    return FPK_OK;
#else
    fpk_scratch sc(sf);
    FPK_TRY(sc.alloc(2 * sizeof(int))); /* out of memory: probed by a later call */
    int got[2] = {0, 0};
    k_conv_amd_path<<<1, 1, 0, st>>>((int *)sc.ptr);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(got, sc.ptr, sizeof got, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    d->probed = 1;
    if (e != cudaSuccess) {
        d->disabled = 1;
        return fpk_gpu_check_error(e, "conv3d: matrix path probe", d->why, sizeof d->why);
    }
    d->path = got[0];
    if ((d->path == CONV_PATH_MFMA && got[1] != 64) || (d->path == CONV_PATH_WMMA && got[1] != 32)) {
        snprintf(d->why, sizeof d->why, "%s kernel built for wave size %d", conv_path_name(d->path), got[1]);
        d->disabled = 1;
    }
    if (d->path == CONV_PATH_NONE) snprintf(d->why, sizeof d->why, "no matrix-core path compiled for %s", c->arch);
    return FPK_OK;
#endif
}

/* The path for a call of dtype dt in that variant (CONV_PATH_NONE: decline). The first call on a
 * device probes it; the first call of each dtype and variant self-checks it (one stream sync); a
 * failure disables the path on that device for the process. */
static fpk_status conv_matrix_path(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int dt, int variant,
                                   int *path, char *why, size_t nwhy) {
    *path = CONV_PATH_NONE;
    snprintf(why, nwhy, "device %d out of range", c->device);
    if (c->device < 0 || c->device >= CONV_MAX_DEVICES) return FPK_OK;
    pthread_mutex_lock(&conv_devices_mu);
    conv_device_state *d = &conv_devices[c->device];
    fpk_status s = FPK_OK;
    if (!d->probed) s = conv_probe(c, st, sf, d);
    int bf = dt == FPK_BF16;
    if (s == FPK_OK && d->probed && d->path != CONV_PATH_NONE && !d->disabled && !d->passed[bf][variant]) {
        bool ok = false;
        char w[256] = "";
        s = conv_self_check(c->device, st, sf, d->path, variant, dt, &ok, w, sizeof w);
        if (s == FPK_OK && ok) {
            d->passed[bf][variant] = 1;
        } else if (s == FPK_OK) {
            snprintf(d->why, sizeof d->why, "%s on %s: %s", conv_path_name(d->path), c->arch, w);
            d->disabled = 1;
        }
    }
    int use = d->probed && !d->disabled && d->passed[bf][variant] ? d->path : CONV_PATH_NONE;
    int refused = d->disabled && d->path != CONV_PATH_NONE;
    if (!d->probed) snprintf(why, nwhy, "not probed yet (no scratch memory)");
    else if (use == CONV_PATH_NONE && !d->disabled && d->path != CONV_PATH_NONE)
        snprintf(why, nwhy, "%s not self-checked yet (no scratch memory)", conv_path_name(d->path));
    else snprintf(why, nwhy, "%s", d->why);
    pthread_mutex_unlock(&conv_devices_mu);
    if (s == FPK_ERR_OUT_OF_MEMORY) return FPK_OK; /* no room to check now: declined, checked later */
    FPK_TRY(s);
    if (refused && conv_strict())
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: matrix path disabled by its self-check: %s", why);
    *path = use;
    return FPK_OK;
}

/* fpk_gpu_cfg.conv_fma: decline every call (k_conv3d serves; tests and comparisons). */
static int conv_mma_off(void) { return fpk_gpu_cfg.conv_fma; }

fpk_status fpk_gpu_conv_ndhwc_mma(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int dt, int64_t N,
                                  int64_t C, int64_t Tp, int64_t Hp, int64_t Wp, const void *x, int64_t K, int64_t kT,
                                  int64_t kH, int64_t kW, const void *w, int64_t sT, int64_t sH, int64_t sW, int64_t To,
                                  int64_t Ho, int64_t Wo, void *y) {
    if (dt != FPK_F16 && dt != FPK_BF16)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d (matrix units): f16 or bf16 only, got dtype %d", dt);
    if (conv_mma_off())
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d (matrix units): the FMA kernel is asked for (conv_fma)");
    if (N < 0 || C < 1 || Tp < 1 || Hp < 1 || Wp < 1 || K < 0 || kT < 1 || kH < 1 || kW < 1 || sT < 1 || sH < 1 || sW < 1 ||
        To < 0 || Ho < 0 || Wo < 0 || (To > 0 && (To - 1) * sT + kT > Tp) || (Ho > 0 && (Ho - 1) * sH + kH > Hp) ||
        (Wo > 0 && (Wo - 1) * sW + kW > Wp))
        return fpk_gpu_set_error(FPK_ERR_INVALID_ARGUMENT,
                                 "conv3d (matrix units): output %lldx%lldx%lld with kernel %lldx%lldx%lld and stride "
                                 "%lldx%lldx%lld reads past the input %lldx%lldx%lld",
                                 (long long)To, (long long)Ho, (long long)Wo, (long long)kT, (long long)kH, (long long)kW,
                                 (long long)sT, (long long)sH, (long long)sW, (long long)Tp, (long long)Hp, (long long)Wp);
    if (C % 16)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d (matrix units): input channels %lld not a multiple of 16",
                                 (long long)C);
    int64_t M = N * To * Ho * Wo, R = kT * kH * kW * C;
    if (M == 0 || K == 0) return FPK_OK;
    /* rows and reduction in int (with a tile of headroom), offsets into x in int64; the grid is
     * one dimension of row tiles × channel tiles */
    int64_t blocks = ((M + CMMA_BM - 1) / CMMA_BM) * ((K + CMMA_BN_WMMA - 1) / CMMA_BN_WMMA);
#if defined(FPK_HIP)
    const int64_t max_blocks = (int64_t)UINT32_MAX / CMMA_NT; /* HIP: a grid's threads within 32 bits */
#else
    const int64_t max_blocks = INT_MAX;
#endif
    if (M > INT_MAX - CMMA_BM || R > INT_MAX - CMMA_BM || K > INT_MAX / 2 || To > INT_MAX || Ho > INT_MAX ||
        Wo > INT_MAX || sT * To > INT_MAX || sH * Ho > INT_MAX || sW * Wo > INT_MAX || blocks > max_blocks)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE,
                                 "conv3d (matrix units): %lld rows × %lld channels × %lld-long reduction beyond the "
                                 "kernel's indexing", (long long)M, (long long)K, (long long)R);
    if (((uintptr_t)x & 15) || ((uintptr_t)w & 15) || ((uintptr_t)y & 15))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d (matrix units): x, w and y must be 16-byte aligned");
    int path = CONV_PATH_NONE, variant = conv_variant();
    char why[320];
    FPK_TRY(conv_matrix_path(c, st, sf, dt, variant, &path, why, sizeof why));
    if (path == CONV_PATH_NONE)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d (matrix units): unavailable on this device: %s", why);
    convmma_args a = conv_args(N, C, Tp, Hp, Wp, x, K, kT, kH, kW, w, sT, sH, sW, To, Ho, Wo, y);
    return launch_path(c->device, path, variant, dt == FPK_BF16, a, st);
}

fpk_status fpk_gpu_conv_mma_ready(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int dt, int *ready) {
    *ready = 0;
    if ((dt != FPK_F16 && dt != FPK_BF16) || conv_mma_off()) return FPK_OK;
    int path = CONV_PATH_NONE;
    char why[320];
    FPK_TRY(conv_matrix_path(c, st, sf, dt, conv_variant(), &path, why, sizeof why));
    *ready = path != CONV_PATH_NONE;
    return FPK_OK;
}
