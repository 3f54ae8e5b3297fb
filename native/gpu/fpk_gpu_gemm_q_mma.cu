/*
 * fpk_gpu_gemm_q_mma.cu — fp8 × fp8 GEMM with activation quantization (fpk_op_gemm_q's per-tensor
 * and per-token modes), on the matrix units:
 *
 *   1. the activations a [M, K] are quantized to e4m3 into scratch: s_a = max|a| / 448 over all of
 *      a (per tensor) or per row (per token), 1 for zeros; q = e4m3(clamp(a / s_a, ±448)) — the
 *      cpu backend's reference arithmetic (fpk_cpu_quantize_act);
 *   2. D = q(a) · q(w)ᵀ with f32 accumulation, unit scales, into f32 scratch, a chunk of rows at a
 *      time (at most 64 MiB of D): cuBLASLt's FP8 matmul on NVIDIA (compute capability 8.9 and
 *      later: Ada, Hopper), our MFMA kernel on CDNA3 (gfx940-942, whose fp8 types are the FNUZ
 *      variants: fed the OCP bytes, with −0 turned into +0, each operand reads at half its value
 *      and the product is multiplied by 4, exactly);
 *   3. out = alpha · D · s_a[row] · s_w[col] + bias, GELU(tanh) when asked, rounded once to out's dtype.
 *
 * Weights with per-tensor or per-channel scales only: block-wise scales (musubi's block mode)
 * cannot leave the product, so those calls are declined (FPK_ERR_UNAVAILABLE) and the runtime
 * falls back to weight-only. K must be a multiple of 32 (16 for cuBLASLt), pointers 16-byte
 * aligned. Each device's path is self-checked before its first use, as the flash and conv matrix
 * kernels are: the path and a plain f32 kernel compute the same quantized product on a small
 * problem (M 40, N 48, K 96) and must agree to a relative L2 of 1e-3 with every output written;
 * otherwise the path is off for the process and every call is declined with the reason.
 * None of this has run on a GPU when written (scripts/gpu-check.sh phase fp8 runs it).
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

/* rowmax[r] = max |a[r][:]|, one block per row. */
__global__ void k_row_absmax(const void *a, int adt, int64_t rows, int64_t K, float *rowmax) {
    __shared__ float red[FPK_BLOCK];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float m = 0.f;
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(fpk_ld(a, adt, r * K + k)));
        red[threadIdx.x] = m;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
            __syncthreads();
        }
        if (threadIdx.x == 0) rowmax[r] = red[0];
        __syncthreads();
    }
}

/* scale[i] = max / 448 (1 for 0) of rowmax[i] per row, or of the max over every row into scale[0]. */
__global__ void k_act_scales(float *rowmax, int64_t rows, int per_row) {
    if (per_row) {
        for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)blockDim.x * gridDim.x)
            rowmax[r] = rowmax[r] > 0.f ? rowmax[r] / 448.f : 1.f;
        return;
    }
    __shared__ float red[FPK_BLOCK];
    float m = 0.f;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) m = fmaxf(m, rowmax[r]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) rowmax[0] = red[0] > 0.f ? red[0] / 448.f : 1.f;
}

/* aq[r][k] = e4m3(clamp(a[r][k] / s, ±448)), s = scale[r] per row or scale[0]. */
__global__ void k_act_quant(const void *a, int adt, int64_t rows, int64_t K, const float *scale, int per_row, uint8_t *aq) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * K; i += (int64_t)blockDim.x * gridDim.x) {
        float s = scale[per_row ? i / K : 0];
        float q = fpk_ld(a, adt, i) / s;
        q = q != q ? 0.f : fminf(448.f, fmaxf(-448.f, q));
        aq[i] = fpk_f32_to_e4m3(q);
    }
}

/* out[r][n] = alpha · d[r][n] · sa · sw + bias[n], GELU(tanh) when gelu, for rows r0 + r. */
__global__ void k_q8_epilogue(const float *d, int64_t rows, int64_t N, const float *sa, int sa_rows, int64_t r0,
                              const float *sw, int sw_rows, float alpha, const void *bias, int bdt, int gelu, void *out,
                              int odt) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * N; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t r = i / N, n = i - r * N;
        float v = alpha * d[i] * sa[sa_rows ? r0 + r : 0] * (sw ? sw[sw_rows ? n : 0] : 1.f);
        if (bias) v += fpk_ld(bias, bdt, n);
        if (gelu) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        fpk_st(out, odt, (r0 + r) * N + n, v);
    }
}

