/*
 * fpk_gpu_internal.h — shared by the gpu backend's device code (C++, CUDA spelling): the context,
 * error mapping, launch helpers, scratch memory, and the vendor-library shims (fpk_gpu_vendor.cu).
 */
#ifndef FPK_GPU_INTERNAL_H
#define FPK_GPU_INTERNAL_H

#include "fpk_gpu_compat.h"
#include "fpk_gpu.h"
#include "fpk_scratch.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Which vendor libraries the shims load: cuBLAS/cuDNN (CUDA) or rocBLAS/MIOpen (ROCm). The
 * runtime spelling and the vendor set are separate switches so the CUDA shims can be
 * compile-checked with hipcc (make native-hip-check builds both). */
#if !defined(FPK_VENDOR_CUDA) && !defined(FPK_VENDOR_ROCM)
#ifdef FPK_HIP
#define FPK_VENDOR_ROCM 1
#else
#define FPK_VENDOR_CUDA 1
#endif
#endif

/* Row-major strided batched GEMM through the vendor BLAS:
 * C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] with op(A) [M, K], op(B) [K, N], C [M, N]. */
typedef struct fpk_gemm_desc {
    int trans_a, trans_b;
    int64_t M, N, K, batch;
    float alpha, beta;
    const void *a;
    int adt;
    int64_t lda, stride_a;
    const void *b;
    int bdt;
    int64_t ldb, stride_b;
    void *c;
    int cdt;
    int64_t ldc, stride_c;
    /* Epilogue for fpk_gpu_gemm (zero elsewhere): bias [N] (dtype bias_dt) or NULL, then
     * GELU(tanh) when gelu. When fused is set and the vendor's GEMM applied both (cuBLASLt),
     * *fused becomes 1; otherwise the caller adds them after the GEMM. */
    const void *bias;
    int bias_dt;
    int gelu;
    int *fused;
} fpk_gemm_desc;

/* The vendor BLAS (cuBLAS / rocBLAS), opened at backend creation; NULL handle = unavailable. */
typedef struct fpk_vendor_blas {
    void *dl;
    void *handle;
    char library[256];
    void *fn[8];
} fpk_vendor_blas;

/* The vendor BLAS's matmul with epilogues (cuBLASLt), opened beside the BLAS; NULL handle =
 * unavailable (fpk_gpu_cfg.no_blaslt disables it). plans caches the heuristic's choice per
 * shape (this process). */
typedef struct fpk_vendor_blaslt {
    void *dl;
    void *handle;
    char library[256];
    void *fn[16];
    struct fpk_lt_plan *plans;
} fpk_vendor_blaslt;

/* The vendor DNN library (cuDNN / MIOpen); NULL handle = unavailable. */
typedef struct fpk_vendor_dnn {
    void *dl;
    void *handle;
    char library[256];
    void *fn[32];
    struct fpk_conv_algo *algos; /* tuned / default choices per shape, this process */
    /* cuDNN 9's backend graph API (fpk_gpu_vendor_sdpa.cu): entry points, cudnnGetVersion, and
     * whether the vendor attention tier can run (graph != 0) */
    void *gfn[8];
    size_t version;
    int graph;
    struct fpk_sdpa_plan *plans; /* SDPA execution plans (and refusals) per shape, this process */
} fpk_vendor_dnn;

struct fpk_gpu_ctx {
    int device;
    cudaStream_t stream; /* the backend's default stream (ctx NULL in the core) */
    uint32_t flags;
    char name[128];
    char arch[64];
    uint64_t total_memory;
    int multiprocessors;
    int no_blas;      /* fpk_gpu_cfg.no_blas: own GEMM even where the vendor BLAS loaded */
    char find_db[512]; /* fpk_backend_config.find_db_path: the cuDNN find database ("" none) */
    pthread_mutex_t mu; /* op submission, see fpk_gpu_lock */
    struct fpk_small_cache *small; /* freed blocks under 1 MiB (fpk_gpu_device.cu) */
    fpk_vendor_blas blas;
    fpk_vendor_blaslt blaslt;
    fpk_vendor_dnn dnn;
};

