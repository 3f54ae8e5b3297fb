/*
 * fpk_gpu_vendor.cu — vendor libraries, dlopened with our own prototypes (no vendor header is
 * needed to build): cuBLAS + cuDNN 9 (legacy conv API; its graph API for fused attention in
 * fpk_gpu_vendor_sdpa.cu) on CUDA, rocBLAS + MIOpen on ROCm.
 *
 * Search: sonames newest first, in one root — fpk_gpu_cfg.cuda_root / CUDA_HOME / CUDA_PATH or
 * /usr/local/cuda (lib64, lib, targets/x86_64-linux/lib), fpk_gpu_cfg.rocm_root / ROCM_PATH or
 * /opt/rocm (lib, lib64) — and then the loader's own path (LD_LIBRARY_PATH, ldconfig). Once a
 * library is found, the next one is looked for first in the same directory, so the set comes
 * from one install. A library that is missing or fails to start disables its tiers (BLAS: our
 * own GEMM kernel; DNN: the vendor conv tiers), never the backend. fpk_gpu_cfg.no_dnn and
 * no_blas disable them for tests. cuBLASLt (the GEMM's bias and GELU epilogues)
 * is opened beside cuBLAS; fpk_gpu_cfg.no_blaslt leaves it out (bias and GELU then run as
 * kernels after the GEMM).
 */
#include "fpk_gpu_internal.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- library search -------------------------------------------------------------------------- */

/* Opens the first of names (newest first) found in pref (a directory, may be ""), then in the
 * install roots, then by the loader's search. Writes the path opened into found. */
static void *open_first(const char *const *names, const char *pref, char *found, size_t n) {
#ifdef FPK_VENDOR_ROCM
    const char *own = fpk_gpu_cfg.rocm_root;
    const char *envs[] = {"ROCM_PATH", NULL};
    const char *def = "/opt/rocm";
    const char *subs[] = {"lib", "lib64", NULL};
#else
    const char *own = fpk_gpu_cfg.cuda_root;
    const char *envs[] = {"CUDA_HOME", "CUDA_PATH", NULL};
    const char *def = "/usr/local/cuda";
    const char *subs[] = {"lib64", "lib", "targets/x86_64-linux/lib", NULL};
#endif
    const char *root = own;
    for (int i = 0; envs[i] && !root; i++) {
        const char *v = getenv(envs[i]);
        if (v && *v) root = v;
    }
    if (!root) root = def;
    char path[PATH_MAX];
    for (int i = 0; names[i]; i++) {
        if (pref && *pref) {
            snprintf(path, sizeof path, "%s/%s", pref, names[i]);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) {
                snprintf(found, n, "%s", path);
                return h;
            }
        }
        for (int j = 0; subs[j]; j++) {
            snprintf(path, sizeof path, "%s/%s/%s", root, subs[j], names[i]);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) {
                snprintf(found, n, "%s", path);
                return h;
            }
        }
    }
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            /* the directory it came from, so the next library is looked for there first */
            snprintf(found, n, "%s", names[i]);
            char origin[PATH_MAX];
            if (dlinfo(h, RTLD_DI_ORIGIN, origin) == 0) snprintf(found, n, "%s/%s", origin, names[i]);
            return h;
        }
    }
    return NULL;
}

static void dir_of(const char *path, char *dir, size_t n) {
    snprintf(dir, n, "%s", path);
    char *sl = strrchr(dir, '/');
    if (sl) *sl = 0;
    else dir[0] = 0;
}

/* Resolves every name into fn (NULL-terminated names); 0 if one is missing. */
static int resolve(void *dl, const char *const *names, void **fn) {
    for (int i = 0; names[i]; i++) {
        fn[i] = dlsym(dl, names[i]);
        if (!fn[i]) return 0;
    }
    return 1;
}

/* Choices of the vendor conv per shape (this process). */
struct fpk_conv_algo {
    int tuned, dt;
    int x[5], w[5], y[5];
    int64_t pad[3], stride[3], groups;
    int algo;          /* cuDNN algo / MIOpen fwd algo */
    int math;          /* cuDNN math type */
    uint64_t solution; /* MIOpen solution id (immediate mode) */
    size_t ws;
    int from_db; /* read from the cuDNN find database (found in another process) */
    struct fpk_conv_algo *next;
};

static struct fpk_conv_algo *algo_find(fpk_vendor_dnn *d, int tuned, int dt, const int *x, const int *w, const int *y,
                                       const fpk_conv3d_params *p) {
    for (struct fpk_conv_algo *a = d->algos; a; a = a->next) {
        if (a->tuned != tuned || a->dt != dt || memcmp(a->x, x, sizeof a->x) || memcmp(a->w, w, sizeof a->w) ||
            memcmp(a->y, y, sizeof a->y))
            continue;
        if (memcmp(a->pad, p->padding, sizeof a->pad) || a->groups != (p->groups ? p->groups : 1)) continue;
        int same = 1;
        for (int i = 0; i < 3; i++) same &= a->stride[i] == (p->stride[i] ? p->stride[i] : 1);
        if (same) return a;
    }
    return NULL;
}

static struct fpk_conv_algo *algo_add(fpk_vendor_dnn *d, int tuned, int dt, const int *x, const int *w, const int *y,
                                      const fpk_conv3d_params *p) {
    struct fpk_conv_algo *a = (struct fpk_conv_algo *)calloc(1, sizeof *a);
    if (!a) return NULL;
    a->tuned = tuned;
    a->dt = dt;
    memcpy(a->x, x, sizeof a->x);
    memcpy(a->w, w, sizeof a->w);
    memcpy(a->y, y, sizeof a->y);
    memcpy(a->pad, p->padding, sizeof a->pad);
    for (int i = 0; i < 3; i++) a->stride[i] = p->stride[i] ? p->stride[i] : 1;
    a->groups = p->groups ? p->groups : 1;
    a->next = d->algos;
    d->algos = a;
    return a;
}

static void algos_free(fpk_vendor_dnn *d) {
    while (d->algos) {
        struct fpk_conv_algo *n = d->algos->next;
        free(d->algos);
        d->algos = n;
    }
}

int fpk_vendor_has_dnn(fpk_gpu_ctx *c) { return c->dnn.handle != NULL; }

/* A channels-last conv's choice is kept under its dtype with this bit set, in the per-process
 * list and in the cuDNN find database (lines written before it are NCDHW choices, as they were). */
#define FPK_CONV_KEY_NHWC 0x100

#ifdef FPK_VENDOR_CUDA
/* =====================================================================================
 * CUDA: cuBLAS (GemmStridedBatchedEx, f32 compute) and cuDNN (legacy convolution API).
 * ===================================================================================== */

/* Scratch for Find: as much as fits of `want`, halving down to 16 MiB. */
static size_t find_workspace(fpk_scratch &ws, size_t want) {
    for (size_t n = want; n >= ((size_t)16 << 20); n /= 2)
        if (ws.alloc(n) == FPK_OK) return n;
    return 0;
}

/* What Find may offer cuDNN as workspace (fpk_gpu_find_workspace_want, native/src/fpk_scratch.h:
 * the policy the shape-only backend estimates with): NCDHW at most fpk_gpu_cfg.cudnn_workspace_bytes
 * (default 8 GiB), channels-last at most fpk_gpu_cfg.cudnn_nhwc_workspace_bytes (default 256 MiB),
 * and never more than fits under the memory cap (find_workspace halves down to what does). */
