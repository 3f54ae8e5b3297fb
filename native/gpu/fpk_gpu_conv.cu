/*
 * fpk_gpu_conv.cu — conv3d tiers of the gpu backend:
 *   vendor tuned   cuDNN FindEx / MIOpen Find (fpk_gpu_vendor.cu), choice kept per shape;
 *   vendor default cuDNN GetConvolutionForwardAlgorithm_v7 / MIOpen immediate mode;
 *   own kernel     16-bit, one group, channels a multiple of 16: the matrix-unit implicit GEMM
 *                  (fpk_gpu_conv_mma.cu) on the channels-last slabs below; else the FMA
 *                  implicit-GEMM conv3d below (any float dtypes, f32 accumulation, 64-bit
 *                  indexing, groups, strides, zero padding, the input view), bias fused;
 *   cpu            not here: FPK_ERR_UNAVAILABLE makes the core serve it (host round trip).
 * Vendor libraries take 32-bit dims and element counts: a 16-bit conv on cuDNN runs
 * channels-last in slabs of output frames (conv_nhwc, which the own tier's matrix kernel shares),
 * and an NCDHW one with a larger tensor and no temporal padding in slabs too (input frames copied
 * into scratch, the output slab copied into place), so the VAE's full-resolution convs stay on
 * the vendor tiers.
 */
#include "fpk_gpu_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct conv_desc {
    const void *x;
    int xdt;
    const void *w;
    int wdt;
    const void *bias;
    int bdt;
    void *y;
    int ydt;
    int64_t N, Cin, T, H, W, Cout, kT, kH, kW, To, Ho, Wo, sT, sH, sW, pT, pH, pW, G;
    /* the input as the conv reads it (fpk_conv3d_params' view): T, H, W upsampled by uT.. and
     * replicate padded by bT.. before, to vT, vH, vW; without a view u = 1, b = 0, v = T, H, W */
    int64_t uT, uH, uW, bT, bH, bW, vT, vH, vW;
};

/* The source index of view coordinate i (0 <= i < the view's extent) of a dim of n elements
 * upsampled by u and replicate padded by b before. */
template <typename I> __device__ __forceinline__ I view_src(I i, I u, I b, I n) {
    I j = i - b;
    j = j < 0 ? 0 : j >= u * n ? u * n - 1 : j;
    return u == 1 ? j : j / u;
}

#define CM 64 /* output channels per block */
#define CP 64 /* output positions per block */
#define CK 16