/* The reference the self-check compares against: d[m][n] = Σ_k q(a)[m][k]·q(w)[n][k] in f32. */
__global__ void k_q8_reference(const uint8_t *aq, const uint8_t *wq, int wdt, int64_t M, int64_t N, int64_t K, float *d) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += (int64_t)blockDim.x * gridDim.x) {
        int64_t m = i / N, n = i - m * N;
        float acc = 0.f;
        for (int64_t k = 0; k < K; k++) acc += fpk_e4m3_to_f32(aq[m * K + k]) * fpk_fp8_to_f32(wq[n * K + k], wdt);
        d[i] = acc;
    }
}

/* D [M, N] f32 (row stride N) = aq · wqᵀ on the path. */
static fpk_status q8_product(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, const uint8_t *aq,
                             const uint8_t *wq, int wdt, int64_t M, int64_t N, int64_t K, float *d) {
    if (path == Q8_PATH_CUBLASLT) return fpk_vendor_gemm_fp8_lt(c, st, sf, aq, wq, wdt, M, N, K, d);
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

#define Q8_MAX_DEVICES 64
struct q8_device_state {
    int probed, path, disabled, passed[2]; /* passed per weight type: e4m3, e5m2 */
    char why[320];
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

/* Runs the path and the reference kernel on the same quantized operands (deterministic values
 * in ±[2^-9, 448], both signs, zeros) and compares: *ok when every output was written (the
 * output is prefilled with NaN) and the relative L2 distance is at most 1e-3. */
static fpk_status q8_self_check(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int path, int wdt, bool *ok,
                                char *why, size_t nwhy) {
    const int64_t na = SC8_M * SC8_K, nw = SC8_N * SC8_K, nd = SC8_M * SC8_N;
    *ok = false;
    uint8_t *host = (uint8_t *)malloc((size_t)(na + nw) + (size_t)nd * 8);
    if (!host) return fpk_gpu_set_oom((uint64_t)(na + nw + nd * 8), 0, "host gemm q self-check");
    uint32_t seed = 0x2545f491u + (uint32_t)wdt;
    for (int64_t i = 0; i < na + nw; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint8_t b = (uint8_t)(seed >> 24);
        if ((b & 0x7f) == 0x7f) b &= 0xf7;                                 /* no e4m3 NaN */
        if (i >= na && wdt == FPK_F8E5M2 && (b & 0x7c) == 0x7c) b ^= 0x40; /* no e5m2 inf or NaN */
        host[i] = b;
    }
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
    int64_t chunk = (int64_t)(Q8_CHUNK / ((size_t)N * 4));
    chunk = chunk < 16 ? 16 : chunk - chunk % 16;
    if (chunk > M) chunk = M;
    fpk_scratch sq(sf), ss(sf), sd(sf);
    FPK_TRY(sq.alloc((size_t)M * (size_t)K));
    FPK_TRY(ss.alloc((size_t)(M ? M : 1) * 4));
    FPK_TRY(sd.alloc((size_t)(chunk ? chunk : 1) * (size_t)N * 4));
    float *scale = (float *)ss.ptr;
    k_row_absmax<<<(unsigned)(M < 65535 ? (M ? M : 1) : 65535), FPK_BLOCK, 0, st>>>(a->data, a->dtype, M, K, scale);
    FPK_TRY(fpk_gpu_launched("gemm q: activation max"));
    k_act_scales<<<per_row ? fpk_blocks(M) : 1, FPK_BLOCK, 0, st>>>(scale, M, per_row);
    FPK_TRY(fpk_gpu_launched("gemm q: activation scales"));
    k_act_quant<<<fpk_blocks(M * K), FPK_BLOCK, 0, st>>>(a->data, a->dtype, M, K, scale, per_row, (uint8_t *)sq.ptr);
    FPK_TRY(fpk_gpu_launched("gemm q: activation quantization"));
    const float *sw = w_scale ? (const float *)w_scale->data : NULL;
    int sw_rows = w_scale && w_scale->shape[0] != 1;
    float alpha = p->alpha != 0 ? p->alpha : 1.0f;
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        int64_t rows = M - r0 < chunk ? M - r0 : chunk;
        FPK_TRY(q8_product(c, st, sf, path, (const uint8_t *)sq.ptr + r0 * K, (const uint8_t *)w->data, w->dtype, rows, N, K,
                           (float *)sd.ptr));
        k_q8_epilogue<<<fpk_blocks(rows * N), FPK_BLOCK, 0, st>>>((const float *)sd.ptr, rows, N, scale, per_row, r0, sw, sw_rows,
                                                                  alpha, bias ? bias->data : NULL, bias ? bias->dtype : 0,
                                                                  p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH, out->data,
                                                                  out->dtype);
        FPK_TRY(fpk_gpu_launched("gemm q: epilogue"));
    }
    return FPK_OK;
}