static size_t find_workspace_want(size_t io_bytes, int nhwc) {
    return fpk_gpu_find_workspace_want(io_bytes, nhwc,
                                       nhwc ? fpk_gpu_cfg.cudnn_nhwc_workspace_bytes : fpk_gpu_cfg.cudnn_workspace_bytes);
}

int fpk_vendor_conv_nhwc(fpk_gpu_ctx *c, int dt) {
    return c->dnn.handle != NULL && dt != FPK_F32 && !fpk_gpu_cfg.cudnn_ncdhw;
}

enum { FPK_CUDA_R_32F = 0, FPK_CUDA_R_16F = 2, FPK_CUDA_R_16BF = 14, FPK_CUDA_R_8F_E4M3 = 28, FPK_CUDA_R_8F_E5M2 = 29 };
enum { FPK_CUBLAS_OP_N = 0, FPK_CUBLAS_OP_T = 1, FPK_CUBLAS_COMPUTE_32F = 68, FPK_CUBLAS_GEMM_DEFAULT = -1 };

typedef int (*cublasSetStream_t)(void *, cudaStream_t);
typedef int (*cublasGemmStridedBatchedEx_t)(void *, int, int, int, int, int, const void *, const void *, int, int,
                                            long long, const void *, int, int, long long, const void *, void *, int,
                                            int, long long, int, int, int);
static const char *const blas_syms[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
                                        "cublasGemmStridedBatchedEx", NULL};
static const char *const blas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", NULL};

enum { FPK_CUDNN_DATA_FLOAT = 0, FPK_CUDNN_DATA_HALF = 2, FPK_CUDNN_DATA_BFLOAT16 = 9 };
enum { FPK_CUDNN_TENSOR_NCHW = 0, FPK_CUDNN_TENSOR_NHWC = 1, FPK_CUDNN_CROSS_CORRELATION = 1 };
enum { FPK_CUDNN_DEFAULT_MATH = 0, FPK_CUDNN_TENSOR_OP_MATH = 1, FPK_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2, FPK_CUDNN_FMA_MATH = 3 };