__global__ void __launch_bounds__(256) k_conv3d(conv_desc d) {
    __shared__ float Ws[CK][CM + 4];
    __shared__ float Xs[CK][CP + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t P = d.To * d.Ho * d.Wo, HW = d.H * d.W;
    const int64_t Cg = d.Cin / d.G, Cog = d.Cout / d.G, kvol = d.kT * d.kH * d.kW, K = Cg * kvol;
    const int64_t p0 = (int64_t)blockIdx.x * CP, co0 = (int64_t)blockIdx.y * CM;
    /* this thread's column of the X tile and its output position */
    const int col = tid % CP;
    const int64_t p = p0 + col;
    int64_t tb = 0, hb = 0, wb = 0;
    if (p < P) {
        int64_t wo = p % d.Wo, ho = (p / d.Wo) % d.Ho, to = p / (d.Wo * d.Ho);
        tb = to * d.sT - d.pT;
        hb = ho * d.sH - d.pH;
        wb = wo * d.sW - d.pW;
    }
    for (int64_t nz = blockIdx.z; nz < d.N * d.G; nz += gridDim.z) {
        const int64_t n = nz / d.G, g = nz % d.G;
        const int64_t xbase = (n * d.Cin + g * Cg) * d.T * HW;
        const int64_t wbase = (g * Cog) * K;
        float acc[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
        for (int64_t k0 = 0; k0 < K; k0 += CK) {
            for (int r = 0; r < 4; r++) {
                int e = tid + 256 * r;
                int kk = e % CK, mm = e / CK;
                int64_t co = co0 + mm, k = k0 + kk;
                Ws[kk][mm] = (co < Cog && k < K) ? fpk_ld(d.w, d.wdt, wbase + co * K + k) : 0.f;
                kk = tid / CP + 4 * r;
                k = k0 + kk;
                float v = 0.f;
                if (p < P && k < K) {
                    int64_t ci = k / kvol, rem = k % kvol;
                    int64_t kt = rem / (d.kH * d.kW), kh = (rem / d.kW) % d.kH, kw = rem % d.kW;
                    int64_t t = tb + kt, h = hb + kh, w = wb + kw;
                    if (t >= 0 && t < d.vT && h >= 0 && h < d.vH && w >= 0 && w < d.vW) {
                        t = view_src(t, d.uT, d.bT, d.T);
                        h = view_src(h, d.uH, d.bH, d.H);
                        w = view_src(w, d.uW, d.bW, d.W);
                        v = fpk_ld(d.x, d.xdt, xbase + (ci * d.T + t) * HW + h * d.W + w);
                    }
                }
                Xs[kk][col] = v;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < CK; kk++) {
                float a[4], b[4];
                for (int i = 0; i < 4; i++) a[i] = Ws[kk][ty * 4 + i];
                for (int j = 0; j < 4; j++) b[j] = Xs[kk][tx * 4 + j];
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; i++) {
            int64_t co = co0 + ty * 4 + i;
            if (co >= Cog) continue;
            float bv = d.bias ? fpk_ld(d.bias, d.bdt, g * Cog + co) : 0.f;
            for (int j = 0; j < 4; j++) {
                int64_t pp = p0 + tx * 4 + j;
                if (pp >= P) continue;
                fpk_st(d.y, d.ydt, (n * d.Cout + g * Cog + co) * P + pp, acc[i][j] + bv);
            }
        }
    }
}

static void fill_desc(conv_desc *d, const fpk_conv3d_params *p, const fpk_gt *x, const fpk_gt *w, const fpk_gt *bias,
                      const fpk_gt *out) {
    memset(d, 0, sizeof *d);
    d->x = x->data;
    d->xdt = x->dtype;
    d->w = w->data;
    d->wdt = w->dtype;
    d->bias = bias ? bias->data : nullptr;
    d->bdt = bias ? bias->dtype : 0;
    d->y = out->data;
    d->ydt = out->dtype;
    d->N = x->shape[0];
    d->Cin = x->shape[1];
    d->T = x->shape[2];
    d->H = x->shape[3];
    d->W = x->shape[4];
    d->Cout = w->shape[0];
    d->kT = w->shape[2];
    d->kH = w->shape[3];
    d->kW = w->shape[4];
    d->To = out->shape[2];
    d->Ho = out->shape[3];
    d->Wo = out->shape[4];
    d->sT = p->stride[0] ? p->stride[0] : 1;
    d->sH = p->stride[1] ? p->stride[1] : 1;
    d->sW = p->stride[2] ? p->stride[2] : 1;
    d->pT = p->padding[0];
    d->pH = p->padding[1];
    d->pW = p->padding[2];
    d->G = p->groups ? p->groups : 1;
    d->uT = fpk_conv_view_scale(p, 0);
    d->uH = fpk_conv_view_scale(p, 1);
    d->uW = fpk_conv_view_scale(p, 2);
    d->bT = p->replicate_before[0];
    d->bH = p->replicate_before[1];
    d->bW = p->replicate_before[2];
    d->vT = fpk_conv_view_dim(p, 0, d->T);
    d->vH = fpk_conv_view_dim(p, 1, d->H);
    d->vW = fpk_conv_view_dim(p, 2, d->W);
}

static fpk_status conv_own(cudaStream_t st, const conv_desc *d) {
    int64_t P = d->To * d->Ho * d->Wo, Cog = d->Cout / d->G;
    int64_t gx = (P + CP - 1) / CP, gy = (Cog + CM - 1) / CM, gz = d->N * d->G;
    if (gx > INT_MAX || gy > 65535)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d own kernel: grid %lld x %lld", (long long)gx, (long long)gy);
    k_conv3d<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)(gz < 65535 ? gz : 65535)), 256, 0, st>>>(*d);
    return fpk_gpu_launched("conv3d (own kernel)");
}

/* dst[n][c][r] = src[n][r][c] (+ bias[c], when given) for n < N, r < R, c < C, with src's c and
 * dst's r contiguous (element strides: src sN, sR; dst dN, dC). 32 x 32 tiles through shared
 * memory, so both sides are read and written in whole rows; one block per tile (blockIdx.x
 * counts R tiles x C tiles: either alone can pass 65535 tiles), n on blockIdx.z. Values go
 * through f32 (exact for the 16-bit dtypes); the bias is added in f32 and rounded once, as the
 * separate bias op would. */
struct transpose_desc {
    const void *src;
    void *dst;
    const void *bias;
    int dt, bdt;
    int64_t R, C, sN, sR, dN, dC;
};

__global__ void __launch_bounds__(256) k_transpose_rc(transpose_desc d) {
    __shared__ float t[32][33];
    const int64_t tilesC = (d.C + 31) / 32;
    const int64_t r0 = ((int64_t)blockIdx.x / tilesC) * 32, c0 = ((int64_t)blockIdx.x % tilesC) * 32;
    const int64_t n = blockIdx.z;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int i = ty; i < 32; i += 8) {
        int64_t r = r0 + i, cc = c0 + tx;
        if (r < d.R && cc < d.C) t[i][tx] = fpk_ld(d.src, d.dt, n * d.sN + r * d.sR + cc);
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
        int64_t cc = c0 + i, r = r0 + tx;
        if (r < d.R && cc < d.C) {
            float v = t[tx][i];
            if (d.bias) v += fpk_ld(d.bias, d.bdt, cc);
            fpk_st(d.dst, d.dt, n * d.dN + cc * d.dC + r, v);
        }
    }
}

