/*
 * fpk_core.c — handles, errors, memory accounting, dtype conversion and argument checks.
 * Backends (native/cpu, GPU libraries later) implement struct fpk_backend_iface.
 */
#include "fpk_impl.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ----------------------------------------------------------------------------- */

static _Thread_local fpk_error_info tls_err;

static fpk_status vset_error(fpk_status status, const char *fmt, va_list ap) {
    tls_err.status = status;
    tls_err.requested = 0;
    tls_err.available = 0;
    vsnprintf(tls_err.message, sizeof tls_err.message, fmt, ap);
    return status;
}

fpk_status fpk_set_error(fpk_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset_error(status, fmt, ap);
    va_end(ap);
    return status;
}

fpk_status fpk_set_oom(uint64_t requested, uint64_t available, const char *what) {
    fpk_set_error(FPK_ERR_OUT_OF_MEMORY, "out of memory: %s of %llu bytes, %llu available", what,
                  (unsigned long long)requested, (unsigned long long)available);
    tls_err.requested = requested;
    tls_err.available = available;
    return FPK_ERR_OUT_OF_MEMORY;
}

const char *fpk_last_error(void) { return tls_err.message; }

void fpk_last_error_info(fpk_error_info *out) {
    if (out) *out = tls_err;
}

void fpk_clear_error(void) { memset(&tls_err, 0, sizeof tls_err); }

const char *fpk_status_name(fpk_status status) {
    switch (status) {
    case FPK_OK: return "ok";
    case FPK_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FPK_ERR_OUT_OF_MEMORY: return "out of memory";
    case FPK_ERR_UNSUPPORTED: return "unsupported";
    case FPK_ERR_UNAVAILABLE: return "unavailable";
    case FPK_ERR_BACKEND: return "backend error";
    case FPK_ERR_DEVICE_LOST: return "device lost";
    case FPK_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

/* Every dtype fact comes from the one table, fpk_dtype.h. */
size_t fpk_dtype_size(fpk_dtype dtype) { return fpk_dtype_bytes(dtype); }

static const char *dtype_name(fpk_dtype d) { return fpk_dtype_name(d); }

static int dtype_is_float(fpk_dtype d) { return fpk_dtype_is_float(d); }

/* Formats a shape as [a, b, c] into buf (for error messages). */
static const char *shape_str(fpk_tensor_t t, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, n - used, "[");
    for (int i = 0; t && i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

/* ---- dtype conversion ------------------------------------------------------------------- */

static float load_f(const void *src, fpk_dtype dt, size_t i) { return fpk_dtype_load(src, dt, (int64_t)i); }

/* Converts n elements; same dtype is a memcpy. Integer targets round toward zero and
 * saturate; NaN becomes 0. */
void fpk_convert(void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt, size_t n) {
    if (ddt == sdt) {
        memcpy(dst, src, n * fpk_dtype_size(ddt));
        return;
    }
    /* the weight-loading paths, as tight loops */
    if (ddt == FPK_F32 && sdt == FPK_BF16) {
        const uint16_t *h = src;
        uint32_t *f = dst;
        for (size_t i = 0; i < n; i++) f[i] = (uint32_t)h[i] << 16;
        return;
    }
    if (ddt == FPK_F32 && sdt == FPK_F16) {
        const uint16_t *h = src;
        float *f = dst;
        for (size_t i = 0; i < n; i++) f[i] = fpk_f16_to_f32(h[i]);
        return;
    }
    if (ddt == FPK_BF16 && sdt == FPK_F32) {
        const float *f = src;
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) h[i] = fpk_f32_to_bf16(f[i]);
        return;
    }
    if (ddt == FPK_F16 && sdt == FPK_F32) {
        const float *f = src;
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) h[i] = fpk_f32_to_f16(f[i]);
        return;
    }
    if (ddt == FPK_I32 && sdt == FPK_U8) {
        for (size_t i = 0; i < n; i++) ((int32_t *)dst)[i] = ((const uint8_t *)src)[i];
        return;
    }
    if (ddt == FPK_F32 && fpk_dtype_is_fp8(sdt)) { /* 8-bit weights: through a table of the 256 values */
        float table[256];
        for (int q = 0; q < 256; q++) table[q] = fpk_fp8_to_f32((uint8_t)q, sdt);
        for (size_t i = 0; i < n; i++) ((float *)dst)[i] = table[((const uint8_t *)src)[i]];
        return;
    }
    for (size_t i = 0; i < n; i++) fpk_dtype_store(dst, ddt, (int64_t)i, load_f(src, sdt, i));
}

/* ---- backends ----------------------------------------------------------------------------- */

static struct fpk_cached_block *cache_take_all(fpk_backend_t b);
static void cache_free_list(fpk_backend_t b, struct fpk_cached_block *list);

fpk_status fpk_backend_wrap(const struct fpk_backend_iface *iface, void *ctx, int is_host,
                            const fpk_backend_config *config, fpk_backend_t *out) {
    if (!iface || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend wrap: null argument");
    if (iface->api_version != FPK_API_VERSION)
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "backend %s: api version %d, runtime has %d",
                             iface->name ? iface->name : "?", iface->api_version, FPK_API_VERSION);
    if (!iface->buffer_alloc || !iface->buffer_free || !iface->copy_h2d || !iface->copy_d2h ||
        !iface->copy_d2d)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend %s: table lacks memory slots",
                             iface->name ? iface->name : "?");
    struct fpk_backend *b = calloc(1, sizeof *b);
    if (!b) return fpk_set_oom(sizeof *b, 0, "host allocation of backend");
    b->iface = iface;
    b->ctx = ctx;
    if (config) b->config = *config;
    b->is_host = is_host;
    b->cap = b->config.memory_cap;
    pthread_mutex_init(&b->mem_mu, NULL);
    pthread_mutex_init(&b->host_mu, NULL);
    b->default_stream.backend = b;
    b->default_stream.ctx = NULL;
    b->default_stream.is_default = 1;
    *out = b;
    return FPK_OK;
}

fpk_status fpk_backend_new_cpu(const fpk_backend_config *config, fpk_backend_t *out) {
    if (!out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend new cpu: null out");
    *out = NULL;
    fpk_backend_config cfg = {0};
    if (config) cfg = *config;
    const struct fpk_backend_iface *iface = NULL;
    void *ctx = NULL;
    fpk_status st = fpk_cpu_create(&cfg, &iface, &ctx);
    if (st != FPK_OK) return st;
    st = fpk_backend_wrap(iface, ctx, 1, &cfg, out);
    if (st != FPK_OK) iface->free(ctx);
    return st;
}

static const struct fpk_host_api host_api = {
    .api_version = FPK_API_VERSION,
    .set_error = fpk_set_error,
    .scratch_alloc = fpk_scratch_alloc,
    .scratch_free = fpk_scratch_free,
    .set_oom = fpk_set_oom,
    .convert = fpk_convert,
};

fpk_status fpk_backend_open(const char *path, const fpk_backend_config *config, fpk_backend_t *out) {
    if (!path || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend open: null argument");
    *out = NULL;
    fpk_backend_config cfg = {0};
    if (config) cfg = *config;
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        return fpk_set_error(FPK_ERR_UNAVAILABLE, "backend open %s: %s", path, why ? why : "dlopen failed");
    }
    fpk_backend_create_fn create = (fpk_backend_create_fn)dlsym(dl, FPK_BACKEND_ENTRY);
    if (!create) {
        dlclose(dl);
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "backend open %s: no %s", path, FPK_BACKEND_ENTRY);
    }
    const struct fpk_backend_iface *iface = NULL;
    void *ctx = NULL;
    fpk_status st = create(&host_api, &cfg, &iface, &ctx);
    if (st != FPK_OK) {
        dlclose(dl);
        return st;
    }
    if (!iface) {
        dlclose(dl);
        return fpk_set_error(FPK_ERR_INTERNAL, "backend open %s: no function table", path);
    }
    st = fpk_backend_wrap(iface, ctx, 0, &cfg, out);
    if (st != FPK_OK) {
        if (iface->free) iface->free(ctx);
        dlclose(dl);
        return st;
    }
    (*out)->dl = dl;
    return FPK_OK;
}

fpk_status fpk_backend_free(fpk_backend_t b) {
    if (!b) return FPK_OK;
    long live = atomic_load(&b->live_tensors);
    long streams = atomic_load(&b->live_streams);
    if (live != 0 || streams != 0)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT,
                             "backend free: %ld tensors and %ld streams still alive", live, streams);
    if (b->host) {
        fpk_status st = fpk_backend_free(b->host);
        if (st != FPK_OK) return st;
        b->host = NULL;
    }
    cache_free_list(b, cache_take_all(b));
    if (b->iface->free) b->iface->free(b->ctx);
    void *dl = b->dl;
    pthread_mutex_destroy(&b->mem_mu);
    pthread_mutex_destroy(&b->host_mu);
    free(b);
    if (dl) dlclose(dl);
    return FPK_OK;
}

const char *fpk_backend_name(fpk_backend_t b) { return b ? b->iface->name : "(null)"; }

fpk_status fpk_backend_get_props(fpk_backend_t b, fpk_backend_props *out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend get props: null argument");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", b->iface->name);
    out->api_version = b->iface->api_version;
    out->device = b->config.device;
    out->is_host = b->is_host;
    fpk_status st = b->iface->get_props ? b->iface->get_props(b->ctx, out) : FPK_OK;
    /* the core serves the CPU tier for every backend (host round trip when the backend has
     * no host conv of its own) */
    out->conv_tiers |= 1u << FPK_CONV_TIER_CPU;
    return st;
}