typedef struct {
    int algo;
    int status;
    float time;
    size_t memory;
    int determinism;
    int mathType;
    int reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;

enum {
    D_CREATE, D_DESTROY, D_SET_STREAM, D_ERRSTR,
    D_CT, D_ST, D_DT, D_CF, D_SF, D_DF, D_CC, D_SC, D_GC, D_MC, D_DC,
    D_FIND, D_V7, D_WS, D_FWD, D_VERSION, D_N
};
static const char *const dnn_syms[] = {
    "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetErrorString",
    "cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptor", "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor", "cudnnSetFilterNdDescriptor", "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor", "cudnnSetConvolutionNdDescriptor", "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType", "cudnnDestroyConvolutionDescriptor",
    "cudnnFindConvolutionForwardAlgorithmEx", "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward", "cudnnGetVersion", NULL};
static const char *const dnn_names[] = {"libcudnn.so.9", "libcudnn.so.8", NULL};

typedef int (*fn_h)(void *);
typedef int (*fn_hp)(void **);
typedef int (*fn_hs)(void *, cudaStream_t);
typedef const char *(*fn_err)(int);
typedef int (*fn_st)(void *, int, int, const int *, const int *);
typedef int (*fn_sf)(void *, int, int, int, const int *);
typedef int (*fn_sc)(void *, int, const int *, const int *, const int *, int, int);
typedef int (*fn_hi)(void *, int);
typedef int (*fn_find)(void *, void *, const void *, void *, const void *, void *, void *, void *, int, int *,
                       cudnnConvolutionFwdAlgoPerf_t *, void *, size_t);
typedef int (*fn_v7)(void *, void *, void *, void *, void *, int, int *, cudnnConvolutionFwdAlgoPerf_t *);
typedef int (*fn_ws)(void *, void *, void *, void *, void *, int, size_t *);
typedef int (*fn_fwd)(void *, const void *, void *, const void *, void *, const void *, void *, int, void *, size_t,
                      const void *, void *, void *);

/* ---- cuDNN find database ----------------------------------------------------------------------
 * FindEx benchmarks every algorithm of a shape, which a fresh worker process would repeat for
 * each shape of every stage. fpk_backend_config.find_db_path names a text file shared by the
 * workers (every worker that convolves puts it beside the conv decision cache): one line per tuned choice, appended
 * after a Find (one write of a short line with O_APPEND, so concurrent workers do not tear
 * lines), read when the library opens. A line holds the device name and cuDNN version it was
 * found on (others are skipped), the shape key (dtype, dims, padding, strides, groups) and the
 * choice (algorithm, math type, workspace bytes). A malformed line is skipped; a later line for
 * the same shape wins. A recorded algorithm that fails to run fails the conv at this tier as a
 * fresh Find's would, and the chain falls through. */

#define FIND_DB_TAG "fpkfind1"

static void find_db_device(const fpk_gpu_ctx *c, char *out, size_t n) {
    snprintf(out, n, "%s", c->name[0] ? c->name : "unknown");
    for (char *p = out; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n') *p = '_';
}

static size_t find_db_version(const fpk_vendor_dnn *d) {
    typedef size_t (*fn_ver)(void);
    return d->fn[D_VERSION] ? ((fn_ver)d->fn[D_VERSION])() : 0;
}

static void find_db_load(fpk_gpu_ctx *c) {
    const char *path = c->find_db;
    fpk_vendor_dnn *d = &c->dnn;
    if (!*path || !d->handle) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char dev[128], want[128], line[1024];
    find_db_device(c, want, sizeof want);
    size_t ver = find_db_version(d);
    while (fgets(line, sizeof line, f)) {
        unsigned long long v = 0, ws = 0;
        long long pad[3], str[3], groups;
        int dt, x[5], w[5], y[5], algo, math, used = 0;
        int got = sscanf(line,
                         FIND_DB_TAG " %127s %llu %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %lld %lld %lld %lld "
                                     "%lld %lld %lld %d %d %llu%n",
                         dev, &v, &dt, &x[0], &x[1], &x[2], &x[3], &x[4], &w[0], &w[1], &w[2], &w[3], &w[4], &y[0],
                         &y[1], &y[2], &y[3], &y[4], &pad[0], &pad[1], &pad[2], &str[0], &str[1], &str[2], &groups,
                         &algo, &math, &ws, &used);
        if (got != 28 || used == 0 || strcmp(dev, want) != 0 || (size_t)v != ver || algo < 0 || groups < 1) continue;
        fpk_conv3d_params p;
        memset(&p, 0, sizeof p);
        for (int i = 0; i < 3; i++) {
            p.padding[i] = pad[i];
            p.stride[i] = str[i];
        }
        p.groups = groups;
        struct fpk_conv_algo *a = algo_find(d, 1, dt, x, w, y, &p);
        if (!a) a = algo_add(d, 1, dt, x, w, y, &p);
        if (!a) break;
        a->algo = algo;
        a->math = math;
        a->ws = (size_t)ws;
        a->from_db = 1;
    }
    fclose(f);
}

static void find_db_append(fpk_gpu_ctx *c, const struct fpk_conv_algo *a) {
    const char *path = c->find_db;
    if (!*path) return;
    char dev[128], line[1024];
    find_db_device(c, dev, sizeof dev);
    int n = snprintf(line, sizeof line,
                     FIND_DB_TAG " %s %llu %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %lld %lld %lld %lld %lld "
                                 "%lld %lld %d %d %llu\n",
                     dev, (unsigned long long)find_db_version(&c->dnn), a->dt, a->x[0], a->x[1], a->x[2], a->x[3],
                     a->x[4], a->w[0], a->w[1], a->w[2], a->w[3], a->w[4], a->y[0], a->y[1], a->y[2], a->y[3], a->y[4],
                     (long long)a->pad[0], (long long)a->pad[1], (long long)a->pad[2], (long long)a->stride[0],
                     (long long)a->stride[1], (long long)a->stride[2], (long long)a->groups, a->algo, a->math,
                     (unsigned long long)a->ws);
    if (n <= 0 || n >= (int)sizeof line) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t wr = write(fd, line, (size_t)n);
    (void)wr; /* a lost line only costs a later Find */
    close(fd);
}

static int cuda_type(int dt) { return dt == FPK_F32 ? FPK_CUDA_R_32F : dt == FPK_F16 ? FPK_CUDA_R_16F : dt == FPK_BF16 ? FPK_CUDA_R_16BF : -1; }

fpk_status fpk_vendor_gemm(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gemm_desc *d) {
    fpk_vendor_blas *b = &c->blas;
    if (!b->handle) return FPK_ERR_UNAVAILABLE;
    int at = cuda_type(d->adt), bt = cuda_type(d->bdt), ct = cuda_type(d->cdt);
    if (at < 0 || bt < 0 || ct < 0 || d->adt != d->bdt || (ct != FPK_CUDA_R_32F && d->cdt != d->adt)) return FPK_ERR_UNAVAILABLE;
    if (d->M > INT_MAX || d->N > INT_MAX || d->K > INT_MAX || d->batch > INT_MAX || d->lda > INT_MAX ||
        d->ldb > INT_MAX || d->ldc > INT_MAX)
        return FPK_ERR_UNAVAILABLE;
    ((cublasSetStream_t)b->fn[2])(b->handle, st);
    float alpha = d->alpha, beta = d->beta;
    /* row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: swap the operands */
    int s = ((cublasGemmStridedBatchedEx_t)b->fn[3])(
        b->handle, d->trans_b ? FPK_CUBLAS_OP_T : FPK_CUBLAS_OP_N, d->trans_a ? FPK_CUBLAS_OP_T : FPK_CUBLAS_OP_N, (int)d->N, (int)d->M,
        (int)d->K, &alpha, d->b, bt, (int)d->ldb, d->stride_b, d->a, at, (int)d->lda, d->stride_a, &beta, d->c, ct,
        (int)d->ldc, d->stride_c, (int)d->batch, FPK_CUBLAS_COMPUTE_32F, FPK_CUBLAS_GEMM_DEFAULT);
    if (s != 0)
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "gemm: cublasGemmStridedBatchedEx status %d (%lld x %lld x %lld, batch %lld)",
                                 s, (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->batch);
    return FPK_OK;
}

/* ---- cuBLASLt: GEMM with the bias (+ GELU) epilogue ---------------------------------------- */

enum {
    LT_CREATE, LT_DESTROY, LT_DESC_CREATE, LT_DESC_DESTROY, LT_DESC_SET, LT_LAYOUT_CREATE, LT_LAYOUT_DESTROY,
    LT_PREF_CREATE, LT_PREF_DESTROY, LT_PREF_SET, LT_HEURISTIC, LT_MATMUL, LT_N
};
static const char *const lt_syms[] = {
    "cublasLtCreate", "cublasLtDestroy", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
    "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
    "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul", NULL};
static const char *const lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", NULL};

/* cublasLt.h's values (cublasLtMatmulDescAttributes_t, cublasLtEpilogue_t, cublasLtMatmulMatrixScale_t,
 * the preference, cublasStatus_t). The scale pointers (17, 18: const void *, device f32) are
 * cuBLAS 11.8's; the scale modes (31, 32: int32_t) and OUTER_VEC_32F (3: a vector of M f32 for A,
 * one scale per row of op(A), and of N for B, one per column of op(B)) are cuBLAS 12.9's, FP8 on
 * Ada and Hopper; an older library refuses the attribute (CUBLAS_STATUS_INVALID_VALUE). */
enum {
    LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8, LT_DESC_A_SCALE_POINTER = 17,
    LT_DESC_B_SCALE_POINTER = 18, LT_DESC_A_SCALE_MODE = 31, LT_DESC_B_SCALE_MODE = 32
};
enum { LT_EPILOGUE_DEFAULT = 1, LT_EPILOGUE_BIAS = 4, LT_EPILOGUE_GELU = 32, LT_EPILOGUE_GELU_BIAS = 36 };
enum { LT_MATRIX_SCALE_OUTER_VEC_32F = 3 };
enum { LT_STATUS_INVALID_VALUE = 7, LT_STATUS_ARCH_MISMATCH = 8, LT_STATUS_NOT_SUPPORTED = 15 };
enum { LT_PREF_MAX_WORKSPACE_BYTES = 1, LT_PREF_MIN_ALIGNMENT_A_BYTES = 5 }; /* then B, C, D: 6, 7, 8 */
#define LT_WORKSPACE ((size_t)32 << 20)

typedef struct {
    uint64_t data[8];
} lt_algo_t;
typedef struct {
    lt_algo_t algo;
    size_t workspace;
    int state;
    float waves;
    int reserved[4];
} lt_heuristic_t;

typedef int (*lt_h_t)(void *);
typedef int (*lt_desc_create_t)(void **, int, int);
typedef int (*lt_set_t)(void *, int, const void *, size_t);
typedef int (*lt_layout_create_t)(void **, int, uint64_t, uint64_t, int64_t);
typedef int (*lt_pref_create_t)(void **);
typedef int (*lt_heuristic_fn_t)(void *, void *, void *, void *, void *, void *, void *, int, lt_heuristic_t *, int *);
typedef int (*lt_matmul_t)(void *, void *, const void *, const void *, void *, const void *, void *, const void *,
                           const void *, void *, void *, void *, const lt_algo_t *, void *, size_t, cudaStream_t);

/* The heuristic's algorithm for one shape, or a refusal (ok 0), cached for the process. */
struct fpk_lt_plan {
    int64_t M, N, K;
    int ta, tb, at, ct, epi, align;
    int scales; /* fp8: FPK_FP8_SCALES_* (0 for the 16-bit GEMMs) */
    int ok;
    lt_heuristic_t h;
    struct fpk_lt_plan *next;
};

/* Descriptors of one cuBLASLt call, destroyed with the object. */
struct lt_call {
    fpk_vendor_blaslt *lt;
    void *desc = nullptr, *la = nullptr, *lb = nullptr, *lc = nullptr, *pref = nullptr;
    explicit lt_call(fpk_vendor_blaslt *l) : lt(l) {}
    ~lt_call() {
        lt_h_t ld = (lt_h_t)lt->fn[LT_LAYOUT_DESTROY];
        if (la) ld(la);
        if (lb) ld(lb);
        if (lc) ld(lc);
        if (desc) ((lt_h_t)lt->fn[LT_DESC_DESTROY])(desc);
        if (pref) ((lt_h_t)lt->fn[LT_PREF_DESTROY])(pref);
    }
};

/* The cached plan for key's shape and types (the heuristic asked once, with k's descriptors and
 * key->align as every buffer's alignment; ok 0 when it refused), NULL when out of memory. */
static struct fpk_lt_plan *lt_plan(fpk_vendor_blaslt *lt, lt_call &k, const struct fpk_lt_plan *key) {
    struct fpk_lt_plan *pl = lt->plans;
    for (; pl; pl = pl->next)
        if (pl->M == key->M && pl->N == key->N && pl->K == key->K && pl->ta == key->ta && pl->tb == key->tb && pl->at == key->at &&
            pl->ct == key->ct && pl->epi == key->epi && pl->align == key->align && pl->scales == key->scales)
            return pl;
    pl = (struct fpk_lt_plan *)calloc(1, sizeof *pl);
    if (!pl) return NULL;
    *pl = *key;
    pl->ok = 0;
    uint64_t ws = LT_WORKSPACE;
    uint32_t align = (uint32_t)key->align;
    int n = 0;
    lt_set_t pset = (lt_set_t)lt->fn[LT_PREF_SET];
    bool pref_ok = ((lt_pref_create_t)lt->fn[LT_PREF_CREATE])(&k.pref) == 0 && pset(k.pref, LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == 0;
    for (int i = 0; i < 4 && pref_ok; i++) pref_ok = pset(k.pref, LT_PREF_MIN_ALIGNMENT_A_BYTES + i, &align, sizeof align) == 0;
    if (pref_ok && ((lt_heuristic_fn_t)lt->fn[LT_HEURISTIC])(lt->handle, k.desc, k.la, k.lb, k.lc, k.lc, k.pref, 1, &pl->h, &n) == 0 &&
        n > 0 && pl->h.state == 0)
        pl->ok = 1;
    pl->next = lt->plans;
    lt->plans = pl;
    return pl;
}

fpk_status fpk_vendor_gemm_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_desc *d) {
    fpk_vendor_blaslt *lt = &c->blaslt;
    if (!lt->handle) return FPK_ERR_UNAVAILABLE;
    int at = cuda_type(d->adt), ct = cuda_type(d->cdt);
    if (at < 0 || ct < 0 || d->adt != d->bdt || (ct != FPK_CUDA_R_32F && d->cdt != d->adt) || d->batch != 1 ||
        d->beta != 0.f)
        return FPK_ERR_UNAVAILABLE;
    if (d->M > INT_MAX || d->N > INT_MAX || d->K > INT_MAX) return FPK_ERR_UNAVAILABLE;
    int epi = d->bias ? (d->gelu ? LT_EPILOGUE_GELU_BIAS : LT_EPILOGUE_BIAS) : (d->gelu ? LT_EPILOGUE_GELU : LT_EPILOGUE_DEFAULT);
    /* row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: Lt's "A" is our b, its "B" our a; D has N rows, so
     * the bias (one per row of D) is one per output column, as Linear's */
    int ta = d->trans_b ? FPK_CUBLAS_OP_T : FPK_CUBLAS_OP_N, tb = d->trans_a ? FPK_CUBLAS_OP_T : FPK_CUBLAS_OP_N;
    lt_call k(lt);
    if (((lt_desc_create_t)lt->fn[LT_DESC_CREATE])(&k.desc, FPK_CUBLAS_COMPUTE_32F, FPK_CUDA_R_32F) != 0)
        return FPK_ERR_UNAVAILABLE;
    lt_set_t dset = (lt_set_t)lt->fn[LT_DESC_SET];
    uint32_t e = (uint32_t)epi;
    int32_t ta32 = ta, tb32 = tb;
    fpk_scratch sbias(sf);
    const void *bias = d->bias;
    if (bias && d->bias_dt != d->cdt) { /* the epilogue reads the bias in the output's type */
        FPK_TRY(sbias.alloc((size_t)d->N * fpk_dt_size(d->cdt)));
        FPK_TRY(fpk_gpu_convert(st, sbias.ptr, d->cdt, bias, d->bias_dt, d->N));
        bias = sbias.ptr;
    }
    /* the heuristic assumes 256-byte aligned buffers unless told less: tell it what these are
     * (the plan is cached per alignment too, since later calls bring other pointers) */
    uint32_t align = 256;
    const void *ptrs[4] = {d->a, d->b, d->c, bias};
    for (int i = 0; i < 4; i++)
        while (ptrs[i] && ((uintptr_t)ptrs[i] % align) != 0) align /= 2;
    if (align < 16) return FPK_ERR_UNAVAILABLE;
    if (dset(k.desc, LT_DESC_TRANSA, &ta32, sizeof ta32) != 0 || dset(k.desc, LT_DESC_TRANSB, &tb32, sizeof tb32) != 0 ||
        dset(k.desc, LT_DESC_EPILOGUE, &e, sizeof e) != 0 ||
        (bias && dset(k.desc, LT_DESC_BIAS_POINTER, &bias, sizeof bias) != 0))
        return FPK_ERR_UNAVAILABLE;
    lt_layout_create_t lc = (lt_layout_create_t)lt->fn[LT_LAYOUT_CREATE];
    /* column-major layouts: Lt's A = our b (op(A) is N x K), B = our a (op(B) is K x M), D N x M */
    uint64_t ar = d->trans_b ? d->K : d->N, ac = d->trans_b ? d->N : d->K;
    uint64_t br = d->trans_a ? d->M : d->K, bc = d->trans_a ? d->K : d->M;
    if (lc(&k.la, at, ar, ac, d->ldb) != 0 || lc(&k.lb, at, br, bc, d->lda) != 0 ||
        lc(&k.lc, ct, (uint64_t)d->N, (uint64_t)d->M, d->ldc) != 0)
        return FPK_ERR_UNAVAILABLE;
    struct fpk_lt_plan key = {d->M, d->N, d->K, ta, tb, at, ct, epi, (int)align, 0, 0, {}, NULL};
    struct fpk_lt_plan *pl = lt_plan(lt, k, &key);
    if (!pl || !pl->ok) return FPK_ERR_UNAVAILABLE;
    fpk_scratch ws(sf);
    if (pl->h.workspace) FPK_TRY(ws.alloc(pl->h.workspace));
    float alpha = d->alpha, beta = 0.f;
    int s = ((lt_matmul_t)lt->fn[LT_MATMUL])(lt->handle, k.desc, &alpha, d->b, k.la, d->a, k.lb, &beta, d->c, k.lc,
                                             d->c, k.lc, &pl->h.algo, ws.ptr, pl->h.workspace, st);
    if (s != 0)
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "gemm: cublasLtMatmul status %d (%lld x %lld x %lld, epilogue %d)", s,
                                 (long long)d->M, (long long)d->N, (long long)d->K, epi);
    return FPK_OK;
}

/* cuBLASLt's FP8 matmul (compute capability 8.9 and later), fpk_fp8_gemm_desc's contract. FP8 wants
 * both operands K-major ("TN"): in column-major terms dᵀ (N × M) = wqᵀ-as-stored (op T of a K × N
 * matrix) · aq (K × M). So cuBLASLt's A is our weight and its B our activations: its A scale is
 * sw (the outer vector along op(A)'s N rows, one per output channel) and its B scale is sa (along
 * op(B)'s M columns, one per token); D's rows are our columns, so the bias (one per row of D) is
 * one per output channel, as Linear's. C is never read (beta 0) and is not d (as PyTorch's
 * scaled_gemm: the FP8 kernels take no C aliasing D): it points at wq with D's layout. */
fpk_status fpk_vendor_gemm_fp8_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_fp8_gemm_desc *d) {
    fpk_vendor_blaslt *lt = &c->blaslt;
    const int64_t M = d->M, N = d->N, K = d->K;
    if (!lt->handle) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt did not load");
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || K % 16 != 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt fp8 takes K a multiple of 16 and 32-bit dims");
    const int dt = cuda_type(d->ddt);
    if (dt < 0 || (d->bias && dt == FPK_CUDA_R_32F))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt fp8 writes f32, f16 or bf16, with a bias 16-bit only");
    if (M == 0 || N == 0) return FPK_OK;
    const int at = FPK_CUDA_R_8F_E4M3, bt = d->wdt == FPK_F8E5M2 ? FPK_CUDA_R_8F_E5M2 : FPK_CUDA_R_8F_E4M3;
    const int epi = d->bias ? (d->gelu ? LT_EPILOGUE_GELU_BIAS : LT_EPILOGUE_BIAS) : (d->gelu ? LT_EPILOGUE_GELU : LT_EPILOGUE_DEFAULT);
    lt_call k(lt);
    if (((lt_desc_create_t)lt->fn[LT_DESC_CREATE])(&k.desc, FPK_CUBLAS_COMPUTE_32F, FPK_CUDA_R_32F) != 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cublasLtMatmulDescCreate failed");
    lt_set_t dset = (lt_set_t)lt->fn[LT_DESC_SET];
    int32_t ta = FPK_CUBLAS_OP_T, tb = FPK_CUBLAS_OP_N;
    if (dset(k.desc, LT_DESC_TRANSA, &ta, sizeof ta) != 0 || dset(k.desc, LT_DESC_TRANSB, &tb, sizeof tb) != 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt descriptor attributes refused");
    fpk_scratch sbias(sf);
    const void *bias = d->bias;
    if (bias && d->bias_dt != d->ddt) { /* the epilogue reads the bias in the output's type */
        FPK_TRY(sbias.alloc((size_t)N * fpk_dt_size(d->ddt)));
        FPK_TRY(fpk_gpu_convert(st, sbias.ptr, d->ddt, bias, d->bias_dt, N));
        bias = sbias.ptr;
    }
    uint32_t e = (uint32_t)epi;
    if (epi != LT_EPILOGUE_DEFAULT &&
        (dset(k.desc, LT_DESC_EPILOGUE, &e, sizeof e) != 0 || (bias && dset(k.desc, LT_DESC_BIAS_POINTER, &bias, sizeof bias) != 0)))
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt refused the fp8 epilogue %d", epi);
    if (d->scales != FPK_FP8_SCALES_NONE) {
        const void *sa = d->sw, *sb = d->sa; /* Lt's A is our weight, its B our activations */
        if (dset(k.desc, LT_DESC_A_SCALE_POINTER, &sa, sizeof sa) != 0 || dset(k.desc, LT_DESC_B_SCALE_POINTER, &sb, sizeof sb) != 0)
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt refused the fp8 scale pointers");
        int32_t mode = LT_MATRIX_SCALE_OUTER_VEC_32F;
        if (d->scales == FPK_FP8_SCALES_OUTER &&
            (dset(k.desc, LT_DESC_A_SCALE_MODE, &mode, sizeof mode) != 0 || dset(k.desc, LT_DESC_B_SCALE_MODE, &mode, sizeof mode) != 0))
            return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: %s has no outer-vector fp8 scales (cuBLAS 12.9 or later has)",
                                     lt->library);
    }
    lt_layout_create_t lc = (lt_layout_create_t)lt->fn[LT_LAYOUT_CREATE];
    if (lc(&k.la, bt, (uint64_t)K, (uint64_t)N, K) != 0 || lc(&k.lb, at, (uint64_t)K, (uint64_t)M, K) != 0 ||
        lc(&k.lc, dt, (uint64_t)N, (uint64_t)M, N) != 0)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt layouts refused");
    uint32_t align = 256;
    const void *ptrs[4] = {d->aq, d->wq, d->d, bias};
    for (int i = 0; i < 4; i++)
        while (ptrs[i] && ((uintptr_t)ptrs[i] % align) != 0) align /= 2;
    if (align < 16) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cuBLASLt fp8 wants 16-byte aligned operands");
    const int plan_at = 1000 + bt; /* fp8 plans apart from the 16-bit ones in the cache */
    struct fpk_lt_plan key = {M, N, K, ta, tb, plan_at, dt, epi, (int)align, d->scales, 0, {}, NULL};
    struct fpk_lt_plan *pl = lt_plan(lt, k, &key);
    if (!pl) return fpk_gpu_set_oom(sizeof *pl, 0, "cuBLASLt plan");
    if (!pl->ok)
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE,
                                 "gemm q: cuBLASLt has no fp8 algorithm for %lld x %lld x %lld (output type %d, epilogue %d, scales %d)",
                                 (long long)M, (long long)N, (long long)K, dt, epi, d->scales);
    fpk_scratch wsp(sf);
    if (pl->h.workspace) FPK_TRY(wsp.alloc(pl->h.workspace));
    float alpha = d->alpha, beta = 0.f;
    int s = ((lt_matmul_t)lt->fn[LT_MATMUL])(lt->handle, k.desc, &alpha, d->wq, k.la, d->aq, k.lb, &beta, d->wq, k.lc, d->d,
                                             k.lc, &pl->h.algo, wsp.ptr, pl->h.workspace, st);
    if (s == LT_STATUS_INVALID_VALUE || s == LT_STATUS_NOT_SUPPORTED || s == LT_STATUS_ARCH_MISMATCH) {
        /* refused before launching (cublasLt.h: a scale pointer set for a combination the library
         * does not support fails the matmul, not the heuristic) */
        pl->ok = 0;
        return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: cublasLtMatmul fp8 refused (status %d, %lld x %lld x %lld, scales %d)", s,
                                 (long long)M, (long long)N, (long long)K, d->scales);
    }
    if (s != 0)
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "gemm q: cublasLtMatmul fp8 status %d (%lld x %lld x %lld)", s, (long long)M,
                                 (long long)N, (long long)K);
    return FPK_OK;
}