static fpk_status transpose_rc(cudaStream_t st, const transpose_desc &d, int64_t N) {
    int64_t tiles = ((d.R + 31) / 32) * ((d.C + 31) / 32);
    if (N == 0 || tiles == 0) return FPK_OK;
    if (tiles > INT_MAX || N > 65535)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: channels-last transpose of %lld x %lld x %lld",
                                 (long long)N, (long long)d.R, (long long)d.C);
    k_transpose_rc<<<dim3((unsigned)tiles, 1, (unsigned)N), 256, 0, st>>>(d);
    return fpk_gpu_launched("conv3d channels-last transpose");
}

/* dst[n][r][c] = the view of src [N][C][T][H][W] (upsampled by u, replicate padded by b before,
 * as conv_desc's view, to vT x vH x vW, then zero padded by z on every side) at position r of its
 * frames [t0, t0 + R/(pH*pW)) (pH = vH + 2zH, pW = vW + 2zW), channel c: one slab of the conv's
 * input, channels-last (NDHWC), read in place of a padded copy. A block takes 32 positions, finds
 * their source offset once (32-bit: the slab is within 32-bit counts) and moves every channel
 * through a 32 x 32 shared tile, so both sides go in whole rows. Values pass through f32
 * unchanged. */
struct gather_desc {
    const void *src;
    void *dst;
    int dt;
    int64_t C, T, H, W, sN; /* source dims and its elements per sample */
    int32_t R, pH, pW;      /* positions of the slab; H and W with the zero padding */
    int32_t t0, uT, uH, uW, bT, bH, bW;
    int32_t vT, vH, vW, zT, zH, zW; /* the view's extent; zero padding before (and after) it */
};

__global__ void __launch_bounds__(256) k_gather_ndhwc(gather_desc d) {
    __shared__ float t[32][33];
    const int32_t r0 = blockIdx.x * 32;
    const int64_t n = blockIdx.z;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int64_t off = -1;
    bool zero = false;
    if (r0 + tx < d.R) {
        int32_t r = r0 + tx, hw = d.pH * d.pW;
        int32_t tv = d.t0 + r / hw - d.zT, hv = (r % hw) / d.pW - d.zH, wv = r % d.pW - d.zW;
        zero = tv < 0 || tv >= d.vT || hv < 0 || hv >= d.vH || wv < 0 || wv >= d.vW;
        int64_t ts = view_src<int32_t>(tv, d.uT, d.bT, (int32_t)d.T),
                hs = view_src<int32_t>(hv, d.uH, d.bH, (int32_t)d.H), ws = view_src<int32_t>(wv, d.uW, d.bW, (int32_t)d.W);
        off = n * d.sN + (ts * d.H + hs) * d.W + ws;
    }
    const int64_t THW = d.T * d.H * d.W;
    for (int64_t c0 = 0; c0 < d.C; c0 += 32) {
        for (int i = ty; i < 32; i += 8)
            if (off >= 0 && c0 + i < d.C) t[i][tx] = zero ? 0.f : fpk_ld(d.src, d.dt, off + (c0 + i) * THW);
        __syncthreads();
        for (int i = ty; i < 32; i += 8) {
            int64_t r = r0 + i, c = c0 + tx;
            if (r < d.R && c < d.C) fpk_st(d.dst, d.dt, (n * d.R + r) * d.C + c, t[tx][i]);
        }
        __syncthreads();
    }
}

