/*
 * fpk_gpu_ops.cu — the gpu backend's elementwise, normalisation, softmax, rope, data-movement,
 * reduction and embedding kernels. Storage is any float dtype (f32, f16, bf16); every kernel loads
 * into f32, accumulates in f32 (sums of statistics in f64) and stores back to the output's dtype.
 */
#include "fpk_gpu_internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------- */

/* Up to 8 dims with a stride per dim, by value into kernels. */
struct fpk_dims {
    int nd;
    int64_t shape[FPK_MAX_DIMS];
    int64_t st[FPK_MAX_DIMS];
    int64_t st2[FPK_MAX_DIMS];
};

#define GRID_LOOP(i, n)                                                                         \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                   \
         i += (int64_t)blockDim.x * gridDim.x)

template <typename T> __device__ T block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

__device__ float block_max(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* Row-major strides of a shape. */
static void row_strides(int nd, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

/* Strides of t read with shape (rank nd, broadcast dims at 0), as the cpu backend's. */
static void bcast_strides(const fpk_gt *t, int nd, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int it = t->ndim - nd + i;
        int64_t d = it >= 0 ? t->shape[it] : 1;
        st[i] = (d == 1 && shape[i] != 1) || it < 0 ? 0 : s;
        if (it >= 0) s *= d;
    }
}

/* ---- fill, convert -------------------------------------------------------------------------- */

template <typename T> __global__ void k_fill(T *p, int64_t n, T v) {
    GRID_LOOP(i, n) p[i] = v;
}

extern "C" fpk_status fpk_gpu_fill(fpk_gpu_ctx *c, void *s, const fpk_gt *t, double value) {
    cudaStream_t st = fpk_stream(c, s);
    if (t->numel == 0) return FPK_OK;
    float f = (float)value;
    int isnan_ = value != value;
    switch (t->dtype) {
    case FPK_F32: {
        uint32_t u;
        memcpy(&u, &f, 4);
        k_fill<uint32_t><<<fpk_blocks(t->numel), FPK_BLOCK, 0, st>>>((uint32_t *)t->data, t->numel, u);
        break;
    }
    case FPK_F16:
    case FPK_BF16: {
        uint16_t h = t->dtype == FPK_BF16 ? fpk_f32_to_bf16(f) : fpk_f32_to_f16(f); /* the core's rounding */
        k_fill<uint16_t><<<fpk_blocks(t->numel), FPK_BLOCK, 0, st>>>((uint16_t *)t->data, t->numel, h);
        break;
    }
    case FPK_F8E4M3:
    case FPK_F8E5M2:
        FPK_CUDA(cudaMemsetAsync(t->data, t->dtype == FPK_F8E4M3 ? fpk_f32_to_e4m3(f) : fpk_f32_to_e5m2(f),
                                 (size_t)t->numel, st),
                 "fill");
        break;
    case FPK_U8:
        FPK_CUDA(cudaMemsetAsync(t->data, isnan_ ? 0xff : (uint8_t)f, (size_t)t->numel, st), "fill");
        break;
    default: {
        int32_t v = isnan_ ? -1 : (int32_t)value;
        k_fill<int32_t><<<fpk_blocks(t->numel), FPK_BLOCK, 0, st>>>((int32_t *)t->data, t->numel, v);
        break;
    }
    }
    return fpk_gpu_launched("fill");
}

__global__ void k_convert(void *dst, int ddt, const void *src, int sdt, int64_t n) {
    GRID_LOOP(i, n) fpk_st(dst, ddt, i, fpk_ld(src, sdt, i));
}

__global__ void k_u8_i32(int32_t *dst, const uint8_t *src, int64_t n) {
    GRID_LOOP(i, n) dst[i] = src[i];
}

fpk_status fpk_gpu_convert(cudaStream_t st, void *dst, int ddt, const void *src, int sdt, int64_t n) {
    if (n == 0) return FPK_OK;
    if (ddt == sdt) {
        FPK_CUDA(cudaMemcpyAsync(dst, src, (size_t)n * fpk_dt_size(ddt), cudaMemcpyDeviceToDevice, st), "copy");
        return FPK_OK;
    }
    if (ddt == FPK_I32 && sdt == FPK_U8)
        k_u8_i32<<<fpk_blocks(n), FPK_BLOCK, 0, st>>>((int32_t *)dst, (const uint8_t *)src, n);
    else
        k_convert<<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(dst, ddt, src, sdt, n);
    return fpk_gpu_launched("convert");
}

extern "C" fpk_status fpk_gpu_cast(fpk_gpu_ctx *c, void *s, const fpk_gt *src, const fpk_gt *dst) {
    return fpk_gpu_convert(fpk_stream(c, s), dst->data, dst->dtype, src->data, src->dtype, src->numel);
}

__global__ void k_bias_rows(void *y, int ydt, const void *b, int bdt, int64_t total, int64_t n) {
    GRID_LOOP(i, total) fpk_st(y, ydt, i, fpk_ld(y, ydt, i) + fpk_ld(b, bdt, i % n));
}

__global__ void k_bias_channels(void *y, int ydt, const void *b, int bdt, int64_t total, int64_t C,
                                int64_t inner) {
    GRID_LOOP(i, total) fpk_st(y, ydt, i, fpk_ld(y, ydt, i) + fpk_ld(b, bdt, (i / inner) % C));
}

fpk_status fpk_gpu_add_bias(cudaStream_t st, void *y, int ydt, const void *bias, int bdt, int64_t total,
                            int64_t n, int64_t inner) {
    if (total == 0) return FPK_OK;
    if (inner > 0)
        k_bias_channels<<<fpk_blocks(total), FPK_BLOCK, 0, st>>>(y, ydt, bias, bdt, total, n, inner);
    else
        k_bias_rows<<<fpk_blocks(total), FPK_BLOCK, 0, st>>>(y, ydt, bias, bdt, total, n);
    return fpk_gpu_launched("bias");
}

/* ---- unary, affine, binary ------------------------------------------------------------------ */

__device__ __forceinline__ float sigmoid_fam(float v, float a, float b) {
    float t = v * (a + b * v * v);
    return 1.0f / (1.0f + expf(-t));
}

__global__ void k_unary(const void *x, int xdt, void *y, int ydt, int64_t n, int op, float a, float b) {
    GRID_LOOP(i, n) {
        float v = fpk_ld(x, xdt, i), r;
        switch (op) {
        case FPK_UNARY_SILU: r = v * sigmoid_fam(v, 1.0f, 0.0f); break;
        case FPK_UNARY_GELU_TANH:
            r = v * sigmoid_fam(v, 1.5957691216057308f, 1.5957691216057308f * 0.044715f);
            break;
        case FPK_UNARY_QUICK_GELU: r = v * sigmoid_fam(v, 1.702f, 0.0f); break;
        /* 0.5·x·(1 + erf(x/√2)) written with erfc so the negative tail keeps its digits */
        case FPK_UNARY_GELU_ERF: r = 0.5f * v * erfcf(-v * 0.7071067811865476f); break;
        case FPK_UNARY_SIGMOID: r = sigmoid_fam(v, 1.0f, 0.0f); break;
        case FPK_UNARY_TANH: r = tanhf(v); break;
        case FPK_UNARY_EXP: r = expf(v); break;
        case FPK_UNARY_NEG: r = -v; break;
        case FPK_UNARY_SQRT: r = sqrtf(v); break;
        case FPK_UNARY_RSQRT: r = 1.0f / sqrtf(v); break;
        default: r = v * a + b; break; /* affine */
        }
        fpk_st(y, ydt, i, r);
    }
}

extern "C" fpk_status fpk_gpu_unary(fpk_gpu_ctx *c, void *s, int op, float scale, float shift,
                                    const fpk_gt *x, const fpk_gt *out) {
    if (x->numel == 0) return FPK_OK;
    k_unary<<<fpk_blocks(x->numel), FPK_BLOCK, 0, fpk_stream(c, s)>>>(x->data, x->dtype, out->data, out->dtype,
                                                                      x->numel, op, scale, shift);
    return fpk_gpu_launched("unary");
}

__device__ __forceinline__ float bin_op(int op, float u, float v) {
    switch (op) {
    case FPK_BINARY_ADD: return u + v;
    case FPK_BINARY_SUB: return u - v;
    case FPK_BINARY_MUL: return u * v;
    case FPK_BINARY_DIV: return u / v;
    case FPK_BINARY_MAX: return u > v || u != u ? u : v;
    default: return u < v || u != u ? u : v;
    }
}

/* Same-shape contiguous operands. */
__global__ void k_binary_flat(const void *a, int adt, const void *b, int bdt, void *y, int ydt, int64_t n,
                              int op) {
    GRID_LOOP(i, n) fpk_st(y, ydt, i, bin_op(op, fpk_ld(a, adt, i), fpk_ld(b, bdt, i)));
}

/* k_binary_flat for three operands of one 16-bit dtype: four elements a thread through 8-byte
 * loads and stores (the VAE's residual adds move gigabytes; 2-byte accesses left them at about
 * half the memory bandwidth). */
__global__ void k_binary_flat16x4(const uint2 *a, const uint2 *b, uint2 *y, int dt, int64_t n4, int op) {
    GRID_LOOP(i, n4) {
        uint2 va = a[i], vb = b[i], vy;
        const uint16_t *pa = (const uint16_t *)&va, *pb = (const uint16_t *)&vb;
        uint16_t *py = (uint16_t *)&vy;
#pragma unroll
        for (int k = 0; k < 4; k++) fpk_st(py, dt, k, bin_op(op, fpk_ld(pa, dt, k), fpk_ld(pb, dt, k)));
        y[i] = vy;
    }
}

/* General broadcast: d.st for a, d.st2 for b, over the merged output shape. */
__global__ void k_binary_bcast(const void *a, int adt, const void *b, int bdt, void *y, int ydt, int64_t n,
                               int op, fpk_dims d) {
    GRID_LOOP(i, n) {
        int64_t rem = i, oa = 0, ob = 0;
        for (int k = d.nd - 1; k >= 0; k--) {
            int64_t cc = rem % d.shape[k];
            rem /= d.shape[k];
            oa += cc * d.st[k];
            ob += cc * d.st2[k];
        }
        fpk_st(y, ydt, i, bin_op(op, fpk_ld(a, adt, oa), fpk_ld(b, bdt, ob)));
    }
}

extern "C" fpk_status fpk_gpu_binary(fpk_gpu_ctx *c, void *s, int op, const fpk_gt *a, const fpk_gt *b,
                                     const fpk_gt *out) {
    if (out->numel == 0) return FPK_OK;
    cudaStream_t st = fpk_stream(c, s);
    int nd = out->ndim;
    int64_t sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS];
    bcast_strides(a, nd, out->shape, sa);
    bcast_strides(b, nd, out->shape, sb);
    fpk_dims d;
    memset(&d, 0, sizeof d);
    int m = 0;
    for (int i = 0; i < nd; i++) {
        if (out->shape[i] == 1) continue;
        if (m > 0 && d.st[m - 1] == sa[i] * out->shape[i] && d.st2[m - 1] == sb[i] * out->shape[i]) {
            d.shape[m - 1] *= out->shape[i];
            d.st[m - 1] = sa[i];
            d.st2[m - 1] = sb[i];
            continue;
        }
        d.shape[m] = out->shape[i];
        d.st[m] = sa[i];
        d.st2[m] = sb[i];
        m++;
    }
    if (m == 0) {
        d.shape[0] = 1;
        m = 1;
    }
    d.nd = m;
    int same16 = a->dtype == b->dtype && a->dtype == out->dtype && fpk_dt_size(out->dtype) == 2;
    if (m == 1 && d.st[0] == 1 && d.st2[0] == 1 && same16 && out->numel % 4 == 0 &&
        (((uintptr_t)a->data | (uintptr_t)b->data | (uintptr_t)out->data) & 7) == 0)
        k_binary_flat16x4<<<fpk_blocks(out->numel / 4), FPK_BLOCK, 0, st>>>(
            (const uint2 *)a->data, (const uint2 *)b->data, (uint2 *)out->data, out->dtype, out->numel / 4, op);
    else if (m == 1 && d.st[0] == 1 && d.st2[0] == 1)
        k_binary_flat<<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(a->data, a->dtype, b->data, b->dtype,
                                                                   out->data, out->dtype, out->numel, op);
    else
        k_binary_bcast<<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(a->data, a->dtype, b->data, b->dtype,
                                                                    out->data, out->dtype, out->numel, op, d);
    return fpk_gpu_launched("binary");
}