int fpk_vendor_has_fp8_lt(fpk_gpu_ctx *c) { return c->blaslt.handle != NULL; }

static void lt_open(fpk_gpu_ctx *c, const char *dir) {
    fpk_vendor_blaslt *lt = &c->blaslt;
    lt->dl = open_first(lt_names, dir, lt->library, sizeof lt->library);
    if (lt->dl && resolve(lt->dl, lt_syms, lt->fn) && ((lt_pref_create_t)lt->fn[LT_CREATE])(&lt->handle) == 0) return;
    if (lt->dl) dlclose(lt->dl);
    lt->dl = NULL;
    lt->handle = NULL;
}

static void lt_close(fpk_gpu_ctx *c) {
    fpk_vendor_blaslt *lt = &c->blaslt;
    while (lt->plans) {
        struct fpk_lt_plan *n = lt->plans->next;
        free(lt->plans);
        lt->plans = n;
    }
    if (lt->handle) ((lt_h_t)lt->fn[LT_DESTROY])(lt->handle);
    if (lt->dl) dlclose(lt->dl);
}

static int cudnn_type(int dt) { return dt == FPK_F32 ? FPK_CUDNN_DATA_FLOAT : dt == FPK_F16 ? FPK_CUDNN_DATA_HALF : FPK_CUDNN_DATA_BFLOAT16; }

