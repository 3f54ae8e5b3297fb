/*
 * fpk_shape.c — what scratch a conv takes on each backend (fpk_conv3d_scratch), and the
 * shape-only backend (fpk_backend_new_shape): tensors with a shape and a dtype but no memory,
 * counted by the core's allocator as a real backend's are; ops checked by the core as always,
 * computing nothing, each holding for its duration the scratch the backend it stands for would
 * (the policies of fpk_scratch.h, which that backend's ops use). Running a model's forward on it
 * measures the memory that forward holds at a shape, without its compute.
 */
#include "fpk_impl.h"
#include "fpk_scratch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { POLICY_CPU, POLICY_CUDA, POLICY_HIP };

static int policy_kind(const fpk_scratch_policy *pol) {
    if (strcmp(pol->backend, "cuda") == 0) return POLICY_CUDA;
    if (strcmp(pol->backend, "hip") == 0) return POLICY_HIP;
    return POLICY_CPU;
}

static int64_t or_default(int64_t v, int64_t def) { return v > 0 ? v : def; }

static int64_t prod(const int64_t *s, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= s[i];
    return p;
}

static int is_half(fpk_dtype dt) { return dt == FPK_F16 || dt == FPK_BF16; }

/* native/cpu/fpk_cpu_conv.c: 16-bit x and out run on f32 stand-ins (FPK_CPU_WIDE), an im2col
 * band unless the conv is pointwise, and a 16-bit weight widened into a panel. */
static uint64_t cpu_conv_scratch(const fpk_conv3d_params *p, fpk_dtype xdt, const int64_t *xs, fpk_dtype wdt,
                                 const int64_t *ws, fpk_dtype odt, const int64_t *os) {
    uint64_t n = 0;
    if (is_half(xdt)) n += (uint64_t)prod(xs, 5) * 4;
    if (is_half(odt)) n += (uint64_t)prod(os, 5) * 4;
    int64_t G = p->groups ? p->groups : 1, K = ws[1] * ws[2] * ws[3] * ws[4], Cog = ws[0] / G;
    if (prod(os, 5) == 0 || K == 0 || Cog == 0) return n;
    int pointwise = ws[2] == 1 && ws[3] == 1 && ws[4] == 1 && p->padding[0] == 0 && p->padding[1] == 0 &&
                    p->padding[2] == 0;
    for (int i = 0; i < 3; i++) pointwise = pointwise && (p->stride[i] ? p->stride[i] : 1) == 1;
    if (!pointwise) n += (uint64_t)K * (uint64_t)fpk_cpu_conv_band_rows(K, os[4], os[3]) * (uint64_t)os[4] * 4;
    if (is_half(wdt)) {
        int64_t rows = (int64_t)(FPK_CPU_WEIGHT_BUDGET / ((size_t)K * sizeof(float)));
        if (rows > Cog) rows = Cog;
        if (rows < 1) rows = 1;
        n += (uint64_t)rows * (uint64_t)K * 4;
    }
    return n;
}

/* native/gpu/fpk_gpu_conv.cu conv_vendor (the vendor tiers, first in the chain): a weight of
 * another dtype converted; on cuda, 16-bit convs channels-last in slabs (the weights transposed,
 * one slab's input and output, the search's workspace for the slab), reading the input view in
 * place; else NCDHW (x and out converted when not the compute dtype, or slabs beyond 32-bit
 * counts) with the search's workspace for the whole conv. MIOpen sizes its own workspace; its
 * estimate is the NCDHW want. */