fpk_status fpk_backend_get_memory(fpk_backend_t b, fpk_memory_stats *out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend get memory: null argument");
    pthread_mutex_lock(&b->mem_mu);
    out->cap = b->cap;
    out->allocated = b->allocated;
    out->peak = b->peak;
    out->allocs = b->allocs;
    out->cached = b->cached;
    pthread_mutex_unlock(&b->mem_mu);
    out->live_tensors = (uint64_t)atomic_load(&b->live_tensors);
    return FPK_OK;
}

fpk_status fpk_backend_set_memory_cap(fpk_backend_t b, uint64_t cap) {
    if (!b) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend set memory cap: null backend");
    pthread_mutex_lock(&b->mem_mu);
    b->cap = cap;
    struct fpk_cached_block *evict = NULL;
    if (cap && b->allocated + b->cached > cap) evict = cache_take_all(b);
    pthread_mutex_unlock(&b->mem_mu);
    cache_free_list(b, evict);
    return FPK_OK;
}

fpk_status fpk_backend_reset_peak(fpk_backend_t b) {
    if (!b) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend reset peak: null backend");
    pthread_mutex_lock(&b->mem_mu);
    b->peak = b->allocated;
    pthread_mutex_unlock(&b->mem_mu);
    return FPK_OK;
}

fpk_status fpk_backend_host_register(fpk_backend_t b, void *ptr, size_t n) {
    if (!b || (!ptr && n)) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "host register: null argument");
    if (!b->iface->host_register || n == 0) return FPK_OK;
    return b->iface->host_register(b->ctx, ptr, n);
}

fpk_status fpk_backend_host_unregister(fpk_backend_t b, void *ptr) {
    if (!b) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "host unregister: null backend");
    if (!b->iface->host_unregister || !ptr) return FPK_OK;
    return b->iface->host_unregister(b->ctx, ptr);
}

fpk_status fpk_backend_get_device_memory(fpk_backend_t b, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (!b || !free_bytes || !total_bytes)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "device memory: null argument");
    if (!b->iface->mem_info)
        return fpk_set_error(FPK_ERR_UNSUPPORTED, "device memory: backend %s has no device memory figures",
                             b->iface->name);
    return b->iface->mem_info(b->ctx, free_bytes, total_bytes);
}

/* ---- allocator ----------------------------------------------------------------------------
 * Every allocation is charged to the backend: `allocated` (live bytes) plus `cached` (freed
 * blocks kept for reuse) never exceed the cap. Blocks of at least CACHE_MIN bytes are rounded
 * up to CACHE_ROUND and, when freed, kept in a small cache (at most cache_limit bytes) so the
 * same shapes in the next step reuse them without a trip to the system allocator (on the cpu:
 * no page faults on fresh memory; on GPUs: no cudaMalloc/hipMalloc). A new allocation that
 * would go over the cap first gives cached blocks back. */

#define CACHE_MIN ((size_t)1 << 20)
#define CACHE_ROUND ((size_t)64 << 10)
#define CACHE_DEFAULT_LIMIT ((uint64_t)1 << 30)

struct fpk_cached_block {
    void *ptr;
    size_t nbytes;
    struct fpk_cached_block *next;
};

/* The bytes charged for a request of nbytes. */
static size_t charged_size(size_t nbytes) {
    if (nbytes < CACHE_MIN) return nbytes;
    return (nbytes + CACHE_ROUND - 1) / CACHE_ROUND * CACHE_ROUND;
}

static uint64_t cache_limit(fpk_backend_t b) {
    uint64_t lim = b->config.cache_limit ? b->config.cache_limit : CACHE_DEFAULT_LIMIT;
    if (b->config.cache_limit == 0 && b->cap && b->cap / 4 < lim) lim = b->cap / 4;
    return lim;
}

/* Unlinks every cached block (caller holds mem_mu); returns the list to free outside it. */
static struct fpk_cached_block *cache_take_all(fpk_backend_t b) {
    struct fpk_cached_block *list = b->cache;
    b->cache = NULL;
    b->cached = 0;
    return list;
}

static void cache_free_list(fpk_backend_t b, struct fpk_cached_block *list) {
    while (list) {
        struct fpk_cached_block *n = list->next;
        b->iface->buffer_free(b->ctx, list->ptr);
        free(list);
        list = n;
    }
}

fpk_status fpk_backend_trim(fpk_backend_t b) {
    if (!b) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "backend trim: null backend");
    pthread_mutex_lock(&b->mem_mu);
    struct fpk_cached_block *list = cache_take_all(b);
    pthread_mutex_unlock(&b->mem_mu);
    cache_free_list(b, list);
    return FPK_OK;
}

static fpk_status device_alloc(fpk_backend_t b, size_t nbytes, void **out, const char *what) {
    size_t need = charged_size(nbytes);
    struct fpk_cached_block *evict = NULL;
    pthread_mutex_lock(&b->mem_mu);
    if (need >= CACHE_MIN) {
        for (struct fpk_cached_block **pp = &b->cache; *pp; pp = &(*pp)->next) {
            if ((*pp)->nbytes != need) continue;
            struct fpk_cached_block *blk = *pp;
            *pp = blk->next;
            b->cached -= need;
            b->allocated += need;
            b->allocs++;
            if (b->allocated > b->peak) b->peak = b->allocated;
            pthread_mutex_unlock(&b->mem_mu);
            *out = blk->ptr;
            free(blk);
            return FPK_OK;
        }
    }
    if (b->cap && (b->allocated > b->cap || need > b->cap - b->allocated)) {
        uint64_t avail = b->allocated >= b->cap ? 0 : b->cap - b->allocated;
        pthread_mutex_unlock(&b->mem_mu);
        return fpk_set_oom(need, avail, what);
    }
    if (b->cap && b->allocated + b->cached + need > b->cap) evict = cache_take_all(b);
    b->allocated += need;
    b->allocs++;
    if (b->allocated > b->peak) b->peak = b->allocated;
    pthread_mutex_unlock(&b->mem_mu);
    cache_free_list(b, evict);

    fpk_status st = b->iface->buffer_alloc(b->ctx, need ? need : 1, out);
    if (st == FPK_ERR_OUT_OF_MEMORY) { /* the device may be fragmented by our cache: retry once */
        fpk_backend_trim(b);
        st = b->iface->buffer_alloc(b->ctx, need ? need : 1, out);
    }
    if (st != FPK_OK) {
        pthread_mutex_lock(&b->mem_mu);
        b->allocated -= need;
        uint64_t avail = b->cap ? (b->allocated >= b->cap ? 0 : b->cap - b->allocated) : 0;
        pthread_mutex_unlock(&b->mem_mu);
        if (st == FPK_ERR_OUT_OF_MEMORY) fpk_set_oom(need, avail, what);
        return st;
    }
    return FPK_OK;
}

static void device_free(fpk_backend_t b, void *ptr, size_t nbytes) {
    size_t size = charged_size(nbytes);
    struct fpk_cached_block *blk = NULL;
    if (size >= CACHE_MIN) blk = malloc(sizeof *blk);
    pthread_mutex_lock(&b->mem_mu);
    b->allocated -= size <= b->allocated ? size : b->allocated;
    if (blk && b->cached + size <= cache_limit(b) && (!b->cap || b->allocated + b->cached + size <= b->cap)) {
        blk->ptr = ptr;
        blk->nbytes = size;
        blk->next = b->cache;
        b->cache = blk;
        b->cached += size;
        pthread_mutex_unlock(&b->mem_mu);
        return;
    }
    pthread_mutex_unlock(&b->mem_mu);
    free(blk);
    b->iface->buffer_free(b->ctx, ptr);
}

fpk_status fpk_scratch_alloc(fpk_backend_t b, size_t nbytes, void **out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "scratch alloc: null argument");
    return device_alloc(b, nbytes, out, "scratch allocation");
}

void fpk_scratch_free(fpk_backend_t b, void *ptr, size_t nbytes) {
    if (!b || !ptr) return;
    device_free(b, ptr, nbytes);
}

/* ---- streams ------------------------------------------------------------------------------ */

fpk_stream_t fpk_backend_get_default_stream(fpk_backend_t b) { return b ? &b->default_stream : NULL; }

fpk_status fpk_stream_new(fpk_backend_t b, fpk_stream_t *out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "stream new: null argument");
    struct fpk_stream *s = calloc(1, sizeof *s);
    if (!s) return fpk_set_oom(sizeof *s, 0, "host allocation of stream");
    s->backend = b;
    if (b->iface->stream_new) {
        fpk_status st = b->iface->stream_new(b->ctx, &s->ctx);
        if (st != FPK_OK) {
            free(s);
            return st;
        }
    }
    atomic_fetch_add(&b->live_streams, 1);
    *out = s;
    return FPK_OK;
}

fpk_status fpk_stream_free(fpk_stream_t s) {
    if (!s || s->is_default) return FPK_OK;
    fpk_backend_t b = s->backend;
    if (b->iface->stream_free) b->iface->stream_free(b->ctx, s->ctx);
    atomic_fetch_sub(&b->live_streams, 1);
    free(s);
    return FPK_OK;
}

