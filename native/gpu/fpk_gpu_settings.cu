/*
 * fpk_gpu_settings.cu — the GPU backend's knobs, read from the environment in this one file:
 * once per backend (fpk_gpu_settings_load, when fpk_gpu_create opens a device) into fpk_gpu_cfg,
 * which the kernels and the vendor code read. They are benchmark and test knobs; what changes a
 * worker's results comes in fpk_backend_config. internal/envconfig declares and documents every
 * one (framepackd --help lists them).
 */
#include "fpk_gpu_internal.h"

#include <stdlib.h>
#include <string.h>

fpk_gpu_settings fpk_gpu_cfg = {
    /* no_blas */ 0, /* no_blas_lib */ 0, /* no_blaslt */ 0, /* no_dnn */ 0,
    /* cudnn_workspace_bytes */ (int64_t)8192 << 20, /* cudnn_nhwc_workspace_bytes */ (int64_t)256 << 20,
    /* cudnn_slab_bytes */ (int64_t)1024 << 20, /* cudnn_ncdhw */ 0,
    /* conv_fma */ 0, /* conv_selfcheck_strict */ 0, /* conv_mma_warps */ 4, /* conv_mma_stages */ 3,
    /* attention_score_bytes */ (int64_t)1024 << 20,
    /* flash_fma */ 0, /* flash_selfcheck_strict */ 0, /* flash_warps */ 8, /* flash_stages */ 2,
    /* cuda_root */ NULL, /* rocm_root */ NULL,
};

/* Set to anything but "" and "0". */
static int set_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static int is(const char *name, const char *want) {
    const char *v = getenv(name);
    return v && strcmp(v, want) == 0;
}

static int int_or(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

/* A size in MiB, in bytes: def_mib when unset, not a number or below least_mib. */
static int64_t mib_or(const char *name, int64_t def_mib, int64_t least_mib) {
    const char *v = getenv(name);
    long long mib = v && *v ? atoll(v) : 0;
    return (int64_t)(mib >= least_mib ? mib : def_mib) << 20;
}

static const char *path_or_null(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

void fpk_gpu_settings_load(void) {
    fpk_gpu_settings s;
    s.no_blas = set_on("FRAMEPACK_GPU_NO_BLAS");
    s.no_blas_lib = set_on("FRAMEPACK_GPU_NO_BLAS_LIB");
    s.no_blaslt = set_on("FRAMEPACK_GPU_NO_BLASLT");
    s.no_dnn = set_on("FRAMEPACK_GPU_NO_DNN");
    s.cudnn_workspace_bytes = mib_or("FRAMEPACK_CUDNN_WORKSPACE_MB", 8192, 16);
    s.cudnn_nhwc_workspace_bytes = mib_or("FRAMEPACK_CUDNN_NHWC_WORKSPACE_MB", 256, 16);
    s.cudnn_slab_bytes = mib_or("FRAMEPACK_CUDNN_SLAB_MB", 1024, 16);
    s.cudnn_ncdhw = is("FRAMEPACK_CUDNN_LAYOUT", "ncdhw");
    s.conv_fma = set_on("FRAMEPACK_GPU_CONV_FMA");
    s.conv_selfcheck_strict = is("FRAMEPACK_GPU_CONV_SELFCHECK", "strict");
    s.conv_mma_warps = int_or("FRAMEPACK_GPU_CONV_MMA_WARPS", 4);
    s.conv_mma_stages = int_or("FRAMEPACK_GPU_CONV_MMA_STAGES", 3);
    s.attention_score_bytes = mib_or("FRAMEPACK_GPU_ATTENTION_MIB", 1024, 1);
    s.flash_fma = set_on("FRAMEPACK_GPU_FLASH_FMA");
    s.flash_selfcheck_strict = is("FRAMEPACK_GPU_FLASH_SELFCHECK", "strict");
    s.flash_warps = int_or("FRAMEPACK_GPU_FLASH_WARPS", 8);
    s.flash_stages = int_or("FRAMEPACK_GPU_FLASH_STAGES", 2);
    s.cuda_root = path_or_null("FRAMEPACK_CUDA_ROOT");
    s.rocm_root = path_or_null("FRAMEPACK_ROCM_ROOT");
    fpk_gpu_cfg = s;
}
