/*
 * fpk.h — the C ABI of the framepackd native tensor runtime.
 *
 * One ABI for every backend: cpu (built in), and cuda and hip (shared libraries, dlopen'ed by
 * fpk_backend_open).
 * Rules:
 *   - Opaque handles only: fpk_backend_t (one device of one backend library), fpk_stream_t
 *     (an ordered queue of work on that device), fpk_tensor_t (an n-d array in the backend's
 *     memory). The structs live in a private header.
 *   - Names read lib_object_verb. Every object has a _free.
 *   - Every call that can fail returns fpk_status and, on failure, sets a thread-local
 *     last-error (fpk_last_error, fpk_last_error_info). Nothing aborts on misuse.
 *   - Tensors are contiguous (row-major) and live in backend memory; data moves only through
 *     fpk_tensor_upload / fpk_tensor_download (which convert between storage dtypes).
 *   - Ops write into an output tensor the caller allocated with the right shape and dtype;
 *     the op checks shapes and dtypes and fails with FPK_ERR_INVALID_ARGUMENT otherwise.
 *   - Every allocation (tensors and backend scratch) counts against the backend's memory cap;
 *     going over fails with FPK_ERR_OUT_OF_MEMORY and the requested and available sizes.
 *     Freed large blocks are cached for reuse within the cap (fpk_backend_trim gives them back).
 */
#ifndef FPK_H
#define FPK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the backend function table; a backend library built for another version is refused.
 * 2: the rope_mode slot (after rope).
 * 3: one rope slot with a mode (the interleaved-only rope slot is gone).
 * 4: fpk_attention_params gained layout and tier.
 * 5: events (fpk_event_*, fpk_stream_wait_event) and fpk_tensor_upload_async, with their
 *    optional backend slots after the version-4 ones.
 * 6: fpk_op_ternary (fused three-operand elementwise: AdaLN modulate, gate + residual), its
 *    optional backend slot after the version-5 ones.
 * 7: fpk_op_group_norm_act (group norm and an activation in one pass) and
 *    fpk_op_upsample_pad (nearest upsampling and replicate padding in one pass), their optional
 *    backend slots after the version-6 one.
 * 8: fpk_op_rms_norm_rope (its optional slot after the version-7 ones),
 *    fpk_gemm_params.epilogue (bias + GELU(tanh) fused into the GEMM) and
 *    fpk_attention_params.causal.
 * 9: fpk_conv3d_params.upsample, replicate_before and replicate_after (the conv reads its input
 *    through nearest upsampling and replicate padding without a padded copy where it can).
 * 10: the 8-bit float dtypes FPK_F8E4M3 and FPK_F8E5M2 and fpk_op_gemm_q (a GEMM with an 8-bit
 *    float weight and its scales), its optional slot after the version-8 one.
 * 11: fpk_backend_config.find_db_path (the cuDNN find database, which the backend read from the
 *    environment before). */
#define FPK_API_VERSION 11

/* Most dimensions a tensor may have. */
#define FPK_MAX_DIMS 8

typedef struct fpk_backend *fpk_backend_t;
typedef struct fpk_stream *fpk_stream_t;
typedef struct fpk_event *fpk_event_t;
typedef struct fpk_tensor *fpk_tensor_t;

/* Status codes. */
typedef enum fpk_status {
    FPK_OK = 0,
    FPK_ERR_INVALID_ARGUMENT = 1, /* bad shape, dtype, parameter or handle */
    FPK_ERR_OUT_OF_MEMORY = 2,    /* allocation over the memory cap or refused by the device */
    FPK_ERR_UNSUPPORTED = 3,      /* op or dtype not implemented by this backend */
    FPK_ERR_UNAVAILABLE = 4,      /* a conv tier or vendor library this backend does not have */
    FPK_ERR_BACKEND = 5,          /* a vendor library call failed */
    FPK_ERR_DEVICE_LOST = 6,      /* the device stopped answering; the process should exit */
    FPK_ERR_INTERNAL = 7          /* a bug in the runtime */
} fpk_status;

/* Element types. F16/BF16 are storage types; the cpu backend computes in F32. The 8-bit float
 * types are PyTorch's float8_e4m3fn and float8_e5m2 (src/fpk_dtype.h has every conversion): weight
 * storage, read by fpk_op_gemm_q and converted by upload, download and copy. */
typedef enum fpk_dtype {
    FPK_F32 = 0,
    FPK_F16 = 1,
    FPK_BF16 = 2,
    FPK_U8 = 3,     /* bytes; boolean masks (nonzero = keep) */
    FPK_I32 = 4,    /* indices (token ids) */
    FPK_F8E4M3 = 5, /* float8_e4m3fn: no infinities, largest 448 */
    FPK_F8E5M2 = 6  /* float8_e5m2: the top byte of an f16, largest 57344 */
} fpk_dtype;