static uint64_t gpu_conv_scratch(const fpk_scratch_policy *pol, int cuda, const fpk_conv3d_params *p, fpk_dtype xdt,
                                 const int64_t *xs, fpk_dtype wdt, const int64_t *ws, fpk_dtype odt,
                                 const int64_t *os, int *reads_view) {
    fpk_dtype dt = xdt == wdt ? xdt : FPK_F32;
    size_t es = fpk_dtype_size(dt);
    int nhwc = cuda && xdt == dt && odt == dt && dt != FPK_F32 && !pol->conv_ncdhw;
    *reads_view = nhwc;
    int64_t wn = prod(ws, 5), xn = prod(xs, 5), on = prod(os, 5);
    if (on == 0 || ws[1] * ws[2] * ws[3] * ws[4] == 0) return 0; /* the own kernel: no scratch */
    uint64_t n = wdt != dt ? (uint64_t)wn * es : 0;
    int64_t sT = p->stride[0] ? p->stride[0] : 1, kT = ws[2], N = xs[0], Cin = xs[1], K = os[1], To = os[2];
    int64_t oHW = os[3] * os[4];
    if (nhwc) {
        int64_t T = fpk_conv_view_dim(p, 0, xs[2]), HW = fpk_conv_view_dim(p, 1, xs[3]) * fpk_conv_view_dim(p, 2, xs[4]);
        int64_t frames = To;
        if (p->padding[0] == 0)
            frames = fpk_gpu_nhwc_slab_frames(or_default(pol->conv_slab_bytes, FPK_GPU_DEFAULT_SLAB), es, N, Cin, HW, T,
                                              kT, sT, K, oHW, To);
        int64_t tin = (frames - 1) * sT + kT;
        if (tin > T || frames == To) tin = T;
        uint64_t sx = (uint64_t)(N * Cin * HW * tin) * es, sy = (uint64_t)(N * K * oHW * frames) * es;
        return n + (uint64_t)wn * es + sx + sy +
               fpk_gpu_find_workspace_want(sx + sy, 1, or_default(pol->conv_nhwc_workspace_bytes, FPK_GPU_DEFAULT_NHWC_WORKSPACE));
    }
    /* NCDHW: the core makes the input view, so x is the conv's whole input */
    int64_t most = or_default(pol->conv_workspace_bytes, FPK_GPU_DEFAULT_WORKSPACE);
    if (xn <= INT32_MAX && on <= INT32_MAX) {
        if (xdt != dt) n += (uint64_t)xn * es;
        if (odt != dt) n += (uint64_t)on * es;
        return n + fpk_gpu_find_workspace_want((uint64_t)(xn + on) * es, 0, most);
    }
    int64_t HW = xs[3] * xs[4];
    int64_t frames = fpk_gpu_ncdhw_slab_frames(es, N, Cin, HW, kT, sT, K, oHW, To);
    if (frames < 1) return 0; /* unavailable: the own kernel serves it */
    int64_t tin = (frames - 1) * sT + kT;
    uint64_t sx = (uint64_t)(N * Cin * tin * HW) * es, sy = (uint64_t)(N * K * frames * oHW) * es;
    n += sx + sy;
    if (xdt != dt) n += (uint64_t)(N * Cin * tin * HW) * fpk_dtype_size(xdt);
    if (odt != dt) n += (uint64_t)(N * K * frames * oHW) * fpk_dtype_size(odt);
    return n + fpk_gpu_find_workspace_want(sx + sy, 0, most);
}

fpk_status fpk_conv3d_scratch(const fpk_scratch_policy *policy, const fpk_conv3d_params *p, fpk_dtype x_dtype,
                              const int64_t *x_shape, fpk_dtype w_dtype, const int64_t *w_shape, fpk_dtype out_dtype,
                              const int64_t *out_shape, uint64_t *bytes, int *reads_view) {
    if (!policy || !p || !x_shape || !w_shape || !out_shape || !bytes || !reads_view)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "conv3d scratch: null argument");
    if (!fpk_dtype_size(x_dtype) || !fpk_dtype_size(w_dtype) || !fpk_dtype_size(out_dtype))
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "conv3d scratch: unknown dtype");
    for (int i = 0; i < 5; i++)
        if (x_shape[i] < 0 || w_shape[i] < 0 || out_shape[i] < 0)
            return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "conv3d scratch: negative dim");
    *reads_view = 0;
    switch (policy_kind(policy)) {
    case POLICY_CPU: *bytes = cpu_conv_scratch(p, x_dtype, x_shape, w_dtype, w_shape, out_dtype, out_shape); break;
    default:
        *bytes = gpu_conv_scratch(policy, policy_kind(policy) == POLICY_CUDA, p, x_dtype, x_shape, w_dtype, w_shape,
                                  out_dtype, out_shape, reads_view);
    }
    return FPK_OK;
}

/* The chunked attention tiers' scores (the flash tiers take less): cpu FPK_CPU_SCORE_BUDGET
 * floats per chunk of queries; gpu at most attention_score_bytes of f32 scores and their 16-bit
 * probabilities (native/gpu/fpk_gpu_attention.cu chunked). */
static uint64_t attention_scratch(const fpk_scratch_policy *pol, fpk_tensor_t q, fpk_tensor_t k, fpk_tensor_t v,
                                  int layout) {
    int64_t Lq = q->shape[layout == FPK_ATTN_BHLD ? 2 : 1], Lk = k->shape[layout == FPK_ATTN_BHLD ? 2 : 1];
    int64_t Hkv = k->shape[layout == FPK_ATTN_BHLD ? 1 : 2];
    if (Lq == 0 || Lk == 0) return 0;
    if (policy_kind(pol) == POLICY_CPU) {
        int64_t chunk = FPK_CPU_SCORE_BUDGET / Lk;
        if (chunk < 1) chunk = 1;
        if (chunk > Lq) chunk = Lq;
        return (uint64_t)chunk * (uint64_t)Lk * 4;
    }
    int64_t row = Lk * 4 + (is_half(v->dtype) ? Lk * 2 : 0);
    int64_t chunk = or_default(pol->attention_score_bytes, FPK_GPU_DEFAULT_SCORES) / (Hkv * row);
    if (chunk < 1) chunk = 1;
    if (chunk > Lq) chunk = Lq;
    return (uint64_t)(Hkv * chunk * row);
}

