/*
 * fpk_impl.h — private structs of the native runtime, shared by the core and the backends.
 *
 * A backend is a table of function pointers (struct fpk_backend_iface) plus a context
 * pointer. The core (fpk_core.c) owns handles, memory accounting, dtype conversion on upload
 * and download, argument checking and errors; a backend only allocates device memory, copies,
 * and runs ops on arguments the core has already checked. Optional slots may be NULL: the core
 * then answers FPK_ERR_UNSUPPORTED (ops), FPK_ERR_UNAVAILABLE (conv tiers) or uses its default
 * (streams: one synchronous stream).
 *
 * GPU backends are shared libraries (libfpk-cuda.so, libfpk-hip.so), opened by
 * fpk_backend_open, that export
 *   fpk_status fpk_backend_create_v1(const struct fpk_host_api *host,
 *                                    const fpk_backend_config *config,
 *                                    const struct fpk_backend_iface **iface, void **ctx);
 * (FPK_BACKEND_ENTRY names it) and reach the core only through the host table below: the
 * executable exports no symbols to them.
 */
#ifndef FPK_IMPL_H
#define FPK_IMPL_H

#include "fpk.h"
#include "fpk_dtype.h"

#include <pthread.h>
#include <stdatomic.h>

struct fpk_cached_block;
struct fpk_backend_iface;

/* Storage shared by every handle reshaped from one allocation. */
struct fpk_buffer {
    fpk_backend_t backend;
    void *data;     /* device pointer (host pointer on cpu) */
    size_t nbytes;  /* bytes counted against the cap */
    atomic_int refs;
};

struct fpk_tensor {
    struct fpk_buffer *buf;
    size_t offset; /* bytes into buf->data */
    fpk_dtype dtype;
    int ndim;
    int64_t shape[FPK_MAX_DIMS];
    int64_t numel;
};

struct fpk_stream {
    fpk_backend_t backend;
    void *ctx; /* the backend's stream (NULL on cpu) */
    int is_default;
};

struct fpk_event {
    fpk_backend_t backend;
    void *ctx; /* the backend's event (NULL when the backend has no event slots) */
};

/* Services the core offers a backend library. */
struct fpk_host_api {
    int api_version;
    /* Sets the thread's last error; returns status. */
    fpk_status (*set_error)(fpk_status status, const char *fmt, ...);
    /* Device scratch memory counted against the cap (freed with scratch_free). */
    fpk_status (*scratch_alloc)(fpk_backend_t backend, size_t nbytes, void **out);
    void (*scratch_free)(fpk_backend_t backend, void *ptr, size_t nbytes);
    /* Sets an out-of-memory error with sizes. */
    fpk_status (*set_oom)(uint64_t requested, uint64_t available, const char *what);
    /* Converts n elements between dtypes on the host. */
    void (*convert)(void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt, size_t n);
};

/* Name of the entry point a backend library exports. */
#define FPK_BACKEND_ENTRY "fpk_backend_create_v1"
typedef fpk_status (*fpk_backend_create_fn)(const struct fpk_host_api *host,
                                            const fpk_backend_config *config,
                                            const struct fpk_backend_iface **iface, void **ctx);

/* The function table of a backend. Every slot receives the backend's ctx. Tensors passed to
 * op slots have been checked by the core (shapes, dtypes, same backend). */
struct fpk_backend_iface {
    int api_version; /* FPK_API_VERSION */
    const char *name;

    void (*free)(void *ctx);
    fpk_status (*get_props)(void *ctx, fpk_backend_props *out);

    /* Device memory. The core has already counted the bytes against the cap. */
    fpk_status (*buffer_alloc)(void *ctx, size_t nbytes, void **out);
    void (*buffer_free)(void *ctx, void *ptr);

    /* Streams (optional; NULL = one synchronous stream, ctx NULL). */
    fpk_status (*stream_new)(void *ctx, void **out);
    void (*stream_free)(void *ctx, void *stream);
    fpk_status (*stream_synchronize)(void *ctx, void *stream);

    /* Copies of raw bytes; src/dst host pointers stay valid until the call returns. */
    fpk_status (*copy_h2d)(void *ctx, void *stream, void *dst, const void *src, size_t n);
    fpk_status (*copy_d2h)(void *ctx, void *stream, void *dst, const void *src, size_t n);
    fpk_status (*copy_d2d)(void *ctx, void *stream, void *dst, const void *src, size_t n);