/* Size of one element of dtype in bytes, 0 for an unknown dtype. */
size_t fpk_dtype_size(fpk_dtype dtype);

/* ---- errors ---------------------------------------------------------------------------- */

/* Details of the last failed call on this thread. */
typedef struct fpk_error_info {
    fpk_status status;
    uint64_t requested; /* FPK_ERR_OUT_OF_MEMORY: bytes asked for */
    uint64_t available; /* FPK_ERR_OUT_OF_MEMORY: bytes left under the cap (or on the device) */
    char message[512];
} fpk_error_info;

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
const char *fpk_last_error(void);
/* Copies the last error of this thread into *out. */
void fpk_last_error_info(fpk_error_info *out);
/* Clears the last error of this thread. */
void fpk_clear_error(void);
/* Name of a status code ("out of memory"). */
const char *fpk_status_name(fpk_status status);

/* ---- backends -------------------------------------------------------------------------- */

/* Fill every newly allocated tensor with NaN (integers with 0xff) so unwritten elements show. */
#define FPK_BACKEND_FLAG_POISON 1u
/* Test only: the cpu backend reports its own conv tier as unavailable, so the core's
 * host round-trip path (download, cpu conv, upload) serves the CPU tier as on a GPU. */
#define FPK_BACKEND_FLAG_TEST_HOST_BOUNCE 2u

/* Configuration of a backend instance. Zero values mean defaults. */
typedef struct fpk_backend_config {
    int device;          /* device index (0 for cpu) */
    int threads;         /* worker threads for own loops and BLAS; 0 = every online core */
    uint64_t memory_cap; /* bytes; 0 = unlimited */
    uint32_t flags;      /* FPK_BACKEND_FLAG_* */
    uint64_t cache_limit;/* most bytes of freed blocks kept for reuse; 0 = min(1 GiB, cap/4) */
    /* PCI bus id of the GPU to open ("0000:65:00.0"); when set, a GPU backend opens the device
     * with this bus id and device is ignored, so a lane drives the GPU the driver's tools name
     * by that id even where the runtime numbers devices differently. "" = by index. */
    char pci_bus_id[32];
    /* The cuDNN find database: a text file shared by the workers where the cuda backend keeps
     * the algorithm FindEx chose per conv shape, read when cuDNN opens and appended to after a
     * Find, so a later worker skips the benchmark. "" = none (Find results live in the process). */
    char find_db_path[512];
} fpk_backend_config;

/* Conv tiers, in chain order. A backend reports which it has in fpk_backend_props.conv_tiers. */
typedef enum fpk_conv_tier {
    FPK_CONV_TIER_VENDOR_TUNED = 0,   /* MIOpen Find / cuDNN FindEx */
    FPK_CONV_TIER_VENDOR_DEFAULT = 1, /* MIOpen immediate mode / cuDNN heuristics */
    FPK_CONV_TIER_OWN_KERNEL = 2,     /* our own GPU kernel */
    FPK_CONV_TIER_CPU = 3,            /* OpenBLAS im2col + GEMM on the host */
    FPK_CONV_TIER_COUNT = 4
} fpk_conv_tier;

/* Properties of a backend instance. */
typedef struct fpk_backend_props {
    char name[32];         /* "cpu", "cuda", "hip" */
    char device_name[128]; /* e.g. the CPU model or GPU name */
    int device;
    int api_version;
    int is_host;           /* tensors are plain host memory */
    int threads;
    uint32_t conv_tiers;   /* bit (1 << tier) for each tier this backend has (CPU always) */
    uint64_t device_memory;/* total device memory in bytes (0 if unknown) */
} fpk_backend_props;

/* Memory accounting of a backend instance. */
typedef struct fpk_memory_stats {
    uint64_t cap;       /* 0 = unlimited */
    uint64_t allocated; /* bytes held now (tensors + scratch), as charged (large blocks are
                           rounded up to 64 KiB) */
    uint64_t cached;    /* freed blocks kept for reuse; allocated + cached <= cap */
    uint64_t peak;      /* most bytes held at once */
    uint64_t allocs;    /* number of allocations so far */
    uint64_t live_tensors;
} fpk_memory_stats;

/* Creates the cpu backend. */
fpk_status fpk_backend_new_cpu(const fpk_backend_config *config, fpk_backend_t *out);
/* Opens a backend library (libfpk-cuda.so, libfpk-hip.so) with dlopen and creates its backend
 * for config->device. A library that is missing, lacks the entry point or was built for another
 * FPK_API_VERSION fails with FPK_ERR_UNAVAILABLE / FPK_ERR_UNSUPPORTED, never a crash. */
fpk_status fpk_backend_open(const char *library_path, const fpk_backend_config *config,
                            fpk_backend_t *out);
/* Frees a backend. Every tensor and stream of it must have been freed first (else
 * FPK_ERR_INVALID_ARGUMENT and nothing is freed). */
