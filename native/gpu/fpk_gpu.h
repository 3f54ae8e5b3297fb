/*
 * fpk_gpu.h — the interface between the gpu backend's C glue (fpk_gpu_backend.c, which sees the
 * core's private structs) and its device code (*.cu, one source for CUDA and HIP), which sees
 * only plain descriptors. Shared by C and C++; no vendor header here.
 *
 * The C glue unpacks every tensor handle into an fpk_gt (data pointer, dtype, shape) and calls
 * the fpk_gpu_* functions below; the device code never touches fpk_impl.h (whose atomics are C11
 * only). Errors are reported through the host table the core gave at creation (fpk_gpu_host).
 */
#ifndef FPK_GPU_H
#define FPK_GPU_H

#include "fpk.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fpk_host_api;

/* A tensor as the device code sees it: contiguous, row-major. */
typedef struct fpk_gt {
    void *data;
    int dtype; /* fpk_dtype */
    int ndim;
    int64_t shape[FPK_MAX_DIMS];
    int64_t numel;
} fpk_gt;

/* Scratch memory charged to the backend's cap (the core's allocator), owner = the backend. */
typedef struct fpk_gpu_scratch_fn {
    fpk_backend_t owner;
    fpk_status (*alloc)(fpk_backend_t backend, size_t nbytes, void **out);
    void (*free)(fpk_backend_t backend, void *ptr, size_t nbytes);
} fpk_gpu_scratch_fn;

/* Backend context (defined in the device code). */
typedef struct fpk_gpu_ctx fpk_gpu_ctx;

/* The host table of the core (set at creation; the library calls nothing else of the core). */
extern const struct fpk_host_api *fpk_gpu_host;