/* ---- fused three-operand ops (AdaLN modulate, gated residual) -------------------------------- */

struct fpk_dims3 {
    int nd;
    int64_t shape[FPK_MAX_DIMS];
    int64_t sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS], sc[FPK_MAX_DIMS];
};

/* y = a·(1 + b) + c (modulate) or a + c·b (gated residual), f32 arithmetic, one rounding. */
__global__ void k_ternary(const void *a, int adt, const void *b, int bdt, const void *c, int cdt, void *y, int ydt,
                          int64_t n, int op, fpk_dims3 d) {
    GRID_LOOP(i, n) {
        int64_t rem = i, oa = 0, ob = 0, oc = 0;
        for (int k = d.nd - 1; k >= 0; k--) {
            int64_t cc = rem % d.shape[k];
            rem /= d.shape[k];
            oa += cc * d.sa[k];
            ob += cc * d.sb[k];
            oc += cc * d.sc[k];
        }
        float u = fpk_ld(a, adt, oa), v = fpk_ld(b, bdt, ob), w = fpk_ld(c, cdt, oc);
        fpk_st(y, ydt, i, op == FPK_TERNARY_MODULATE ? u * (1.0f + v) + w : u + w * v);
    }
}

extern "C" fpk_status fpk_gpu_ternary(fpk_gpu_ctx *c, void *s, int op, const fpk_gt *a, const fpk_gt *b,
                                      const fpk_gt *cc, const fpk_gt *out) {
    if (out->numel == 0) return FPK_OK;
    int nd = out->ndim;
    int64_t sa[FPK_MAX_DIMS], sb[FPK_MAX_DIMS], sc[FPK_MAX_DIMS];
    bcast_strides(a, nd, out->shape, sa);
    bcast_strides(b, nd, out->shape, sb);
    bcast_strides(cc, nd, out->shape, sc);
    fpk_dims3 d;
    memset(&d, 0, sizeof d);
    int m = 0; /* merge dims contiguous for all three; drop size-1 dims */
    for (int i = 0; i < nd; i++) {
        if (out->shape[i] == 1) continue;
        if (m > 0 && d.sa[m - 1] == sa[i] * out->shape[i] && d.sb[m - 1] == sb[i] * out->shape[i] &&
            d.sc[m - 1] == sc[i] * out->shape[i]) {
            d.shape[m - 1] *= out->shape[i];
            d.sa[m - 1] = sa[i];
            d.sb[m - 1] = sb[i];
            d.sc[m - 1] = sc[i];
            continue;
        }
        d.shape[m] = out->shape[i];
        d.sa[m] = sa[i];
        d.sb[m] = sb[i];
        d.sc[m] = sc[i];
        m++;
    }
    if (m == 0) {
        d.shape[0] = 1;
        m = 1;
    }
    d.nd = m;
    k_ternary<<<fpk_blocks(out->numel), FPK_BLOCK, 0, fpk_stream(c, s)>>>(a->data, a->dtype, b->data, b->dtype, cc->data,
                                                                          cc->dtype, out->data, out->dtype, out->numel,
                                                                          op, d);
    return fpk_gpu_launched("ternary");
}