fpk_status fpk_backend_free(fpk_backend_t backend);
/* Name of the backend ("cpu"). */
const char *fpk_backend_name(fpk_backend_t backend);
fpk_status fpk_backend_get_props(fpk_backend_t backend, fpk_backend_props *out);
fpk_status fpk_backend_get_memory(fpk_backend_t backend, fpk_memory_stats *out);
/* Changes the memory cap (0 = unlimited). Lowering it below what is held is allowed; the
 * next allocation then fails. */
fpk_status fpk_backend_set_memory_cap(fpk_backend_t backend, uint64_t cap);
/* Gives every cached free block back to the system (or the device). */
fpk_status fpk_backend_trim(fpk_backend_t backend);
/* Resets the peak to what is allocated now. */
fpk_status fpk_backend_reset_peak(fpk_backend_t backend);
/* Pins n bytes of host memory at ptr (page-locked, registered with the device) so uploads
 * and downloads from it run at DMA speed; a no-op on host backends. Unregister before the
 * memory is unmapped. */
fpk_status fpk_backend_host_register(fpk_backend_t backend, void *ptr, size_t n);
fpk_status fpk_backend_host_unregister(fpk_backend_t backend, void *ptr);
/* Free and total device memory as the driver reports them (cudaMemGetInfo / hipMemGetInfo);
 * FPK_ERR_UNSUPPORTED on host backends. */
fpk_status fpk_backend_get_device_memory(fpk_backend_t backend, uint64_t *free_bytes,
                                         uint64_t *total_bytes);

/* ---- streams --------------------------------------------------------------------------- */

/* The backend's default stream (owned by the backend; never freed by the caller). */
fpk_stream_t fpk_backend_get_default_stream(fpk_backend_t backend);
fpk_status fpk_stream_new(fpk_backend_t backend, fpk_stream_t *out);
fpk_status fpk_stream_free(fpk_stream_t stream);
/* Waits until every queued operation of the stream has finished. */
fpk_status fpk_stream_synchronize(fpk_stream_t stream);

/* ---- events (API version 5) ------------------------------------------------------------ */
/* An event marks a point in a stream's work: fpk_event_record places it after the work queued
 * so far; fpk_stream_wait_event makes later work of another stream wait for it (the host does
 * not wait); fpk_event_synchronize makes the host wait. A backend whose streams run
 * synchronously (cpu) has nothing to order: its events are complete as soon as recorded. Used to
 * copy a streamed block into one device slot on a copy stream while compute reads the other. */
fpk_status fpk_event_new(fpk_backend_t backend, fpk_event_t *out);
fpk_status fpk_event_free(fpk_event_t event);
fpk_status fpk_event_record(fpk_event_t event, fpk_stream_t stream);
fpk_status fpk_stream_wait_event(fpk_stream_t stream, fpk_event_t event);
fpk_status fpk_event_synchronize(fpk_event_t event);

/* ---- tensors --------------------------------------------------------------------------- */

/* Allocates a contiguous tensor (contents undefined, or NaN with FPK_BACKEND_FLAG_POISON). */
fpk_status fpk_tensor_new(fpk_backend_t backend, fpk_dtype dtype, int ndim, const int64_t *shape,
                          fpk_tensor_t *out);
/* A new handle on the same storage with another shape of the same element count (a reshape).
 * Storage is freed when its last handle is freed. */
fpk_status fpk_tensor_reshape(fpk_tensor_t src, int ndim, const int64_t *shape, fpk_tensor_t *out);
/* Frees a handle (NULL is a no-op). */
void fpk_tensor_free(fpk_tensor_t tensor);
fpk_dtype fpk_tensor_dtype(fpk_tensor_t tensor);
int fpk_tensor_ndim(fpk_tensor_t tensor);
int64_t fpk_tensor_dim(fpk_tensor_t tensor, int i);
int64_t fpk_tensor_numel(fpk_tensor_t tensor);
size_t fpk_tensor_nbytes(fpk_tensor_t tensor);
fpk_backend_t fpk_tensor_backend(fpk_tensor_t tensor);
/* Host pointer to the data when the backend is host memory (cpu), NULL otherwise. */
void *fpk_tensor_host_data(fpk_tensor_t tensor);

/* Copies host data of src_dtype (nbytes = numel * size(src_dtype)) into the tensor, converting
 * to the tensor's dtype (float types convert exactly where representable, round to nearest even
 * otherwise). The host buffer may be reused when the call returns. */
fpk_status fpk_tensor_upload(fpk_stream_t stream, fpk_tensor_t dst, fpk_dtype src_dtype,
                             const void *src, size_t nbytes);