fpk_status fpk_stream_synchronize(fpk_stream_t s) {
    if (!s) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "stream synchronize: null stream");
    fpk_backend_t b = s->backend;
    if (b->iface->stream_synchronize) return b->iface->stream_synchronize(b->ctx, s->ctx);
    return FPK_OK;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static fpk_status check_shape(int ndim, const int64_t *shape, int64_t *numel, const char *what) {
    if (ndim < 0 || ndim > FPK_MAX_DIMS)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: %d dims (at most %d)", what, ndim,
                             FPK_MAX_DIMS);
    if (ndim > 0 && !shape) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: null shape", what);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: negative dim %d (%lld)", what, i,
                                 (long long)shape[i]);
        if (shape[i] != 0 && n > INT64_MAX / 16 / shape[i])
            return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: shape too large", what);
        n *= shape[i];
    }
    *numel = n;
    return FPK_OK;
}

fpk_status fpk_tensor_fill(fpk_stream_t s, fpk_tensor_t t, double value);

fpk_status fpk_tensor_new(fpk_backend_t b, fpk_dtype dtype, int ndim, const int64_t *shape,
                          fpk_tensor_t *out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor new: null argument");
    *out = NULL;
    size_t es = fpk_dtype_size(dtype);
    if (!es) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor new: unknown dtype %d", (int)dtype);
    int64_t numel;
    fpk_status st = check_shape(ndim, shape, &numel, "tensor new");
    if (st != FPK_OK) return st;
    struct fpk_tensor *t = calloc(1, sizeof *t);
    struct fpk_buffer *buf = calloc(1, sizeof *buf);
    if (!t || !buf) {
        free(t);
        free(buf);
        return fpk_set_oom(sizeof *t + sizeof *buf, 0, "host allocation of tensor handle");
    }
    size_t nbytes = (size_t)numel * es;
    st = device_alloc(b, nbytes, &buf->data, "tensor allocation");
    if (st != FPK_OK) {
        free(t);
        free(buf);
        return st;
    }
    buf->backend = b;
    buf->nbytes = nbytes;
    atomic_init(&buf->refs, 1);
    t->buf = buf;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
    atomic_fetch_add(&b->live_tensors, 1);
    if (b->config.flags & FPK_BACKEND_FLAG_POISON) {
        st = fpk_tensor_fill(&b->default_stream, t, NAN);
        if (st != FPK_OK) {
            fpk_tensor_free(t);
            return st;
        }
    }
    *out = t;
    return FPK_OK;
}

fpk_status fpk_tensor_reshape(fpk_tensor_t src, int ndim, const int64_t *shape, fpk_tensor_t *out) {
    if (!src || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor reshape: null argument");
    *out = NULL;
    int64_t numel;
    fpk_status st = check_shape(ndim, shape, &numel, "tensor reshape");
    if (st != FPK_OK) return st;
    if (numel != src->numel) {
        char a[128];
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT,
                             "tensor reshape: %lld elements into %s (%lld elements)",
                             (long long)numel, shape_str(src, a, sizeof a), (long long)src->numel);
    }
    struct fpk_tensor *t = calloc(1, sizeof *t);
    if (!t) return fpk_set_oom(sizeof *t, 0, "host allocation of tensor handle");
    *t = *src;
    t->ndim = ndim;
    for (int i = 0; i < FPK_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 0;
    atomic_fetch_add(&src->buf->refs, 1);
    atomic_fetch_add(&src->buf->backend->live_tensors, 1);
    *out = t;
    return FPK_OK;
}

void fpk_tensor_free(fpk_tensor_t t) {
    if (!t) return;
    struct fpk_buffer *buf = t->buf;
    fpk_backend_t b = buf->backend;
    if (atomic_fetch_sub(&buf->refs, 1) == 1) {
        device_free(b, buf->data, buf->nbytes);
        free(buf);
    }
    atomic_fetch_sub(&b->live_tensors, 1);
    free(t);
}

fpk_dtype fpk_tensor_dtype(fpk_tensor_t t) { return t ? t->dtype : FPK_F32; }
int fpk_tensor_ndim(fpk_tensor_t t) { return t ? t->ndim : 0; }
int64_t fpk_tensor_dim(fpk_tensor_t t, int i) { return t && i >= 0 && i < t->ndim ? t->shape[i] : 0; }
int64_t fpk_tensor_numel(fpk_tensor_t t) { return t ? t->numel : 0; }
size_t fpk_tensor_nbytes(fpk_tensor_t t) { return t ? (size_t)t->numel * fpk_dtype_size(t->dtype) : 0; }
fpk_backend_t fpk_tensor_backend(fpk_tensor_t t) { return t ? t->buf->backend : NULL; }
void *fpk_tensor_host_data(fpk_tensor_t t) {
    return t && t->buf->backend->is_host ? fpk_tensor_data(t) : NULL;
}

/* ---- events ----------------------------------------------------------------------------- */

fpk_status fpk_event_new(fpk_backend_t b, fpk_event_t *out) {
    if (!b || !out) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "event new: null argument");
    struct fpk_event *e = calloc(1, sizeof *e);
    if (!e) return fpk_set_oom(sizeof *e, 0, "host allocation of event");
    e->backend = b;
    if (b->iface->event_new) {
        fpk_status st = b->iface->event_new(b->ctx, &e->ctx);
        if (st != FPK_OK) {
            free(e);
            return st;
        }
    }
    *out = e;
    return FPK_OK;
}

fpk_status fpk_event_free(fpk_event_t e) {
    if (!e) return FPK_OK;
    fpk_backend_t b = e->backend;
    if (e->ctx && b->iface->event_free) b->iface->event_free(b->ctx, e->ctx);
    free(e);
    return FPK_OK;
}

fpk_status fpk_event_record(fpk_event_t e, fpk_stream_t s) {
    if (!e || !s) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "event record: null argument");
    if (e->backend != s->backend)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "event record: event and stream on different backends");
    fpk_backend_t b = e->backend;
    if (!e->ctx || !b->iface->event_record) return FPK_OK; /* synchronous streams */
    return b->iface->event_record(b->ctx, e->ctx, s->ctx);
}

fpk_status fpk_stream_wait_event(fpk_stream_t s, fpk_event_t e) {
    if (!e || !s) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "stream wait event: null argument");
    if (e->backend != s->backend)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "stream wait event: event and stream on different backends");
    fpk_backend_t b = e->backend;
    if (!e->ctx || !b->iface->stream_wait_event) return FPK_OK;
    return b->iface->stream_wait_event(b->ctx, s->ctx, e->ctx);
}

fpk_status fpk_event_synchronize(fpk_event_t e) {
    if (!e) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "event synchronize: null event");
    fpk_backend_t b = e->backend;
    if (!e->ctx || !b->iface->event_synchronize) return FPK_OK;
    return b->iface->event_synchronize(b->ctx, e->ctx);
}

static fpk_status check_stream(fpk_stream_t s, fpk_tensor_t t, const char *what) {
    if (!s) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: null stream", what);
    if (!t) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
    if (t->buf->backend != s->backend)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "%s: tensor and stream on different backends",
                             what);
    return FPK_OK;
}

static void host_convert(fpk_backend_t b, void *dst, fpk_dtype ddt, const void *src, fpk_dtype sdt,
                         size_t n) {
    if (b->iface->host_convert && ddt != sdt)
        b->iface->host_convert(b->ctx, dst, ddt, src, sdt, n);
    else
        fpk_convert(dst, ddt, src, sdt, n);
}

/* Host staging for conversions on a device backend, in pieces of at most this many bytes. */
#define STAGE_BYTES ((size_t)16 << 20)

fpk_status fpk_tensor_upload(fpk_stream_t s, fpk_tensor_t dst, fpk_dtype sdt, const void *src,
                             size_t nbytes) {
    fpk_status st = check_stream(s, dst, "tensor upload");
    if (st != FPK_OK) return st;
    size_t ses = fpk_dtype_size(sdt);
    if (!ses) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor upload: unknown dtype %d", (int)sdt);
    if (nbytes != (size_t)dst->numel * ses)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT,
                             "tensor upload: %zu bytes of %s for %lld elements (want %zu)", nbytes,
                             dtype_name(sdt), (long long)dst->numel, (size_t)dst->numel * ses);
    if (nbytes && !src) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor upload: null source");
    if (dtype_is_float(sdt) != dtype_is_float(dst->dtype) && !(sdt == FPK_U8 && dst->dtype == FPK_I32))
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor upload: %s data into a %s tensor",
                             dtype_name(sdt), dtype_name(dst->dtype));
    fpk_backend_t b = s->backend;
    if (sdt == dst->dtype) return b->iface->copy_h2d(b->ctx, s->ctx, fpk_tensor_data(dst), src, nbytes);
    size_t des = fpk_dtype_size(dst->dtype);
    if (b->is_host) {
        host_convert(b, fpk_tensor_data(dst), dst->dtype, src, sdt, (size_t)dst->numel);
        return FPK_OK;
    }
    size_t per = STAGE_BYTES / des;
    void *stage = malloc(per * des);
    if (!stage) return fpk_set_oom(per * des, 0, "host staging buffer");
    for (size_t i = 0; i < (size_t)dst->numel; i += per) {
        size_t n = (size_t)dst->numel - i < per ? (size_t)dst->numel - i : per;
        host_convert(b, stage, dst->dtype, (const char *)src + i * ses, sdt, n);
        st = b->iface->copy_h2d(b->ctx, s->ctx, (char *)fpk_tensor_data(dst) + i * des, stage, n * des);
        if (st == FPK_OK && b->iface->stream_synchronize) st = b->iface->stream_synchronize(b->ctx, s->ctx);
        if (st != FPK_OK) break;
    }
    free(stage);
    return st;
}