/* ---- softmax -------------------------------------------------------------------------------- */

/* One block per row (grid-stride over rows). x is read with dtype xdt; y written as ydt. The mask
 * (optional) is as fpk_gpu_softmax_rows says. */
__global__ void k_softmax(const void *x, int xdt, void *y, int ydt, int64_t rows, int64_t n, float scale,
                          const uint8_t *mask, int64_t rpe, int64_t m_e, int64_t m_q, int64_t m_k) {
    __shared__ float sh[FPK_BLOCK];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const uint8_t *m = mask ? mask + (r / rpe) * m_e + (r % rpe) * m_q : nullptr;
        int64_t base = r * n;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            if (m && !m[j * m_k]) continue;
            mx = fmaxf(mx, fpk_ld(x, xdt, base + j) * scale);
        }
        mx = block_max(mx, sh);
        if (mx == -INFINITY) {
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) fpk_st(y, ydt, base + j, 0.0f);
            continue;
        }
        float sum = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            if (m && !m[j * m_k]) continue;
            sum += expf(fpk_ld(x, xdt, base + j) * scale - mx);
        }
        sum = block_sum(sum, sh);
        float inv = 1.0f / sum;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            float v = (m && !m[j * m_k]) ? 0.0f : expf(fpk_ld(x, xdt, base + j) * scale - mx) * inv;
            fpk_st(y, ydt, base + j, v);
        }
    }
}

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows < 65535 * 8 ? (rows < 1 ? 1 : rows) : 65535 * 8); }

fpk_status fpk_gpu_softmax_rows(cudaStream_t st, const float *s, void *p, int pdt, int64_t rows, int64_t n,
                                float scale, const uint8_t *mask, int64_t rpe, int64_t m_e, int64_t m_q,
                                int64_t m_k) {
    if (rows == 0 || n == 0) return FPK_OK;
    k_softmax<<<row_blocks(rows), FPK_BLOCK, 0, st>>>(s, FPK_F32, p, pdt, rows, n, scale, mask, rpe ? rpe : 1,
                                                      m_e, m_q, m_k);
    return fpk_gpu_launched("softmax");
}

extern "C" fpk_status fpk_gpu_softmax(fpk_gpu_ctx *c, void *s, float scale, const fpk_gt *x, const fpk_gt *out) {
    if (x->numel == 0) return FPK_OK;
    int64_t n = x->shape[x->ndim - 1];
    if (n == 0) return FPK_OK;
    k_softmax<<<row_blocks(x->numel / n), FPK_BLOCK, 0, fpk_stream(c, s)>>>(
        x->data, x->dtype, out->data, out->dtype, x->numel / n, n, scale != 0 ? scale : 1.0f, nullptr, 1, 0, 0, 0);
    return fpk_gpu_launched("softmax");
}

/* ---- layer norm, RMS norm ------------------------------------------------------------------- */

__global__ void k_layer_norm(const void *x, int xdt, const void *w, int wdt, const void *b, int bdt, void *y,
                             int ydt, int64_t rows, int64_t n, float eps, int rms) {
    __shared__ double sh[FPK_BLOCK];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * n;
        double mean = 0;
        if (!rms) {
            float part = 0;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) part += fpk_ld(x, xdt, base + j);
            mean = block_sum((double)part, sh) / (double)n;
        }
        float m = (float)mean, part = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            float d = fpk_ld(x, xdt, base + j) - m;
            part += d * d;
        }
        double var = block_sum((double)part, sh) / (double)n;
        float inv = (float)(1.0 / sqrt(var + (double)eps));
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            float v = (fpk_ld(x, xdt, base + j) - m) * inv;
            if (w) v *= fpk_ld(w, wdt, j);
            if (b) v += fpk_ld(b, bdt, j);
            fpk_st(y, ydt, base + j, v);
        }
    }
}

extern "C" fpk_status fpk_gpu_layer_norm(fpk_gpu_ctx *c, void *s, int rms, float eps, const fpk_gt *x,
                                         const fpk_gt *w, const fpk_gt *b, const fpk_gt *out) {
    if (x->numel == 0) return FPK_OK;
    int64_t n = x->shape[x->ndim - 1];
    if (n == 0) return FPK_OK;
    int64_t rows = x->numel / n;
    k_layer_norm<<<row_blocks(rows), FPK_BLOCK, 0, fpk_stream(c, s)>>>(
        x->data, x->dtype, w ? w->data : nullptr, w ? w->dtype : 0, b ? b->data : nullptr, b ? b->dtype : 0,
        out->data, out->dtype, rows, n, eps, rms);
    return fpk_gpu_launched(rms ? "rms norm" : "layer norm");
}

/* ---- group norm ----------------------------------------------------------------------------
 * Three passes so that a few huge groups still fill the device: partial sums of (x - shift) and
 * its square in f64 per (group, chunk) block, one finalising thread per group, then the
 * elementwise normalisation. shift = the group's first element keeps the cancellation small. */

