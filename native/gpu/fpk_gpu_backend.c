/*
 * fpk_gpu_backend.c — the gpu backend's function table and entry point (C, so it can read the
 * core's private structs). Every slot unpacks its tensors into fpk_gt descriptors and calls the
 * device code (fpk_gpu_*.cu), built by nvcc into libfpk-cuda.so or by hipcc into libfpk-hip.so.
 */
#include "fpk_impl.h"
#include "fpk_gpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct fpk_host_api *fpk_gpu_host;

fpk_status fpk_gpu_set_error(fpk_status status, const char *fmt, ...) {
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!fpk_gpu_host) return status;
    return fpk_gpu_host->set_error(status, "%s", msg);
}

fpk_status fpk_gpu_set_oom(uint64_t requested, uint64_t available, const char *what) {
    if (!fpk_gpu_host) return FPK_ERR_OUT_OF_MEMORY;
    return fpk_gpu_host->set_oom(requested, available, what);
}

#define GCTX(v) ((fpk_gpu_ctx *)(v))

/* Runs one op of the device code under the backend's submission lock. */
#define LOCKED(fn, ...)                                                                         \
    ({                                                                                          \
        fpk_gpu_lock(GCTX(ctx));                                                                \
        fpk_status st_ = fn(GCTX(ctx), __VA_ARGS__);                                            \
        fpk_gpu_unlock(GCTX(ctx));                                                              \
        st_;                                                                                    \
    })

static void gt(fpk_tensor_t t, fpk_gt *out) {
    memset(out, 0, sizeof *out);
    if (!t) return;
    out->data = fpk_tensor_data(t);
    out->dtype = (int)t->dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
    out->numel = t->numel;
}

/* Descriptor of t, or NULL for a NULL tensor (optional arguments). */
#define GT(name, t)                                                                             \
    fpk_gt name##_d;                                                                            \
    gt(t, &name##_d);                                                                           \
    const fpk_gt *name = (t) ? &name##_d : NULL

static fpk_gpu_scratch_fn scratch_of(fpk_tensor_t any) {
    fpk_gpu_scratch_fn f = {any->buf->backend, fpk_gpu_host->scratch_alloc, fpk_gpu_host->scratch_free};
    return f;
}

static void g_free(void *ctx) { fpk_gpu_free(GCTX(ctx)); }
static fpk_status g_props(void *ctx, fpk_backend_props *out) { return fpk_gpu_props(GCTX(ctx), out); }
static fpk_status g_alloc(void *ctx, size_t n, void **out) { return fpk_gpu_alloc(GCTX(ctx), n, out); }
static void g_dealloc(void *ctx, void *p) { fpk_gpu_dealloc(GCTX(ctx), p); }
static fpk_status g_stream_new(void *ctx, void **out) { return fpk_gpu_stream_new(GCTX(ctx), out); }
static void g_stream_free(void *ctx, void *s) { fpk_gpu_stream_free(GCTX(ctx), s); }
static fpk_status g_stream_sync(void *ctx, void *s) { return fpk_gpu_stream_sync(GCTX(ctx), s); }
static fpk_status g_h2d(void *ctx, void *s, void *d, const void *src, size_t n) {
    return fpk_gpu_copy(GCTX(ctx), s, 0, d, src, n);
}
static fpk_status g_d2h(void *ctx, void *s, void *d, const void *src, size_t n) {
    return fpk_gpu_copy(GCTX(ctx), s, 1, d, src, n);
}
static fpk_status g_d2d(void *ctx, void *s, void *d, const void *src, size_t n) {
    return fpk_gpu_copy(GCTX(ctx), s, 2, d, src, n);
}
static fpk_status g_h2d_async(void *ctx, void *s, void *d, const void *src, size_t n) {
    return fpk_gpu_copy_h2d_async(GCTX(ctx), s, d, src, n);
}
static fpk_status g_event_new(void *ctx, void **out) { return fpk_gpu_event_new(GCTX(ctx), out); }
static void g_event_free(void *ctx, void *e) { fpk_gpu_event_free(GCTX(ctx), e); }
static fpk_status g_event_record(void *ctx, void *e, void *s) { return fpk_gpu_event_record(GCTX(ctx), e, s); }
static fpk_status g_stream_wait_event(void *ctx, void *s, void *e) {
    return fpk_gpu_stream_wait_event(GCTX(ctx), s, e);
}
static fpk_status g_event_sync(void *ctx, void *e) { return fpk_gpu_event_sync(GCTX(ctx), e); }
static fpk_status g_host_register(void *ctx, void *p, size_t n) {
    return fpk_gpu_host_register(GCTX(ctx), p, n);
}
static fpk_status g_host_unregister(void *ctx, void *p) { return fpk_gpu_host_unregister(GCTX(ctx), p); }
static fpk_status g_mem_info(void *ctx, uint64_t *fr, uint64_t *tot) { return fpk_gpu_mem_info(GCTX(ctx), fr, tot); }

static fpk_status g_fill(void *ctx, void *s, fpk_tensor_t t, double v) {
    GT(d, t);
    return LOCKED(fpk_gpu_fill, s, d, v);
}

static fpk_status g_gemm(void *ctx, void *s, const fpk_gemm_params *p, fpk_tensor_t a, fpk_tensor_t b,
                         fpk_tensor_t bias, fpk_tensor_t out) {
    GT(ad, a);
    GT(bd, b);
    GT(cd, bias);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_gemm, s, &sf, p, ad, bd, cd, od);
}