/* Copies nbytes of host data already in the tensor's dtype (no conversion) into the tensor and
 * returns without waiting for the copy (API version 5): src must stay valid and unchanged until
 * the stream has passed the copy (record an event after it). From memory pinned with
 * fpk_backend_host_register a GPU copies by DMA, overlapping other streams' work; on cpu, and on
 * a backend without the async slot, this is fpk_tensor_upload (complete on return). */
fpk_status fpk_tensor_upload_async(fpk_stream_t stream, fpk_tensor_t dst, const void *src,
                                   size_t nbytes);
/* Copies the tensor to host memory as dst_dtype (nbytes = numel * size(dst_dtype)). Waits for
 * the stream. */
fpk_status fpk_tensor_download(fpk_stream_t stream, fpk_tensor_t src, fpk_dtype dst_dtype,
                               void *dst, size_t nbytes);
/* Sets every element to value (converted to the tensor's dtype). */
fpk_status fpk_tensor_fill(fpk_stream_t stream, fpk_tensor_t tensor, double value);

/* ---- ops ------------------------------------------------------------------------------- */
/* All ops: inputs first, output last; out must be allocated by the caller with the documented
 * shape. Compute dtype is F32 on the cpu backend: float inputs and outputs must be F32 there
 * unless the op says otherwise. Optional tensors may be NULL. */

/* out = alpha * op(a) @ op(b) (+ bias). a: [batch, M, K] ([batch, K, M] if trans_a);
 * b: [batch or 1, K, N] ([.., N, K] if trans_b); bias: [N] or NULL; out: [batch, M, N].
 * Leading dims of a and out may be any number of dims that multiply to batch, and b may have
 * rank 2 (shared by every batch); the last two dims are the matrix.
 * On the cpu backend b (the weight) may be F16 or BF16 with a, bias and out F32: b is widened to
 * f32 a panel at a time into bounded scratch (fp32 accumulation, the f32 path's results). */
/* What the GEMM applies to its result after the bias (API version 6): nothing, or GELU(tanh)
 * (FPK_UNARY_GELU_TANH's formula; the feed-forward's Linear + GELU in one op: cuBLASLt's
 * GELU_BIAS epilogue on CUDA, the GEMM then an in-place activation elsewhere). */
typedef enum fpk_gemm_epilogue {
    FPK_GEMM_EPILOGUE_NONE = 0,
    FPK_GEMM_EPILOGUE_GELU_TANH = 1,
    FPK_GEMM_EPILOGUE_COUNT = 2
} fpk_gemm_epilogue;
typedef struct fpk_gemm_params {
    int trans_a;
    int trans_b;
    float alpha;      /* 0 means 1 */
    int32_t epilogue; /* fpk_gemm_epilogue (0: none) */
} fpk_gemm_params;
fpk_status fpk_op_gemm(fpk_stream_t stream, const fpk_gemm_params *params, fpk_tensor_t a,
                       fpk_tensor_t b, fpk_tensor_t bias, fpk_tensor_t out);

/* A GEMM with an 8-bit float weight (API version 10): a Linear whose weight is stored in
 * FPK_F8E4M3 or FPK_F8E5M2 with scales. out = alpha · a · dequant(w)ᵀ (+ bias), then the epilogue,
 * where dequant(w)[n][k] = w[n][k] · w_scale[r][k / (K / NB)] with r = n (w_scale [N, NB]) or 0
 * (w_scale [1, NB]); w_scale NULL means 1. So a per-tensor scale is [1, 1], a per-output-channel
 * one [N, 1] and a block-wise one [N, K/block] (the block divides K).
 * a: [batch..., M, K] (f32, f16 or bf16), w: [N, K] fp8, w_scale: F32 or NULL, bias: [N] or NULL
 * (a's dtype or f32), out: [batch..., M, N] in a's dtype.
 *
 * act_quant says how the product is computed:
 *   FPK_ACT_QUANT_NONE   weight-only: the weight is widened (and scaled) where the GEMM loads its
 *                        tiles, never as a copy of the whole weight; the product in f32.
 *   FPK_ACT_QUANT_TENSOR a is quantized to e4m3 with one scale, s_a = max|a| / 448 (1 for an all
 *                        zero a), the product is q(a)·q(w) in f32 times s_a and the weight's scale:
 *                        fp8 × fp8 on the matrix units where the device has them.
 *   FPK_ACT_QUANT_TOKEN  the same with one scale per row of a (per token).
 * A backend without a path for an act_quant answers FPK_ERR_UNAVAILABLE (the runtime then falls
 * back to weight-only); the cpu backend computes every mode (the reference the GPU paths are
 * checked against). */