#define GN_CHUNKS 64

__global__ void k_gn_partial(const void *x, int xdt, int64_t cnt, double *part) {
    __shared__ double sh[FPK_BLOCK];
    int64_t g = blockIdx.y;
    int64_t base = g * cnt;
    float shift = fpk_ld(x, xdt, base);
    double s1 = 0, s2 = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < cnt; i += (int64_t)blockDim.x * gridDim.x) {
        double d = (double)(fpk_ld(x, xdt, base + i) - shift);
        s1 += d;
        s2 += d * d;
    }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    if (threadIdx.x == 0) {
        part[(g * gridDim.x + blockIdx.x) * 2] = s1;
        part[(g * gridDim.x + blockIdx.x) * 2 + 1] = s2;
    }
}

__global__ void k_gn_final(const void *x, int xdt, int64_t cnt, const double *part, int chunks, int64_t G,
                           float eps, float *stats) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= G) return;
    double s1 = 0, s2 = 0;
    for (int k = 0; k < chunks; k++) {
        s1 += part[(g * chunks + k) * 2];
        s2 += part[(g * chunks + k) * 2 + 1];
    }
    double shift = fpk_ld(x, xdt, g * cnt);
    double m = s1 / (double)cnt;
    double var = s2 / (double)cnt - m * m;
    if (var < 0) var = 0;
    stats[g * 2] = (float)(m + shift);
    stats[g * 2 + 1] = (float)(1.0 / sqrt(var + (double)eps));
}

/* The normalisation, then act (fpk_norm_act: SiLU fused for fpk_op_group_norm_act), stored once
 * in y's dtype. */
__global__ void k_gn_apply(const void *x, int xdt, const void *w, int wdt, const void *b, int bdt, void *y,
                           int ydt, int64_t total, int64_t C, int64_t inner, int64_t cpg, const float *stats,
                           int act) {
    GRID_LOOP(i, total) {
        int64_t ch = i / inner;       /* n*C + c */
        int64_t c = ch % C;
        int64_t g = (ch / C) * (C / cpg) + c / cpg;
        float m = stats[g * 2], inv = stats[g * 2 + 1];
        float sc = inv * (w ? fpk_ld(w, wdt, c) : 1.0f);
        float sh = b ? fpk_ld(b, bdt, c) : 0.0f;
        float v = (fpk_ld(x, xdt, i) - m) * sc + sh;
        if (act == FPK_NORM_ACT_SILU) v *= sigmoid_fam(v, 1.0f, 0.0f);
        fpk_st(y, ydt, i, v);
    }
}

/* k_gn_apply with one (sample, channel) row per blockIdx.y: its scale and shift are worked out
 * once per thread, and the elements of the row take no division (the VAE's rows are millions
 * long; the flat kernel's three 64-bit divisions per element made it compute-bound). */
__global__ void k_gn_apply_rows(const void *x, int xdt, const void *w, int wdt, const void *b, int bdt, void *y,
                                int ydt, int64_t C, int64_t inner, int64_t cpg, const float *stats, int act) {
    const int64_t ch = blockIdx.y, c = ch % C, g = (ch / C) * (C / cpg) + c / cpg;
    const float m = stats[g * 2], inv = stats[g * 2 + 1];
    const float sc = inv * (w ? fpk_ld(w, wdt, c) : 1.0f), sh = b ? fpk_ld(b, bdt, c) : 0.0f;
    const int64_t base = ch * inner;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < inner; i += (int64_t)blockDim.x * gridDim.x) {
        float v = (fpk_ld(x, xdt, base + i) - m) * sc + sh; /* as k_gn_apply rounds */
        if (act == FPK_NORM_ACT_SILU) v *= sigmoid_fam(v, 1.0f, 0.0f);
        fpk_st(y, ydt, base + i, v);
    }
}

extern "C" fpk_status fpk_gpu_group_norm(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, int64_t groups,
                                         float eps, const fpk_gt *x, const fpk_gt *w, const fpk_gt *b,
                                         const fpk_gt *out) {
    return fpk_gpu_group_norm_act(c, s, sf, groups, eps, FPK_NORM_ACT_NONE, x, w, b, out);
}

extern "C" fpk_status fpk_gpu_group_norm_act(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, int64_t groups,
                                             float eps, int act, const fpk_gt *x, const fpk_gt *w, const fpk_gt *b,
                                             const fpk_gt *out) {
    if (x->numel == 0) return FPK_OK;
    cudaStream_t st = fpk_stream(c, s);
    int64_t N = x->shape[0], C = x->shape[1], inner = x->numel / (N * C), cpg = C / groups;
    int64_t G = N * groups, cnt = cpg * inner;
    int chunks = (int)((cnt + FPK_BLOCK * 16 - 1) / (FPK_BLOCK * 16));
    if (chunks > GN_CHUNKS) chunks = GN_CHUNKS;
    if (chunks < 1) chunks = 1;
    if (G > 65535) return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "group norm: %lld groups", (long long)G);
    fpk_scratch scr(sf);
    FPK_TRY(scr.alloc((size_t)G * chunks * 2 * sizeof(double) + (size_t)G * 2 * sizeof(float)));
    double *part = (double *)scr.ptr;
    float *stats = (float *)(part + (size_t)G * chunks * 2);
    k_gn_partial<<<dim3(chunks, (unsigned)G), FPK_BLOCK, 0, st>>>(x->data, x->dtype, cnt, part);
    k_gn_final<<<(unsigned)((G + 127) / 128), 128, 0, st>>>(x->data, x->dtype, cnt, part, chunks, G, eps, stats);
    if (N * C <= 65535 && inner >= 4096) {
        /* enough blocks per row to fill the device with a few rows, at most 8 elements a thread */
        int64_t per = (inner + FPK_BLOCK * 8 - 1) / (FPK_BLOCK * 8);
        k_gn_apply_rows<<<dim3((unsigned)(per < 65535 ? per : 65535), (unsigned)(N * C)), FPK_BLOCK, 0, st>>>(
            x->data, x->dtype, w ? w->data : nullptr, w ? w->dtype : 0, b ? b->data : nullptr, b ? b->dtype : 0,
            out->data, out->dtype, C, inner, cpg, stats, act);
    } else {
        k_gn_apply<<<fpk_blocks(x->numel), FPK_BLOCK, 0, st>>>(x->data, x->dtype, w ? w->data : nullptr,
                                                              w ? w->dtype : 0, b ? b->data : nullptr, b ? b->dtype : 0,
                                                              out->data, out->dtype, x->numel, C, inner, cpg, stats, act);
    }
    return fpk_gpu_launched(act == FPK_NORM_ACT_NONE ? "group norm" : "group norm act");
}

/* ---- rope ----------------------------------------------------------------------------------- */