    /* Host-side dtype conversion of n elements (optional; the core converts on one thread
     * otherwise). Used by upload and download when the dtypes differ. */
    void (*host_convert)(void *ctx, void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt,
                         size_t n);

    /* Ops (optional). */
    fpk_status (*fill)(void *ctx, void *stream, fpk_tensor_t t, double value);
    fpk_status (*gemm)(void *ctx, void *stream, const fpk_gemm_params *p, fpk_tensor_t a,
                       fpk_tensor_t b, fpk_tensor_t bias, fpk_tensor_t out);
    /* Returns FPK_ERR_UNAVAILABLE for a tier the backend lacks. */
    fpk_status (*conv3d)(void *ctx, void *stream, fpk_conv_tier tier, const fpk_conv3d_params *p,
                         fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out);
    fpk_status (*group_norm)(void *ctx, void *stream, int64_t groups, float eps, fpk_tensor_t x,
                             fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out);
    fpk_status (*layer_norm)(void *ctx, void *stream, float eps, fpk_tensor_t x, fpk_tensor_t w,
                             fpk_tensor_t b, fpk_tensor_t out);
    fpk_status (*rms_norm)(void *ctx, void *stream, float eps, fpk_tensor_t x, fpk_tensor_t w,
                           fpk_tensor_t out);
    fpk_status (*unary)(void *ctx, void *stream, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out);
    fpk_status (*affine)(void *ctx, void *stream, float scale, float shift, fpk_tensor_t x,
                         fpk_tensor_t out);
    fpk_status (*binary)(void *ctx, void *stream, fpk_binary_op op, fpk_tensor_t a, fpk_tensor_t b,
                         fpk_tensor_t out);
    fpk_status (*softmax)(void *ctx, void *stream, float scale, fpk_tensor_t x, fpk_tensor_t out);
    fpk_status (*attention)(void *ctx, void *stream, const fpk_attention_params *p, fpk_tensor_t q,
                            fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out);
    /* Rope in any fpk_rope_mode; a mode the backend lacks answers FPK_ERR_UNSUPPORTED. */
    fpk_status (*rope)(void *ctx, void *stream, fpk_rope_mode mode, fpk_tensor_t x, fpk_tensor_t cos,
                       fpk_tensor_t sin, fpk_tensor_t out);
    fpk_status (*concat)(void *ctx, void *stream, int dim, int n, const fpk_tensor_t *in,
                         fpk_tensor_t out);
    fpk_status (*slice)(void *ctx, void *stream, int dim, int64_t start, int64_t step,
                        fpk_tensor_t x, fpk_tensor_t out);
    fpk_status (*permute)(void *ctx, void *stream, const int *perm, fpk_tensor_t x,
                          fpk_tensor_t out);
    fpk_status (*pad)(void *ctx, void *stream, fpk_pad_mode mode, const int64_t *before,
                      const int64_t *after, fpk_tensor_t x, fpk_tensor_t out);
    fpk_status (*upsample_nearest3d)(void *ctx, void *stream, const int64_t *scale, fpk_tensor_t x,
                                     fpk_tensor_t out);
    fpk_status (*avg_pool3d)(void *ctx, void *stream, const int64_t *kernel,
                             const int64_t *stride, fpk_tensor_t x, fpk_tensor_t out);
    fpk_status (*reduce)(void *ctx, void *stream, fpk_reduce_op op, int dim, fpk_tensor_t x,
                         fpk_tensor_t out);
    /* Same shape; dtypes may differ. */
    fpk_status (*copy)(void *ctx, void *stream, fpk_tensor_t src, fpk_tensor_t dst);
    fpk_status (*embedding)(void *ctx, void *stream, fpk_tensor_t table, fpk_tensor_t ids,
                            fpk_tensor_t out);

    /* Device backends (optional; NULL on cpu): pin host memory for fast DMA and undo it
     * (fpk_backend_host_register), and the driver's free/total device memory. */
    fpk_status (*host_register)(void *ctx, void *ptr, size_t n);
    fpk_status (*host_unregister)(void *ctx, void *ptr);
    fpk_status (*mem_info)(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes);