typedef enum fpk_act_quant {
    FPK_ACT_QUANT_NONE = 0,
    FPK_ACT_QUANT_TENSOR = 1,
    FPK_ACT_QUANT_TOKEN = 2,
    FPK_ACT_QUANT_COUNT = 3
} fpk_act_quant;
typedef struct fpk_gemm_q_params {
    float alpha;       /* 0 means 1 */
    int32_t epilogue;  /* fpk_gemm_epilogue */
    int32_t act_quant; /* fpk_act_quant */
} fpk_gemm_q_params;
fpk_status fpk_op_gemm_q(fpk_stream_t stream, const fpk_gemm_q_params *params, fpk_tensor_t a,
                         fpk_tensor_t w, fpk_tensor_t w_scale, fpk_tensor_t bias, fpk_tensor_t out);

/* 3-D convolution, cross-correlation as in PyTorch. x: [N, Cin, T, H, W];
 * w: [Cout, Cin/groups, kT, kH, kW]; bias: [Cout] or NULL;
 * out: [N, Cout, (T'+2pT-kT)/sT+1, (H'+2pH-kH)/sH+1, (W'+2pW-kW)/sW+1]. Zero padding.
 * T', H', W' are the input's dims as the conv reads it: x upsampled (nearest) by `upsample`,
 * then replicate padded by replicate_before/after (T' = bT + uT*T + aT; with none, x's dims):
 * the VAE's causal convs (replicate padding) and its upsamplers' convs, read in place where
 * the backend can (the gpu backend's channels-last path and own kernel). A backend that cannot
 * for a call answers FPK_ERR_UNSUPPORTED and the core makes that tensor (fpk_op_upsample_pad)
 * for the call, then convolves it.
 * tier picks the implementation; a tier the backend lacks returns FPK_ERR_UNAVAILABLE.
 * On the cpu tier w may be F16 or BF16 (widened to f32 per group, or per panel of output
 * channels when a group's weight is large). */
typedef struct fpk_conv3d_params {
    int64_t stride[3];           /* T, H, W; 0 means 1 */
    int64_t padding[3];          /* T, H, W, both sides, zeros */
    int64_t groups;              /* 0 means 1 */
    int64_t upsample[3];         /* T, H, W nearest upsampling of x; 0 means 1 (API version 9) */
    int64_t replicate_before[3]; /* T, H, W replicate padding of the upsampled x (API version 9) */
    int64_t replicate_after[3];
} fpk_conv3d_params;
/* Whether a conv reads its input through upsampling or replicate padding (fpk_conv3d_params,
 * API version 9), and the input's dims as it reads them (T, H, W). */
static inline int fpk_conv_has_view(const fpk_conv3d_params *p) {
    for (int i = 0; i < 3; i++)
        if (p->upsample[i] > 1 || p->replicate_before[i] != 0 || p->replicate_after[i] != 0) return 1;
    return 0;
}
static inline int64_t fpk_conv_view_scale(const fpk_conv3d_params *p, int i) {
    return p->upsample[i] > 1 ? p->upsample[i] : 1;
}
static inline int64_t fpk_conv_view_dim(const fpk_conv3d_params *p, int i, int64_t n) {
    return p->replicate_before[i] + fpk_conv_view_scale(p, i) * n + p->replicate_after[i];
}
fpk_status fpk_op_conv3d(fpk_stream_t stream, fpk_conv_tier tier, const fpk_conv3d_params *params,
                         fpk_tensor_t x, fpk_tensor_t w, fpk_tensor_t bias, fpk_tensor_t out);

/* ---- scratch, and the shape-only backend --------------------------------------------------- */

/* Which backend's scratch policy to answer for, with its knobs (zero: the backend's default; the
 * gpu backends read the same knobs from their settings). */
typedef struct fpk_scratch_policy {
    char backend[32];                  /* "cpu", "cuda", "hip" (anything else: "cpu") */
    int64_t conv_workspace_bytes;      /* gpu: most workspace an NCDHW conv's search is offered (8 GiB) */
    int64_t conv_nhwc_workspace_bytes; /* cuda: most workspace of a channels-last conv (256 MiB) */
    int64_t conv_slab_bytes;           /* cuda: most bytes of a channels-last slab (1 GiB) */
    int32_t conv_ncdhw;                /* cuda: 16-bit convs stay NCDHW (no channels-last slabs) */
    int64_t attention_score_bytes;     /* gpu: most bytes of the chunked attention's scores (1 GiB) */
} fpk_scratch_policy;
/* The bytes of scratch fpk_op_conv3d takes beside its operands on the policy's backend, on its
 * first tier (the vendor's on gpus), for x [N, Cin, T, H, W] (before the params' input view),
 * w [Cout, Cin/groups, kT, kH, kW] and out, in those dtypes; *reads_view says whether the backend
 * reads the params' input view in place (else the core makes that tensor for the call). The
 * backends' ops size their scratch with the same functions (src/fpk_scratch.h). */
fpk_status fpk_conv3d_scratch(const fpk_scratch_policy *policy, const fpk_conv3d_params *params,
                              fpk_dtype x_dtype, const int64_t *x_shape, fpk_dtype w_dtype,
                              const int64_t *w_shape, fpk_dtype out_dtype, const int64_t *out_shape,
                              uint64_t *bytes, int *reads_view);