/* ---- the shape-only backend -------------------------------------------------------------- */

typedef struct {
    fpk_backend_t self; /* the handle wrapping this context (for scratch accounting) */
    fpk_scratch_policy policy;
} shape_ctx;

/* Every buffer of the shape backend: never read or written. */
static char shape_nothing;

static void shape_free(void *ctx) { free(ctx); }

static fpk_status shape_props(void *ctx, fpk_backend_props *out) {
    shape_ctx *c = ctx;
    snprintf(out->device_name, sizeof out->device_name, "shape only (%s scratch)", c->policy.backend);
    out->threads = 1;
    out->conv_tiers = policy_kind(&c->policy) == POLICY_CPU
                          ? 0
                          : (1u << FPK_CONV_TIER_VENDOR_TUNED) | (1u << FPK_CONV_TIER_VENDOR_DEFAULT) |
                                (1u << FPK_CONV_TIER_OWN_KERNEL);
    return FPK_OK;
}

static fpk_status shape_alloc(void *ctx, size_t n, void **out) {
    (void)ctx, (void)n;
    *out = &shape_nothing;
    return FPK_OK;
}

static void shape_buffer_free(void *ctx, void *ptr) { (void)ctx, (void)ptr; }

static fpk_status shape_copy(void *ctx, void *s, void *dst, const void *src, size_t n) {
    (void)ctx, (void)s, (void)dst, (void)src, (void)n;
    return FPK_OK;
}

static void shape_convert(void *ctx, void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt, size_t n) {
    (void)ctx, (void)dst, (void)ddt, (void)src, (void)sdt, (void)n;
}

/* Holds n bytes of scratch for the op's duration, as the backend it stands for would. */
static fpk_status shape_hold(shape_ctx *c, uint64_t n) {
    if (!n) return FPK_OK;
    void *p = NULL;
    fpk_status st = fpk_scratch_alloc(c->self, (size_t)n, &p);
    if (st != FPK_OK) return st;
    fpk_scratch_free(c->self, p, (size_t)n);
    return FPK_OK;
}

static fpk_status shape_conv3d(void *ctx, void *s, fpk_conv_tier tier, const fpk_conv3d_params *p, fpk_tensor_t x,
                               fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    (void)s, (void)tier, (void)bias;
    shape_ctx *c = ctx;
    uint64_t n = 0;
    int view = 0;
    fpk_status st = fpk_conv3d_scratch(&c->policy, p, x->dtype, x->shape, w->dtype, w->shape, out->dtype, out->shape,
                                       &n, &view);
    if (st != FPK_OK) return st;
    if (fpk_conv_has_view(p) && !view) /* the core makes the view, as for the backend itself */
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "conv3d: the %s backend reads no input view here", c->policy.backend);
    return shape_hold(c, n);
}

static fpk_status shape_attention(void *ctx, void *s, const fpk_attention_params *p, fpk_tensor_t q, fpk_tensor_t k,
                                  fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out) {
    (void)s, (void)mask, (void)out;
    shape_ctx *c = ctx;
    return shape_hold(c, attention_scratch(&c->policy, q, k, v, p->layout));
}