/* The thread's last error, through the host table (printf format). Returns status. */
fpk_status fpk_gpu_set_error(fpk_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* An out-of-memory error with sizes, through the host table. */
fpk_status fpk_gpu_set_oom(uint64_t requested, uint64_t available, const char *what);

/* Name of this build's backend: "cuda" or "hip". */
const char *fpk_gpu_backend_name(void);

/* ---- lifetime, memory, streams (fpk_gpu_device.cu) -------------------------------------- */

fpk_status fpk_gpu_create(const fpk_backend_config *config, fpk_gpu_ctx **out);
/* Serialises op submission (vendor handles and per-shape caches are not thread-safe); every op
 * slot of the table holds it while it queues work. */
void fpk_gpu_lock(fpk_gpu_ctx *c);
void fpk_gpu_unlock(fpk_gpu_ctx *c);
void fpk_gpu_free(fpk_gpu_ctx *c);
fpk_status fpk_gpu_props(fpk_gpu_ctx *c, fpk_backend_props *out);
fpk_status fpk_gpu_alloc(fpk_gpu_ctx *c, size_t nbytes, void **out);
void fpk_gpu_dealloc(fpk_gpu_ctx *c, void *ptr);
fpk_status fpk_gpu_stream_new(fpk_gpu_ctx *c, void **out);
void fpk_gpu_stream_free(fpk_gpu_ctx *c, void *stream);
fpk_status fpk_gpu_stream_sync(fpk_gpu_ctx *c, void *stream);
/* kind: 0 host→device, 1 device→host, 2 device→device. Host copies are complete on return. */
fpk_status fpk_gpu_copy(fpk_gpu_ctx *c, void *stream, int kind, void *dst, const void *src, size_t n);
/* Host→device copy queued on the stream without waiting (API version 5): the source must
 * stay valid until the stream passes it (an event recorded after it). */
fpk_status fpk_gpu_copy_h2d_async(fpk_gpu_ctx *c, void *stream, void *dst, const void *src, size_t n);
/* Events (cudaEvent_t / hipEvent_t without timing). */
fpk_status fpk_gpu_event_new(fpk_gpu_ctx *c, void **out);
void fpk_gpu_event_free(fpk_gpu_ctx *c, void *event);
fpk_status fpk_gpu_event_record(fpk_gpu_ctx *c, void *event, void *stream);
fpk_status fpk_gpu_stream_wait_event(fpk_gpu_ctx *c, void *stream, void *event);
fpk_status fpk_gpu_event_sync(fpk_gpu_ctx *c, void *event);
/* Pins (registers) host memory for fast DMA, and undoes it. */
fpk_status fpk_gpu_host_register(fpk_gpu_ctx *c, void *ptr, size_t n);
fpk_status fpk_gpu_host_unregister(fpk_gpu_ctx *c, void *ptr);
/* Free and total device memory as the driver reports them. */
fpk_status fpk_gpu_mem_info(fpk_gpu_ctx *c, uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- ops (fpk_gpu_ops.cu, fpk_gpu_gemm.cu, fpk_gpu_attention.cu, fpk_gpu_conv.cu) --------- */

fpk_status fpk_gpu_fill(fpk_gpu_ctx *c, void *s, const fpk_gt *t, double value);
fpk_status fpk_gpu_cast(fpk_gpu_ctx *c, void *s, const fpk_gt *src, const fpk_gt *dst);
fpk_status fpk_gpu_gemm(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf,
                        const fpk_gemm_params *p, const fpk_gt *a, const fpk_gt *b,
                        const fpk_gt *bias, const fpk_gt *out);
/* fpk_op_gemm_q (fpk_gpu_gemm_q.cu): weight-only by widened panels; the activation-quantized
 * modes on the matrix units where the device has them (FPK_ERR_UNAVAILABLE elsewhere). */
fpk_status fpk_gpu_gemm_q(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                          const fpk_gt *a, const fpk_gt *w, const fpk_gt *w_scale, const fpk_gt *bias,
                          const fpk_gt *out);
fpk_status fpk_gpu_conv3d(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, fpk_conv_tier tier,
                          const fpk_conv3d_params *p, const fpk_gt *x, const fpk_gt *w,
                          const fpk_gt *bias, const fpk_gt *out);
fpk_status fpk_gpu_group_norm(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, int64_t groups,
                              float eps, const fpk_gt *x, const fpk_gt *w, const fpk_gt *b,
                              const fpk_gt *out);
/* Replicate padding (before; after implied by out) of the nearest upsampling of x by scale, over
 * the last three dims. */
fpk_status fpk_gpu_upsample_pad(fpk_gpu_ctx *c, void *s, const int64_t *scale, const int64_t *before,
                                const fpk_gt *x, const fpk_gt *out);
/* Group norm then act (an fpk_norm_act) in one pass over the output. */
fpk_status fpk_gpu_group_norm_act(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, int64_t groups,
                                  float eps, int act, const fpk_gt *x, const fpk_gt *w, const fpk_gt *b,
                                  const fpk_gt *out);
/* rms != 0: RMS norm (b ignored). */
fpk_status fpk_gpu_layer_norm(fpk_gpu_ctx *c, void *s, int rms, float eps, const fpk_gt *x,
                              const fpk_gt *w, const fpk_gt *b, const fpk_gt *out);
/* op < 0: affine (scale, shift). */
fpk_status fpk_gpu_unary(fpk_gpu_ctx *c, void *s, int op, float scale, float shift, const fpk_gt *x,
                         const fpk_gt *out);
fpk_status fpk_gpu_binary(fpk_gpu_ctx *c, void *s, int op, const fpk_gt *a, const fpk_gt *b,
                          const fpk_gt *out);
fpk_status fpk_gpu_softmax(fpk_gpu_ctx *c, void *s, float scale, const fpk_gt *x, const fpk_gt *out);
/* op: fpk_ternary_op; a, b, c broadcast to out. */
fpk_status fpk_gpu_ternary(fpk_gpu_ctx *c, void *s, int op, const fpk_gt *a, const fpk_gt *b,
                           const fpk_gt *cc, const fpk_gt *out);
fpk_status fpk_gpu_attention(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf,
                             const fpk_attention_params *p, const fpk_gt *q, const fpk_gt *k,
                             const fpk_gt *v, const fpk_gt *mask, const fpk_gt *out);
/* mode: fpk_rope_mode (interleaved pairs or halves). */
fpk_status fpk_gpu_rope(fpk_gpu_ctx *c, void *s, int mode, const fpk_gt *x, const fpk_gt *cos,
                        const fpk_gt *sin, const fpk_gt *out);
/* RMS norm of the last dim then rope (mode: fpk_rope_mode); w may be NULL. */
fpk_status fpk_gpu_rms_norm_rope(fpk_gpu_ctx *c, void *s, int mode, float eps, const fpk_gt *x,
                                 const fpk_gt *w, const fpk_gt *cos, const fpk_gt *sin, const fpk_gt *out);
fpk_status fpk_gpu_concat(fpk_gpu_ctx *c, void *s, int dim, int n, const fpk_gt *in, const fpk_gt *out);
fpk_status fpk_gpu_slice(fpk_gpu_ctx *c, void *s, int dim, int64_t start, int64_t step,
                         const fpk_gt *x, const fpk_gt *out);
fpk_status fpk_gpu_permute(fpk_gpu_ctx *c, void *s, const int *perm, const fpk_gt *x, const fpk_gt *out);
fpk_status fpk_gpu_pad(fpk_gpu_ctx *c, void *s, int mode, const int64_t *before, const fpk_gt *x,
                       const fpk_gt *out);
fpk_status fpk_gpu_upsample(fpk_gpu_ctx *c, void *s, const int64_t *scale, const fpk_gt *x,
                            const fpk_gt *out);
fpk_status fpk_gpu_avg_pool(fpk_gpu_ctx *c, void *s, const int64_t *kernel, const int64_t *stride,
                            const fpk_gt *x, const fpk_gt *out);
fpk_status fpk_gpu_reduce(fpk_gpu_ctx *c, void *s, int op, int dim, const fpk_gt *x, const fpk_gt *out);
fpk_status fpk_gpu_embedding(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, const fpk_gt *table,
                             const fpk_gt *ids, const fpk_gt *out);

/* Conv tiers this build and machine have (bit per fpk_conv_tier; the CPU tier is the core's). */
uint32_t fpk_gpu_conv_tiers(fpk_gpu_ctx *c);

#ifdef __cplusplus
}
#endif
#endif /* FPK_GPU_H */