fpk_status fpk_tensor_upload_async(fpk_stream_t s, fpk_tensor_t dst, const void *src, size_t nbytes) {
    fpk_status st = check_stream(s, dst, "tensor upload async");
    if (st != FPK_OK) return st;
    size_t want = (size_t)dst->numel * fpk_dtype_size(dst->dtype);
    if (nbytes != want)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor upload async: %zu bytes for %lld elements of %s (want %zu)",
                             nbytes, (long long)dst->numel, dtype_name(dst->dtype), want);
    if (nbytes && !src) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor upload async: null source");
    fpk_backend_t b = s->backend;
    if (b->iface->copy_h2d_async) return b->iface->copy_h2d_async(b->ctx, s->ctx, fpk_tensor_data(dst), src, nbytes);
    return b->iface->copy_h2d(b->ctx, s->ctx, fpk_tensor_data(dst), src, nbytes);
}

fpk_status fpk_tensor_download(fpk_stream_t s, fpk_tensor_t src, fpk_dtype ddt, void *dst,
                               size_t nbytes) {
    fpk_status st = check_stream(s, src, "tensor download");
    if (st != FPK_OK) return st;
    size_t des = fpk_dtype_size(ddt);
    if (!des) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor download: unknown dtype %d", (int)ddt);
    if (nbytes != (size_t)src->numel * des)
        return fpk_set_error(FPK_ERR_INVALID_ARGUMENT,
                             "tensor download: %zu bytes of %s for %lld elements (want %zu)", nbytes,
                             dtype_name(ddt), (long long)src->numel, (size_t)src->numel * des);
    if (nbytes && !dst) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, "tensor download: null destination");
    fpk_backend_t b = s->backend;
    if (ddt == src->dtype) {
        st = b->iface->copy_d2h(b->ctx, s->ctx, dst, fpk_tensor_data(src), nbytes);
        if (st == FPK_OK && b->iface->stream_synchronize) st = b->iface->stream_synchronize(b->ctx, s->ctx);
        return st;
    }
    size_t ses = fpk_dtype_size(src->dtype);
    if (b->is_host) {
        host_convert(b, dst, ddt, fpk_tensor_data(src), src->dtype, (size_t)src->numel);
        return FPK_OK;
    }
    size_t per = STAGE_BYTES / ses;
    void *stage = malloc(per * ses);
    if (!stage) return fpk_set_oom(per * ses, 0, "host staging buffer");
    for (size_t i = 0; i < (size_t)src->numel; i += per) {
        size_t n = (size_t)src->numel - i < per ? (size_t)src->numel - i : per;
        st = b->iface->copy_d2h(b->ctx, s->ctx, stage, (const char *)fpk_tensor_data(src) + i * ses, n * ses);
        if (st == FPK_OK && b->iface->stream_synchronize) st = b->iface->stream_synchronize(b->ctx, s->ctx);
        if (st != FPK_OK) break;
        host_convert(b, (char *)dst + i * des, ddt, stage, src->dtype, n);
    }
    free(stage);
    return st;
}

fpk_status fpk_tensor_fill(fpk_stream_t s, fpk_tensor_t t, double value) {
    fpk_status st = check_stream(s, t, "tensor fill");
    if (st != FPK_OK) return st;
    fpk_backend_t b = s->backend;
    if (!b->iface->fill) return fpk_set_error(FPK_ERR_UNSUPPORTED, "tensor fill: backend %s lacks it", b->iface->name);
    return b->iface->fill(b->ctx, s->ctx, t, value);
}

/* ---- argument checks -------------------------------------------------------------------- */

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) return fpk_set_error(FPK_ERR_INVALID_ARGUMENT, __VA_ARGS__);               \
    } while (0)

/* Checks the stream and that every non-NULL tensor of the list is on the stream's backend.
 * required says which must be non-NULL (bit i for tensor i). */
static fpk_status check_args(const char *op, fpk_stream_t s, int n, const fpk_tensor_t *ts,
                             unsigned required) {
    CHECK(s, "%s: null stream", op);
    for (int i = 0; i < n; i++) {
        if (!ts[i]) {
            CHECK(!(required & (1u << i)), "%s: tensor argument %d is null", op, i);
            continue;
        }
        CHECK(ts[i]->buf->backend == s->backend, "%s: tensor argument %d is on backend %s, stream on %s",
              op, i, ts[i]->buf->backend->iface->name, s->backend->iface->name);
    }
    return FPK_OK;
}

static int same_shape(fpk_tensor_t a, fpk_tensor_t b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

static fpk_status check_same_shape(const char *op, fpk_tensor_t a, const char *an, fpk_tensor_t b,
                                   const char *bn) {
    char s1[160], s2[160];
    CHECK(same_shape(a, b), "%s: %s %s and %s %s differ in shape", op, an,
          shape_str(a, s1, sizeof s1), bn, shape_str(b, s2, sizeof s2));
    return FPK_OK;
}

static fpk_status check_float(const char *op, fpk_tensor_t t, const char *name) {
    CHECK(!t || dtype_is_float(t->dtype), "%s: %s is %s, want a float dtype", op, name,
          dtype_name(t->dtype));
    return FPK_OK;
}

static fpk_status check_vec(const char *op, fpk_tensor_t t, const char *name, int64_t n) {
    CHECK(!t || t->numel == n, "%s: %s has %lld elements, want %lld", op, name,
          (long long)(t ? t->numel : 0), (long long)n);
    return FPK_OK;
}

#define TRY(expr)                                                                               \
    do {                                                                                        \
        fpk_status st_ = (expr);                                                                \
        if (st_ != FPK_OK) return st_;                                                          \
    } while (0)

#define SLOT(s, slot, op)                                                                       \
    do {                                                                                        \
        if (!(s)->backend->iface->slot)                                                         \
            return fpk_set_error(FPK_ERR_UNSUPPORTED, "%s: backend %s lacks it", op,            \
                                 (s)->backend->iface->name);                                    \
    } while (0)

#define BCTX(s) (s)->backend->ctx, (s)->ctx

/* Broadcast shape of a and b (NumPy rules) into out_shape; returns 0 if incompatible. */
static int broadcast_shape(fpk_tensor_t a, fpk_tensor_t b, int *ndim, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return 0;
        shape[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return 1;
}

static fpk_status check_broadcast(const char *op, fpk_tensor_t a, fpk_tensor_t b, fpk_tensor_t out) {
    int n;
    int64_t shape[FPK_MAX_DIMS];
    char s1[160], s2[160], s3[160];
    CHECK(broadcast_shape(a, b, &n, shape), "%s: shapes %s and %s do not broadcast", op,
          shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2));
    int ok = n == out->ndim;
    for (int i = 0; ok && i < n; i++) ok = shape[i] == out->shape[i];
    CHECK(ok, "%s: out %s is not the broadcast shape of %s and %s", op, shape_str(out, s3, sizeof s3),
          shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2));
    return FPK_OK;
}

/* ---- ops ---------------------------------------------------------------------------------- */

fpk_status fpk_op_gemm(fpk_stream_t s, const fpk_gemm_params *p, fpk_tensor_t a, fpk_tensor_t b,
                       fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "gemm";
    fpk_tensor_t ts[] = {a, b, bias, out};
    TRY(check_args(op, s, 4, ts, 0xb));
    CHECK(p, "%s: null params", op);
    CHECK(p->epilogue >= 0 && p->epilogue < FPK_GEMM_EPILOGUE_COUNT, "%s: unknown epilogue %d", op,
          (int)p->epilogue);
    CHECK(a->ndim >= 2 && b->ndim >= 2 && out->ndim >= 2, "%s: operands need at least 2 dims", op);
    int64_t M = p->trans_a ? a->shape[a->ndim - 1] : a->shape[a->ndim - 2];
    int64_t K = p->trans_a ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t Kb = p->trans_b ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2];
    int64_t N = p->trans_b ? b->shape[b->ndim - 2] : b->shape[b->ndim - 1];
    char s1[160], s2[160], s3[160];
    CHECK(K == Kb, "%s: inner dims differ: a %s, b %s (trans_a %d, trans_b %d)", op,
          shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2), p->trans_a, p->trans_b);
    int64_t batch = 1, bbatch = 1;
    for (int i = 0; i < a->ndim - 2; i++) batch *= a->shape[i];
    for (int i = 0; i < b->ndim - 2; i++) bbatch *= b->shape[i];
    CHECK(out->ndim == a->ndim && out->shape[out->ndim - 2] == M && out->shape[out->ndim - 1] == N,
          "%s: out %s, want a's batch dims then [%lld, %lld]", op, shape_str(out, s3, sizeof s3),
          (long long)M, (long long)N);
    for (int i = 0; i < a->ndim - 2; i++)
        CHECK(out->shape[i] == a->shape[i], "%s: out %s and a %s differ in batch dims", op,
              shape_str(out, s3, sizeof s3), shape_str(a, s1, sizeof s1));
    CHECK(b->ndim == 2 || bbatch == 1 || bbatch == batch,
          "%s: b %s has batch %lld, a %s has batch %lld", op, shape_str(b, s2, sizeof s2),
          (long long)bbatch, shape_str(a, s1, sizeof s1), (long long)batch);
    TRY(check_vec(op, bias, "bias", N));
    TRY(check_float(op, a, "a"));
    TRY(check_float(op, b, "b"));
    TRY(check_float(op, out, "out"));
    CHECK(!fpk_dtype_is_fp8(a->dtype) && !fpk_dtype_is_fp8(b->dtype) && !fpk_dtype_is_fp8(out->dtype),
          "%s: an 8-bit float operand (a %s, b %s, out %s): 8-bit weights go through fpk_op_gemm_q", op,
          dtype_name(a->dtype), dtype_name(b->dtype), dtype_name(out->dtype));
    SLOT(s, gemm, op);
    return s->backend->iface->gemm(BCTX(s), p, a, b, bias, out);
}