/* cuDNN descriptors of one conv, destroyed with the object. */
struct cudnn_descs {
    fpk_vendor_dnn *d;
    void *x = nullptr, *w = nullptr, *y = nullptr, *conv = nullptr;
    explicit cudnn_descs(fpk_vendor_dnn *dd) : d(dd) {}
    ~cudnn_descs() {
        if (x) ((fn_h)d->fn[D_DT])(x);
        if (y) ((fn_h)d->fn[D_DT])(y);
        if (w) ((fn_h)d->fn[D_DF])(w);
        if (conv) ((fn_h)d->fn[D_DC])(conv);
    }
};

static fpk_status dnn_fail(fpk_vendor_dnn *d, int s, const char *what) {
    const char *msg = d->fn[D_ERRSTR] ? ((fn_err)d->fn[D_ERRSTR])(s) : "?";
    return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: cuDNN %s: %s (%d)", what, msg, s);
}

#define DNN(call, what)                                                                        \
    do {                                                                                        \
        int s_ = (call);                                                                        \
        if (s_ != 0) return dnn_fail(d, s_, what);                                              \
    } while (0)

/* Element strides of a tensor with dims [N, C, D, H, W]: contiguous NCDHW, or NDHWC. */
static void cudnn_strides(const int *dims, int nhwc, int *st) {
    if (!nhwc) {
        st[4] = 1;
        for (int i = 3; i >= 0; i--) st[i] = st[i + 1] * dims[i + 1];
        return;
    }
    st[1] = 1;
    st[4] = dims[1];
    st[3] = st[4] * dims[4];
    st[2] = st[3] * dims[3];
    st[0] = st[2] * dims[2];
}