static fpk_status g_gemm_q(void *ctx, void *s, const fpk_gemm_q_params *p, fpk_tensor_t a, fpk_tensor_t w,
                           fpk_tensor_t w_scale, fpk_tensor_t bias, fpk_tensor_t out) {
    GT(ad, a);
    GT(wd, w);
    GT(sd, w_scale);
    GT(cd, bias);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_gemm_q, s, &sf, p, ad, wd, sd, cd, od);
}

static fpk_status g_conv3d(void *ctx, void *s, fpk_conv_tier tier, const fpk_conv3d_params *p,
                           fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(bd, bias);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_conv3d, s, &sf, tier, p, xd, wd, bd, od);
}

static fpk_status g_group_norm(void *ctx, void *s, int64_t groups, float eps, fpk_tensor_t x,
                               fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(bd, b);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_group_norm, s, &sf, groups, eps, xd, wd, bd, od);
}

static fpk_status g_group_norm_act(void *ctx, void *s, int64_t groups, float eps, fpk_norm_act act,
                                   fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(bd, b);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_group_norm_act, s, &sf, groups, eps, (int)act, xd, wd, bd, od);
}

static fpk_status g_layer_norm(void *ctx, void *s, float eps, fpk_tensor_t x, fpk_tensor_t w,
                               fpk_tensor_t b, fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(bd, b);
    GT(od, out);
    return LOCKED(fpk_gpu_layer_norm, s, 0, eps, xd, wd, bd, od);
}

static fpk_status g_rms_norm(void *ctx, void *s, float eps, fpk_tensor_t x, fpk_tensor_t w,
                             fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(od, out);
    return LOCKED(fpk_gpu_layer_norm, s, 1, eps, xd, wd, NULL, od);
}

static fpk_status g_unary(void *ctx, void *s, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_unary, s, (int)op, 0, 0, xd, od);
}

static fpk_status g_affine(void *ctx, void *s, float scale, float shift, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_unary, s, -1, scale, shift, xd, od);
}

static fpk_status g_binary(void *ctx, void *s, fpk_binary_op op, fpk_tensor_t a, fpk_tensor_t b,
                           fpk_tensor_t out) {
    GT(ad, a);
    GT(bd, b);
    GT(od, out);
    return LOCKED(fpk_gpu_binary, s, (int)op, ad, bd, od);
}

static fpk_status g_ternary(void *ctx, void *s, fpk_ternary_op op, fpk_tensor_t a, fpk_tensor_t b,
                            fpk_tensor_t c, fpk_tensor_t out) {
    GT(ad, a);
    GT(bd, b);
    GT(cd, c);
    GT(od, out);
    return LOCKED(fpk_gpu_ternary, s, (int)op, ad, bd, cd, od);
}

static fpk_status g_softmax(void *ctx, void *s, float scale, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_softmax, s, scale, xd, od);
}

static fpk_status g_attention(void *ctx, void *s, const fpk_attention_params *p, fpk_tensor_t q,
                              fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out) {
    GT(qd, q);
    GT(kd, k);
    GT(vd, v);
    GT(md, mask);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_attention, s, &sf, p, qd, kd, vd, md, od);
}

static fpk_status g_rope(void *ctx, void *s, fpk_rope_mode mode, fpk_tensor_t x, fpk_tensor_t cos,
                         fpk_tensor_t sin, fpk_tensor_t out) {
    GT(xd, x);
    GT(cd, cos);
    GT(sd, sin);
    GT(od, out);
    return LOCKED(fpk_gpu_rope, s, (int)mode, xd, cd, sd, od);
}

static fpk_status g_rms_norm_rope(void *ctx, void *s, fpk_rope_mode mode, float eps, fpk_tensor_t x,
                                  fpk_tensor_t w, fpk_tensor_t cos, fpk_tensor_t sin, fpk_tensor_t out) {
    GT(xd, x);
    GT(wd, w);
    GT(cd, cos);
    GT(sd, sin);
    GT(od, out);
    return LOCKED(fpk_gpu_rms_norm_rope, s, (int)mode, eps, xd, wd, cd, sd, od);
}

