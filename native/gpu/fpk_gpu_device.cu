/*
 * fpk_gpu_device.cu — the gpu backend's device, memory, streams and copies (CUDA spelling; HIP
 * through fpk_gpu_compat.h). Every device allocation comes here only after the core's allocator
 * has charged it to the cap.
 */
#include "fpk_gpu_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

/* Blocks under 1 MiB, which the core's allocator does not cache: kept here in power-of-two
 * classes (256 B … 512 KiB), at most SMALL_CACHE bytes, because cudaMalloc and cudaFree cost
 * tens of microseconds and cudaFree synchronises the device. The core still charges every
 * block to the cap; the few MiB kept here while free are not charged. */
#define SMALL_MIN_LOG 8
#define SMALL_MAX_LOG 19
#define SMALL_CACHE ((size_t)64 << 20)

struct fpk_small_cache {
    std::mutex mu;
    std::unordered_map<void *, int> live; /* small blocks handed out → class */
    std::vector<void *> free_[SMALL_MAX_LOG + 1];
    size_t cached = 0;
};

static int small_class(size_t n) {
    int k = SMALL_MIN_LOG;
    while (((size_t)1 << k) < n) k++;
    return k;
}

static void small_cache_free(fpk_gpu_ctx *c) {
    fpk_small_cache *sc = c->small;
    if (!sc) return;
    for (auto &v : sc->free_)
        for (void *p : v) (void)cudaFree(p);
    delete sc;
    c->small = nullptr;
}

extern "C" const char *fpk_gpu_backend_name(void) { return FPK_GPU_NAME; }

fpk_status fpk_gpu_error(cudaError_t e, const char *what) {
    fpk_status st = FPK_ERR_BACKEND;
    switch (e) {
    case cudaErrorMemoryAllocation: st = FPK_ERR_OUT_OF_MEMORY; break;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure: st = FPK_ERR_DEVICE_LOST; break;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice: st = FPK_ERR_UNAVAILABLE; break;
    default: break;
    }
    if (st == FPK_ERR_OUT_OF_MEMORY) {
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) fr = 0;
        fpk_gpu_set_error(st, "%s: %s (%s), %zu bytes free on the device", what, cudaGetErrorString(e),
                          cudaGetErrorName(e), fr);
        return st;
    }
    return fpk_gpu_set_error(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

fpk_status fpk_gpu_check_error(cudaError_t e, const char *what, char *why, size_t nwhy) {
    fpk_status s = fpk_gpu_error(e, what);
    snprintf(why, nwhy, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();
    return s == FPK_ERR_DEVICE_LOST ? s : FPK_OK;
}

double fpk_rel_l2_host(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

fpk_status fpk_gpu_launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fpk_gpu_error(e, what);
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_create(const fpk_backend_config *config, fpk_gpu_ctx **out) {
    fpk_gpu_settings_load();
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "%s backend: no usable device: %s", FPK_GPU_NAME,
                                 cudaGetErrorString(e));
    }
    int device = config->device;
    if (config->pci_bus_id[0]) {
        char bus[sizeof config->pci_bus_id];
        memcpy(bus, config->pci_bus_id, sizeof bus);
        bus[sizeof bus - 1] = 0;
        e = cudaDeviceGetByPCIBusId(&device, bus);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "%s backend: no device with PCI bus id %s: %s", FPK_GPU_NAME,
                                     bus, cudaGetErrorString(e));
        }
    }
    if (device < 0 || device >= n)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "%s backend: device %d of %d", FPK_GPU_NAME,
                                 device, n);
    FPK_CUDA(cudaSetDevice(device), "set device");
    fpk_gpu_ctx *c = (fpk_gpu_ctx *)calloc(1, sizeof *c);
    if (!c) return fpk_gpu_set_oom(sizeof *c, 0, "host allocation of gpu backend");
    c->device = device;
    c->flags = config->flags;
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, c->device);
    if (e != cudaSuccess) {
        free(c);
        return fpk_gpu_error(e, "device properties");
    }
    snprintf(c->name, sizeof c->name, "%s", prop.name);
#ifdef FPK_HIP
    snprintf(c->arch, sizeof c->arch, "%s", prop.gcnArchName);
#else
    snprintf(c->arch, sizeof c->arch, "sm_%d%d", prop.major, prop.minor);
#endif
    c->total_memory = prop.totalGlobalMem;
    c->multiprocessors = prop.multiProcessorCount;
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return fpk_gpu_error(e, "create stream");
    }
    c->no_blas = fpk_gpu_cfg.no_blas;
    if (config->find_db_path[0]) memcpy(c->find_db, config->find_db_path, sizeof c->find_db - 1);
    pthread_mutex_init(&c->mu, NULL);
    c->small = new (std::nothrow) fpk_small_cache();
    fpk_vendor_open(c);
    *out = c;
    return FPK_OK;
}