    /* Events and async copies (API version 5; optional, NULL on cpu: streams are synchronous,
     * events complete when recorded, copy_h2d_async falls back to copy_h2d). */
    fpk_status (*event_new)(void *ctx, void **out);
    void (*event_free)(void *ctx, void *event);
    fpk_status (*event_record)(void *ctx, void *event, void *stream);
    fpk_status (*stream_wait_event)(void *ctx, void *stream, void *event);
    fpk_status (*event_synchronize)(void *ctx, void *event);
    /* Host→device copy that returns once queued (the source must stay valid until done). */
    fpk_status (*copy_h2d_async)(void *ctx, void *stream, void *dst, const void *src, size_t n);

    /* Fused three-operand elementwise ops (API version 6; optional). */
    fpk_status (*ternary)(void *ctx, void *stream, fpk_ternary_op op, fpk_tensor_t a, fpk_tensor_t b,
                          fpk_tensor_t c, fpk_tensor_t out);
    /* Group norm and an activation in one pass (API version 7; optional: the core runs
     * group_norm then unary in place). */
    fpk_status (*group_norm_act)(void *ctx, void *stream, int64_t groups, float eps, fpk_norm_act act,
                                 fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out);
    /* Replicate padding of a nearest upsampling over the last 3 dims (API version 7; optional). */
    fpk_status (*upsample_pad)(void *ctx, void *stream, const int64_t *scale, const int64_t *before,
                               const int64_t *after, fpk_tensor_t x, fpk_tensor_t out);
    /* API version 8 (optional): RMS norm then rope in one pass; a mode the backend lacks answers
     * FPK_ERR_UNSUPPORTED. The gemm slot honours fpk_gemm_params.epilogue. */
    fpk_status (*rms_norm_rope)(void *ctx, void *stream, fpk_rope_mode mode, float eps,
                                fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t cos, fpk_tensor_t sin,
                                fpk_tensor_t out);
    /* API version 10 (optional): GEMM with an 8-bit float weight and its scales; an act_quant
     * the backend has no path for answers FPK_ERR_UNAVAILABLE. */
    fpk_status (*gemm_q)(void *ctx, void *stream, const fpk_gemm_q_params *p, fpk_tensor_t a,
                         fpk_tensor_t w, fpk_tensor_t w_scale, fpk_tensor_t bias, fpk_tensor_t out);
};

struct fpk_backend {
    const struct fpk_backend_iface *iface;
    void *ctx;
    fpk_backend_config config;
    int is_host;
    struct fpk_stream default_stream;

    /* Memory accounting; mem_mu protects nothing else. */
    pthread_mutex_t mem_mu;
    uint64_t cap, allocated, peak, allocs;
    uint64_t cached;                /* bytes in freed blocks kept for reuse */
    struct fpk_cached_block *cache; /* those blocks */
    atomic_long live_tensors;
    atomic_long live_streams;

    void *dl; /* dlopen handle of the backend library (NULL for cpu) */

    /* Lazily created cpu backend used for the host round trip of the CPU conv tier. */
    pthread_mutex_t host_mu;
    fpk_backend_t host;
};

/* ---- core internals used by backends compiled into the binary -------------------------- */

fpk_status fpk_set_error(fpk_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sets an out-of-memory error with the requested and available sizes. */
fpk_status fpk_set_oom(uint64_t requested, uint64_t available, const char *what);
fpk_status fpk_scratch_alloc(fpk_backend_t backend, size_t nbytes, void **out);
void fpk_scratch_free(fpk_backend_t backend, void *ptr, size_t nbytes);
/* Wraps a backend table into a backend handle (used by the backend constructors). */
fpk_status fpk_backend_wrap(const struct fpk_backend_iface *iface, void *ctx, int is_host,
                            const fpk_backend_config *config, fpk_backend_t *out);

/* Converts n elements between dtypes (same dtype: memcpy). */
void fpk_convert(void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt, size_t n);


static inline void *fpk_tensor_data(fpk_tensor_t t) {
    return (char *)t->buf->data + t->offset;
}

/* The cpu backend's table and context constructor (native/cpu). */
fpk_status fpk_cpu_create(const fpk_backend_config *config, const struct fpk_backend_iface **iface,
                          void **ctx);

#endif /* FPK_IMPL_H */