fpk_status fpk_vendor_conv(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int tuned, int dt, int nhwc,
                           const int *xdims, const void *x, const int *wdims, const void *w, const int *ydims, void *y,
                           const fpk_conv3d_params *p) {
    fpk_vendor_dnn *d = &c->dnn;
    if (!d->handle) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: cuDNN not loaded");
    DNN(((fn_hs)d->fn[D_SET_STREAM])(d->handle, st), "set stream");
    int ty = cudnn_type(dt), key = dt | (nhwc ? FPK_CONV_KEY_NHWC : 0);
    cudnn_descs ds(d);
    int xs[5], ys[5];
    cudnn_strides(xdims, nhwc, xs);
    cudnn_strides(ydims, nhwc, ys);
    DNN(((fn_hp)d->fn[D_CT])(&ds.x), "create descriptor");
    DNN(((fn_st)d->fn[D_ST])(ds.x, ty, 5, xdims, xs), "x descriptor");
    DNN(((fn_hp)d->fn[D_CT])(&ds.y), "create descriptor");
    DNN(((fn_st)d->fn[D_ST])(ds.y, ty, 5, ydims, ys), "y descriptor");
    DNN(((fn_hp)d->fn[D_CF])(&ds.w), "create descriptor");
    DNN(((fn_sf)d->fn[D_SF])(ds.w, ty, nhwc ? FPK_CUDNN_TENSOR_NHWC : FPK_CUDNN_TENSOR_NCHW, 5, wdims), "w descriptor");
    DNN(((fn_hp)d->fn[D_CC])(&ds.conv), "create descriptor");
    int pad[3], str[3], dil[3] = {1, 1, 1};
    for (int i = 0; i < 3; i++) {
        pad[i] = (int)p->padding[i];
        str[i] = (int)(p->stride[i] ? p->stride[i] : 1);
    }
    DNN(((fn_sc)d->fn[D_SC])(ds.conv, 3, pad, str, dil, FPK_CUDNN_CROSS_CORRELATION, FPK_CUDNN_DATA_FLOAT), "conv descriptor");
    DNN(((fn_hi)d->fn[D_GC])(ds.conv, (int)(p->groups ? p->groups : 1)), "group count");
    /* f32 stays f32: FMA math forbids TF32 (cuDNN's default allows it on Ampere and later) */
    int math = dt == FPK_F32 ? FPK_CUDNN_FMA_MATH : FPK_CUDNN_TENSOR_OP_MATH;
    DNN(((fn_hi)d->fn[D_MC])(ds.conv, math), "math type");
    struct fpk_conv_algo *a = algo_find(d, tuned, key, xdims, wdims, ydims, p);
    if (a && a->from_db && a->ws) {
        /* found in another process, maybe under a larger cap: when its workspace does not fit
         * now, Find again within what does (the new choice is found first from then on) */
        fpk_scratch probe(sf);
        a->from_db = 0;
        if (probe.alloc(a->ws) != FPK_OK) a = NULL;
    }
    if (!a) {
        cudnnConvolutionFwdAlgoPerf_t perf[8];
        int got = 0, pick = -1;
        if (tuned) {
            fpk_scratch ws(sf);
            size_t io = 0, xn = 1, yn = 1;
            for (int i = 0; i < 5; i++) xn *= (size_t)xdims[i], yn *= (size_t)ydims[i];
            io = (xn + yn) * fpk_dt_size(dt);
            size_t wsz = find_workspace(ws, find_workspace_want(io, nhwc));
            DNN(((fn_find)d->fn[D_FIND])(d->handle, ds.x, x, ds.w, w, ds.conv, ds.y, y, 8, &got, perf, ws.ptr, wsz),
                "FindConvolutionForwardAlgorithmEx");
            for (int i = 0; i < got && pick < 0; i++)
                if (perf[i].status == 0 && perf[i].memory <= wsz && (dt != FPK_F32 || perf[i].mathType != FPK_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) pick = i;
        } else {
            DNN(((fn_v7)d->fn[D_V7])(d->handle, ds.x, ds.w, ds.conv, ds.y, 8, &got, perf),
                "GetConvolutionForwardAlgorithm_v7");
            for (int i = 0; i < got && pick < 0; i++)
                if (perf[i].status == 0 && (dt != FPK_F32 || perf[i].mathType != FPK_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) pick = i;
        }
        if (pick < 0) return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: cuDNN offers no algorithm for this shape");
        size_t need = 0;
        if (dt != FPK_F32) DNN(((fn_hi)d->fn[D_MC])(ds.conv, perf[pick].mathType), "math type");
        DNN(((fn_ws)d->fn[D_WS])(d->handle, ds.x, ds.w, ds.conv, ds.y, perf[pick].algo, &need), "workspace size");
        a = algo_add(d, tuned, key, xdims, wdims, ydims, p);
        if (!a) return fpk_gpu_set_oom(sizeof *a, 0, "host conv algo record");
        a->algo = perf[pick].algo;
        a->math = dt == FPK_F32 ? FPK_CUDNN_FMA_MATH : perf[pick].mathType;
        a->ws = need;
        if (tuned) find_db_append(c, a);
    }
    DNN(((fn_hi)d->fn[D_MC])(ds.conv, a->math), "math type");
    fpk_scratch ws(sf);
    if (a->ws) FPK_TRY(ws.alloc(a->ws));
    float alpha = 1.0f, beta = 0.0f;
    DNN(((fn_fwd)d->fn[D_FWD])(d->handle, &alpha, ds.x, x, ds.w, w, ds.conv, a->algo, ws.ptr, a->ws, &beta, ds.y, y),
        "ConvolutionForward");
    return fpk_gpu_launched("conv3d (cuDNN)");
}

#else /* FPK_VENDOR_ROCM */
/* =====================================================================================
 * ROCm: rocBLAS (gemm_strided_batched_ex, f32 compute) and MIOpen (Find, immediate mode).
 * ===================================================================================== */

enum { RB_OP_N = 111, RB_OP_T = 112, RB_F16 = 150, RB_F32 = 151, RB_BF16 = 168 };

typedef int (*rb_set_stream_t)(void *, hipStream_t);
typedef int (*rb_gemm_t)(void *, int, int, int, int, int, const void *, const void *, int, int, int64_t, const void *,
                         int, int, int64_t, const void *, const void *, int, int, int64_t, void *, int, int, int64_t,
                         int, int, int, int32_t, uint32_t);
static const char *const blas_syms[] = {"rocblas_create_handle", "rocblas_destroy_handle", "rocblas_set_stream",
                                        "rocblas_gemm_strided_batched_ex", NULL};
static const char *const blas_names[] = {"librocblas.so.5", "librocblas.so.4", "librocblas.so.3", "librocblas.so.0", NULL};

enum { MIO_HALF = 0, MIO_FLOAT = 1, MIO_BF16 = 5, MIO_CONV = 0 };

typedef struct {
    int fwd_algo;
    float time;
    size_t memory;
} miopenConvAlgoPerf_t;

typedef struct {
    float time;
    size_t workspace_size;
    uint64_t solution_id;
    int algorithm;
} miopenConvSolution_t;

enum {
    M_CREATE, M_DESTROY, M_SET_STREAM, M_ERRSTR, M_CT, M_ST, M_DT, M_CC, M_INIT, M_GC, M_DC,
    M_WS, M_FIND, M_FWD, M_SOLCOUNT, M_SOL, M_COMPILE, M_IMMED, M_N
};
static const char *const dnn_syms[] = {
    "miopenCreate", "miopenDestroy", "miopenSetStream", "miopenGetErrorString",
    "miopenCreateTensorDescriptor", "miopenSetTensorDescriptor", "miopenDestroyTensorDescriptor",
    "miopenCreateConvolutionDescriptor", "miopenInitConvolutionNdDescriptor", "miopenSetConvolutionGroupCount",
    "miopenDestroyConvolutionDescriptor", "miopenConvolutionForwardGetWorkSpaceSize",
    "miopenFindConvolutionForwardAlgorithm", "miopenConvolutionForward",
    "miopenConvolutionForwardGetSolutionCount", "miopenConvolutionForwardGetSolution",
    "miopenConvolutionForwardCompileSolution", "miopenConvolutionForwardImmediate", NULL};
static const char *const dnn_names[] = {"libMIOpen.so.1", NULL};

typedef int (*m_h)(void *);
typedef int (*m_hp)(void **);
typedef int (*m_hs)(void *, hipStream_t);
typedef const char *(*m_err)(int);
typedef int (*m_st)(void *, int, int, const int *, const int *);
typedef int (*m_init)(void *, int, const int *, const int *, const int *, int);
typedef int (*m_gc)(void *, int);
typedef int (*m_ws)(void *, void *, void *, void *, void *, size_t *);
typedef int (*m_find)(void *, void *, const void *, void *, const void *, void *, void *, void *, int, int *,
                      miopenConvAlgoPerf_t *, void *, size_t, bool);
typedef int (*m_fwd)(void *, const void *, void *, const void *, void *, const void *, void *, int, const void *, void *,
                     void *, void *, size_t);
typedef int (*m_solcount)(void *, void *, void *, void *, void *, size_t *);
typedef int (*m_sol)(void *, void *, void *, void *, void *, size_t, size_t *, miopenConvSolution_t *);
typedef int (*m_compile)(void *, void *, void *, void *, void *, uint64_t);
typedef int (*m_immed)(void *, void *, const void *, void *, const void *, void *, void *, void *, void *, size_t,
                       uint64_t);

static int rb_type(int dt) { return dt == FPK_F32 ? RB_F32 : dt == FPK_F16 ? RB_F16 : dt == FPK_BF16 ? RB_BF16 : -1; }

/* hipBLASLt's epilogues are not wired yet: the GEMM then our bias and activation kernels. */
fpk_status fpk_vendor_gemm_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_desc *d) {
    (void)c, (void)st, (void)sf, (void)d;
    return FPK_ERR_UNAVAILABLE;
}
static void lt_open(fpk_gpu_ctx *c, const char *dir) { (void)c, (void)dir; }
static void lt_close(fpk_gpu_ctx *c) { (void)c; }
/* hipBLASLt's fp8 is not wired: CDNA3 runs our MFMA kernel (fpk_gpu_gemm_q_mma.cu). */
fpk_status fpk_vendor_gemm_fp8_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_fp8_gemm_desc *d) {
    (void)c, (void)st, (void)sf, (void)d;
    return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "gemm q: no fp8 vendor GEMM on ROCm here");
}
int fpk_vendor_has_fp8_lt(fpk_gpu_ctx *c) { (void)c; return 0; }