/* Ops whose scratch is small (statistics, indices): checked by the core, nothing to do. */
static fpk_status shape_fill(void *ctx, void *s, fpk_tensor_t t, double v) { (void)ctx, (void)s, (void)t, (void)v; return FPK_OK; }
static fpk_status shape_gemm(void *ctx, void *s, const fpk_gemm_params *p, fpk_tensor_t a, fpk_tensor_t b,
                             fpk_tensor_t bias, fpk_tensor_t out) {
    (void)ctx, (void)s, (void)p, (void)a, (void)b, (void)bias, (void)out;
    return FPK_OK;
}
static fpk_status shape_group_norm(void *ctx, void *s, int64_t g, float eps, fpk_tensor_t x, fpk_tensor_t w,
                                   fpk_tensor_t b, fpk_tensor_t out) {
    (void)ctx, (void)s, (void)g, (void)eps, (void)x, (void)w, (void)b, (void)out;
    return FPK_OK;
}
static fpk_status shape_group_norm_act(void *ctx, void *s, int64_t g, float eps, fpk_norm_act act, fpk_tensor_t x,
                                       fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    (void)act;
    return shape_group_norm(ctx, s, g, eps, x, w, b, out);
}
static fpk_status shape_layer_norm(void *ctx, void *s, float eps, fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b,
                                   fpk_tensor_t out) {
    return shape_group_norm(ctx, s, 1, eps, x, w, b, out);
}
static fpk_status shape_unary(void *ctx, void *s, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out) {
    (void)ctx, (void)s, (void)op, (void)x, (void)out;
    return FPK_OK;
}
static fpk_status shape_affine(void *ctx, void *s, float a, float b, fpk_tensor_t x, fpk_tensor_t out) {
    (void)a, (void)b;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_binary(void *ctx, void *s, fpk_binary_op op, fpk_tensor_t a, fpk_tensor_t b, fpk_tensor_t out) {
    (void)op, (void)b;
    return shape_unary(ctx, s, FPK_UNARY_NEG, a, out);
}
static fpk_status shape_softmax(void *ctx, void *s, float scale, fpk_tensor_t x, fpk_tensor_t out) {
    (void)scale;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_concat(void *ctx, void *s, int dim, int n, const fpk_tensor_t *in, fpk_tensor_t out) {
    (void)ctx, (void)s, (void)dim, (void)n, (void)in, (void)out;
    return FPK_OK;
}
static fpk_status shape_slice(void *ctx, void *s, int dim, int64_t start, int64_t step, fpk_tensor_t x,
                              fpk_tensor_t out) {
    (void)dim, (void)start, (void)step;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_permute(void *ctx, void *s, const int *perm, fpk_tensor_t x, fpk_tensor_t out) {
    (void)perm;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_pad(void *ctx, void *s, fpk_pad_mode mode, const int64_t *before, const int64_t *after,
                            fpk_tensor_t x, fpk_tensor_t out) {
    (void)mode, (void)before, (void)after;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_upsample(void *ctx, void *s, const int64_t *scale, fpk_tensor_t x, fpk_tensor_t out) {
    (void)scale;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_upsample_pad(void *ctx, void *s, const int64_t *scale, const int64_t *before,
                                     const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    (void)scale, (void)before, (void)after;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_reduce(void *ctx, void *s, fpk_reduce_op op, int dim, fpk_tensor_t x, fpk_tensor_t out) {
    (void)op, (void)dim;
    return shape_unary(ctx, s, FPK_UNARY_NEG, x, out);
}
static fpk_status shape_tensor_copy(void *ctx, void *s, fpk_tensor_t src, fpk_tensor_t dst) {
    return shape_unary(ctx, s, FPK_UNARY_NEG, src, dst);
}

static const struct fpk_backend_iface shape_iface = {
    .api_version = FPK_API_VERSION,
    .name = "shape",
    .free = shape_free,
    .get_props = shape_props,
    .buffer_alloc = shape_alloc,
    .buffer_free = shape_buffer_free,
    .copy_h2d = shape_copy,
    .copy_d2h = shape_copy,
    .copy_d2d = shape_copy,
    .host_convert = shape_convert,
    .fill = shape_fill,
    .gemm = shape_gemm,
    .conv3d = shape_conv3d,
    .group_norm = shape_group_norm,
    .layer_norm = shape_layer_norm,
    .unary = shape_unary,
    .affine = shape_affine,
    .binary = shape_binary,
    .softmax = shape_softmax,
    .attention = shape_attention,
    .concat = shape_concat,
    .slice = shape_slice,
    .permute = shape_permute,
    .pad = shape_pad,
    .upsample_nearest3d = shape_upsample,
    .reduce = shape_reduce,
    .copy = shape_tensor_copy,
    .group_norm_act = shape_group_norm_act,
    .upsample_pad = shape_upsample_pad,
};

fpk_status fpk_backend_new_shape(const fpk_backend_config *config, const fpk_scratch_policy *policy,
                                 fpk_backend_t *out) {
    if (!policy || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend new shape: null argument");
    *out = NULL;
    if (!memchr(policy->backend, 0, sizeof policy->backend))
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend new shape: unterminated backend name");
    shape_ctx *c = calloc(1, sizeof *c);
    if (!c) return fpk_set_oom(sizeof *c, 0, "host allocation of shape backend");
    c->policy = *policy;
    fpk_backend_config cfg = {0};
    if (config) cfg = *config;
    cfg.flags &= ~(uint32_t)FPK_BACKEND_FLAG_POISON; /* nothing to poison */
    fpk_status st = fpk_backend_wrap(&shape_iface, c, 0, &cfg, out);
    if (st != FPK_OK) {
        free(c);
        return st;
    }
    c->self = *out;
    return FPK_OK;
}