fpk_status fpk_op_gemm_q(fpk_stream_t s, const fpk_gemm_q_params *p, fpk_tensor_t a, fpk_tensor_t w,
                         fpk_tensor_t w_scale, fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "gemm q";
    fpk_tensor_t ts[] = {a, w, w_scale, bias, out};
    TRY(check_args(op, s, 5, ts, 0x13));
    CHECK(p, "%s: null params", op);
    CHECK(p->epilogue >= 0 && p->epilogue < FPK_GEMM_EPILOGUE_COUNT, "%s: unknown epilogue %d", op,
          (int)p->epilogue);
    CHECK(p->act_quant >= 0 && p->act_quant < FPK_ACT_QUANT_COUNT, "%s: unknown act_quant %d", op,
          (int)p->act_quant);
    char s1[160], s2[160], s3[160];
    CHECK(fpk_dtype_is_fp8(w->dtype) && w->ndim == 2, "%s: w %s is %s, want an 8-bit float [N, K]", op,
          shape_str(w, s2, sizeof s2), dtype_name(w->dtype));
    CHECK(a->ndim >= 2 && out->ndim == a->ndim, "%s: a %s and out %s need the same rank, at least 2", op,
          shape_str(a, s1, sizeof s1), shape_str(out, s3, sizeof s3));
    int64_t N = w->shape[0], K = w->shape[1];
    CHECK(a->shape[a->ndim - 1] == K, "%s: a %s has inner dim %lld, w %s has %lld", op, shape_str(a, s1, sizeof s1),
          (long long)a->shape[a->ndim - 1], shape_str(w, s2, sizeof s2), (long long)K);
    int ok = out->shape[out->ndim - 1] == N;
    for (int i = 0; ok && i < a->ndim - 1; i++) ok = out->shape[i] == a->shape[i];
    CHECK(ok, "%s: out %s, want a's %s with the last dim %lld", op, shape_str(out, s3, sizeof s3),
          shape_str(a, s1, sizeof s1), (long long)N);
    if (w_scale) {
        CHECK(w_scale->dtype == FPK_F32 && w_scale->ndim == 2 &&
                  (w_scale->shape[0] == 1 || w_scale->shape[0] == N) && w_scale->shape[1] >= 1 &&
                  K % w_scale->shape[1] == 0,
              "%s: w_scale %s (%s), want f32 [1 or %lld, a divisor of %lld]", op, shape_str(w_scale, s1, sizeof s1),
              dtype_name(w_scale->dtype), (long long)N, (long long)K);
    }
    TRY(check_vec(op, bias, "bias", N));
    TRY(check_float(op, a, "a"));
    TRY(check_float(op, bias, "bias"));
    CHECK(!fpk_dtype_is_fp8(a->dtype) && out->dtype == a->dtype && (!bias || !fpk_dtype_is_fp8(bias->dtype)),
          "%s: a %s, bias %s, out %s: want a 16- or 32-bit a and out of a's dtype", op, dtype_name(a->dtype),
          bias ? dtype_name(bias->dtype) : "none", dtype_name(out->dtype));
    SLOT(s, gemm_q, op);
    return s->backend->iface->gemm_q(BCTX(s), p, a, w, w_scale, bias, out);
}

/* Fills o with the conv output dims (T, H, W) or fails. */
static fpk_status conv_out_dims(const char *op, const fpk_conv3d_params *p, fpk_tensor_t x,
                                fpk_tensor_t w, int64_t *o) {
    for (int i = 0; i < 3; i++) {
        int64_t st = p->stride[i] ? p->stride[i] : 1;
        CHECK(st > 0 && p->padding[i] >= 0, "%s: stride %lld and padding %lld of dim %d", op,
              (long long)st, (long long)p->padding[i], i);
        CHECK(p->upsample[i] >= 0 && p->upsample[i] <= 1024 && p->replicate_before[i] >= 0 &&
                  p->replicate_before[i] <= INT32_MAX && p->replicate_after[i] >= 0 && p->replicate_after[i] <= INT32_MAX,
              "%s: upsample %lld and replicate padding %lld, %lld of dim %d", op, (long long)p->upsample[i],
              (long long)p->replicate_before[i], (long long)p->replicate_after[i], i);
        CHECK(x->shape[2 + i] > 0 || (p->replicate_before[i] == 0 && p->replicate_after[i] == 0),
              "%s: replicate padding of an empty dim %d", op, i);
        int64_t in = fpk_conv_view_dim(p, i, x->shape[2 + i]);
        int64_t span = in + 2 * p->padding[i] - w->shape[2 + i];
        CHECK(span >= 0, "%s: kernel %lld larger than padded input %lld in dim %d", op,
              (long long)w->shape[2 + i], (long long)(in + 2 * p->padding[i]), i);
        o[i] = span / st + 1;
    }
    return FPK_OK;
}

static fpk_status check_conv(const char *op, fpk_stream_t s, const fpk_conv3d_params *p,
                             fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    fpk_tensor_t ts[] = {x, w, bias, out};
    TRY(check_args(op, s, 4, ts, 0xb));
    CHECK(p, "%s: null params", op);
    char s1[160], s2[160], s3[160];
    CHECK(x->ndim == 5 && w->ndim == 5 && out->ndim == 5,
          "%s: x %s, w %s and out %s must have 5 dims", op, shape_str(x, s1, sizeof s1),
          shape_str(w, s2, sizeof s2), shape_str(out, s3, sizeof s3));
    int64_t g = p->groups ? p->groups : 1;
    CHECK(g > 0 && x->shape[1] % g == 0 && w->shape[0] % g == 0,
          "%s: groups %lld do not divide in channels %lld and out channels %lld", op, (long long)g,
          (long long)x->shape[1], (long long)w->shape[0]);
    CHECK(w->shape[1] * g == x->shape[1], "%s: w %s wants %lld in channels, x %s has %lld", op,
          shape_str(w, s2, sizeof s2), (long long)(w->shape[1] * g), shape_str(x, s1, sizeof s1),
          (long long)x->shape[1]);
    int64_t o[3];
    TRY(conv_out_dims(op, p, x, w, o));
    CHECK(out->shape[0] == x->shape[0] && out->shape[1] == w->shape[0] && out->shape[2] == o[0] &&
              out->shape[3] == o[1] && out->shape[4] == o[2],
          "%s: out %s, want [%lld, %lld, %lld, %lld, %lld]", op, shape_str(out, s3, sizeof s3),
          (long long)x->shape[0], (long long)w->shape[0], (long long)o[0], (long long)o[1],
          (long long)o[2]);
    TRY(check_vec(op, bias, "bias", w->shape[0]));
    TRY(check_float(op, x, "x"));
    TRY(check_float(op, w, "w"));
    TRY(check_float(op, out, "out"));
    return FPK_OK;
}

/* The host (cpu) backend b's host bounces run on, made on first use with b's thread count. */
static fpk_status host_backend(fpk_backend_t b, fpk_backend_t *out) {
    pthread_mutex_lock(&b->host_mu);
    if (!b->host) {
        fpk_backend_config cfg = {0};
        cfg.threads = b->config.threads;
        fpk_status st = fpk_backend_new_cpu(&cfg, &b->host);
        if (st != FPK_OK) {
            pthread_mutex_unlock(&b->host_mu);
            return st;
        }
    }
    *out = b->host;
    pthread_mutex_unlock(&b->host_mu);
    return FPK_OK;
}

/* Serves the CPU tier for a backend whose table does not: download the operands into a host
 * (cpu) backend, convolve there, upload the result. */
static fpk_status conv3d_host_bounce(fpk_stream_t s, const fpk_conv3d_params *p, fpk_tensor_t x,
                                     fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    fpk_backend_t h;
    TRY(host_backend(s->backend, &h));
    fpk_stream_t hs = &h->default_stream;
    fpk_tensor_t src[3] = {x, w, bias}, dst[3] = {NULL, NULL, NULL}, hout = NULL;
    fpk_status st = FPK_OK;
    void *tmp = NULL;
    for (int i = 0; i < 3 && st == FPK_OK; i++) {
        if (!src[i]) continue;
        st = fpk_tensor_new(h, FPK_F32, src[i]->ndim, src[i]->shape, &dst[i]);
        if (st != FPK_OK) break;
        st = fpk_tensor_download(s, src[i], FPK_F32, fpk_tensor_data(dst[i]), fpk_tensor_nbytes(dst[i]));
    }
    if (st == FPK_OK) st = fpk_tensor_new(h, FPK_F32, out->ndim, out->shape, &hout);
    if (st == FPK_OK) st = fpk_op_conv3d(hs, FPK_CONV_TIER_CPU, p, dst[0], dst[1], dst[2], hout);
    if (st == FPK_OK)
        st = fpk_tensor_upload(s, out, FPK_F32, fpk_tensor_data(hout), fpk_tensor_nbytes(hout));
    for (int i = 0; i < 3; i++) fpk_tensor_free(dst[i]);
    fpk_tensor_free(hout);
    free(tmp);
    return st;
}

/* Serves a conv whose backend cannot read its input's view (upsampling, replicate padding)
 * in place for this call: the view made as a tensor of the backend (counted against its cap),
 * convolved, and freed right after the conv is queued — safe as the callers' own temporaries
 * are: a backend's ops run in the order of its one stream, and a freed block is reused only by
 * work queued after it. */