/* d.shape: x's leading dims; d.st / d.st2: cos / sin strides over them (last dim contiguous). */
__global__ void k_rope(const void *x, int xdt, const void *cs, int cdt, const void *sn, int sdt, void *y, int ydt,
                       int64_t pairs, int64_t D, fpk_dims d, int halves) {
    GRID_LOOP(p, pairs) {
        int64_t r = p / (D / 2), i = p % (D / 2);
        int64_t rem = r, oc = 0, os = 0;
        for (int k = d.nd - 1; k >= 0; k--) {
            int64_t cc = rem % d.shape[k];
            rem /= d.shape[k];
            oc += cc * d.st[k];
            os += cc * d.st2[k];
        }
        /* the pair (i0, i1): (2i, 2i+1) interleaved, (i, i + D/2) in halves (rotate_half) */
        int64_t i0 = halves ? i : 2 * i, i1 = halves ? i + D / 2 : 2 * i + 1;
        float x0 = fpk_ld(x, xdt, r * D + i0), x1 = fpk_ld(x, xdt, r * D + i1);
        fpk_st(y, ydt, r * D + i0, x0 * fpk_ld(cs, cdt, oc + i0) - x1 * fpk_ld(sn, sdt, os + i0));
        fpk_st(y, ydt, r * D + i1, x1 * fpk_ld(cs, cdt, oc + i1) + x0 * fpk_ld(sn, sdt, os + i1));
    }
}

extern "C" fpk_status fpk_gpu_rope(fpk_gpu_ctx *c, void *s, int mode, const fpk_gt *x, const fpk_gt *cos,
                                   const fpk_gt *sin, const fpk_gt *out) {
    if (mode != FPK_ROPE_INTERLEAVED && mode != FPK_ROPE_HALVES)
        return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "rope: mode %d", mode);
    if (x->numel == 0) return FPK_OK;
    int64_t D = x->shape[x->ndim - 1];
    int64_t sc[FPK_MAX_DIMS], ss[FPK_MAX_DIMS];
    bcast_strides(cos, x->ndim, x->shape, sc);
    bcast_strides(sin, x->ndim, x->shape, ss);
    fpk_dims d;
    memset(&d, 0, sizeof d);
    d.nd = x->ndim - 1;
    for (int k = 0; k < d.nd; k++) {
        d.shape[k] = x->shape[k];
        d.st[k] = sc[k];
        d.st2[k] = ss[k];
    }
    int64_t pairs = x->numel / 2;
    k_rope<<<fpk_blocks(pairs), FPK_BLOCK, 0, fpk_stream(c, s)>>>(x->data, x->dtype, cos->data, cos->dtype, sin->data,
                                                                 sin->dtype, out->data, out->dtype, pairs, D, d,
                                                                 mode == FPK_ROPE_HALVES);
    return fpk_gpu_launched("rope");
}

/* ---- rms norm + rope ------------------------------------------------------------------------
 * One group of 32 lanes per row of D (a head's q or k): the sum of squares in f32 across the
 * group's shuffles, then each lane normalises, weights and rotates its pairs; the normalised row
 * never leaves registers (no rounding to x's dtype between norm and rotation). */

#define RNR_LANES 32

__global__ void k_rms_norm_rope(const void *x, int xdt, const void *w, int wdt, const void *cs, int cdt,
                                const void *sn, int sdt, void *y, int ydt, int64_t rows, int64_t D, fpk_dims d,
                                float eps, int halves) {
    const int lane = threadIdx.x % RNR_LANES, per_block = blockDim.x / RNR_LANES;
    for (int64_t r = (int64_t)blockIdx.x * per_block + threadIdx.x / RNR_LANES; r < rows;
         r += (int64_t)gridDim.x * per_block) {
        const int64_t base = r * D;
        float ss = 0.f;
        for (int64_t i = lane; i < D; i += RNR_LANES) {
            float v = fpk_ld(x, xdt, base + i);
            ss += v * v;
        }
        for (int o = RNR_LANES / 2; o > 0; o >>= 1) ss += FPK_SHFL_XOR(ss, o, RNR_LANES);
        const float inv = rsqrtf(ss / (float)D + eps);
        int64_t rem = r, oc = 0, os = 0;
        for (int k = d.nd - 1; k >= 0; k--) {
            int64_t cc = rem % d.shape[k];
            rem /= d.shape[k];
            oc += cc * d.st[k];
            os += cc * d.st2[k];
        }
        for (int64_t p = lane; p < D / 2; p += RNR_LANES) {
            int64_t i0 = halves ? p : 2 * p, i1 = halves ? p + D / 2 : 2 * p + 1;
            float x0 = fpk_ld(x, xdt, base + i0) * inv, x1 = fpk_ld(x, xdt, base + i1) * inv;
            if (w) {
                x0 *= fpk_ld(w, wdt, i0);
                x1 *= fpk_ld(w, wdt, i1);
            }
            fpk_st(y, ydt, base + i0, x0 * fpk_ld(cs, cdt, oc + i0) - x1 * fpk_ld(sn, sdt, os + i0));
            fpk_st(y, ydt, base + i1, x1 * fpk_ld(cs, cdt, oc + i1) + x0 * fpk_ld(sn, sdt, os + i1));
        }
    }
}

extern "C" fpk_status fpk_gpu_rms_norm_rope(fpk_gpu_ctx *c, void *s, int mode, float eps, const fpk_gt *x,
                                            const fpk_gt *w, const fpk_gt *cos, const fpk_gt *sin,
                                            const fpk_gt *out) {
    if (mode != FPK_ROPE_INTERLEAVED && mode != FPK_ROPE_HALVES)
        return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "rms norm rope: mode %d", mode);
    if (x->numel == 0) return FPK_OK;
    int64_t D = x->shape[x->ndim - 1];
    int64_t sc[FPK_MAX_DIMS], ss[FPK_MAX_DIMS];
    bcast_strides(cos, x->ndim, x->shape, sc);
    bcast_strides(sin, x->ndim, x->shape, ss);
    fpk_dims d;
    memset(&d, 0, sizeof d);
    d.nd = x->ndim - 1;
    for (int k = 0; k < d.nd; k++) {
        d.shape[k] = x->shape[k];
        d.st[k] = sc[k];
        d.st2[k] = ss[k];
    }
    int64_t rows = x->numel / D, per_block = FPK_BLOCK / RNR_LANES;
    int64_t blocks = (rows + per_block - 1) / per_block;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    k_rms_norm_rope<<<(unsigned)blocks, FPK_BLOCK, 0, fpk_stream(c, s)>>>(
        x->data, x->dtype, w ? w->data : nullptr, w ? w->dtype : 0, cos->data, cos->dtype, sin->data, sin->dtype,
        out->data, out->dtype, rows, D, d, eps, mode == FPK_ROPE_HALVES);
    return fpk_gpu_launched("rms norm rope");
}

/* ---- data movement -------------------------------------------------------------------------- */