fpk_status fpk_vendor_gemm(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gemm_desc *d) {
    fpk_vendor_blas *b = &c->blas;
    if (!b->handle) return FPK_ERR_UNAVAILABLE;
    int at = rb_type(d->adt), bt = rb_type(d->bdt), ct = rb_type(d->cdt);
    if (at < 0 || bt < 0 || ct < 0 || d->adt != d->bdt || (ct != RB_F32 && d->cdt != d->adt)) return FPK_ERR_UNAVAILABLE;
    if (d->M > INT_MAX || d->N > INT_MAX || d->K > INT_MAX || d->batch > INT_MAX || d->lda > INT_MAX ||
        d->ldb > INT_MAX || d->ldc > INT_MAX)
        return FPK_ERR_UNAVAILABLE;
    ((rb_set_stream_t)b->fn[2])(b->handle, st);
    float alpha = d->alpha, beta = d->beta;
    int s = ((rb_gemm_t)b->fn[3])(b->handle, d->trans_b ? RB_OP_T : RB_OP_N, d->trans_a ? RB_OP_T : RB_OP_N, (int)d->N,
                                  (int)d->M, (int)d->K, &alpha, d->b, bt, (int)d->ldb, d->stride_b, d->a, at,
                                  (int)d->lda, d->stride_a, &beta, d->c, ct, (int)d->ldc, d->stride_c, d->c, ct,
                                  (int)d->ldc, d->stride_c, (int)d->batch, RB_F32, 0, 0, 0);
    if (s != 0)
        return fpk_gpu_set_error(FPK_ERR_BACKEND, "gemm: rocblas_gemm_strided_batched_ex status %d", s);
    return FPK_OK;
}

static int mio_type(int dt) { return dt == FPK_F32 ? MIO_FLOAT : dt == FPK_F16 ? MIO_HALF : MIO_BF16; }

struct mio_descs {
    fpk_vendor_dnn *d;
    void *x = nullptr, *w = nullptr, *y = nullptr, *conv = nullptr;
    explicit mio_descs(fpk_vendor_dnn *dd) : d(dd) {}
    ~mio_descs() {
        if (x) ((m_h)d->fn[M_DT])(x);
        if (y) ((m_h)d->fn[M_DT])(y);
        if (w) ((m_h)d->fn[M_DT])(w);
        if (conv) ((m_h)d->fn[M_DC])(conv);
    }
};

static fpk_status dnn_fail(fpk_vendor_dnn *d, int s, const char *what) {
    const char *msg = d->fn[M_ERRSTR] ? ((m_err)d->fn[M_ERRSTR])(s) : "?";
    return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: MIOpen %s: %s (%d)", what, msg, s);
}

#define DNN(call, what)                                                                        \
    do {                                                                                        \
        int s_ = (call);                                                                        \
        if (s_ != 0) return dnn_fail(d, s_, what);                                              \
    } while (0)

int fpk_vendor_conv_nhwc(fpk_gpu_ctx *, int) { return 0; }