/* Creates a shape-only backend: its tensors have a shape and a dtype but no memory (uploads and
 * downloads move nothing), its ops are checked as on any backend and compute nothing, and its
 * allocator counts every tensor, and the scratch each conv and attention of the policy's backend
 * would hold during the op, as that backend's would (cap, peak, 64 KiB rounding). A model's
 * forward run on it measures the memory the forward holds at a shape. is_host is 0; the conv
 * tiers are the policy backend's (the CPU tier for "cpu"). */
fpk_status fpk_backend_new_shape(const fpk_backend_config *config, const fpk_scratch_policy *policy,
                                 fpk_backend_t *out);

/* Group norm over [N, C, ...]: statistics per (n, group) over C/groups channels and all
 * trailing dims; weight and bias [C] or NULL. */
fpk_status fpk_op_group_norm(fpk_stream_t stream, int64_t groups, float eps, fpk_tensor_t x,
                             fpk_tensor_t weight, fpk_tensor_t bias, fpk_tensor_t out);
/* The activation fpk_op_group_norm_act applies after the norm. */
typedef enum fpk_norm_act {
    FPK_NORM_ACT_NONE = 0,
    FPK_NORM_ACT_SILU = 1, /* x * sigmoid(x) */
} fpk_norm_act;
/* Group norm then act, in one pass over the output (API version 7): the result of
 * fpk_op_group_norm followed by fpk_op_unary without the intermediate tensor. x and out may be
 * f32, f16 or bf16 (out normally x's dtype); statistics are taken in f32 or wider, the output
 * rounded once. A backend without the slot runs the two ops (the activation in place). */
fpk_status fpk_op_group_norm_act(fpk_stream_t stream, int64_t groups, float eps, fpk_norm_act act,
                                 fpk_tensor_t x, fpk_tensor_t weight, fpk_tensor_t bias,
                                 fpk_tensor_t out);
/* Layer norm over the last dim D; weight and bias [D] or NULL. */
fpk_status fpk_op_layer_norm(fpk_stream_t stream, float eps, fpk_tensor_t x, fpk_tensor_t weight,
                             fpk_tensor_t bias, fpk_tensor_t out);
/* RMS norm over the last dim D: x / sqrt(mean(x²) + eps) * weight; weight [D] or NULL. */
fpk_status fpk_op_rms_norm(fpk_stream_t stream, float eps, fpk_tensor_t x, fpk_tensor_t weight,
                           fpk_tensor_t out);

/* Elementwise functions of one tensor. */
typedef enum fpk_unary_op {
    FPK_UNARY_SILU = 0,       /* x * sigmoid(x) */
    FPK_UNARY_GELU_TANH = 1,  /* 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x³))) */
    FPK_UNARY_QUICK_GELU = 2, /* x * sigmoid(1.702x) */
    FPK_UNARY_GELU_ERF = 3,   /* 0.5x(1 + erf(x/sqrt 2)) */
    FPK_UNARY_SIGMOID = 4,
    FPK_UNARY_TANH = 5,
    FPK_UNARY_EXP = 6,
    FPK_UNARY_NEG = 7,
    FPK_UNARY_SQRT = 8,
    FPK_UNARY_RSQRT = 9,
    FPK_UNARY_COUNT = 10
} fpk_unary_op;
fpk_status fpk_op_unary(fpk_stream_t stream, fpk_unary_op op, fpk_tensor_t x, fpk_tensor_t out);

/* out = x * scale + shift, elementwise with scalars. */
fpk_status fpk_op_affine(fpk_stream_t stream, float scale, float shift, fpk_tensor_t x,
                         fpk_tensor_t out);

/* Elementwise functions of two tensors with NumPy broadcasting (shapes right-aligned; a dim
 * of 1 or a missing dim broadcasts). out has the broadcast shape. */
typedef enum fpk_binary_op {
    FPK_BINARY_ADD = 0,
    FPK_BINARY_SUB = 1,
    FPK_BINARY_MUL = 2,
    FPK_BINARY_DIV = 3,
    FPK_BINARY_MAX = 4,
    FPK_BINARY_MIN = 5,
    FPK_BINARY_COUNT = 6
} fpk_binary_op;
fpk_status fpk_op_binary(fpk_stream_t stream, fpk_binary_op op, fpk_tensor_t a, fpk_tensor_t b,
                         fpk_tensor_t out);

/* Fused elementwise functions of three tensors (API version 6), one pass instead of two or
 * three: the transformer's AdaLN modulation and gated residuals. a, b and c broadcast (NumPy
 * rules) to out's shape, which must be their broadcast shape; f32 arithmetic in the order
 * written, one rounding to out's dtype. */