static fpk_status conv3d_view_made(fpk_stream_t s, fpk_conv_tier tier, const fpk_conv3d_params *p,
                                   fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    int64_t shape[5] = {x->shape[0], x->shape[1], 0, 0, 0}, scale[3], before[3], after[3];
    int64_t b5[5] = {0}, a5[5] = {0}; /* the pads over all five dims, for fpk_op_pad */
    int up = 0;
    for (int i = 0; i < 3; i++) {
        shape[2 + i] = fpk_conv_view_dim(p, i, x->shape[2 + i]);
        scale[i] = fpk_conv_view_scale(p, i);
        b5[2 + i] = before[i] = p->replicate_before[i];
        a5[2 + i] = after[i] = p->replicate_after[i];
        up |= scale[i] > 1;
    }
    fpk_tensor_t v = NULL;
    TRY(fpk_tensor_new(s->backend, x->dtype, 5, shape, &v));
    /* every backend built for this API version has both slots (cpu, cuda, hip) */
    fpk_status st = up ? fpk_op_upsample_pad(s, scale, before, after, x, v)
                       : fpk_op_pad(s, FPK_PAD_REPLICATE, b5, a5, x, v);
    fpk_conv3d_params plain = *p;
    for (int i = 0; i < 3; i++) plain.upsample[i] = plain.replicate_before[i] = plain.replicate_after[i] = 0;
    if (st == FPK_OK) st = fpk_op_conv3d(s, tier, &plain, v, w, bias, out);
    fpk_tensor_free(v);
    return st;
}

fpk_status fpk_op_conv3d(fpk_stream_t s, fpk_conv_tier tier, const fpk_conv3d_params *p,
                         fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "conv3d";
    TRY(check_conv(op, s, p, x, w, bias, out));
    CHECK(tier >= 0 && tier < FPK_CONV_TIER_COUNT, "%s: unknown tier %d", op, (int)tier);
    fpk_status st = FPK_ERR_UNAVAILABLE;
    if (s->backend->iface->conv3d)
        st = s->backend->iface->conv3d(BCTX(s), tier, p, x, w, bias, out);
    else
        fpk_set_error(st, "%s: backend %s has no conv", op, s->backend->iface->name);
    if (st == FPK_ERR_UNSUPPORTED && fpk_conv_has_view(p)) {
        fpk_clear_error();
        return conv3d_view_made(s, tier, p, x, w, bias, out);
    }
    if (st == FPK_ERR_UNAVAILABLE && tier == FPK_CONV_TIER_CPU) {
        fpk_clear_error();
        return conv3d_host_bounce(s, p, x, w, bias, out);
    }
    return st;
}

/* the shapes a group norm takes: x [N, C, ...] with groups dividing C, out like x, weight and
 * bias (optional) of C elements */
static fpk_status check_group_norm(const char *op, int64_t groups, fpk_tensor_t x, fpk_tensor_t weight,
                                   fpk_tensor_t bias, fpk_tensor_t out) {
    CHECK(x->ndim >= 2, "%s: x needs at least 2 dims [N, C, ...]", op);
    CHECK(groups > 0 && x->shape[1] % groups == 0, "%s: %lld groups do not divide %lld channels", op,
          (long long)groups, (long long)x->shape[1]);
    TRY(check_same_shape(op, x, "x", out, "out"));
    TRY(check_vec(op, weight, "weight", x->shape[1]));
    TRY(check_vec(op, bias, "bias", x->shape[1]));
    return FPK_OK;
}

fpk_status fpk_op_group_norm(fpk_stream_t s, int64_t groups, float eps, fpk_tensor_t x,
                             fpk_tensor_t weight, fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "group norm";
    fpk_tensor_t ts[] = {x, weight, bias, out};
    TRY(check_args(op, s, 4, ts, 0x9));
    TRY(check_group_norm(op, groups, x, weight, bias, out));
    SLOT(s, group_norm, op);
    return s->backend->iface->group_norm(BCTX(s), groups, eps, x, weight, bias, out);
}

fpk_status fpk_op_group_norm_act(fpk_stream_t s, int64_t groups, float eps, fpk_norm_act act,
                                 fpk_tensor_t x, fpk_tensor_t weight, fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "group norm act";
    fpk_tensor_t ts[] = {x, weight, bias, out};
    TRY(check_args(op, s, 4, ts, 0x9));
    CHECK(act == FPK_NORM_ACT_NONE || act == FPK_NORM_ACT_SILU, "%s: unknown activation %d", op, (int)act);
    TRY(check_float(op, x, "x"));
    TRY(check_float(op, out, "out"));
    TRY(check_group_norm(op, groups, x, weight, bias, out));
    if (s->backend->iface->group_norm_act)
        return s->backend->iface->group_norm_act(BCTX(s), groups, eps, act, x, weight, bias, out);
    SLOT(s, group_norm, op);
    TRY(s->backend->iface->group_norm(BCTX(s), groups, eps, x, weight, bias, out));
    if (act == FPK_NORM_ACT_NONE) return FPK_OK;
    SLOT(s, unary, op);
    return s->backend->iface->unary(BCTX(s), FPK_UNARY_SILU, out, out);
}

fpk_status fpk_op_layer_norm(fpk_stream_t s, float eps, fpk_tensor_t x, fpk_tensor_t weight,
                             fpk_tensor_t bias, fpk_tensor_t out) {
    const char *op = "layer norm";
    fpk_tensor_t ts[] = {x, weight, bias, out};
    TRY(check_args(op, s, 4, ts, 0x9));
    CHECK(x->ndim >= 1, "%s: x needs at least 1 dim", op);
    TRY(check_same_shape(op, x, "x", out, "out"));
    TRY(check_vec(op, weight, "weight", x->shape[x->ndim - 1]));
    TRY(check_vec(op, bias, "bias", x->shape[x->ndim - 1]));
    SLOT(s, layer_norm, op);
    return s->backend->iface->layer_norm(BCTX(s), eps, x, weight, bias, out);
}

fpk_status fpk_op_rms_norm(fpk_stream_t s, float eps, fpk_tensor_t x, fpk_tensor_t weight,
                           fpk_tensor_t out) {
    const char *op = "rms norm";
    fpk_tensor_t ts[] = {x, weight, out};
    TRY(check_args(op, s, 3, ts, 0x5));
    CHECK(x->ndim >= 1, "%s: x needs at least 1 dim", op);
    TRY(check_same_shape(op, x, "x", out, "out"));
    TRY(check_vec(op, weight, "weight", x->shape[x->ndim - 1]));
    SLOT(s, rms_norm, op);
    return s->backend->iface->rms_norm(BCTX(s), eps, x, weight, out);
}

fpk_status fpk_op_unary(fpk_stream_t s, fpk_unary_op u, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "unary";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(u >= 0 && u < FPK_UNARY_COUNT, "%s: unknown op %d", op, (int)u);
    TRY(check_same_shape(op, x, "x", out, "out"));
    SLOT(s, unary, op);
    return s->backend->iface->unary(BCTX(s), u, x, out);
}

fpk_status fpk_op_affine(fpk_stream_t s, float scale, float shift, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "affine";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    TRY(check_same_shape(op, x, "x", out, "out"));
    SLOT(s, affine, op);
    return s->backend->iface->affine(BCTX(s), scale, shift, x, out);
}

fpk_status fpk_op_binary(fpk_stream_t s, fpk_binary_op bop, fpk_tensor_t a, fpk_tensor_t b,
                         fpk_tensor_t out) {
    const char *op = "binary";
    fpk_tensor_t ts[] = {a, b, out};
    TRY(check_args(op, s, 3, ts, 0x7));
    CHECK(bop >= 0 && bop < FPK_BINARY_COUNT, "%s: unknown op %d", op, (int)bop);
    TRY(check_broadcast(op, a, b, out));
    SLOT(s, binary, op);
    return s->backend->iface->binary(BCTX(s), bop, a, b, out);
}

fpk_status fpk_op_ternary(fpk_stream_t s, fpk_ternary_op top, fpk_tensor_t a, fpk_tensor_t b, fpk_tensor_t c,
                          fpk_tensor_t out) {
    const char *op = "ternary";
    fpk_tensor_t ts[] = {a, b, c, out};
    TRY(check_args(op, s, 4, ts, 0xf));
    CHECK(top >= 0 && top < FPK_TERNARY_COUNT, "%s: unknown op %d", op, (int)top);
    TRY(check_float(op, a, "a"));
    TRY(check_float(op, b, "b"));
    TRY(check_float(op, c, "c"));
    TRY(check_float(op, out, "out"));
    /* out is the broadcast shape of all three */
    struct fpk_tensor ab = {0}, abc = {0};
    char s1[160], s2[160], s3[160];
    CHECK(broadcast_shape(a, b, &ab.ndim, ab.shape), "%s: shapes %s and %s do not broadcast", op,
          shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2));
    CHECK(broadcast_shape(&ab, c, &abc.ndim, abc.shape), "%s: shapes %s, %s and %s do not broadcast", op,
          shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2), shape_str(c, s3, sizeof s3));
    CHECK(same_shape(&abc, out), "%s: out %s is not the broadcast shape of a %s, b %s and c", op,
          shape_str(out, s3, sizeof s3), shape_str(a, s1, sizeof s1), shape_str(b, s2, sizeof s2));
    SLOT(s, ternary, op);
    return s->backend->iface->ternary(BCTX(s), top, a, b, c, out);
}

fpk_status fpk_op_softmax(fpk_stream_t s, float scale, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "softmax";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(x->ndim >= 1, "%s: x needs at least 1 dim", op);
    TRY(check_same_shape(op, x, "x", out, "out"));
    SLOT(s, softmax, op);
    return s->backend->iface->softmax(BCTX(s), scale, x, out);
}

