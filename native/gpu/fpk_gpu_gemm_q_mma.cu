/*
 * fpk_gpu_gemm_q_mma.cu — fp8 × fp8 GEMM with activation quantization (fpk_op_gemm_q's per-tensor
 * and per-token modes), on the matrix units:
 *
 *   1. the activations a [M, K] are quantized to e4m3 into scratch: s_a = max|a| / 448 over all of
 *      a (per tensor) or per row (per token), 1 for zeros; q = e4m3(clamp(a / s_a, ±448)) — the
 *      cpu backend's reference arithmetic (fpk_cpu_quantize_act). One kernel per token (a
 *      32-lane group a row: its max, then its bytes, 16-byte loads), two per tensor (the rows'
 *      maxima into one, then the bytes). Every row's s_a is written, so both modes hand the
 *      product a vector of M scales.
 *   2. On NVIDIA (compute capability 8.9 and later: Ada, Hopper), cuBLASLt's FP8 matmul writes out
 *      directly (alpha 1): out = GELU?(s_a[m] · s_w[n] · Σ q(a)·q(w) + bias[n]) in out's dtype, the
 *      scales as its A/B scale pointers — one scalar each when both are per tensor, else
 *      cuBLAS 12.9's outer-vector mode with both as vectors (a per-tensor one repeated) — and the
 *      bias and GELU as its epilogue for 16-bit outputs (an f32 output, or a 16-bit one whose
 *      epilogue variant is off, gets them from a kernel after: the fp8 kernels read a bias in 16
 *      bits only). Each such variant (scalar or vector
 *      scales, output dtype, epilogue, weight type) is self-checked before its first use; one the
 *      library refuses (an older cuBLAS, no algorithm for the shape) or that fails its check goes
 *      to step 3.
 *   3. Otherwise (and on CDNA3) the product D = q(a) · q(w)ᵀ with f32 accumulation and unit scales
 *      goes into f32 scratch, a chunk of rows at a time (at most 64 MiB of D): cuBLASLt's FP8
 *      matmul on NVIDIA, our MFMA kernel on CDNA3 (gfx940-942, whose fp8 types are the FNUZ
 *      variants: fed the OCP bytes, with −0 turned into +0, each operand reads at half its value
 *      and the product is multiplied by 4, exactly); then
 *      out = alpha · D · s_a[row] · s_w[col] + bias, GELU(tanh) when asked, rounded once to out's dtype.
 *
 * Weights with per-tensor or per-channel scales only: block-wise scales (musubi's block mode)
 * cannot leave the product, so those calls are declined (FPK_ERR_UNAVAILABLE) and the runtime
 * falls back to weight-only. K must be a multiple of 32 (16 for cuBLASLt), pointers 16-byte
 * aligned. Each device's path is self-checked before its first use, as the flash and conv matrix
 * kernels are: the path and a plain f32 kernel compute the same quantized product on a small
 * problem (M 40, N 48, K 96) and must agree to a relative L2 of 1e-3 with every output written;
 * otherwise the path is off for the process and every call is declined with the reason. The
 * direct variants of step 2 are checked the same way against the reference's product with the
 * scales, bias and GELU applied on the host (1e-3 for an f32 output, 1e-2 for a 16-bit one).
 * scripts/gpu-check.sh phase fp8 runs it on an H100/H200 (with cuBLASLt's own log of the calls).
 */
#include "fpk_gpu_mma.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Q8_PATH_NONE = 0, Q8_PATH_CUBLASLT = 1, Q8_PATH_MFMA = 2 };

static const char *q8_path_name(int p) { return p == Q8_PATH_CUBLASLT ? "cuBLASLt fp8" : p == Q8_PATH_MFMA ? "MFMA fp8" : "none"; }

/* ---- the fp8 kernel body (scripts/fp8mmaemu cuts it out and runs it on the host) ------------ */
#if defined(FPK_AMD_MFMA_FP8) || defined(FPK_FP8MMA_EMU)
/* 8 fp8 bytes as an FNUZ operand: a byte 0x80 (−0 in the OCP types, NaN in FNUZ) becomes 0x00;
 * every other byte reads as FNUZ at half its OCP value (the exponent bias is one more). */
__device__ __forceinline__ uint64_t fp8_fnuz8(uint64_t v) {
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full;
    uint64_t x = v ^ 0x8080808080808080ull; /* bytes that were 0x80 are now 0 */
    uint64_t zero = ~(((x & lo7) + lo7) | x | lo7); /* the high bit of each zero byte of x */
    return v & ~((zero >> 7) * 0xffull);
}