/* The stream a slot should use: its own, or the backend's default when the core passes NULL. */
static inline cudaStream_t fpk_stream(fpk_gpu_ctx *c, void *s) {
    if (c->device) (void)cudaSetDevice(c->device); /* the current device is per OS thread */
    return s ? (cudaStream_t)s : c->stream;
}

/* Sets the thread's last error for a failed runtime call and returns the status it maps to
 * (out of memory, device lost for sticky errors, backend error otherwise). */
fpk_status fpk_gpu_error(cudaError_t e, const char *what);
/* A device self-check's runtime error (the matrix kernels' checks before first use): taken as
 * fpk_gpu_error does, and said in why; FPK_OK unless the device is lost, so the check disables
 * its path rather than failing the call. */
fpk_status fpk_gpu_check_error(cudaError_t e, const char *what, char *why, size_t nwhy);
/* ‖got − want‖ / ‖want‖ over n host floats (infinite when want is all zeros; NaN anywhere in got
 * makes it NaN, which fails any bound). */
double fpk_rel_l2_host(const float *got, const float *want, int64_t n);

/* Status of the launches just queued (a launch error or an earlier sticky one). */
fpk_status fpk_gpu_launched(const char *what);

#define FPK_TRY(expr)                                                                           \
    do {                                                                                        \
        fpk_status st_ = (expr);                                                                \
        if (st_ != FPK_OK) return st_;                                                          \
    } while (0)

#define FPK_CUDA(expr, what)                                                                    \
    do {                                                                                        \
        cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess) return fpk_gpu_error(e_, what);                                  \
    } while (0)

/* The backend's knobs for tests and benchmarks, read from the environment once per backend
 * (fpk_gpu_settings_load, called when a device opens) by fpk_gpu_settings.cu, the one file that
 * names the variables (internal/envconfig documents them). */
typedef struct fpk_gpu_settings {
    int no_blas;     /* the own GEMM kernel even where the vendor BLAS loaded */
    int no_blas_lib; /* the vendor BLAS is not opened */
    int no_blaslt;   /* cuBLASLt is not opened (bias and GELU run as separate ops) */
    int no_dnn;      /* the vendor DNN library is not opened */
    int64_t cudnn_workspace_bytes;      /* most workspace of an NCDHW cuDNN conv (8 GiB) */
    int64_t cudnn_nhwc_workspace_bytes; /* most workspace of a channels-last cuDNN conv (256 MiB) */
    int64_t cudnn_slab_bytes;           /* most bytes of one channels-last slab (1 GiB) */
    int cudnn_ncdhw;                    /* cuDNN convs in NCDHW instead of channels-last */
    int conv_fma;                       /* the own conv tier's FMA kernel, not the matrix-unit one */
    int conv_selfcheck_strict;          /* a matrix-unit conv path that failed its check fails */
    int conv_mma_warps, conv_mma_stages; /* the matrix-unit conv kernel's variant (4, 3) */
    int64_t attention_score_bytes;      /* most score bytes of the chunked attention (1 GiB) */
    int flash_fma;                      /* the flash attention's FMA kernel alone */
    int flash_selfcheck_strict;         /* a matrix-unit attention path that failed its check fails */
    int flash_warps, flash_stages;      /* the matrix flash kernel's variant at head dim 128 (8, 2) */
    const char *cuda_root, *rocm_root;  /* vendor library roots (NULL: the usual search) */
} fpk_gpu_settings;

extern fpk_gpu_settings fpk_gpu_cfg;
/* Reads the knobs into fpk_gpu_cfg (fpk_gpu_create calls it, so a test may set them before it
 * opens a backend). */
void fpk_gpu_settings_load(void);

/* Blocks for n elements with FPK_BLOCK threads, capped (kernels loop over the rest). */
static inline unsigned fpk_blocks(int64_t n) {
    int64_t b = (n + FPK_BLOCK - 1) / FPK_BLOCK;
    if (b < 1) b = 1;
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)b;
}

/* Device scratch memory charged to the cap; freed by its destructor (work queued on the one
 * stream before the free stays ordered before any reuse of the block). */