typedef enum fpk_ternary_op {
    FPK_TERNARY_MODULATE = 0,      /* out = a·(1 + b) + c   (x, scale, shift) */
    FPK_TERNARY_GATE_RESIDUAL = 1, /* out = a + c·b         (x, gate, y) */
    FPK_TERNARY_COUNT = 2
} fpk_ternary_op;
fpk_status fpk_op_ternary(fpk_stream_t stream, fpk_ternary_op op, fpk_tensor_t a, fpk_tensor_t b,
                          fpk_tensor_t c, fpk_tensor_t out);

/* Softmax over the last dim of x * scale (scale 0 means 1). */
fpk_status fpk_op_softmax(fpk_stream_t stream, float scale, fpk_tensor_t x, fpk_tensor_t out);

/* Scaled dot-product attention. Layout FPK_ATTN_BHLD: q [B, H, Lq, D], k [B, Hkv, Lk, D],
 * v [B, Hkv, Lk, Dv], out [B, H, Lq, Dv]; layout FPK_ATTN_BLHD: q [B, Lq, H, D],
 * k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv], out [B, Lq, H, Dv] (the projections' own layout, read
 * through strides: no permute copies). H is a multiple of Hkv (grouped-query attention).
 * mask: NULL or U8 broadcastable to [B, H, Lq, Lk] in either layout (nonzero = attend). A query
 * row whose mask is all zero gives zeros. Scratch stays bounded at any length: the flash tier
 * keeps per-thread (cpu) or per-block (gpu) tiles and never forms the score matrix; the chunked
 * tier forms one chunk of scores at a time. */
typedef enum fpk_attention_layout {
    FPK_ATTN_BHLD = 0, /* [B, H, L, D] */
    FPK_ATTN_BLHD = 1, /* [B, L, H, D] */
    FPK_ATTN_LAYOUT_COUNT = 2
} fpk_attention_layout;
/* Implementations, tried in this order by the runtime's attention chain (internal/runtime).
 * A backend answers FPK_ERR_UNAVAILABLE for a tier it lacks (or cannot serve for these shapes
 * and dtypes); the core serves FPK_ATTN_TIER_CPU for every backend (host round trip). */
typedef enum fpk_attention_tier {
    FPK_ATTN_TIER_AUTO = 0,    /* the backend's best tier for these operands */
    FPK_ATTN_TIER_VENDOR = 1,  /* the vendor library's fused attention: cuDNN 9's SDPA graph on
                                  CUDA (16-bit q, k, v; no mask or key padding); none on HIP */
    FPK_ATTN_TIER_FLASH = 2,   /* our fused kernel: tiles, online softmax, f32 accumulation */
    FPK_ATTN_TIER_CHUNKED = 3, /* GEMM, masked softmax, GEMM per chunk of queries */
    FPK_ATTN_TIER_CPU = 4,     /* the cpu backend's flash attention (host round trip on GPUs) */
    FPK_ATTN_TIER_COUNT = 5
} fpk_attention_tier;
typedef struct fpk_attention_params {
    float scale;         /* 0 means 1/sqrt(D) */
    int64_t query_chunk; /* chunked tier: queries per chunk; 0 = backend default */
    int32_t layout;      /* fpk_attention_layout */
    int32_t tier;        /* fpk_attention_tier */
    /* API version 6: the caller's word that mask is causal (query i attends to keys j <= i)
     * AND a key-padding mask (each batch entry's first n >= 1 keys), as Llama's and CLIP's. The
     * vendor tier then checks the mask on the device and serves it with cuDNN's causal mask
     * (declining, as for any mask it cannot take, when the check fails); every other tier reads
     * the mask as always. 0: no claim. */
    int32_t causal;
} fpk_attention_params;
fpk_status fpk_op_attention(fpk_stream_t stream, const fpk_attention_params *params,
                            fpk_tensor_t q, fpk_tensor_t k, fpk_tensor_t v, fpk_tensor_t mask,
                            fpk_tensor_t out);

/* Layouts of the pairs RoPE rotates. */
typedef enum fpk_rope_mode {
    FPK_ROPE_INTERLEAVED = 0, /* pairs (x[2i], x[2i+1]) (HunyuanVideo) */
    FPK_ROPE_HALVES = 1,      /* pairs (x[i], x[i+D/2]): transformers' rotate_half (Llama) */
    FPK_ROPE_MODE_COUNT = 2
} fpk_rope_mode;
/* Rotary embedding of the last dim in the given layout. FPK_ROPE_INTERLEAVED:
 * out[2i]   = x[2i] cos[2i]     - x[2i+1] sin[2i]
 * out[2i+1] = x[2i+1] cos[2i+1] + x[2i] sin[2i+1]
 * FPK_ROPE_HALVES is x·cos + rotate_half(x)·sin with rotate_half(x) = cat(−x[D/2:], x[:D/2]):
 * for i < D/2
 * out[i]       = x[i] cos[i]             - x[i+D/2] sin[i]
 * out[i+D/2]   = x[i+D/2] cos[i+D/2]     + x[i] sin[i+D/2]
 * (cos and sin as transformers builds them: cat(freqs, freqs) along the last dim).
 * cos and sin have the full last dim and broadcast to x (NumPy rules); the last dim D must be
 * even. A backend without the mode answers FPK_ERR_UNSUPPORTED. */