/* One wave (64 lanes) computes a 16 × 16 tile of d (f32, row stride ldd) = q(a) · q(w)ᵀ for
 * rows m0.., columns n0.. of aq [M, K] and wq [N, K] (row-major bytes, K a multiple of 32), with
 * the 16x16x32 fp8 MFMA. Lane L's operands: a row m0 + L % 16, w row n0 + L % 16, bytes
 * k + 8 (L / 16) .. + 7 of each step of 32; its results D[4 (L / 16) + v][L % 16], v < 4. wbf8:
 * w is e5m2 (bf8). */
__device__ __forceinline__ void fp8mma_wave(int lane, const uint8_t *aq, const uint8_t *wq, int64_t M, int64_t N,
                                            int64_t K, int64_t m0, int64_t n0, float *d, int64_t ldd, bool wbf8) {
    amd_v4f acc = {0.f, 0.f, 0.f, 0.f};
    const int r = lane % 16, g = lane / 16;
    const bool aok = m0 + r < M, bok = n0 + r < N;
    const uint8_t *ar = aq + (aok ? m0 + r : 0) * K + 8 * g, *br = wq + (bok ? n0 + r : 0) * K + 8 * g;
    for (int64_t k = 0; k < K; k += 32) {
        uint64_t av = aok ? fp8_fnuz8(*(const uint64_t *)(ar + k)) : 0;
        uint64_t bv = bok ? fp8_fnuz8(*(const uint64_t *)(br + k)) : 0;
        acc = amd_mfma_fp8(av, bv, acc, wbf8);
    }
    for (int v = 0; v < 4; v++) {
        int64_t m = m0 + 4 * g + v, n = n0 + r;
        if (m < M && n < N) d[m * ldd + n] = 4.0f * acc[v]; /* each FNUZ operand read at half its value */
    }
}
#endif
/* ---- end of the fp8 kernel body -------------------------------------------------------------- */

/* Four waves of 64, one 16 × 16 tile each (a device pass without the path compiles it empty). */
__global__ void __launch_bounds__(256) k_fp8mma(const uint8_t *aq, const uint8_t *wq, int64_t M, int64_t N, int64_t K,
                                                float *d, int64_t ldd, int wbf8) {
#if defined(FPK_AMD_MFMA_FP8)
    int64_t tiles_n = (N + 15) / 16;
    int64_t tile = (int64_t)blockIdx.x * 4 + threadIdx.x / 64;
    if (tile >= ((M + 15) / 16) * tiles_n) return;
    fp8mma_wave(threadIdx.x % 64, aq, wq, M, N, K, tile / tiles_n * 16, tile % tiles_n * 16, d, ldd, wbf8 != 0);
#else
    (void)aq, (void)wq, (void)M, (void)N, (void)K, (void)d, (void)ldd, (void)wbf8;
#endif
}

/* Which path this device's code object has (HIP: the device pass decides). */
__global__ void k_fp8mma_path(int *out) {
#if defined(FPK_AMD_MFMA_FP8)
    out[0] = Q8_PATH_MFMA;
    out[1] = warpSize;
#else
    out[0] = Q8_PATH_NONE;
    out[1] = 0;
#endif
}

/* ---- the shared steps ------------------------------------------------------------------------ */

/* 8 consecutive elements of a (dtype adt: f32, f16 or bf16) from element i, 16-byte aligned. */
__device__ __forceinline__ void act_ld8(const void *a, int adt, int64_t i, float *v) {
    if (adt == FPK_F32) {
        float4 x = *(const float4 *)((const float *)a + i), y = *(const float4 *)((const float *)a + i + 4);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        return;
    }
    uint4 x = *(const uint4 *)((const uint16_t *)a + i);
    uint32_t h[4] = {x.x, x.y, x.z, x.w};
    for (int j = 0; j < 4; j++) {
        uint16_t lo = (uint16_t)(h[j] & 0xffffu), hi = (uint16_t)(h[j] >> 16);
        v[2 * j] = adt == FPK_F16 ? fpk_f16_f32(lo) : fpk_bf16_f32(lo);
        v[2 * j + 1] = adt == FPK_F16 ? fpk_f16_f32(hi) : fpk_bf16_f32(hi);
    }
}

__device__ __forceinline__ uint8_t act_q(float x, float s) {
    float q = x / s;
    q = q != q ? 0.f : fminf(448.f, fmaxf(-448.f, q));
    return fpk_f32_to_e4m3(q);
}

enum { ACTQ_TENSOR_MAX = 0, ACTQ_TENSOR_QUANT = 1, ACTQ_TOKEN = 2 };

/* Activation quantization, one row of a [M, K] per group of 32 lanes (K a multiple of 8; vec: a
 * 16-byte aligned, so each lane loads 8 elements at a time):
 *   ACTQ_TENSOR_MAX    *gmax (f32 bits, zeroed before) = max over rows of max |a[r][:]|;
 *   ACTQ_TENSOR_QUANT  s = *gmax / 448 (1 for 0) for every row;
 *   ACTQ_TOKEN         s = max |a[r][:]| / 448 (1 for 0) per row;
 * the last two write sa[r] = s and aq[r][k] = e4m3(clamp(a[r][k] / s, ±448)) (NaN → 0). */