fpk_status fpk_vendor_conv(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int tuned, int dt, int nhwc,
                           const int *xdims, const void *x, const int *wdims, const void *w, const int *ydims, void *y,
                           const fpk_conv3d_params *p) {
    fpk_vendor_dnn *d = &c->dnn;
    if (!d->handle) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: MIOpen not loaded");
    if (nhwc) return fpk_gpu_set_error(FPK_ERR_UNAVAILABLE, "conv3d: channels-last MIOpen convs are not used");
    DNN(((m_hs)d->fn[M_SET_STREAM])(d->handle, st), "set stream");
    int ty = mio_type(dt);
    mio_descs ds(d);
    int xs[5], ws_[5], ys[5];
    xs[4] = ws_[4] = ys[4] = 1;
    for (int i = 3; i >= 0; i--) {
        xs[i] = xs[i + 1] * xdims[i + 1];
        ws_[i] = ws_[i + 1] * wdims[i + 1];
        ys[i] = ys[i + 1] * ydims[i + 1];
    }
    DNN(((m_hp)d->fn[M_CT])(&ds.x), "create descriptor");
    DNN(((m_st)d->fn[M_ST])(ds.x, ty, 5, xdims, xs), "x descriptor");
    DNN(((m_hp)d->fn[M_CT])(&ds.w), "create descriptor");
    DNN(((m_st)d->fn[M_ST])(ds.w, ty, 5, wdims, ws_), "w descriptor");
    DNN(((m_hp)d->fn[M_CT])(&ds.y), "create descriptor");
    DNN(((m_st)d->fn[M_ST])(ds.y, ty, 5, ydims, ys), "y descriptor");
    DNN(((m_hp)d->fn[M_CC])(&ds.conv), "create descriptor");
    int pad[3], str[3], dil[3] = {1, 1, 1};
    for (int i = 0; i < 3; i++) {
        pad[i] = (int)p->padding[i];
        str[i] = (int)(p->stride[i] ? p->stride[i] : 1);
    }
    DNN(((m_init)d->fn[M_INIT])(ds.conv, 3, pad, str, dil, MIO_CONV), "conv descriptor");
    DNN(((m_gc)d->fn[M_GC])(ds.conv, (int)(p->groups ? p->groups : 1)), "group count");
    struct fpk_conv_algo *a = algo_find(d, tuned, dt, xdims, wdims, ydims, p);
    if (!a) {
        int algo = 0;
        uint64_t solution = 0;
        size_t wsz = 0;
        if (tuned) {
            size_t need = 0;
            DNN(((m_ws)d->fn[M_WS])(d->handle, ds.w, ds.x, ds.conv, ds.y, &need), "workspace size");
            fpk_scratch ws(sf);
            if (need) FPK_TRY(ws.alloc(need));
            miopenConvAlgoPerf_t perf[4];
            int got = 0;
            DNN(((m_find)d->fn[M_FIND])(d->handle, ds.x, x, ds.w, w, ds.conv, ds.y, y, 4, &got, perf, ws.ptr, need, false),
                "FindConvolutionForwardAlgorithm");
            if (got < 1) return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: MIOpen Find returned no algorithm");
            algo = perf[0].fwd_algo;
            wsz = perf[0].memory;
        } else {
            size_t count = 0;
            DNN(((m_solcount)d->fn[M_SOLCOUNT])(d->handle, ds.w, ds.x, ds.conv, ds.y, &count), "GetSolutionCount");
            if (count < 1) return fpk_gpu_set_error(FPK_ERR_BACKEND, "conv3d: MIOpen immediate mode has no solution");
            miopenConvSolution_t sol[8];
            DNN(((m_sol)d->fn[M_SOL])(d->handle, ds.w, ds.x, ds.conv, ds.y, count < 8 ? count : 8, &count, sol), "GetSolution");
            DNN(((m_compile)d->fn[M_COMPILE])(d->handle, ds.w, ds.x, ds.conv, ds.y, sol[0].solution_id), "CompileSolution");
            solution = sol[0].solution_id;
            wsz = sol[0].workspace_size;
        }
        a = algo_add(d, tuned, dt, xdims, wdims, ydims, p);
        if (!a) return fpk_gpu_set_oom(sizeof *a, 0, "host conv algo record");
        a->algo = algo;
        a->solution = solution;
        a->ws = wsz;
    }
    fpk_scratch ws(sf);
    if (a->ws) FPK_TRY(ws.alloc(a->ws));
    if (tuned) {
        float alpha = 1.0f, beta = 0.0f;
        DNN(((m_fwd)d->fn[M_FWD])(d->handle, &alpha, ds.x, x, ds.w, w, ds.conv, a->algo, &beta, ds.y, y, ws.ptr, a->ws),
            "ConvolutionForward");
    } else {
        DNN(((m_immed)d->fn[M_IMMED])(d->handle, ds.w, w, ds.x, x, ds.conv, ds.y, y, ws.ptr, a->ws, a->solution),
            "ConvolutionForwardImmediate");
    }
    return fpk_gpu_launched("conv3d (MIOpen)");
}
#endif

/* =====================================================================================
 * Shared by both vendors: every BLAS and DNN library's table starts with its create
 * (int (*)(void **)) and destroy (int (*)(void *)) functions.
 * ===================================================================================== */

typedef int (*vendor_create_t)(void **);
typedef int (*vendor_destroy_t)(void *);

/* Opens the first of names (looked up in dir first), resolves syms into fn and creates a handle
 * with fn[0]; on any failure *dl and *handle stay NULL and the library's tiers are unavailable. */
static void vendor_lib_open(const char *const *names, const char *const *syms, const char *dir, void **dl,
                            void **fn, void **handle, char *library, size_t n) {
    *dl = open_first(names, dir, library, n);
    if (*dl && resolve(*dl, syms, fn) && ((vendor_create_t)fn[0])(handle) == 0) return;
    if (*dl) dlclose(*dl);
    *dl = NULL;
    *handle = NULL;
}

void fpk_vendor_open(fpk_gpu_ctx *c) {
    char dir[PATH_MAX] = "";
    if (!fpk_gpu_cfg.no_blas_lib) {
        fpk_vendor_blas *b = &c->blas;
        vendor_lib_open(blas_names, blas_syms, "", &b->dl, b->fn, &b->handle, b->library, sizeof b->library);
        if (b->handle) dir_of(b->library, dir, sizeof dir); /* the DNN library from the same root */
        if (b->handle && !fpk_gpu_cfg.no_blaslt) lt_open(c, dir);
    }
    if (!fpk_gpu_cfg.no_dnn) {
        fpk_vendor_dnn *d = &c->dnn;
        vendor_lib_open(dnn_names, dnn_syms, dir, &d->dl, d->fn, &d->handle, d->library, sizeof d->library);
        fpk_vendor_sdpa_open(c);
#ifdef FPK_VENDOR_CUDA
        find_db_load(c);
#endif
    }
}

void fpk_vendor_close(fpk_gpu_ctx *c) {
    if (c->blas.handle) ((vendor_destroy_t)c->blas.fn[1])(c->blas.handle);
    if (c->blas.dl) dlclose(c->blas.dl);
    lt_close(c);
    fpk_vendor_sdpa_close(c);
    if (c->dnn.handle) ((vendor_destroy_t)c->dnn.fn[1])(c->dnn.handle);
    algos_free(&c->dnn);
    if (c->dnn.dl) dlclose(c->dnn.dl);
    memset(&c->blas, 0, sizeof c->blas);
    memset(&c->blaslt, 0, sizeof c->blaslt);
    memset(&c->dnn, 0, sizeof c->dnn);
}