/* Serves the CPU attention tier for a backend whose table does not: download the operands into
 * the host (cpu) backend as f32, run its flash attention, upload the result. */
static fpk_status attention_host_bounce(fpk_stream_t s, const fpk_attention_params *p, fpk_tensor_t q,
                                        fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask,
                                        fpk_tensor_t out) {
    fpk_backend_t h;
    TRY(host_backend(s->backend, &h));
    fpk_tensor_t src[4] = {q, k, v, mask}, dst[4] = {NULL, NULL, NULL, NULL}, hout = NULL;
    fpk_status st = FPK_OK;
    for (int i = 0; i < 4 && st == FPK_OK; i++) {
        if (!src[i]) continue;
        fpk_dtype dt = i == 3 ? FPK_U8 : FPK_F32;
        st = fpk_tensor_new(h, dt, src[i]->ndim, src[i]->shape, &dst[i]);
        if (st != FPK_OK) break;
        st = fpk_tensor_download(s, src[i], dt, fpk_tensor_data(dst[i]), fpk_tensor_nbytes(dst[i]));
    }
    if (st == FPK_OK) st = fpk_tensor_new(h, FPK_F32, out->ndim, out->shape, &hout);
    fpk_attention_params hp = *p;
    hp.tier = FPK_ATTN_TIER_CPU;
    if (st == FPK_OK) st = fpk_op_attention(&h->default_stream, &hp, dst[0], dst[1], dst[2], dst[3], hout);
    if (st == FPK_OK)
        st = fpk_tensor_upload(s, out, FPK_F32, fpk_tensor_data(hout), fpk_tensor_nbytes(hout));
    for (int i = 0; i < 4; i++) fpk_tensor_free(dst[i]);
    fpk_tensor_free(hout);
    return st;
}

fpk_status fpk_op_attention(fpk_stream_t s, const fpk_attention_params *p, fpk_tensor_t q,
                            fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask, fpk_tensor_t out) {
    const char *op = "attention";
    fpk_tensor_t ts[] = {q, k, v, mask, out};
    TRY(check_args(op, s, 5, ts, 0x17));
    CHECK(p, "%s: null params", op);
    CHECK(p->layout >= 0 && p->layout < FPK_ATTN_LAYOUT_COUNT, "%s: unknown layout %d", op, (int)p->layout);
    CHECK(p->tier >= 0 && p->tier < FPK_ATTN_TIER_COUNT, "%s: unknown tier %d", op, (int)p->tier);
    char s1[160], s2[160], s3[160];
    int blhd = p->layout == FPK_ATTN_BLHD;
    const char *lay = blhd ? "[B, L, H, D]" : "[B, H, L, D]";
    CHECK(q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && out->ndim == 4,
          "%s: q, k, v and out must be %s", op, lay);
    int hd = blhd ? 2 : 1, ld = blhd ? 1 : 2; /* dims of heads and positions */
    int64_t B = q->shape[0], H = q->shape[hd], Lq = q->shape[ld], D = q->shape[3];
    int64_t Hkv = k->shape[hd], Lk = k->shape[ld], Dv = v->shape[3];
    CHECK(k->shape[0] == B && k->shape[3] == D && Hkv > 0 && H % Hkv == 0,
          "%s: k %s does not fit q %s (%s)", op, shape_str(k, s2, sizeof s2), shape_str(q, s1, sizeof s1), lay);
    CHECK(v->shape[0] == B && v->shape[hd] == Hkv && v->shape[ld] == Lk, "%s: v %s does not fit k %s (%s)",
          op, shape_str(v, s3, sizeof s3), shape_str(k, s2, sizeof s2), lay);
    int64_t want[4] = {B, blhd ? Lq : H, blhd ? H : Lq, Dv};
    CHECK(out->shape[0] == want[0] && out->shape[1] == want[1] && out->shape[2] == want[2] &&
              out->shape[3] == want[3],
          "%s: out %s, want [%lld, %lld, %lld, %lld]", op, shape_str(out, s3, sizeof s3),
          (long long)want[0], (long long)want[1], (long long)want[2], (long long)want[3]);
    if (mask) {
        CHECK(mask->dtype == FPK_U8, "%s: mask must be u8, got %s", op, dtype_name(mask->dtype));
        CHECK(mask->ndim <= 4, "%s: mask has %d dims (at most 4)", op, mask->ndim);
        int64_t full[4] = {B, H, Lq, Lk};
        for (int i = 0; i < mask->ndim; i++) {
            int64_t d = mask->shape[i], w = full[4 - mask->ndim + i];
            CHECK(d == 1 || d == w, "%s: mask %s does not broadcast to [%lld, %lld, %lld, %lld]",
                  op, shape_str(mask, s1, sizeof s1), (long long)B, (long long)H, (long long)Lq,
                  (long long)Lk);
        }
    }
    CHECK(p->query_chunk >= 0, "%s: negative query chunk", op);
    fpk_status st = FPK_ERR_UNAVAILABLE;
    if (s->backend->iface->attention)
        st = s->backend->iface->attention(BCTX(s), p, q, k, v, mask, out);
    else
        fpk_set_error(st, "%s: backend %s has no attention", op, s->backend->iface->name);
    if (st == FPK_ERR_UNAVAILABLE && p->tier == FPK_ATTN_TIER_CPU) {
        fpk_clear_error();
        return attention_host_bounce(s, p, q, k, v, mask, out);
    }
    return st;
}

/* the rope tables: cos and sin broadcast to x, each with x's full last dim */
static fpk_status check_rope_tables(const char *op, fpk_tensor_t x, fpk_tensor_t cos, fpk_tensor_t sin,
                                    fpk_tensor_t out) {
    TRY(check_broadcast(op, x, cos, out));
    TRY(check_broadcast(op, x, sin, out));
    CHECK(cos->ndim >= 1 && cos->shape[cos->ndim - 1] == x->shape[x->ndim - 1] && sin->ndim >= 1 &&
              sin->shape[sin->ndim - 1] == x->shape[x->ndim - 1],
          "%s: cos and sin must have the full last dim of x", op);
    return FPK_OK;
}

fpk_status fpk_op_rope(fpk_stream_t s, fpk_rope_mode mode, fpk_tensor_t x, fpk_tensor_t cos,
                       fpk_tensor_t sin, fpk_tensor_t out) {
    const char *op = "rope";
    CHECK(mode >= 0 && mode < FPK_ROPE_MODE_COUNT, "%s: unknown mode %d", op, (int)mode);
    fpk_tensor_t ts[] = {x, cos, sin, out};
    TRY(check_args(op, s, 4, ts, 0xf));
    CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] % 2 == 0, "%s: last dim of x must be even", op);
    TRY(check_same_shape(op, x, "x", out, "out"));
    TRY(check_rope_tables(op, x, cos, sin, out));
    SLOT(s, rope, op);
    return s->backend->iface->rope(BCTX(s), mode, x, cos, sin, out);
}

fpk_status fpk_op_rms_norm_rope(fpk_stream_t s, fpk_rope_mode mode, float eps, fpk_tensor_t x,
                                fpk_tensor_t weight, fpk_tensor_t cos, fpk_tensor_t sin,
                                fpk_tensor_t out) {
    const char *op = "rms norm rope";
    CHECK(mode >= 0 && mode < FPK_ROPE_MODE_COUNT, "%s: unknown mode %d", op, (int)mode);
    fpk_tensor_t ts[] = {x, weight, cos, sin, out};
    TRY(check_args(op, s, 5, ts, 0x1d));
    CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] % 2 == 0, "%s: last dim of x must be even", op);
    TRY(check_same_shape(op, x, "x", out, "out"));
    TRY(check_vec(op, weight, "weight", x->shape[x->ndim - 1]));
    TRY(check_rope_tables(op, x, cos, sin, out));
    SLOT(s, rms_norm_rope, op);
    return s->backend->iface->rms_norm_rope(BCTX(s), mode, eps, x, weight, cos, sin, out);
}

fpk_status fpk_op_concat(fpk_stream_t s, int dim, int n, const fpk_tensor_t *in, fpk_tensor_t out) {
    const char *op = "concat";
    fpk_tensor_t ts[] = {out};
    TRY(check_args(op, s, 1, ts, 0x1));
    CHECK(n >= 1 && in, "%s: no inputs", op);
    CHECK(dim >= 0 && dim < out->ndim, "%s: dim %d of %d", op, dim, out->ndim);
    int64_t total = 0;
    char s1[160], s2[160];
    for (int i = 0; i < n; i++) {
        TRY(check_args(op, s, 1, &in[i], 0x1));
        CHECK(in[i]->ndim == out->ndim && in[i]->dtype == out->dtype,
              "%s: input %d %s (%s) does not match out %s (%s)", op, i,
              shape_str(in[i], s1, sizeof s1), dtype_name(in[i]->dtype),
              shape_str(out, s2, sizeof s2), dtype_name(out->dtype));
        for (int d = 0; d < out->ndim; d++)
            CHECK(d == dim || in[i]->shape[d] == out->shape[d],
                  "%s: input %d %s differs from out %s outside dim %d", op, i,
                  shape_str(in[i], s1, sizeof s1), shape_str(out, s2, sizeof s2), dim);
        total += in[i]->shape[dim];
    }
    CHECK(total == out->shape[dim], "%s: inputs sum to %lld along dim %d, out has %lld", op,
          (long long)total, dim, (long long)out->shape[dim]);
    SLOT(s, concat, op);
    return s->backend->iface->concat(BCTX(s), dim, n, in, out);
}