template <int ES> struct elem_t;
template <> struct elem_t<1> { typedef uint8_t T; };
template <> struct elem_t<2> { typedef uint16_t T; };
template <> struct elem_t<4> { typedef uint32_t T; };

/* out[i] = src[offset(i)] where offset sums coordinate × d.st over the (merged) output dims. */
template <int ES> __global__ void k_gather(const void *src, void *dst, int64_t n, fpk_dims d) {
    typedef typename elem_t<ES>::T T;
    GRID_LOOP(i, n) {
        int64_t rem = i, off = 0;
        for (int k = d.nd - 1; k >= 0; k--) {
            int64_t cc = rem % d.shape[k];
            rem /= d.shape[k];
            off += cc * d.st[k];
        }
        ((T *)dst)[i] = ((const T *)src)[off];
    }
}

static fpk_status gather(cudaStream_t st, const void *src, void *dst, size_t es, int64_t n, fpk_dims *d,
                         const char *what) {
    if (n == 0) return FPK_OK;
    /* drop size-1 dims, merge dims contiguous in the source */
    fpk_dims m;
    memset(&m, 0, sizeof m);
    int k = 0;
    for (int i = 0; i < d->nd; i++) {
        if (d->shape[i] == 1) continue;
        if (k > 0 && m.st[k - 1] == d->st[i] * d->shape[i]) {
            m.shape[k - 1] *= d->shape[i];
            m.st[k - 1] = d->st[i];
            continue;
        }
        m.shape[k] = d->shape[i];
        m.st[k] = d->st[i];
        k++;
    }
    if (k == 0) {
        m.shape[0] = 1;
        m.st[0] = 1;
        k = 1;
    }
    m.nd = k;
    if (k == 1 && m.st[0] == 1) {
        FPK_CUDA(cudaMemcpyAsync(dst, src, (size_t)n * es, cudaMemcpyDeviceToDevice, st), what);
        return FPK_OK;
    }
    switch (es) {
    case 1: k_gather<1><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, dst, n, m); break;
    case 2: k_gather<2><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, dst, n, m); break;
    default: k_gather<4><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, dst, n, m); break;
    }
    return fpk_gpu_launched(what);
}

extern "C" fpk_status fpk_gpu_permute(fpk_gpu_ctx *c, void *s, const int *perm, const fpk_gt *x, const fpk_gt *out) {
    int64_t xst[FPK_MAX_DIMS];
    row_strides(x->ndim, x->shape, xst);
    fpk_dims d;
    memset(&d, 0, sizeof d);
    d.nd = out->ndim;
    for (int i = 0; i < out->ndim; i++) {
        d.shape[i] = out->shape[i];
        d.st[i] = xst[perm[i]];
    }
    return gather(fpk_stream(c, s), x->data, out->data, fpk_dt_size(x->dtype), out->numel, &d, "permute");
}

extern "C" fpk_status fpk_gpu_slice(fpk_gpu_ctx *c, void *s, int dim, int64_t start, int64_t step,
                                    const fpk_gt *x, const fpk_gt *out) {
    int64_t xst[FPK_MAX_DIMS];
    row_strides(x->ndim, x->shape, xst);
    fpk_dims d;
    memset(&d, 0, sizeof d);
    d.nd = out->ndim;
    for (int i = 0; i < out->ndim; i++) {
        d.shape[i] = out->shape[i];
        d.st[i] = xst[i] * (i == dim ? step : 1);
    }
    size_t es = fpk_dt_size(x->dtype);
    return gather(fpk_stream(c, s), (const char *)x->data + (size_t)(start * xst[dim]) * es, out->data, es,
                  out->numel, &d, "slice");
}

/* Rows of srow elements into rows of drow elements at column off. */
template <int ES>
__global__ void k_rows(const void *src, void *dst, int64_t outer, int64_t srow, int64_t drow, int64_t off) {
    typedef typename elem_t<ES>::T T;
    int64_t n = outer * srow;
    GRID_LOOP(i, n) {
        int64_t o = i / srow, j = i % srow;
        ((T *)dst)[o * drow + off + j] = ((const T *)src)[i];
    }
}