/* One vendor conv on contiguous tensors of one dtype (dims must fit 32 bits). */
static fpk_status vendor_once(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int tuned, int dt,
                              const int64_t *xs, const void *x, const int64_t *ws, const void *w, const int64_t *ys,
                              void *y, const fpk_conv3d_params *p, int nhwc = 0) {
    int xd[5], wd[5], yd[5];
    for (int i = 0; i < 5; i++) {
        if (xs[i] > INT_MAX || ws[i] > INT_MAX || ys[i] > INT_MAX)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d vendor tier: a dim beyond 32 bits");
        xd[i] = (int)xs[i];
        wd[i] = (int)ws[i];
        yd[i] = (int)ys[i];
    }
    return fpk_vendor_conv(c, st, sf, tuned, dt, nhwc, xd, x, wd, w, yd, y, p);
}

/* A 16-bit conv channels-last, in slabs of output frames, by cuDNN (fpk_vendor_conv_nhwc) or
 * by the own tier's matrix kernel (fpk_gpu_conv_ndhwc_mma): per slab, its input frames gathered
 * into scratch (NCDHW -> NDHWC, through the input view; frames are contiguous there), the conv,
 * and its NDHWC output transposed into place in out with the bias added on the way. The weights
 * are transposed once (K C kT kH kW -> K kT kH kW C). Scratch: one slab's input and output (at
 * most fpk_gpu_cfg.cudnn_slab_bytes, for both engines, and within 32-bit element counts, so no
 * tensor is too big), the weights, and cuDNN's own workspace (small: no layout transforms
 * inside it). cuDNN applies the zero padding from its descriptor, so a conv with temporal zero
 * padding runs there as one slab; the own engine gathers the zero padding in and slabs any
 * conv. An empty input is FPK_ERR_UNAVAILABLE (the FMA kernel writes the bias). */
enum nhwc_engine { NHWC_CUDNN_TUNED, NHWC_CUDNN_DEFAULT, NHWC_OWN };