struct fpk_scratch {
    const fpk_gpu_scratch_fn *sf;
    void *ptr;
    size_t n;
    fpk_scratch(const fpk_gpu_scratch_fn *f) : sf(f), ptr(nullptr), n(0) {}
    fpk_status alloc(size_t bytes) {
        release();
        if (bytes == 0) bytes = 1;
        fpk_status st = sf->alloc(sf->owner, bytes, &ptr);
        if (st == FPK_OK) n = bytes;
        else ptr = nullptr;
        return st;
    }
    void release() {
        if (ptr) sf->free(sf->owner, ptr, n);
        ptr = nullptr;
        n = 0;
    }
    ~fpk_scratch() { release(); }
    fpk_scratch(const fpk_scratch &) = delete;
    fpk_scratch &operator=(const fpk_scratch &) = delete;
};

static inline size_t fpk_dt_size(int dt) { return fpk_dtype_bytes(dt); }

/* ---- shared kernels (fpk_gpu_ops.cu) -------------------------------------------------------- */

/* dst (dtype ddt) = src (dtype sdt), n elements, on stream st. */
fpk_status fpk_gpu_convert(cudaStream_t st, void *dst, int ddt, const void *src, int sdt, int64_t n);
/* y[r, j] += bias[j] for rows of length n (rows = total / n), or y[n, c, i] += bias[c] when
 * inner > 0 (channels of [N, C, inner]). */
fpk_status fpk_gpu_add_bias(cudaStream_t st, void *y, int ydt, const void *bias, int bdt, int64_t total,
                            int64_t n, int64_t inner);
/* Softmax of rows (length n) of s (f32) into p (dtype pdt; may alias s when f32), with an
 * optional u8 mask: row r = (batch entry e, row q) with e = r / rows_per_entry, mask element
 * mask[e*m_e + q*m_q + j*m_k]. Fully masked rows give zeros. */
fpk_status fpk_gpu_softmax_rows(cudaStream_t st, const float *s, void *p, int pdt, int64_t rows, int64_t n,
                                float scale, const uint8_t *mask, int64_t rows_per_entry, int64_t m_e,
                                int64_t m_q, int64_t m_k);

/* dst[o*dpitch + j] = src[o*spitch + j] for o < rows, j < width (elements of es bytes). */
fpk_status fpk_gpu_copy2d(cudaStream_t st, const void *src, int64_t spitch, void *dst, int64_t dpitch, int64_t rows,
                          int64_t width, size_t es);

/* ---- conv3d on the matrix units, channels-last (fpk_gpu_conv_mma.cu) ----------------------- */

/* y = conv3d of x with w, channels-last, no padding (x is already padded), no bias, one group:
 *   x [N][Tp][Hp][Wp][C]   (NDHWC, dtype dt)
 *   w [K][kT][kH][kW][C]   (dt)
 *   y [N][To][Ho][Wo][K]   (NDHWC, dt), To = (Tp - kT) / sT + 1 etc. (the caller passes them)
 * dt FPK_F16 or FPK_BF16, f32 accumulation, each output rounded once; nothing to do (M or K 0)
 * is FPK_OK. Runs on mma.sync (CUDA, compute capability 8.0+) or MFMA/WMMA (HIP, CDNA2/3 and
 * RDNA3 code objects), each self-checked on the device before its first use per dtype (one
 * stream sync). FPK_ERR_UNAVAILABLE, with the reason as the last error and nothing launched
 * but that first self-check, when the device has no matrix path or it failed its self-check,
 * fpk_gpu_cfg.conv_fma is set, or the call is not eligible: C not a multiple of 16; x, w or
 * y not 16-byte aligned; M = N·To·Ho·Wo or the reduction kT·kH·kW·C beyond 2^31 - 128; K
 * beyond 2^30; on HIP, more than 2^24 blocks (128 rows × 64 channels each). The caller then
 * runs k_conv3d. FPK_ERR_INVALID_ARGUMENT when an output window would read past x;
 * FPK_ERR_BACKEND when fpk_gpu_cfg.conv_selfcheck_strict is set and the path failed its self-check. */