extern "C" fpk_status fpk_gpu_concat(fpk_gpu_ctx *c, void *s, int dim, int n, const fpk_gt *in, const fpk_gt *out) {
    cudaStream_t st = fpk_stream(c, s);
    size_t es = fpk_dt_size(out->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= out->shape[d];
    for (int d = dim + 1; d < out->ndim; d++) inner *= out->shape[d];
    int64_t drow = out->shape[dim] * inner, off = 0;
    for (int i = 0; i < n; i++) {
        int64_t srow = in[i].shape[dim] * inner;
        if (srow > 0 && outer > 0) {
            if (outer == 1) {
                FPK_CUDA(cudaMemcpyAsync((char *)out->data + (size_t)off * es, in[i].data, (size_t)srow * es,
                                         cudaMemcpyDeviceToDevice, st),
                         "concat");
            } else {
                int64_t total = outer * srow;
                switch (es) {
                case 1: k_rows<1><<<fpk_blocks(total), FPK_BLOCK, 0, st>>>(in[i].data, out->data, outer, srow, drow, off); break;
                case 2: k_rows<2><<<fpk_blocks(total), FPK_BLOCK, 0, st>>>(in[i].data, out->data, outer, srow, drow, off); break;
                default: k_rows<4><<<fpk_blocks(total), FPK_BLOCK, 0, st>>>(in[i].data, out->data, outer, srow, drow, off); break;
                }
                FPK_TRY(fpk_gpu_launched("concat"));
            }
        }
        off += srow;
    }
    return FPK_OK;
}

/* ---- pad, nearest upsample, and both ------------------------------------------------------
 * One warp per output row (the last dim): the row's source offset is worked out once (64-bit
 * div/mod over the outer dims), then the lanes copy along the row, so the per-element work is a
 * 32-bit index map and a coalesced store. Per dim k the source coordinate of output coordinate
 * o: pad: o - before[k], outside [0, in) zero (mode 0) or the edge (mode 1, replicate);
 * upsample: o / scale[k]; upsample then replicate pad: clamp(o - before[k], 0, in*scale - 1) /
 * scale[k]. */
enum { RS_PAD = 0, RS_UP = 1, RS_UP_PAD = 2 };

struct resample_desc {
    int nd, kind, mode;
    int64_t out[FPK_MAX_DIMS], in[FPK_MAX_DIMS], scale[FPK_MAX_DIMS], before[FPK_MAX_DIMS];
};

__device__ __forceinline__ int64_t resample_src(const resample_desc &d, int k, int64_t o, int *zero) {
    switch (d.kind) {
    case RS_PAD: {
        int64_t xi = o - d.before[k];
        if (xi < 0 || xi >= d.in[k]) {
            if (d.mode == 0) *zero = 1;
            xi = xi < 0 ? 0 : d.in[k] - 1;
        }
        return xi;
    }
    case RS_UP: return o / d.scale[k];
    default: {
        int64_t up = d.in[k] * d.scale[k], cc = o - d.before[k];
        cc = cc < 0 ? 0 : cc >= up ? up - 1 : cc;
        return cc / d.scale[k];
    }
    }
}

/* The last dim in 32 bits (rows are far shorter than 2^31). */
__device__ __forceinline__ int resample_col(const resample_desc &d, int kind, int j, int Wi, int sc, int bf, int *zero) {
    switch (kind) {
    case RS_PAD: {
        int xi = j - bf;
        if (xi < 0 || xi >= Wi) {
            if (d.mode == 0) *zero = 1;
            xi = xi < 0 ? 0 : Wi - 1;
        }
        return xi;
    }
    case RS_UP: return sc == 1 ? j : sc == 2 ? j >> 1 : j / sc;
    default: {
        int cc = j - bf, up = Wi * sc;
        cc = cc < 0 ? 0 : cc >= up ? up - 1 : cc;
        return sc == 1 ? cc : sc == 2 ? cc >> 1 : cc / sc;
    }
    }
}

#define RS_WARPS 8

template <int ES> __global__ void __launch_bounds__(32 * RS_WARPS) k_resample_rows(const void *src, void *dst, int64_t rows,
                                                                                 resample_desc d) {
    typedef typename elem_t<ES>::T T;
    const int lane = threadIdx.x % 32, last = d.nd - 1;
    const int W = (int)d.out[last], Wi = (int)d.in[last], sc = (int)d.scale[last], bf = (int)d.before[last];
    for (int64_t r = (int64_t)blockIdx.x * RS_WARPS + threadIdx.x / 32; r < rows; r += (int64_t)gridDim.x * RS_WARPS) {
        int64_t rem = r, off = 0, mul = Wi;
        int zero = 0;
        for (int k = last - 1; k >= 0; k--) {
            int64_t cc = rem % d.out[k];
            rem /= d.out[k];
            off += resample_src(d, k, cc, &zero) * mul;
            mul *= d.in[k];
        }
        T *drow = (T *)dst + r * (int64_t)W;
        const T *srow = (const T *)src + off;
        for (int j = lane; j < W; j += 32) {
            int z = zero;
            int xj = resample_col(d, d.kind, j, Wi, sc, bf, &z);
            drow[j] = z ? (T)0 : srow[xj];
        }
    }
}

static fpk_status resample(cudaStream_t st, const fpk_gt *x, const fpk_gt *out, resample_desc &d, const char *what) {
    if (out->numel == 0) return FPK_OK;
    size_t es = fpk_dt_size(x->dtype);
    if (x->numel == 0) { /* zero padding of an empty tensor */
        FPK_CUDA(cudaMemsetAsync(out->data, 0, (size_t)out->numel * es, st), what);
        return FPK_OK;
    }
    d.nd = x->ndim;
    for (int k = 0; k < x->ndim; k++) {
        d.out[k] = out->shape[k];
        d.in[k] = x->shape[k];
    }
    int64_t W = out->shape[x->ndim - 1];
    if (W > INT_MAX || x->shape[x->ndim - 1] * (d.scale[x->ndim - 1] ? d.scale[x->ndim - 1] : 1) > INT_MAX)
        return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "%s: rows of %lld elements", what, (long long)W);
    int64_t rows = out->numel / W, blocks = (rows + RS_WARPS - 1) / RS_WARPS;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    switch (es) {
    case 1: k_resample_rows<1><<<(unsigned)blocks, 32 * RS_WARPS, 0, st>>>(x->data, out->data, rows, d); break;
    case 2: k_resample_rows<2><<<(unsigned)blocks, 32 * RS_WARPS, 0, st>>>(x->data, out->data, rows, d); break;
    default: k_resample_rows<4><<<(unsigned)blocks, 32 * RS_WARPS, 0, st>>>(x->data, out->data, rows, d); break;
    }
    return fpk_gpu_launched(what);
}

extern "C" fpk_status fpk_gpu_pad(fpk_gpu_ctx *c, void *s, int mode, const int64_t *before, const fpk_gt *x,
                                  const fpk_gt *out) {
    if (x->ndim == 0) return fpk_gpu_convert(fpk_stream(c, s), out->data, out->dtype, x->data, x->dtype, 1);
    resample_desc d;
    memset(&d, 0, sizeof d);
    d.kind = RS_PAD;
    d.mode = mode;
    for (int k = 0; k < x->ndim; k++) d.before[k] = before[k];
    return resample(fpk_stream(c, s), x, out, d, "pad");
}

/* scale and before name the last three dims; the dims before them keep their size */
static void resample_scale(resample_desc &d, int nd, const int64_t *scale, const int64_t *before) {
    for (int k = 0; k < nd; k++) {
        int i = k - (nd - 3);
        d.scale[k] = i >= 0 ? scale[i] : 1;
        d.before[k] = i >= 0 && before ? before[i] : 0;
    }
}

extern "C" fpk_status fpk_gpu_upsample(fpk_gpu_ctx *c, void *s, const int64_t *scale, const fpk_gt *x,
                                       const fpk_gt *out) {
    resample_desc d;
    memset(&d, 0, sizeof d);
    d.kind = RS_UP;
    resample_scale(d, x->ndim, scale, nullptr);
    return resample(fpk_stream(c, s), x, out, d, "upsample nearest3d");
}

extern "C" fpk_status fpk_gpu_upsample_pad(fpk_gpu_ctx *c, void *s, const int64_t *scale, const int64_t *before,
                                           const fpk_gt *x, const fpk_gt *out) {
    resample_desc d;
    memset(&d, 0, sizeof d);
    d.kind = RS_UP_PAD;
    resample_scale(d, x->ndim, scale, before);
    return resample(fpk_stream(c, s), x, out, d, "upsample pad");
}

__global__ void k_avg_pool(const void *x, int xdt, void *y, int ydt, int64_t n, int64_t T, int64_t H, int64_t W,
                           int64_t oT, int64_t oH, int64_t oW, int64_t k0, int64_t k1, int64_t k2, int64_t s0,
                           int64_t s1, int64_t s2) {
    float inv = 1.0f / (float)(k0 * k1 * k2);
    GRID_LOOP(i, n) {
        int64_t ow = i % oW, oh = (i / oW) % oH, ot = (i / (oW * oH)) % oT, pl = i / (oW * oH * oT);
        int64_t base = pl * T * H * W;
        float acc = 0;
        for (int64_t a = 0; a < k0; a++)
            for (int64_t b = 0; b < k1; b++) {
                int64_t row = base + ((ot * s0 + a) * H + oh * s1 + b) * W + ow * s2;
                for (int64_t cc = 0; cc < k2; cc++) acc += fpk_ld(x, xdt, row + cc);
            }
        fpk_st(y, ydt, i, acc * inv);
    }
}