static fpk_status conv_nhwc(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, nhwc_engine engine, int dt,
                            const fpk_conv3d_params *p, const fpk_gt *x, const void *wp, const fpk_gt *w,
                            const fpk_gt *bias, const fpk_gt *out) {
    size_t es = fpk_dt_size(dt);
    /* the input as the conv reads it (its view); the own engine also gathers the zero padding
     * (its kernel reads a padded input), cuDNN applies it from the descriptor */
    const int own = engine == NHWC_OWN;
    int64_t vT = fpk_conv_view_dim(p, 0, x->shape[2]), vH = fpk_conv_view_dim(p, 1, x->shape[3]),
            vW = fpk_conv_view_dim(p, 2, x->shape[4]);
    int64_t zT = own ? p->padding[0] : 0, zH = own ? p->padding[1] : 0, zW = own ? p->padding[2] : 0;
    int64_t pH = vH + 2 * zH, pW = vW + 2 * zW;
    int64_t N = x->shape[0], Cin = x->shape[1], T = vT + 2 * zT, HW = pH * pW;
    int64_t K = w->shape[0], Cg = w->shape[1], kT = w->shape[2], kvol = kT * w->shape[3] * w->shape[4];
    int64_t To = out->shape[2], oHW = out->shape[3] * out->shape[4];
    if (x->numel == 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d channels-last: an empty input");
    if (T > INT_MAX || HW > INT_MAX)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d channels-last: input view %lld x %lld x %lld beyond 32 bits",
                                 (long long)T, (long long)pH, (long long)pW);
    int64_t sT = p->stride[0] ? p->stride[0] : 1;
    /* output frames per slab: the most whose input and output fit the slab bytes (and 32 bits) */
    int64_t frames = To;
    if (own || p->padding[0] == 0) {
        /* fpk_gpu_cfg.cudnn_slab_bytes (default 1 GiB), at least one output frame */
        frames = fpk_gpu_nhwc_slab_frames(fpk_gpu_cfg.cudnn_slab_bytes, es, N, Cin, HW, T, kT, sT, K, oHW, To);
    }
    int64_t tin_max = (frames - 1) * sT + kT;
    if (tin_max > T || frames == To) tin_max = T;
    if (N * Cin * HW * tin_max > INT_MAX || N * K * oHW * frames > INT_MAX || N > 65535 ||
        x->shape[2] * x->shape[3] * x->shape[4] > INT_MAX)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE,
                                 "conv3d channels-last: a slab beyond 32-bit element counts (or more than 65535 samples)");
    fpk_scratch sw(sf), sx(sf), sy(sf);
    FPK_TRY(sw.alloc((size_t)w->numel * es));
    FPK_TRY(transpose_rc(st, {wp, sw.ptr, nullptr, dt, 0, Cg, kvol, Cg * kvol, kvol, kvol * Cg, Cg}, K));
    FPK_TRY(sx.alloc((size_t)(N * Cin * HW * tin_max) * es));
    FPK_TRY(sy.alloc((size_t)(N * K * oHW * frames) * es));
    int64_t ws[5];
    for (int i = 0; i < 5; i++) ws[i] = w->shape[i];
    for (int64_t t0 = 0; t0 < To; t0 += frames) {
        int64_t tn = To - t0 < frames ? To - t0 : frames;
        int64_t ti0 = t0 * sT, tin = (tn - 1) * sT + kT; /* several slabs: no temporal padding */
        if (frames == To) ti0 = 0, tin = T;
        if (ti0 + tin > T) tin = T - ti0;
        gather_desc g = {x->data, sx.ptr, dt, Cin, x->shape[2], x->shape[3], x->shape[4],
                         Cin * x->shape[2] * x->shape[3] * x->shape[4], (int32_t)(tin * HW), (int32_t)pH, (int32_t)pW,
                         (int32_t)ti0, (int32_t)fpk_conv_view_scale(p, 0), (int32_t)fpk_conv_view_scale(p, 1),
                         (int32_t)fpk_conv_view_scale(p, 2),
                         (int32_t)p->replicate_before[0], (int32_t)p->replicate_before[1], (int32_t)p->replicate_before[2],
                         (int32_t)vT, (int32_t)vH, (int32_t)vW, (int32_t)zT, (int32_t)zH, (int32_t)zW};
        k_gather_ndhwc<<<dim3((unsigned)((g.R + 31) / 32), 1, (unsigned)N), 256, 0, st>>>(g);
        FPK_TRY(fpk_gpu_launched("conv3d channels-last gather"));
        if (own) {
            FPK_TRY(fpk_gpu_conv_ndhwc_mma(c, st, sf, dt, N, Cin, tin, pH, pW, sx.ptr, K, kT, w->shape[3], w->shape[4],
                                           sw.ptr, sT, p->stride[1] ? p->stride[1] : 1, p->stride[2] ? p->stride[2] : 1, tn,
                                           out->shape[3], out->shape[4], sy.ptr));
        } else {
            int64_t sxs[5] = {N, Cin, tin, pH, pW}, sys[5] = {N, K, tn, out->shape[3], out->shape[4]};
            FPK_TRY(vendor_once(c, st, sf, engine == NHWC_CUDNN_TUNED, dt, sxs, sx.ptr, ws, sw.ptr, sys, sy.ptr, p, 1));
        }
        char *ys0 = (char *)out->data + (size_t)(t0 * oHW) * es;
        FPK_TRY(transpose_rc(st, {sy.ptr, ys0, bias ? bias->data : nullptr, dt, bias ? bias->dtype : 0, tn * oHW, K,
                                  tn * oHW * K, K, K * To * oHW, To * oHW}, N));
    }
    return FPK_OK;
}

