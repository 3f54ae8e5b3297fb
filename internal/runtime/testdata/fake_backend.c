/*
 * fake_backend.c — a backend library for tests of fpk_backend_open: "device" memory is malloc'd
 * but reported as not host memory (so uploads and downloads go through the core's staging),
 * copies are memcpy, and it has only fill and unary SiLU/NEG. It has no conv tier, so the conv
 * chain falls to the core's host round trip, as a GPU backend whose vendor libraries are missing
 * would. Built by the Go test with gcc -shared; -DNO_ENTRY and -DWRONG_VERSION build broken
 * variants; -DRECORD_PATH='"file"' appends the device and PCI bus id each backend instance is
 * created for to that file (for tests of which device a worker process opens).
 */
#include "fpk_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct fpk_host_api *host;

typedef struct {
    int device;
} fake_ctx;

static void fake_free(void *ctx) { free(ctx); }

static fpk_status fake_props(void *ctx, fpk_backend_props *out) {
    snprintf(out->device_name, sizeof out->device_name, "fake device %d", ((fake_ctx *)ctx)->device);
    out->device_memory = 1u << 30;
    return FPK_OK;
}

static fpk_status fake_alloc(void *ctx, size_t n, void **out) {
    (void)ctx;
    *out = malloc(n);
    if (!*out) return host->set_oom(n, 0, "fake device allocation");
    return FPK_OK;
}

static void fake_buffer_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static fpk_status fake_copy(void *ctx, void *stream, void *dst, const void *src, size_t n) {
    (void)ctx;
    (void)stream;
    memmove(dst, src, n);
    return FPK_OK;
}

static fpk_status fake_fill(void *ctx, void *stream, fpk_tensor_t t, double v) {
    (void)ctx;
    (void)stream;
    if (t->dtype != FPK_F32) {
        if (v != v) { /* poison */
            memset(fpk_tensor_data(t), 0xff, (size_t)t->numel * fpk_dtype_bytes(t->dtype));
            return FPK_OK;
        }
        return host->set_error(FPK_ERR_UNSUPPORTED, "fake fill: dtype %d", (int)t->dtype);
    }
    float *d = fpk_tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++) d[i] = (float)v;
    return FPK_OK;
}

static fpk_status fake_unary(void *ctx, void *stream, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out) {
    (void)ctx;
    (void)stream;
    if (x->dtype != FPK_F32 || (op != FPK_UNARY_SILU && op != FPK_UNARY_NEG))
        return host->set_error(FPK_ERR_UNSUPPORTED, "fake unary: op %d dtype %d", (int)op, (int)x->dtype);
    const float *a = fpk_tensor_data(x);
    float *y = fpk_tensor_data(out);
    for (int64_t i = 0; i < x->numel; i++) y[i] = op == FPK_UNARY_NEG ? -a[i] : a[i] / (1.0f + expf(-a[i]));
    return FPK_OK;
}

static fpk_status fake_conv(void *ctx, void *stream, fpk_conv_tier tier, const fpk_conv3d_params *p,
                            fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t b, fpk_tensor_t out) {
    (void)ctx, (void)stream, (void)p, (void)x, (void)w, (void)b, (void)out;
    return host->set_error(FPK_ERR_UNAVAILABLE, "fake backend has no conv tier %d", (int)tier);
}

static const struct fpk_backend_iface fake_iface = {
#ifdef WRONG_VERSION
    .api_version = FPK_API_VERSION + 1,
#else
    .api_version = FPK_API_VERSION,
#endif
    .name = "fake",
    .free = fake_free,
    .get_props = fake_props,
    .buffer_alloc = fake_alloc,
    .buffer_free = fake_buffer_free,
    .copy_h2d = fake_copy,
    .copy_d2h = fake_copy,
    .copy_d2d = fake_copy,
    .fill = fake_fill,
    .unary = fake_unary,
    .conv3d = fake_conv,
};

#ifndef NO_ENTRY
__attribute__((visibility("default"))) fpk_status fpk_backend_create_v1(
    const struct fpk_host_api *h, const fpk_backend_config *config,
    const struct fpk_backend_iface **iface, void **ctx) {
    host = h;
    fake_ctx *c = calloc(1, sizeof *c);
    if (!c) return h->set_oom(sizeof *c, 0, "fake backend context");
    c->device = config->device;
#ifdef RECORD_PATH
    FILE *f = fopen(RECORD_PATH, "a");
    if (f) {
        fprintf(f, "device=%d pci_bus_id=%s\n", config->device, config->pci_bus_id);
        fclose(f);
    }
#endif
    *iface = &fake_iface;
    *ctx = c;
    return FPK_OK;
}
#endif