fpk_status fpk_op_rope(fpk_stream_t stream, fpk_rope_mode mode, fpk_tensor_t x, fpk_tensor_t cos,
                       fpk_tensor_t sin, fpk_tensor_t out);
/* RMS norm of the last dim, then rope, in one pass (API version 6): out = rope(mode,
 * rms_norm(eps, x, weight), cos, sin), the q/k of HunyuanVideo's attention. x [..., D] (e.g.
 * [B, L, H, D]: one row per head), weight [D] or NULL, cos and sin as fpk_op_rope's (full last dim,
 * broadcast to x). The normalised row stays f32 into the rotation (no rounding to x's dtype
 * between the two). f16/bf16 x and out on GPUs, with f32 statistics. */
fpk_status fpk_op_rms_norm_rope(fpk_stream_t stream, fpk_rope_mode mode, float eps, fpk_tensor_t x,
                                fpk_tensor_t weight, fpk_tensor_t cos, fpk_tensor_t sin,
                                fpk_tensor_t out);

/* Concatenates n tensors along dim (all other dims equal). */
fpk_status fpk_op_concat(fpk_stream_t stream, int dim, int n, const fpk_tensor_t *inputs,
                         fpk_tensor_t out);
/* out = x[..., start : start + step*len : step, ...] along dim (len = out's size at dim). */
fpk_status fpk_op_slice(fpk_stream_t stream, int dim, int64_t start, int64_t step, fpk_tensor_t x,
                        fpk_tensor_t out);
/* out = x permuted: out dim i is x dim perm[i]. */
fpk_status fpk_op_permute(fpk_stream_t stream, const int *perm, fpk_tensor_t x, fpk_tensor_t out);

/* Padding of every dim: before[i] and after[i] elements (out dim = in + before + after). */
typedef enum fpk_pad_mode {
    FPK_PAD_ZERO = 0,
    FPK_PAD_REPLICATE = 1
} fpk_pad_mode;
fpk_status fpk_op_pad(fpk_stream_t stream, fpk_pad_mode mode, const int64_t *before,
                      const int64_t *after, fpk_tensor_t x, fpk_tensor_t out);

/* Replicate padding of the nearest upsampling of x, in one pass (API version 7): out =
 * pad(upsample_nearest3d(x, scale), before, after) over the last three dims (T, H, W), without
 * the upsampled intermediate (the VAE's upsampler before its causal conv). A backend without
 * the slot answers FPK_ERR_UNSUPPORTED (the caller runs the two ops). */
fpk_status fpk_op_upsample_pad(fpk_stream_t stream, const int64_t *scale, const int64_t *before,
                               const int64_t *after, fpk_tensor_t x, fpk_tensor_t out);
/* Nearest upsampling by integer factors of the last three dims: x [..., T, H, W] →
 * [..., T*sT, H*sH, W*sW]. */
fpk_status fpk_op_upsample_nearest3d(fpk_stream_t stream, const int64_t *scale, fpk_tensor_t x,
                                     fpk_tensor_t out);
/* Average pooling of the last three dims without padding: out = (in - k)/s + 1 per dim. */
fpk_status fpk_op_avg_pool3d(fpk_stream_t stream, const int64_t *kernel, const int64_t *stride,
                             fpk_tensor_t x, fpk_tensor_t out);

/* Reductions over one dim: out has x's shape with dim of size 1. Sums accumulate in double. */
typedef enum fpk_reduce_op {
    FPK_REDUCE_SUM = 0,
    FPK_REDUCE_MEAN = 1,
    FPK_REDUCE_MAX = 2,
    FPK_REDUCE_COUNT = 3
} fpk_reduce_op;
fpk_status fpk_op_reduce(fpk_stream_t stream, fpk_reduce_op op, int dim, fpk_tensor_t x,
                         fpk_tensor_t out);

/* Copies src into dst of the same shape, converting dtype (this is cast). */
fpk_status fpk_op_copy(fpk_stream_t stream, fpk_tensor_t src, fpk_tensor_t dst);

/* Rows of table [V, D] picked by ids (I32, any shape S): out [S..., D], in the table's dtype or
 * another float dtype (converted; the cpu backend takes an f16/bf16 table into f32 rows). */
fpk_status fpk_op_embedding(fpk_stream_t stream, fpk_tensor_t table, fpk_tensor_t ids,
                            fpk_tensor_t out);

#ifdef __cplusplus
}
#endif
#endif /* FPK_H */