static fpk_status conv_vendor(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int tuned,
                              const fpk_conv3d_params *p, const fpk_gt *x, const fpk_gt *w, const fpk_gt *bias,
                              const fpk_gt *out) {
    if (!fpk_vendor_has_dnn(c))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: no vendor DNN library loaded");
    /* one compute dtype: the operands' when they agree (16-bit activations and weights: cuDNN's
     * matrix units, float accumulation), else f32 (the 16-bit one widened exactly) */
    int dt = x->dtype == w->dtype ? x->dtype : FPK_F32;
    size_t es = fpk_dt_size(dt);
    /* channels-last implies w in dt already (dt is x's) */
    bool nhwc = x->dtype == dt && out->dtype == dt && fpk_vendor_conv_nhwc(c, dt);
    if (!nhwc && fpk_conv_has_view(p)) /* the core makes the view for the NCDHW path */
        return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "conv3d vendor tier: no input view on the NCDHW path");
    fpk_scratch sx(sf), sw(sf), sy(sf);
    const void *xp = x->data, *wp = w->data;
    if (w->dtype != dt) {
        FPK_TRY(sw.alloc((size_t)w->numel * es));
        FPK_TRY(fpk_gpu_convert(st, sw.ptr, dt, w->data, w->dtype, w->numel));
        wp = sw.ptr;
    }
    if (nhwc) return conv_nhwc(c, st, sf, tuned ? NHWC_CUDNN_TUNED : NHWC_CUDNN_DEFAULT, dt, p, x, wp, w, bias, out);
    int64_t xs[5], ws[5], ys[5];
    for (int i = 0; i < 5; i++) {
        xs[i] = x->shape[i];
        ws[i] = w->shape[i];
        ys[i] = out->shape[i];
    }
    int64_t sT = p->stride[0] ? p->stride[0] : 1;
    int big = x->numel > INT_MAX || out->numel > INT_MAX;
    if (!big) {
        if (x->dtype != dt) {
            FPK_TRY(sx.alloc((size_t)x->numel * es));
            FPK_TRY(fpk_gpu_convert(st, sx.ptr, dt, x->data, x->dtype, x->numel));
            xp = sx.ptr;
        }
        void *yp = out->data;
        if (out->dtype != dt) {
            FPK_TRY(sy.alloc((size_t)out->numel * es));
            yp = sy.ptr;
        }
        FPK_TRY(vendor_once(c, st, sf, tuned, dt, xs, xp, ws, wp, ys, yp, p));
        if (yp != out->data) FPK_TRY(fpk_gpu_convert(st, out->data, out->dtype, yp, dt, out->numel));
    } else {
        if (p->padding[0] != 0)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE,
                                     "conv3d vendor tier: tensor beyond 32-bit element counts with temporal padding");
        /* slabs of output frames: per slab, input frames [t0*sT, (t1-1)*sT + kT) */
        int64_t N = xs[0], Cin = xs[1], T = xs[2], HW = xs[3] * xs[4], Cout = ys[1], To = ys[2], oHW = ys[3] * ys[4];
        int64_t kT = ws[2];
        int64_t frames = fpk_gpu_ncdhw_slab_frames(es, N, Cin, HW, kT, sT, Cout, oHW, To);
        if (frames < 1)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d vendor tier: one output frame exceeds 32-bit counts");
        int64_t tin_max = (frames - 1) * sT + kT;
        FPK_TRY(sx.alloc((size_t)(N * Cin * tin_max * HW) * es));
        FPK_TRY(sy.alloc((size_t)(N * Cout * frames * oHW) * es));
        size_t xes = fpk_dt_size(x->dtype), oes = fpk_dt_size(out->dtype);
        fpk_scratch sconv(sf);
        if (x->dtype != dt) FPK_TRY(sconv.alloc((size_t)(N * Cin * tin_max * HW) * xes));
        for (int64_t t0 = 0; t0 < To; t0 += frames) {
            int64_t tn = To - t0 < frames ? To - t0 : frames;
            int64_t ti0 = t0 * sT, tin = (tn - 1) * sT + kT;
            if (ti0 + tin > T) tin = T - ti0;
            /* input slab [N*Cin rows of tin*HW] */
            if (x->dtype == dt) {
                FPK_TRY(fpk_gpu_copy2d(st, (const char *)x->data + (size_t)(ti0 * HW) * xes, T * HW, sx.ptr, tin * HW,
                                       N * Cin, tin * HW, es));
            } else {
                FPK_TRY(fpk_gpu_copy2d(st, (const char *)x->data + (size_t)(ti0 * HW) * xes, T * HW, sconv.ptr,
                                       tin * HW, N * Cin, tin * HW, xes));
                FPK_TRY(fpk_gpu_convert(st, sx.ptr, dt, sconv.ptr, x->dtype, N * Cin * tin * HW));
            }
            int64_t sxs[5] = {N, Cin, tin, xs[3], xs[4]}, sys[5] = {N, Cout, tn, ys[3], ys[4]};
            FPK_TRY(vendor_once(c, st, sf, tuned, dt, sxs, sx.ptr, ws, wp, sys, sy.ptr, p));
            /* output slab into place (converting when out is another dtype) */
            if (out->dtype == dt) {
                FPK_TRY(fpk_gpu_copy2d(st, sy.ptr, tn * oHW, (char *)out->data + (size_t)(t0 * oHW) * oes, To * oHW,
                                       N * Cout, tn * oHW, es));
            } else {
                fpk_scratch so(sf);
                FPK_TRY(so.alloc((size_t)(N * Cout * tn * oHW) * oes));
                FPK_TRY(fpk_gpu_convert(st, so.ptr, out->dtype, sy.ptr, dt, N * Cout * tn * oHW));
                FPK_TRY(fpk_gpu_copy2d(st, so.ptr, tn * oHW, (char *)out->data + (size_t)(t0 * oHW) * oes, To * oHW,
                                       N * Cout, tn * oHW, oes));
            }
        }
    }
    if (bias)
        return fpk_gpu_add_bias(st, out->data, out->dtype, bias->data, bias->dtype, out->numel, out->shape[1],
                                out->numel / (out->shape[0] * out->shape[1]));
    return FPK_OK;
}