__global__ void __launch_bounds__(256) k_act_quant_rows(const void *a, int adt, int64_t M, int64_t K, int vec, int mode,
                                                        unsigned int *gmax, float *sa, uint8_t *aq) {
    const int lane = (int)(threadIdx.x % 32);
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (r >= M) return; /* whole groups: the shuffles below stay within live lanes */
    const int64_t row = r * K;
    float m = 0.f;
    if (mode != ACTQ_TENSOR_QUANT) {
        if (vec) {
            for (int64_t k = 8 * lane; k < K; k += 256) {
                float v[8];
                act_ld8(a, adt, row + k, v);
                for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
            }
        } else {
            for (int64_t k = lane; k < K; k += 32) m = fmaxf(m, fabsf(fpk_ld(a, adt, row + k)));
        }
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, FPK_SHFL_XOR(m, o, 32));
        if (mode == ACTQ_TENSOR_MAX) {
            if (lane == 0) atomicMax(gmax, __float_as_uint(m)); /* m >= 0: its bits order as the values */
            return;
        }
    } else {
        m = __uint_as_float(*gmax);
    }
    const float s = m > 0.f ? m / 448.f : 1.f;
    if (lane == 0) sa[r] = s;
    if (vec) {
        for (int64_t k = 8 * lane; k < K; k += 256) {
            float v[8];
            act_ld8(a, adt, row + k, v);
            uint2 q;
            q.x = (uint32_t)act_q(v[0], s) | (uint32_t)act_q(v[1], s) << 8 | (uint32_t)act_q(v[2], s) << 16 |
                  (uint32_t)act_q(v[3], s) << 24;
            q.y = (uint32_t)act_q(v[4], s) | (uint32_t)act_q(v[5], s) << 8 | (uint32_t)act_q(v[6], s) << 16 |
                  (uint32_t)act_q(v[7], s) << 24;
            *(uint2 *)(aq + row + k) = q;
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) aq[row + k] = act_q(fpk_ld(a, adt, row + k), s);
    }
}

/* aq [M, K] and sa [M] from a (fpk_op_gemm_q's rule), per row (per token) or per tensor; gmax is
 * one word of scratch. */
static fpk_status q8_quantize(cudaStream_t st, const fpk_gt *a, int64_t M, int64_t K, int per_row, unsigned int *gmax,
                              float *sa, uint8_t *aq) {
    if (M == 0) return FPK_OK;
    const int vec = ((uintptr_t)a->data % 16) == 0 && K % 8 == 0;
    const int64_t blocks = (M + 7) / 8; /* 8 rows of 32 lanes per block of 256 */
    if (blocks > 0x7fffffff) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: %lld rows", (long long)M);
    if (per_row) {
        k_act_quant_rows<<<(unsigned)blocks, 256, 0, st>>>(a->data, a->dtype, M, K, vec, ACTQ_TOKEN, gmax, sa, aq);
        return fpk_gpu_launched("gemm q: activation quantization");
    }
    FPK_CUDA(cudaMemsetAsync(gmax, 0, sizeof *gmax, st), "gemm q: activation max");
    k_act_quant_rows<<<(unsigned)blocks, 256, 0, st>>>(a->data, a->dtype, M, K, vec, ACTQ_TENSOR_MAX, gmax, sa, aq);
    FPK_TRY(fpk_gpu_launched("gemm q: activation max"));
    k_act_quant_rows<<<(unsigned)blocks, 256, 0, st>>>(a->data, a->dtype, M, K, vec, ACTQ_TENSOR_QUANT, gmax, sa, aq);
    return fpk_gpu_launched("gemm q: activation quantization");
}

/* dst[i] = src ? src[0] : 1 for i < n (a per-tensor scale as the outer-vector mode's vector). */
__global__ void k_fill_scale(float *dst, int64_t n, const float *src) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x)
        dst[i] = src ? src[0] : 1.f;
}

/* out[r][n] = alpha · d[r][n] · sa[r0 + r] · sw + bias[n], GELU(tanh) when gelu, for rows r0 + r. */
__global__ void k_q8_epilogue(const float *d, int64_t rows, int64_t N, const float *sa, int64_t r0, const float *sw,
                              int sw_rows, float alpha, const void *bias, int bdt, int gelu, void *out, int odt) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * N; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t r = i / N, n = i - r * N;
        float v = alpha * d[i] * sa[r0 + r] * (sw ? sw[sw_rows ? n : 0] : 1.f);
        if (bias) v += fpk_ld(bias, bdt, n);
        if (gelu) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        fpk_st(out, odt, (r0 + r) * N + n, v);
    }
}