fpk_status fpk_gpu_conv_ndhwc_mma(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int dt, int64_t N,
                                  int64_t C, int64_t Tp, int64_t Hp, int64_t Wp, const void *x, int64_t K, int64_t kT,
                                  int64_t kH, int64_t kW, const void *w, int64_t sT, int64_t sH, int64_t sW, int64_t To,
                                  int64_t Ho, int64_t Wo, void *y);
/* *ready: whether fpk_gpu_conv_ndhwc_mma has a path for dt on this device now (probed and
 * self-checked here on first use, as the conv itself would; fpk_gpu_cfg.conv_fma says no), so
 * the caller builds its slabs only for a kernel that will run. Errors as the conv's. */
fpk_status fpk_gpu_conv_mma_ready(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int dt, int *ready);

/* ---- GEMM (fpk_gpu_gemm.cu) ---------------------------------------------------------------- */

/* Row-major batched GEMM: vendor BLAS when loaded and the operand types fit, else our kernel.
 * Operands of different float types are converted into scratch first. */
fpk_status fpk_gpu_gemm_run(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf,
                            const fpk_gemm_desc *d);
/* Our own batched GEMM kernel (any float dtypes, f32 accumulation). */
fpk_status fpk_gpu_gemm_own(cudaStream_t st, const fpk_gemm_desc *d);
/* out[r][n0 + j] = GELU?(out[r][n0 + j] + bias[n0 + j]) for r < rows, j < nn, out of dtype odt with
 * row stride ldo, bias (dtype bdt) NULL for none, GELU(tanh) when gelu (fpk_gpu_gemm_q.cu). */
fpk_status fpk_gpu_bias_gelu_cols(cudaStream_t st, void *out, int odt, int64_t ldo, int64_t rows, int64_t n0, int64_t nn,
                                  const void *bias, int bdt, int gelu);

/* fpk_op_gemm_q with act_quant per tensor or per token: activations quantized to e4m3 and
 * fp8 × fp8 products on the matrix units (fpk_gpu_gemm_q_mma.cu). FPK_ERR_UNAVAILABLE, with the
 * reason as the last error, where the device or the call has no such path. */
fpk_status fpk_gpu_gemm_q_mma(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_q_params *p,
                              const fpk_gt *a, const fpk_gt *w, const fpk_gt *w_scale, const fpk_gt *bias,
                              const fpk_gt *out);

/* ---- vendor shims (fpk_gpu_vendor.cu) ----------------------------------------------------- */

void fpk_vendor_open(fpk_gpu_ctx *c);
void fpk_vendor_close(fpk_gpu_ctx *c);
/* FPK_ERR_UNAVAILABLE when there is no vendor BLAS or it lacks these types. */
fpk_status fpk_vendor_gemm(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gemm_desc *d);
/* d's GEMM with its epilogue (d->bias, d->gelu) in one vendor call (cuBLASLt's BIAS / GELU_BIAS
 * epilogues): one matrix (batch 1), a and b of one type, c f32 or that type.
 * FPK_ERR_UNAVAILABLE when the library is missing or declines the shape (the caller then runs
 * the GEMM and adds the epilogue itself). */
fpk_status fpk_vendor_gemm_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_desc *d);
/* How an fp8 product's operands are scaled (fpk_fp8_gemm_desc.scales). */
enum {
    FPK_FP8_SCALES_NONE = 0,   /* unit scales: d = q(a)·q(w)ᵀ */
    FPK_FP8_SCALES_SCALAR = 1, /* one scale each: sa[0], sw[0] */
    FPK_FP8_SCALES_OUTER = 2   /* a scale per row of a (sa [M]) and per row of w (sw [N]) */
};

/* One fp8 × fp8 product for cuBLASLt: d [M, N] (row stride N, dtype ddt: f32, f16 or bf16) =
 * epilogue(alpha · sa[m] · sw[n] · Σ_k aq[m][k] · wq[n][k] + bias[n]), aq [M, K] e4m3, wq [N, K]
 * e4m3 or e5m2 (wdt), f32 accumulation, each output rounded once. sa and sw are device f32 (as
 * scales says); bias [N] (bias_dt) or NULL, only with a 16-bit ddt (the fp8 kernels read their
 * bias in 16 bits); gelu: GELU(tanh) after the bias. */