extern "C" uint32_t fpk_gpu_conv_tiers(fpk_gpu_ctx *c) {
    uint32_t t = 1u << FPK_CONV_TIER_OWN_KERNEL;
    if (fpk_vendor_has_dnn(c)) t |= (1u << FPK_CONV_TIER_VENDOR_TUNED) | (1u << FPK_CONV_TIER_VENDOR_DEFAULT);
    return t;
}

extern "C" fpk_status fpk_gpu_conv3d(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, fpk_conv_tier tier,
                                     const fpk_conv3d_params *p, const fpk_gt *x, const fpk_gt *w, const fpk_gt *bias,
                                     const fpk_gt *out) {
    cudaStream_t st = fpk_stream(c, s);
    if (out->numel == 0 && tier != FPK_CONV_TIER_CPU) return FPK_OK;
    switch (tier) {
    case FPK_CONV_TIER_VENDOR_TUNED:
    case FPK_CONV_TIER_VENDOR_DEFAULT: {
        int64_t K = w->shape[1] * w->shape[2] * w->shape[3] * w->shape[4];
        if (K == 0) break; /* an empty reduction: the own kernel writes the bias */
        return conv_vendor(c, st, sf, tier == FPK_CONV_TIER_VENDOR_TUNED, p, x, w, bias, out);
    }
    case FPK_CONV_TIER_OWN_KERNEL:
        /* 16-bit operands of one dtype, channels a multiple of 16, one group: the matrix-unit
         * kernel (fpk_gpu_conv_mma.cu) on the channels-last slabs of the vendor path, with the
         * zero padding gathered in too; a device without a working matrix path (checked
         * before any slab is built), a shape the kernel declines or scratch the slabs cannot
         * get falls to the FMA kernel below, as does fpk_gpu_cfg.conv_fma. */
        if (x->dtype != FPK_F32 && x->dtype == w->dtype && x->dtype == out->dtype && p->groups <= 1 &&
            x->shape[1] % 16 == 0 && x->numel > 0) {
            int ready = 0;
            FPK_TRY(fpk_gpu_conv_mma_ready(c, st, sf, x->dtype, &ready));
            if (ready) {
                /* scratch the slabs cannot get: the FMA kernel needs none */
                fpk_status s2 = conv_nhwc(c, st, sf, NHWC_OWN, x->dtype, p, x, w->data, w, bias, out);
                if (s2 != FPK_ERR_UNAVAILABLE && s2 != FPK_ERR_OUT_OF_MEMORY) return s2;
            }
        }
        break;
    default: return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: the %s backend serves no tier %d itself", FPK_GPU_NAME, (int)tier);
    }
    conv_desc d;
    fill_desc(&d, p, x, w, bias, out);
    return conv_own(st, &d);
}