static fpk_status g_concat(void *ctx, void *s, int dim, int n, const fpk_tensor_t *in, fpk_tensor_t out) {
    fpk_gt stack[16] = {{0}};
    fpk_gt *ins = n <= 16 ? stack : malloc((size_t)n * sizeof *ins);
    if (!ins) return fpk_gpu_host->set_oom((uint64_t)n * sizeof *ins, 0, "host concat descriptors");
    for (int i = 0; i < n; i++) gt(in[i], &ins[i]);
    GT(od, out);
    fpk_status st = LOCKED(fpk_gpu_concat, s, dim, n, ins, od);
    if (ins != stack) free(ins);
    return st;
}

static fpk_status g_slice(void *ctx, void *s, int dim, int64_t start, int64_t step, fpk_tensor_t x,
                          fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_slice, s, dim, start, step, xd, od);
}

static fpk_status g_permute(void *ctx, void *s, const int *perm, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_permute, s, perm, xd, od);
}

static fpk_status g_pad(void *ctx, void *s, fpk_pad_mode mode, const int64_t *before,
                        const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    (void)after;
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_pad, s, (int)mode, before, xd, od);
}

static fpk_status g_upsample(void *ctx, void *s, const int64_t *scale, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_upsample, s, scale, xd, od);
}

static fpk_status g_upsample_pad(void *ctx, void *s, const int64_t *scale, const int64_t *before,
                                 const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    (void)after;
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_upsample_pad, s, scale, before, xd, od);
}

static fpk_status g_avg_pool(void *ctx, void *s, const int64_t *kernel, const int64_t *stride,
                             fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_avg_pool, s, kernel, stride, xd, od);
}

static fpk_status g_reduce(void *ctx, void *s, fpk_reduce_op op, int dim, fpk_tensor_t x, fpk_tensor_t out) {
    GT(xd, x);
    GT(od, out);
    return LOCKED(fpk_gpu_reduce, s, (int)op, dim, xd, od);
}

static fpk_status g_copy(void *ctx, void *s, fpk_tensor_t src, fpk_tensor_t dst) {
    GT(sd, src);
    GT(dd, dst);
    return LOCKED(fpk_gpu_cast, s, sd, dd);
}

static fpk_status g_embedding(void *ctx, void *s, fpk_tensor_t table, fpk_tensor_t ids, fpk_tensor_t out) {
    GT(td, table);
    GT(id, ids);
    GT(od, out);
    fpk_gpu_scratch_fn sf = scratch_of(out);
    return LOCKED(fpk_gpu_embedding, s, &sf, td, id, od);
}

static struct fpk_backend_iface gpu_iface = {
    .api_version = FPK_API_VERSION,
    .free = g_free,
    .get_props = g_props,
    .buffer_alloc = g_alloc,
    .buffer_free = g_dealloc,
    .stream_new = g_stream_new,
    .stream_free = g_stream_free,
    .stream_synchronize = g_stream_sync,
    .copy_h2d = g_h2d,
    .copy_d2h = g_d2h,
    .copy_d2d = g_d2d,
    .fill = g_fill,
    .gemm = g_gemm,
    .conv3d = g_conv3d,
    .group_norm = g_group_norm,
    .group_norm_act = g_group_norm_act,
    .layer_norm = g_layer_norm,
    .rms_norm = g_rms_norm,
    .unary = g_unary,
    .affine = g_affine,
    .binary = g_binary,
    .softmax = g_softmax,
    .attention = g_attention,
    .rope = g_rope,
    .concat = g_concat,
    .slice = g_slice,
    .permute = g_permute,
    .pad = g_pad,
    .upsample_nearest3d = g_upsample,
    .upsample_pad = g_upsample_pad,
    .avg_pool3d = g_avg_pool,
    .reduce = g_reduce,
    .copy = g_copy,
    .embedding = g_embedding,
    .host_register = g_host_register,
    .host_unregister = g_host_unregister,
    .mem_info = g_mem_info,
    .event_new = g_event_new,
    .event_free = g_event_free,
    .event_record = g_event_record,
    .stream_wait_event = g_stream_wait_event,
    .event_synchronize = g_event_sync,
    .copy_h2d_async = g_h2d_async,
    .ternary = g_ternary,
    .rms_norm_rope = g_rms_norm_rope,
    .gemm_q = g_gemm_q,
};

__attribute__((visibility("default"))) fpk_status fpk_backend_create_v1(
    const struct fpk_host_api *host, const fpk_backend_config *config,
    const struct fpk_backend_iface **iface, void **ctx) {
    if (!host || !config || !iface || !ctx) return FPK_ERR_INVALID_ARGUMENT;
    if (host->api_version != FPK_API_VERSION)
        return host->set_error(FPK_ERR_UNSUPPORTED, "%s backend: runtime api %d, library built for %d",
                               fpk_gpu_backend_name(), host->api_version, FPK_API_VERSION);
    fpk_gpu_host = host;
    gpu_iface.name = fpk_gpu_backend_name();
    fpk_gpu_ctx *c = NULL;
    fpk_status st = fpk_gpu_create(config, &c);
    if (st != FPK_OK) return st;
    *iface = &gpu_iface;
    *ctx = c;
    return FPK_OK;
}