/* The reference the self-checks compare against: d[m][n] = Σ_k q(a)[m][k]·q(w)[n][k] in f32. */
__global__ void k_q8_reference(const uint8_t *aq, const uint8_t *wq, int wdt, int64_t M, int64_t N, int64_t K, float *d) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t m = i / N, n = i - m * N;
        float acc = 0.f;
        for (int64_t k = 0; k < K; k++) acc += fpk_e4m3_to_f32(aq[m * K + k]) * fpk_fp8_to_f32(wq[n * K + k], wdt);
        d[i] = acc;
    }
}

/* D [M, N] f32 (row stride N) = aq · wqᵀ on the path, unit scales. */
static fpk_status q8_product(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, const uint8_t *aq,
                             const uint8_t *wq, int wdt, int64_t M, int64_t N, int64_t K, float *d) {
    if (path == Q8_PATH_CUBLASLT) {
        fpk_fp8_gemm_desc g;
        memset(&g, 0, sizeof g);
        g.M = M, g.N = N, g.K = K, g.aq = aq, g.wq = wq, g.wdt = wdt, g.scales = FPK_FP8_SCALES_NONE, g.alpha = 1.f;
        g.d = d, g.ddt = FPK_F32;
        return fpk_vendor_gemm_fp8_lt(c, st, sf, &g);
    }
#if defined(FPK_HIP)
    if (path == Q8_PATH_MFMA) {
        int64_t tiles = ((M + 15) / 16) * ((N + 15) / 16);
        if ((tiles + 3) / 4 > 0x7fffffff) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: %lld tiles", (long long)tiles);
        k_fp8mma<<<dim3((unsigned)((tiles + 3) / 4)), dim3(256), 0, st>>>(aq, wq, M, N, K, d, N, wdt == FPK_F8E5M2);
        return fpk_gpu_launched("gemm q: fp8 mfma");
    }
#endif
    (void)sf;
    return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: no fp8 matrix path");
}

/* ---- the path, its self-check and the op ------------------------------------------------------ */

/* The direct variants (step 2): [scales: scalar, outer vector][out: f32, f16, bf16]
 * [cuBLASLt epilogue: none, bias, GELU, bias + GELU][weights: e4m3, e5m2]. */
enum { Q8D_VEC = 2, Q8D_ODT = 3, Q8D_EPI = 4 };

#define Q8_MAX_DEVICES 64
struct q8_device_state {
    int probed, path, disabled, passed[2]; /* passed per weight type: e4m3, e5m2 */
    char why[320];
    signed char direct[Q8D_VEC][Q8D_ODT][Q8D_EPI][2]; /* 0 unchecked, 1 passed its self-check, -1 off */
};
static q8_device_state q8_devices[Q8_MAX_DEVICES];
static pthread_mutex_t q8_devices_mu = PTHREAD_MUTEX_INITIALIZER; /* protects q8_devices */

/* The device's path: cuBLASLt fp8 on compute capability 8.9 and later where cuBLASLt loaded;
 * the MFMA kernel where the device's code object has it. */
static fpk_status q8_probe(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, q8_device_state *d) {
    d->probed = 1;
#if !defined(FPK_HIP)
    (void)st, (void)sf;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device) != cudaSuccess)
        major = minor = 0;
    if (major * 10 + minor < 89) {
        snprintf(d->why, sizeof d->why, "no fp8 matrix units on %s (compute capability %d.%d, fp8 needs 8.9)", c->arch, major, minor);
        return FPK_OK;
    }
    if (!fpk_vendor_has_fp8_lt(c)) {
        snprintf(d->why, sizeof d->why, "cuBLASLt did not load");
        return FPK_OK;
    }
    d->path = Q8_PATH_CUBLASLT;
    return FPK_OK;
#else
    fpk_scratch sc(sf);
    FPK_TRY(sc.alloc(2 * sizeof(int)));
    int got[2] = {0, 0};
    k_fp8mma_path<<<1, 1, 0, st>>>((int *)sc.ptr);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(got, sc.ptr, sizeof got, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        d->disabled = 1;
        return fpk_gpu_check_error(e, "gemm q: fp8 path probe", d->why, sizeof d->why);
    }
    d->path = got[0];
    if (d->path == Q8_PATH_MFMA && got[1] != 64) {
        snprintf(d->why, sizeof d->why, "MFMA fp8 kernel built for wave size %d", got[1]);
        d->disabled = 1;
    }
    if (d->path == Q8_PATH_NONE) snprintf(d->why, sizeof d->why, "no fp8 matrix path compiled for %s (CDNA3 only)", c->arch);
    return FPK_OK;
#endif
}

enum { SC8_M = 40, SC8_N = 48, SC8_K = 96 };

/* The self-checks' operands: deterministic bytes, values in ±[2^-9, 448] (e5m2 weights up to
 * 57344), both signs, zeros, no NaN or infinity; na bytes of aq, then nw of wq. */