fpk_status fpk_op_slice(fpk_stream_t s, int dim, int64_t start, int64_t step, fpk_tensor_t x,
                        fpk_tensor_t out) {
    const char *op = "slice";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(x->ndim == out->ndim && x->dtype == out->dtype, "%s: out must have x's rank and dtype", op);
    CHECK(dim >= 0 && dim < x->ndim, "%s: dim %d of %d", op, dim, x->ndim);
    for (int d = 0; d < x->ndim; d++)
        CHECK(d == dim || x->shape[d] == out->shape[d], "%s: out differs from x outside dim %d", op, dim);
    CHECK(step >= 1, "%s: step %lld", op, (long long)step);
    int64_t len = out->shape[dim];
    CHECK(start >= 0 && (len == 0 || start + step * (len - 1) < x->shape[dim]),
          "%s: start %lld step %lld len %lld out of range for size %lld", op, (long long)start,
          (long long)step, (long long)len, (long long)x->shape[dim]);
    SLOT(s, slice, op);
    return s->backend->iface->slice(BCTX(s), dim, start, step, x, out);
}

fpk_status fpk_op_permute(fpk_stream_t s, const int *perm, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "permute";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(perm, "%s: null perm", op);
    CHECK(x->ndim == out->ndim && x->dtype == out->dtype, "%s: out must have x's rank and dtype", op);
    int seen[FPK_MAX_DIMS] = {0};
    for (int i = 0; i < x->ndim; i++) {
        CHECK(perm[i] >= 0 && perm[i] < x->ndim && !seen[perm[i]], "%s: bad permutation", op);
        seen[perm[i]] = 1;
        CHECK(out->shape[i] == x->shape[perm[i]], "%s: out dim %d is %lld, want %lld", op, i,
              (long long)out->shape[i], (long long)x->shape[perm[i]]);
    }
    SLOT(s, permute, op);
    return s->backend->iface->permute(BCTX(s), perm, x, out);
}

fpk_status fpk_op_pad(fpk_stream_t s, fpk_pad_mode mode, const int64_t *before,
                      const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "pad";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(before && after, "%s: null pads", op);
    CHECK(mode == FPK_PAD_ZERO || mode == FPK_PAD_REPLICATE, "%s: unknown mode %d", op, (int)mode);
    CHECK(x->ndim == out->ndim && x->dtype == out->dtype, "%s: out must have x's rank and dtype", op);
    for (int d = 0; d < x->ndim; d++) {
        CHECK(before[d] >= 0 && after[d] >= 0, "%s: negative pad in dim %d", op, d);
        CHECK(out->shape[d] == x->shape[d] + before[d] + after[d], "%s: out dim %d is %lld, want %lld",
              op, d, (long long)out->shape[d], (long long)(x->shape[d] + before[d] + after[d]));
        CHECK(mode != FPK_PAD_REPLICATE || x->shape[d] > 0 || out->shape[d] == 0,
              "%s: replicate padding of an empty dim %d", op, d);
    }
    SLOT(s, pad, op);
    return s->backend->iface->pad(BCTX(s), mode, before, after, x, out);
}

fpk_status fpk_op_upsample_nearest3d(fpk_stream_t s, const int64_t *scale, fpk_tensor_t x,
                                     fpk_tensor_t out) {
    const char *op = "upsample nearest3d";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(scale, "%s: null scale", op);
    CHECK(x->ndim >= 3 && x->ndim == out->ndim && x->dtype == out->dtype,
          "%s: x needs at least 3 dims and out its rank and dtype", op);
    for (int d = 0; d < x->ndim; d++) {
        int i = d - (x->ndim - 3);
        int64_t f = i >= 0 ? scale[i] : 1;
        CHECK(f >= 1, "%s: scale %lld", op, (long long)f);
        CHECK(out->shape[d] == x->shape[d] * f, "%s: out dim %d is %lld, want %lld", op, d,
              (long long)out->shape[d], (long long)(x->shape[d] * f));
    }
    SLOT(s, upsample_nearest3d, op);
    return s->backend->iface->upsample_nearest3d(BCTX(s), scale, x, out);
}

fpk_status fpk_op_upsample_pad(fpk_stream_t s, const int64_t *scale, const int64_t *before,
                               const int64_t *after, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "upsample pad";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(scale && before && after, "%s: null scale or pads", op);
    CHECK(x->ndim >= 3 && x->ndim == out->ndim && x->dtype == out->dtype,
          "%s: x needs at least 3 dims and out its rank and dtype", op);
    for (int d = 0; d < x->ndim; d++) {
        int i = d - (x->ndim - 3);
        int64_t f = i >= 0 ? scale[i] : 1, b = i >= 0 ? before[i] : 0, a = i >= 0 ? after[i] : 0;
        CHECK(f >= 1 && b >= 0 && a >= 0, "%s: scale %lld, pads %lld and %lld in dim %d", op, (long long)f,
              (long long)b, (long long)a, d);
        CHECK(out->shape[d] == x->shape[d] * f + b + a, "%s: out dim %d is %lld, want %lld", op, d,
              (long long)out->shape[d], (long long)(x->shape[d] * f + b + a));
        CHECK(x->shape[d] > 0 || out->shape[d] == 0, "%s: replicate padding of an empty dim %d", op, d);
    }
    SLOT(s, upsample_pad, op);
    if (out->numel == 0) return FPK_OK;
    return s->backend->iface->upsample_pad(BCTX(s), scale, before, after, x, out);
}

fpk_status fpk_op_avg_pool3d(fpk_stream_t s, const int64_t *kernel, const int64_t *stride,
                             fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "avg pool3d";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(kernel && stride, "%s: null kernel or stride", op);
    CHECK(x->ndim >= 3 && x->ndim == out->ndim && x->dtype == out->dtype,
          "%s: x needs at least 3 dims and out its rank and dtype", op);
    for (int d = 0; d < x->ndim; d++) {
        int i = d - (x->ndim - 3);
        if (i < 0) {
            CHECK(out->shape[d] == x->shape[d], "%s: out differs from x in dim %d", op, d);
            continue;
        }
        CHECK(kernel[i] >= 1 && stride[i] >= 1 && kernel[i] <= x->shape[d],
              "%s: kernel %lld stride %lld for size %lld", op, (long long)kernel[i],
              (long long)stride[i], (long long)x->shape[d]);
        int64_t o = (x->shape[d] - kernel[i]) / stride[i] + 1;
        CHECK(out->shape[d] == o, "%s: out dim %d is %lld, want %lld", op, d,
              (long long)out->shape[d], (long long)o);
    }
    SLOT(s, avg_pool3d, op);
    return s->backend->iface->avg_pool3d(BCTX(s), kernel, stride, x, out);
}

fpk_status fpk_op_reduce(fpk_stream_t s, fpk_reduce_op rop, int dim, fpk_tensor_t x, fpk_tensor_t out) {
    const char *op = "reduce";
    fpk_tensor_t ts[] = {x, out};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(rop >= 0 && rop < FPK_REDUCE_COUNT, "%s: unknown op %d", op, (int)rop);
    CHECK(dim >= 0 && dim < x->ndim, "%s: dim %d of %d", op, dim, x->ndim);
    CHECK(x->ndim == out->ndim && x->dtype == out->dtype, "%s: out must have x's rank and dtype", op);
    CHECK(x->shape[dim] > 0 || rop == FPK_REDUCE_SUM, "%s: mean or max over an empty dim", op);
    for (int d = 0; d < x->ndim; d++)
        CHECK(out->shape[d] == (d == dim ? 1 : x->shape[d]), "%s: out dim %d is %lld, want %lld", op, d,
              (long long)out->shape[d], (long long)(d == dim ? 1 : x->shape[d]));
    SLOT(s, reduce, op);
    return s->backend->iface->reduce(BCTX(s), rop, dim, x, out);
}

fpk_status fpk_op_copy(fpk_stream_t s, fpk_tensor_t src, fpk_tensor_t dst) {
    const char *op = "copy";
    fpk_tensor_t ts[] = {src, dst};
    TRY(check_args(op, s, 2, ts, 0x3));
    CHECK(src->numel == dst->numel, "%s: %lld elements into %lld", op, (long long)src->numel,
          (long long)dst->numel);
    TRY(check_same_shape(op, src, "src", dst, "dst"));
    SLOT(s, copy, op);
    return s->backend->iface->copy(BCTX(s), src, dst);
}

fpk_status fpk_op_embedding(fpk_stream_t s, fpk_tensor_t table, fpk_tensor_t ids, fpk_tensor_t out) {
    const char *op = "embedding";
    fpk_tensor_t ts[] = {table, ids, out};
    TRY(check_args(op, s, 3, ts, 0x7));
    CHECK(table->ndim == 2, "%s: table must be [V, D]", op);
    CHECK(ids->dtype == FPK_I32, "%s: ids must be i32, got %s", op, dtype_name(ids->dtype));
    CHECK(out->ndim == ids->ndim + 1 && out->shape[out->ndim - 1] == table->shape[1] &&
              (out->dtype == table->dtype || (dtype_is_float(out->dtype) && dtype_is_float(table->dtype))),
          "%s: out must be ids' shape + [D] in the table's dtype (or another float dtype)", op);
    for (int i = 0; i < ids->ndim; i++)
        CHECK(out->shape[i] == ids->shape[i], "%s: out dim %d differs from ids", op, i);
    SLOT(s, embedding, op);
    return s->backend->iface->embedding(BCTX(s), table, ids, out);
}