typedef struct fpk_fp8_gemm_desc {
    int64_t M, N, K;
    const uint8_t *aq, *wq;
    int wdt;
    int scales;
    const float *sa, *sw;
    float alpha;
    const void *bias;
    int bias_dt;
    int gelu;
    void *d;
    int ddt;
} fpk_fp8_gemm_desc;

/* d's product through cuBLASLt's FP8 matmul (NVIDIA, compute capability 8.9+): the scales as
 * CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER (scalar, or the outer-vector mode of cuBLAS 12.9+),
 * the bias and GELU as its epilogue, d written in its own dtype. FPK_ERR_UNAVAILABLE with the
 * reason when the library, the device, the shape (K a multiple of 16, 16-byte aligned operands)
 * or the loaded cuBLASLt (an attribute, a mode or the combination refused, no algorithm) does not
 * allow it; nothing was launched then. */
fpk_status fpk_vendor_gemm_fp8_lt(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_fp8_gemm_desc *d);
/* Whether cuBLASLt loaded (the fp8 matmul's library). */
int fpk_vendor_has_fp8_lt(fpk_gpu_ctx *c);
/* Conv through the vendor DNN library: tuned (Find) or default (heuristic / immediate).
 * x, w, y share dtype dt and have 32-bit dims given as NCDHW (w: K C kT kH kW). They are
 * contiguous NCDHW, or with nhwc contiguous channels-last: x and y NDHWC, w K kT kH kW C
 * (only where fpk_vendor_conv_nhwc said yes). */
fpk_status fpk_vendor_conv(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, int tuned,
                           int dt, int nhwc, const int *xdims, const void *x, const int *wdims, const void *w,
                           const int *ydims, void *y, const fpk_conv3d_params *p);
/* Whether the vendor conv of dtype dt runs channels-last (the caller transposes around it):
 * cuDNN's matrix-unit 3-D kernels want NDHWC, and a conv handed NCDHW makes cuDNN transform
 * both tensors itself inside a workspace of twice their size. cuDNN and 16-bit dt only, unless
 * fpk_gpu_cfg.cudnn_ncdhw; MIOpen stays NCDHW (its NDHWC 3-D solvers are untested here). */
int fpk_vendor_conv_nhwc(fpk_gpu_ctx *c, int dt);
/* Whether the vendor DNN library loaded. */
int fpk_vendor_has_dnn(fpk_gpu_ctx *c);

/* One fused attention for the vendor tier (fpk_gpu_vendor_sdpa.cu): q [B, Lq, H, D],
 * k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv], o [B, Lq, H, Dv] through element strides (batch,
 * position, head; the head dim contiguous), all of dtype dt (FPK_BF16 or FPK_F16), f32
 * accumulation. seq_q and seq_kv: NULL, or device int32 [B] lengths of a padding mask (keys at or
 * past seq_kv[b] are masked; every length >= 1). */
typedef struct fpk_sdpa_desc {
    int64_t B, H, Hkv, Lq, Lk, D, Dv;
    int dt;
    const void *q, *k, *v;
    void *o;
    int64_t qs[3], ks[3], vs[3], os[3];
    float scale;
    const int32_t *seq_q, *seq_kv;
    int causal; /* query i attends to keys j <= i (cuDNN's top-left causal mask) */
} fpk_sdpa_desc;
/* Resolves the graph API from the DNN library fpk_vendor_open loaded (called by it). */
void fpk_vendor_sdpa_open(fpk_gpu_ctx *c);
/* Frees the cached plans (called by fpk_vendor_close before the library closes). */
void fpk_vendor_sdpa_close(fpk_gpu_ctx *c);
/* Whether the vendor attention tier can run: cuDNN 9 with its graph API (never on ROCm). */
int fpk_vendor_has_sdpa(fpk_gpu_ctx *c);
/* Runs sd through cuDNN's fused SDPA: FPK_ERR_UNAVAILABLE when cuDNN is missing, too old or
 * refuses this graph (the reason in the last error), a backend error when execution fails. */
fpk_status fpk_vendor_sdpa(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_sdpa_desc *sd);

#endif /* FPK_GPU_INTERNAL_H */