extern "C" fpk_status fpk_gpu_avg_pool(fpk_gpu_ctx *c, void *s, const int64_t *kernel, const int64_t *stride,
                                       const fpk_gt *x, const fpk_gt *out) {
    if (out->numel == 0) return FPK_OK;
    int nd = x->ndim;
    k_avg_pool<<<fpk_blocks(out->numel), FPK_BLOCK, 0, fpk_stream(c, s)>>>(
        x->data, x->dtype, out->data, out->dtype, out->numel, x->shape[nd - 3], x->shape[nd - 2], x->shape[nd - 1],
        out->shape[nd - 3], out->shape[nd - 2], out->shape[nd - 1], kernel[0], kernel[1], kernel[2], stride[0],
        stride[1], stride[2]);
    return fpk_gpu_launched("avg pool3d");
}

__global__ void k_reduce(const void *x, int xdt, void *y, int ydt, int64_t outs, int64_t n, int64_t inner, int op) {
    GRID_LOOP(r, outs) {
        int64_t o = r / inner, i = r % inner;
        int64_t base = o * n * inner + i;
        if (op == FPK_REDUCE_MAX) {
            float m = -INFINITY;
            for (int64_t k = 0; k < n; k++) {
                float v = fpk_ld(x, xdt, base + k * inner);
                m = v > m || v != v ? v : m;
            }
            fpk_st(y, ydt, r, m);
            continue;
        }
        double acc = 0;
        for (int64_t k = 0; k < n; k++) acc += fpk_ld(x, xdt, base + k * inner);
        fpk_st(y, ydt, r, (float)(op == FPK_REDUCE_MEAN ? acc / (double)n : acc));
    }
}

extern "C" fpk_status fpk_gpu_reduce(fpk_gpu_ctx *c, void *s, int op, int dim, const fpk_gt *x, const fpk_gt *out) {
    if (out->numel == 0) return FPK_OK;
    int64_t inner = 1;
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    k_reduce<<<fpk_blocks(out->numel), FPK_BLOCK, 0, fpk_stream(c, s)>>>(x->data, x->dtype, out->data, out->dtype,
                                                                        out->numel, x->shape[dim], inner, op);
    return fpk_gpu_launched("reduce");
}

/* ---- embedding ------------------------------------------------------------------------------ */

/* Rows converted to another float dtype. */
__global__ void k_embedding_cvt(const void *table, int tdt, const int32_t *ids, void *out, int odt, int64_t n, int64_t D,
                                int64_t V, int *bad) {
    GRID_LOOP(i, n) {
        int64_t r = i / D;
        int32_t id = ids[r];
        if (id < 0 || id >= V) {
            atomicMin(bad, (int)(r < 0x7fffffff ? r : 0x7fffffff));
            fpk_st(out, odt, i, 0.f);
            continue;
        }
        fpk_st(out, odt, i, fpk_ld(table, tdt, (int64_t)id * D + i % D));
    }
}

template <int ES>
__global__ void k_embedding(const void *table, const int32_t *ids, void *out, int64_t n, int64_t D, int64_t V,
                            int *bad) {
    typedef typename elem_t<ES>::T T;
    GRID_LOOP(i, n) {
        int64_t r = i / D;
        int32_t id = ids[r];
        if (id < 0 || id >= V) {
            atomicMin(bad, (int)(r < 0x7fffffff ? r : 0x7fffffff));
            ((T *)out)[i] = 0;
            continue;
        }
        ((T *)out)[i] = ((const T *)table)[(int64_t)id * D + i % D];
    }
}

extern "C" fpk_status fpk_gpu_embedding(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, const fpk_gt *table,
                                        const fpk_gt *ids, const fpk_gt *out) {
    if (out->numel == 0) return FPK_OK;
    cudaStream_t st = fpk_stream(c, s);
    int64_t V = table->shape[0], D = table->shape[1];
    fpk_scratch scr(sf);
    FPK_TRY(scr.alloc(sizeof(int)));
    int init = 0x7fffffff, bad = 0;
    FPK_CUDA(cudaMemcpyAsync(scr.ptr, &init, sizeof init, cudaMemcpyHostToDevice, st), "embedding");
    if (out->dtype != table->dtype)
        k_embedding_cvt<<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(table->data, table->dtype, (const int32_t *)ids->data,
                                                                     out->data, out->dtype, out->numel, D, V, (int *)scr.ptr);
    else switch (fpk_dt_size(table->dtype)) {
    case 1: k_embedding<1><<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(table->data, (const int32_t *)ids->data, out->data, out->numel, D, V, (int *)scr.ptr); break;
    case 2: k_embedding<2><<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(table->data, (const int32_t *)ids->data, out->data, out->numel, D, V, (int *)scr.ptr); break;
    default: k_embedding<4><<<fpk_blocks(out->numel), FPK_BLOCK, 0, st>>>(table->data, (const int32_t *)ids->data, out->data, out->numel, D, V, (int *)scr.ptr); break;
    }
    FPK_TRY(fpk_gpu_launched("embedding"));
    FPK_CUDA(cudaMemcpyAsync(&bad, scr.ptr, sizeof bad, cudaMemcpyDeviceToHost, st), "embedding");
    FPK_CUDA(cudaStreamSynchronize(st), "embedding");
    if (bad != 0x7fffffff) {
        int32_t id = 0;
        FPK_CUDA(cudaMemcpyAsync(&id, (const int32_t *)ids->data + bad, sizeof id, cudaMemcpyDeviceToHost, st), "embedding");
        FPK_CUDA(cudaStreamSynchronize(st), "embedding");
        return fpk_gpu_set_error(FPK_ERR_INVALID_ARGUMENT, "embedding: id %d at %d outside [0, %lld)", id, bad,
                                 (long long)V);
    }
    return FPK_OK;
}

/* ---- strided row copies (the conv tiers' time slabs) ------------------------------------- */

template <int ES>
__global__ void k_copy2d(const void *src, int64_t spitch, void *dst, int64_t dpitch, int64_t rows, int64_t width) {
    typedef typename elem_t<ES>::T T;
    int64_t n = rows * width;
    GRID_LOOP(i, n) {
        int64_t o = i / width, j = i % width;
        ((T *)dst)[o * dpitch + j] = ((const T *)src)[o * spitch + j];
    }
}

fpk_status fpk_gpu_copy2d(cudaStream_t st, const void *src, int64_t spitch, void *dst, int64_t dpitch, int64_t rows,
                          int64_t width, size_t es) {
    int64_t n = rows * width;
    if (n == 0) return FPK_OK;
    switch (es) {
    case 1: k_copy2d<1><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, spitch, dst, dpitch, rows, width); break;
    case 2: k_copy2d<2><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, spitch, dst, dpitch, rows, width); break;
    default: k_copy2d<4><<<fpk_blocks(n), FPK_BLOCK, 0, st>>>(src, spitch, dst, dpitch, rows, width); break;
    }
    return fpk_gpu_launched("strided copy");
}