extern "C" void fpk_gpu_free(fpk_gpu_ctx *c) {
    if (!c) return;
    (void)cudaSetDevice(c->device);
    (void)cudaStreamSynchronize(c->stream);
    fpk_vendor_close(c);
    small_cache_free(c);
    (void)cudaStreamDestroy(c->stream);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

extern "C" void fpk_gpu_lock(fpk_gpu_ctx *c) { pthread_mutex_lock(&c->mu); }
extern "C" void fpk_gpu_unlock(fpk_gpu_ctx *c) { pthread_mutex_unlock(&c->mu); }

extern "C" fpk_status fpk_gpu_props(fpk_gpu_ctx *c, fpk_backend_props *out) {
    snprintf(out->device_name, sizeof out->device_name, "%s (%s)", c->name, c->arch);
    out->device_memory = c->total_memory;
    out->threads = c->multiprocessors;
    out->conv_tiers = fpk_gpu_conv_tiers(c);
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_alloc(fpk_gpu_ctx *c, size_t nbytes, void **out) {
    if (c->device) (void)cudaSetDevice(c->device);
    fpk_small_cache *sc = c->small;
    int cls = -1;
    if (sc && nbytes <= ((size_t)1 << SMALL_MAX_LOG)) {
        cls = small_class(nbytes);
        std::lock_guard<std::mutex> g(sc->mu);
        if (!sc->free_[cls].empty()) {
            void *p = sc->free_[cls].back();
            sc->free_[cls].pop_back();
            sc->cached -= (size_t)1 << cls;
            sc->live[p] = cls;
            *out = p;
            return FPK_OK;
        }
        nbytes = (size_t)1 << cls;
    }
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation) {
            size_t fr = 0, tot = 0;
            if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) fr = 0;
            return fpk_gpu_set_oom(nbytes, fr, "device allocation");
        }
        return fpk_gpu_error(e, "device allocation");
    }
    if (cls >= 0) {
        std::lock_guard<std::mutex> g(sc->mu);
        sc->live[p] = cls;
    }
    *out = p;
    return FPK_OK;
}

extern "C" void fpk_gpu_dealloc(fpk_gpu_ctx *c, void *ptr) {
    if (c->device) (void)cudaSetDevice(c->device);
    if (!ptr) return;
    fpk_small_cache *sc = c->small;
    if (sc) {
        std::lock_guard<std::mutex> g(sc->mu);
        auto it = sc->live.find(ptr);
        if (it != sc->live.end()) {
            int cls = it->second;
            sc->live.erase(it);
            if (sc->cached + ((size_t)1 << cls) <= SMALL_CACHE) {
                sc->free_[cls].push_back(ptr);
                sc->cached += (size_t)1 << cls;
                return;
            }
        }
    }
    (void)cudaFree(ptr);
}

extern "C" fpk_status fpk_gpu_stream_new(fpk_gpu_ctx *c, void **out) {
    (void)c;
    cudaStream_t s;
    FPK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create stream");
    *out = (void *)s;
    return FPK_OK;
}

extern "C" void fpk_gpu_stream_free(fpk_gpu_ctx *c, void *stream) {
    (void)c;
    if (stream) {
        (void)cudaStreamSynchronize((cudaStream_t)stream);
        (void)cudaStreamDestroy((cudaStream_t)stream);
    }
}

extern "C" fpk_status fpk_gpu_stream_sync(fpk_gpu_ctx *c, void *stream) {
    FPK_CUDA(cudaStreamSynchronize(fpk_stream(c, stream)), "synchronize");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_copy_h2d_async(fpk_gpu_ctx *c, void *stream, void *dst, const void *src,
                                            size_t n) {
    if (n == 0) return FPK_OK;
    FPK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, fpk_stream(c, stream)), "async copy to device");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_event_new(fpk_gpu_ctx *c, void **out) {
    (void)c;
    cudaEvent_t e = NULL;
    FPK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create event");
    *out = (void *)e;
    return FPK_OK;
}

extern "C" void fpk_gpu_event_free(fpk_gpu_ctx *c, void *event) {
    (void)c;
    if (event) (void)cudaEventDestroy((cudaEvent_t)event);
}

extern "C" fpk_status fpk_gpu_event_record(fpk_gpu_ctx *c, void *event, void *stream) {
    FPK_CUDA(cudaEventRecord((cudaEvent_t)event, fpk_stream(c, stream)), "record event");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_stream_wait_event(fpk_gpu_ctx *c, void *stream, void *event) {
    FPK_CUDA(cudaStreamWaitEvent(fpk_stream(c, stream), (cudaEvent_t)event, 0), "wait for event");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_event_sync(fpk_gpu_ctx *c, void *event) {
    (void)c;
    FPK_CUDA(cudaEventSynchronize((cudaEvent_t)event), "synchronize event");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_copy(fpk_gpu_ctx *c, void *stream, int kind, void *dst, const void *src,
                                   size_t n) {
    if (n == 0) return FPK_OK;
    cudaStream_t st = fpk_stream(c, stream);
    switch (kind) {
    case 0:
        FPK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st), "copy to device");
        FPK_CUDA(cudaStreamSynchronize(st), "copy to device");
        break;
    case 1:
        FPK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st), "copy to host");
        FPK_CUDA(cudaStreamSynchronize(st), "copy to host");
        break;
    default:
        FPK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st), "copy on device");
        break;
    }
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_host_register(fpk_gpu_ctx *c, void *ptr, size_t n) {
    (void)c;
    cudaError_t e = cudaHostRegister(ptr, n, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        return FPK_OK;
    }
    if (e != cudaSuccess) return fpk_gpu_error(e, "register host memory");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_host_unregister(fpk_gpu_ctx *c, void *ptr) {
    (void)c;
    cudaError_t e = cudaHostUnregister(ptr);
    if (e == cudaErrorHostMemoryNotRegistered) {
        (void)cudaGetLastError();
        return FPK_OK;
    }
    if (e != cudaSuccess) return fpk_gpu_error(e, "unregister host memory");
    return FPK_OK;
}

extern "C" fpk_status fpk_gpu_mem_info(fpk_gpu_ctx *c, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)c;
    size_t fr = 0, tot = 0;
    FPK_CUDA(cudaMemGetInfo(&fr, &tot), "memory info");
    *free_bytes = fr;
    *total_bytes = tot;
    return FPK_OK;
}