static void q8_check_operands(uint8_t *host, int64_t na, int64_t nw, int wdt) {
    uint32_t seed = 0x2545f491u + (uint32_t)wdt;
    for (int64_t i = 0; i < na + nw; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint8_t b = (uint8_t)(seed >> 24);
        if ((b & 0x7f) == 0x7f) b &= 0xf7;                                 /* no e4m3 NaN */
        if (i >= na && wdt == FPK_F8E5M2 && (b & 0x7c) == 0x7c) b ^= 0x40; /* no e5m2 inf or NaN */
        host[i] = b;
    }
}

/* Runs the path and the reference kernel on the same quantized operands and compares: *ok when
 * every output was written (the output is prefilled with NaN) and the relative L2 distance is at
 * most 1e-3. */
static fpk_status q8_self_check(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, int wdt, bool *ok,
                                char *why, size_t nwhy) {
    const int64_t na = SC8_M * SC8_K, nw = SC8_N * SC8_K, nd = SC8_M * SC8_N;
    *ok = false;
    uint8_t *host = (uint8_t *)malloc((size_t)(na + nw) + (size_t)nd * 8);
    if (!host) return fpk_gpu_set_oom((uint64_t)(na + nw + nd * 8), 0, "host gemm q self-check");
    q8_check_operands(host, na, nw, wdt);
    float *hd = (float *)(host + na + nw), *hr = hd + nd;
    fpk_scratch sc(sf);
    fpk_status s = sc.alloc((size_t)(na + nw) + 256 + (size_t)nd * 8);
    if (s != FPK_OK) {
        free(host);
        return s;
    }
    uint8_t *aq = (uint8_t *)sc.ptr, *wq = aq + na;
    float *d = (float *)(aq + ((na + nw + 255) / 256 * 256)), *r = d + nd;
    cudaError_t e = cudaMemcpyAsync(aq, host, (size_t)(na + nw), cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(d, 0xff, (size_t)nd * 4, st); /* NaN */
    if (e == cudaSuccess) {
        k_q8_reference<<<fpk_blocks(nd), FPK_BLOCK, 0, st>>>(aq, wq, wdt, SC8_M, SC8_N, SC8_K, r);
        s = fpk_gpu_launched("gemm q self-check reference");
        if (s == FPK_OK) s = q8_product(c, st, sf, path, aq, wq, wdt, SC8_M, SC8_N, SC8_K, d);
        if (s != FPK_OK) {
            snprintf(why, nwhy, "self-check: the %s product failed (status %d)", q8_path_name(path), (int)s);
            free(host);
            return s == FPK_ERR_DEVICE_LOST ? s : FPK_OK;
        }
        e = cudaMemcpyAsync(hd, d, (size_t)nd * 8, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess) {
        free(host);
        return fpk_gpu_check_error(e, "gemm q self-check", why, nwhy);
    }
    double rel = fpk_rel_l2_host(hd, hr, nd);
    free(host);
    *ok = rel <= 1e-3; /* NaN (an output never written) fails too */
    if (!*ok)
        snprintf(why, nwhy, "%s differs from the reference on the self-check (%s weights): relative L2 %g (at most 1e-3)",
                 q8_path_name(path), wdt == FPK_F8E5M2 ? "e5m2" : "e4m3", rel);
    return FPK_OK;
}

static const char *q8_dt_name(int dt) { return dt == FPK_F32 ? "f32" : dt == FPK_F16 ? "f16" : dt == FPK_BF16 ? "bf16" : "?"; }

/* A direct variant's self-check: cuBLASLt writes out (dtype odt) = epilogue(sa[m] · sw[n] ·
 * Σ q(a)·q(w) + bias[n]) for the self-check's operands, with scales that differ per row and per
 * column (vec; else one scalar each), alpha 1 (q8_direct runs nothing else), a bias (bit 1 of
 * epi) of values exact in 16 bits handed over in f32 (so the conversion into out's dtype runs
 * too) and GELU (bit 2); the
 * reference kernel's product gets the same on the host in double. *ok when every output was
 * written and the relative L2 distance is at most 1e-3 (f32) or 1e-2 (16-bit: one rounding of
 * the output, and of the bias). A variant cuBLASLt refuses (FPK_ERR_UNAVAILABLE) is *ok false
 * with its reason. */
static fpk_status q8_direct_check(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int vec, int odt, int epi,
                                  int wdt, bool *ok, char *why, size_t nwhy) {
    const int64_t M = SC8_M, N = SC8_N, K = SC8_K, na = M * K, nw = N * K, nd = M * N;
    *ok = false;
    auto up = [](int64_t bytes) { return (size_t)((bytes + 255) / 256 * 256); };
    const size_t o_sa = up(na + nw), o_sw = o_sa + up(M * 4), o_b = o_sw + up(N * 4), o_r = o_b + up(N * 4);
    const size_t o_d = o_r + up(nd * 4), o_df = o_d + up(nd * 4), total = o_df + up(nd * 4);
    const size_t hbytes = (size_t)(na + nw) + (size_t)(M + 2 * N + 3 * nd) * sizeof(float);
    uint8_t *host = (uint8_t *)malloc(hbytes);
    if (!host) return fpk_gpu_set_oom(hbytes, 0, "host gemm q self-check");
    q8_check_operands(host, na, nw, wdt);
    float *hsa = (float *)(host + na + nw), *hsw = hsa + M, *hb = hsw + N, *hr = hb + N, *hgot = hr + nd, *hwant = hgot + nd;
    const float wsc = wdt == FPK_F8E5M2 ? 0x1p-16f : 0x1p-8f; /* outputs of a few units before the bias */
    for (int64_t m = 0; m < M; m++) hsa[m] = (1.f + (float)(m % 7) / 8.f) * 0x1p-9f;
    for (int64_t n = 0; n < N; n++) hsw[n] = (1.f + (float)(n % 5) / 4.f) * wsc;
    for (int64_t n = 0; n < N; n++) hb[n] = (float)(n % 9 - 4) * 0.25f;
    const int bias = epi & 1, gelu = (epi & 2) != 0;
    fpk_scratch sc(sf);
    fpk_status s = sc.alloc(total);
    if (s != FPK_OK) {
        free(host);
        return s;
    }
    uint8_t *base = (uint8_t *)sc.ptr, *aq = base, *wq = base + na;
    float *sa = (float *)(base + o_sa), *sw = (float *)(base + o_sw), *b = (float *)(base + o_b), *r = (float *)(base + o_r);
    void *d = base + o_d;
    float *df = (float *)(base + o_df);
    cudaError_t e = cudaMemcpyAsync(aq, host, (size_t)(na + nw), cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(sa, hsa, (size_t)M * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(sw, hsw, (size_t)N * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(b, hb, (size_t)N * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(d, 0xff, (size_t)nd * fpk_dt_size(odt), st); /* NaN in every float type */
    if (e == cudaSuccess) {
        k_q8_reference<<<fpk_blocks(nd), FPK_BLOCK, 0, st>>>(aq, wq, wdt, M, N, K, r);
        s = fpk_gpu_launched("gemm q self-check reference");
        fpk_fp8_gemm_desc g;
        memset(&g, 0, sizeof g);
        g.M = M, g.N = N, g.K = K, g.aq = aq, g.wq = wq, g.wdt = wdt;
        g.scales = vec ? FPK_FP8_SCALES_OUTER : FPK_FP8_SCALES_SCALAR, g.sa = sa, g.sw = sw, g.alpha = 1.f;
        g.bias = bias ? b : NULL, g.bias_dt = FPK_F32, g.gelu = gelu, g.d = d, g.ddt = odt;
        if (s == FPK_OK) s = fpk_vendor_gemm_fp8_lt(c, st, sf, &g);
        if (s == FPK_OK) s = fpk_gpu_convert(st, df, FPK_F32, d, odt, nd);
        if (s != FPK_OK) {
            snprintf(why, nwhy, "%s (status %d)", s == FPK_ERR_UNAVAILABLE ? "cuBLASLt declined it" : "the call failed", (int)s);
            free(host);
            return s == FPK_ERR_DEVICE_LOST ? s : FPK_OK;
        }
        e = cudaMemcpyAsync(hr, r, (size_t)nd * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(hgot, df, (size_t)nd * 4, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess) {
        free(host);
        return fpk_gpu_check_error(e, "gemm q self-check", why, nwhy);
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double v = (double)hr[m * N + n] * hsa[vec ? m : 0] * hsw[vec ? n : 0] + (bias ? hb[n] : 0.0);
            if (gelu) v = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
            hwant[m * N + n] = (float)v;
        }
    double rel = fpk_rel_l2_host(hgot, hwant, nd), tol = odt == FPK_F32 ? 1e-3 : 1e-2;
    free(host);
    *ok = rel <= tol; /* NaN (an output never written) fails too */
    if (!*ok) snprintf(why, nwhy, "differs from the reference on the self-check: relative L2 %g (at most %g)", rel, tol);
    return FPK_OK;
}

/* The checked path for weights of dtype wdt (Q8_PATH_NONE: decline, with why). */
static fpk_status q8_path(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int wdt, int *path, char *why,
                          size_t nwhy) {
    *path = Q8_PATH_NONE;
    snprintf(why, nwhy, "device %d out of range", c->device);
    if (c->device < 0 || c->device >= Q8_MAX_DEVICES) return FPK_OK;
    pthread_mutex_lock(&q8_devices_mu);
    q8_device_state *d = &q8_devices[c->device];
    fpk_status s = FPK_OK;
    if (!d->probed) s = q8_probe(c, st, sf, d);
    int w5 = wdt == FPK_F8E5M2;
    if (s == FPK_OK && d->path != Q8_PATH_NONE && !d->disabled && !d->passed[w5]) {
        bool ok = false;
        char w[256] = "";
        s = q8_self_check(c, st, sf, d->path, wdt, &ok, w, sizeof w);
        if (s == FPK_OK && ok) d->passed[w5] = 1;
        else if (s == FPK_OK) {
            snprintf(d->why, sizeof d->why, "%s on %s: %s", q8_path_name(d->path), c->arch, w);
            d->disabled = 1;
        }
    }
    int use = !d->disabled && d->passed[w5] ? d->path : Q8_PATH_NONE;
    if (use == Q8_PATH_NONE && d->path != Q8_PATH_NONE && !d->disabled)
        snprintf(why, nwhy, "%s not self-checked yet (no scratch memory)", q8_path_name(d->path));
    else snprintf(why, nwhy, "%s", d->why);
    pthread_mutex_unlock(&q8_devices_mu);
    if (s == FPK_ERR_OUT_OF_MEMORY) return FPK_OK;
    FPK_TRY(s);
    *path = use;
    return FPK_OK;
}

/* Whether the direct variant (vec, out dtype odt, cuBLASLt epilogue epi, weights wdt) passed its
 * self-check on this device (run here on first use; a refusal or a failed check turns it off for
 * the process, with the reason as the last error, and the call takes step 3). */
static fpk_status q8_direct_ready(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int vec, int odt, int epi,
                                  int wdt, int *ready) {
    *ready = 0;
    const int oi = odt == FPK_F32 ? 0 : odt == FPK_F16 ? 1 : odt == FPK_BF16 ? 2 : -1;
    if (oi < 0 || c->device < 0 || c->device >= Q8_MAX_DEVICES) return FPK_OK;
    pthread_mutex_lock(&q8_devices_mu);
    signed char *v = &q8_devices[c->device].direct[vec != 0][oi][epi & 3][wdt == FPK_F8E5M2];
    fpk_status s = FPK_OK;
    char why[320] = "";
    if (*v == 0) {
        bool ok = false;
        s = q8_direct_check(c, st, sf, vec, odt, epi & 3, wdt, &ok, why, sizeof why);
        if (s == FPK_OK) *v = ok ? 1 : -1;
    }
    *ready = *v == 1;
    pthread_mutex_unlock(&q8_devices_mu);
    if (s == FPK_ERR_OUT_OF_MEMORY) return FPK_OK; /* not decided: step 3 this time */
    FPK_TRY(s);
    if (!*ready && why[0])
        fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt fp8 into %s (%s scales, epilogue %d, %s weights) is off: %s",
                          q8_dt_name(odt), vec ? "outer-vector" : "scalar", epi & 3, wdt == FPK_F8E5M2 ? "e5m2" : "e4m3", why);
    return FPK_OK;
}

/* Step 2: out straight from cuBLASLt (sa [M] the activations' scales, swv [N] scratch for a
 * per-tensor weight scale as a vector). A 16-bit output takes the bias and GELU in cuBLASLt's
 * epilogue, or, where that variant is off, from a kernel after the product. FPK_ERR_UNAVAILABLE
 * when no variant serves or cuBLASLt declines this shape: nothing was written then. */
static fpk_status q8_direct(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                            const uint8_t *aq, const float *sa, float *swv, int64_t M, int64_t N, int64_t K, const fpk_gt *w,
                            const fpk_gt *w_scale, const fpk_gt *bias, const fpk_gt *out) {
    const int sw_rows = w_scale && w_scale->shape[0] != 1;
    const int vec = p->act_quant == FPK_ACT_QUANT_TOKEN || sw_rows;
    const int gelu = p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH;
    if (p->alpha != 0 && p->alpha != 1.0f) return FPK_ERR_UNAVAILABLE; /* the self-checks ran with alpha 1 (as LinearQ's) */
    /* the epilogues to try: cuBLASLt's (a 16-bit output only: its fp8 kernels add a 16-bit bias),
     * then none (a kernel adds them) */
    const int full = out->dtype != FPK_F32 ? (bias ? 1 : 0) | (gelu ? 2 : 0) : 0;
    const int epis[2] = {full, 0}, tries = full ? 2 : 1;
    const float *wsd = w_scale ? (const float *)w_scale->data : NULL, *sw = wsd;
    int filled = 0;
    for (int t = 0; t < tries; t++) {
        const int epi = epis[t];
        int ready = 0;
        FPK_TRY(q8_direct_ready(c, st, sf, vec, out->dtype, epi, w->dtype, &ready));
        if (!ready) continue;
        if (!sw_rows && (vec || !wsd) && !filled) { /* the per-tensor weight scale (or 1) as N values, or the unit scalar */
            int64_t n = vec ? N : 1;
            k_fill_scale<<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(swv, n, wsd);
            FPK_TRY(fpk_gpu_launched("gemm q: weight scales"));
            sw = swv;
            filled = 1;
        }
        fpk_fp8_gemm_desc g;
        memset(&g, 0, sizeof g);
        g.M = M, g.N = N, g.K = K, g.aq = aq, g.wq = (const uint8_t *)w->data, g.wdt = w->dtype;
        g.scales = vec ? FPK_FP8_SCALES_OUTER : FPK_FP8_SCALES_SCALAR, g.sa = sa, g.sw = sw;
        g.alpha = 1.f;
        g.bias = (epi & 1) ? bias->data : NULL, g.bias_dt = bias ? bias->dtype : 0, g.gelu = (epi & 2) != 0;
        g.d = out->data, g.ddt = out->dtype;
        fpk_status s = fpk_vendor_gemm_fp8_lt(c, st, sf, &g);
        if (s == FPK_ERR_UNAVAILABLE) continue;
        FPK_TRY(s);
        if (epi == 0 && (bias || gelu))
            return fpk_gpu_bias_gelu_cols(st, out->data, out->dtype, N, M, 0, N, bias ? bias->data : NULL, bias ? bias->dtype : 0,
                                          gelu);
        return FPK_OK;
    }
    return FPK_ERR_UNAVAILABLE;
}

/* Most bytes of f32 product per chunk of rows. */
#define Q8_CHUNK ((size_t)64 << 20)

fpk_status fpk_gpu_gemm_q_mma(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                              const fpk_gt *a, const fpk_gt *w, const fpk_gt *w_scale, const fpk_gt *bias,
                              const fpk_gt *out) {
    const int64_t N = w->shape[0], K = w->shape[1];
    const int64_t M = K ? a->numel / K : 0;
    if (w_scale && w_scale->shape[1] != 1)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: block-wise weight scales cannot leave an fp8 x fp8 product");
    if (K == 0 || K % 32 != 0 || ((uintptr_t)w->data % 16) != 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: fp8 x fp8 needs K a multiple of 32 (got %lld) and an aligned weight",
                                 (long long)K);
    int path;
    char why[320];
    FPK_TRY(q8_path(c, st, sf, w->dtype, &path, why, sizeof why));
    if (path == Q8_PATH_NONE) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: fp8 x fp8: %s", why);
    const int per_row = p->act_quant == FPK_ACT_QUANT_TOKEN;
    /* scratch: q(a) [M, K]; then sa [M], the per-tensor max (one word), the weight scales [N] */
    const size_t o_g = (size_t)(M ? M : 1) * 4 / 256 * 256 + 256, o_sw = o_g + 256;
    fpk_scratch sq(sf), ss(sf), sd(sf);
    FPK_TRY(sq.alloc((size_t)M * (size_t)K));
    FPK_TRY(ss.alloc(o_sw + (size_t)N * 4));
    float *sa = (float *)ss.ptr;
    const uint8_t *aq = (const uint8_t *)sq.ptr;
    FPK_TRY(q8_quantize(st, a, M, K, per_row, (unsigned int *)((char *)ss.ptr + o_g), sa, (uint8_t *)sq.ptr));
    if (path == Q8_PATH_CUBLASLT) {
        fpk_status ds = q8_direct(c, st, sf, p, aq, sa, (float *)((char *)ss.ptr + o_sw), M, N, K, w, w_scale, bias, out);
        if (ds != FPK_ERR_UNAVAILABLE) return ds;
    }
    /* step 3: unit-scale products into f32 chunks, then the epilogue kernel */
    int64_t chunk = (int64_t)(Q8_CHUNK / ((size_t)N * 4));
    chunk = chunk < 16 ? 16 : chunk - chunk % 16;
    if (chunk > M) chunk = M;
    FPK_TRY(sd.alloc((size_t)(chunk ? chunk : 1) * (size_t)N * 4));
    const float *sw = w_scale ? (const float *)w_scale->data : NULL;
    int sw_rows = w_scale && w_scale->shape[0] != 1;
    float alpha = p->alpha != 0 ? p->alpha : 1.0f;
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        int64_t rows = M - r0 < chunk ? M - r0 : chunk;
        FPK_TRY(q8_product(c, st, sf, path, aq + r0 * K, (const uint8_t *)w->data, w->dtype, rows, N, K, (float *)sd.ptr));
        k_q8_epilogue<<<fpk_blocks(rows * N), FPK_BLOCK, 0, st>>>((const float *)sd.ptr, rows, N, sa, r0, sw, sw_rows, alpha,
                                                                  bias ? bias->data : NULL, bias ? bias->dtype : 0,
                                                                  p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH, out->data,
                                                                  out->dtype);
        FPK_TRY(fpk_gpu_launched("gemm q: epilogue"));
    }
    return FPK_OK;
}
