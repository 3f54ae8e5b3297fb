/*
 * fpk_gpu_mma.h — the matrix instructions of the kernels that use them (flash attention in
 * fpk_gpu_attention.cu, the channels-last conv in fpk_gpu_conv_mma.cu):
 *   NVIDIA  mma.sync m16n8k16 (bf16/f16 → f32) and cp.async, sm_80 and later; the host's test
 *           for them (fpk_gpu_mma_device).
 *   AMD     MFMA 16x16x16 (CDNA2/3: gfx90a, gfx940-942, wave64) and WMMA 16x16x16 (RDNA3:
 *           gfx1100-1102, gfx1150/1151, wave32), bf16/f16 → f32: which device pass compiles
 *           which (FPK_AMD_MFMA, FPK_AMD_WMMA: the target's arch macro and the compiler's
 *           builtins), their operand types, and one call each.
 * The host emulators (scripts/amdflashemu, scripts/convmmaemu) cut the AMD block between its
 * marker comments out of this file, so it holds device code only and no includes.
 */
#ifndef FPK_GPU_MMA_H
#define FPK_GPU_MMA_H

#include "fpk_gpu_internal.h"

#if !defined(FPK_HIP)
/* c += a·b for one m16n8k16 tile: a the A fragment (4 registers of 2 values), b0 b1 the B
 * fragment, c the f32 accumulator (PTX ISA, "Matrix Fragments for mma.m16n8k16"). */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (bf16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1, (void)bf16;
    __trap();
#endif
}

/* 16 bytes global → shared without registers; pred false writes zeros (reads nothing). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
#else
    (void)smem, (void)gmem, (void)pred;
#endif
}

/* The same through L1 (cp.async.ca): for data other blocks' or this block's later copies read
 * again soon (a conv's neighbouring taps). */
__device__ __forceinline__ void cp_async16_ca(void *smem, const void *gmem, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    int n = pred ? 16 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
#else
    (void)smem, (void)gmem, (void)pred;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

/* Waits until at most N of this thread's committed copy groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

/* Whether this device has mma.sync for bf16/f16 (compute capability 8.0 and later); the answer
 * is kept per device (per source file that asks). */
static inline int fpk_gpu_mma_device(fpk_gpu_ctx *c) {
    static int cc[64];
    int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
    if (!cc[dev]) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess) major = 0;
        cc[dev] = major + 1;
    }
    return cc[dev] - 1 >= 8;
}
#endif /* !FPK_HIP */

#if defined(FPK_HIP)
enum { AMD_PATH_NONE = 0, AMD_PATH_MFMA = 1, AMD_PATH_WMMA = 2 };

/* Which path this device pass compiles: the target's arch macro and the compiler's builtins. */
#if (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)) &&                     \
    __has_builtin(__builtin_amdgcn_mfma_f32_16x16x16bf16_1k) && __has_builtin(__builtin_amdgcn_mfma_f32_16x16x16f16)
#define FPK_AMD_MFMA 1
#endif
#if (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1150__) ||                   \
     defined(__gfx1151__)) &&                                                                                        \
    __has_builtin(__builtin_amdgcn_wmma_f32_16x16x16_f16_w32) && __has_builtin(__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32)
#define FPK_AMD_WMMA 1
#endif
/* fp8 × fp8 (fpk_gpu_gemm_q_mma.cu): CDNA3's 16x16x32 fp8/bf8 MFMA (FNUZ types). */
#if (defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)) &&                                           \
    __has_builtin(__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8) && __has_builtin(__builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8)
#define FPK_AMD_MFMA_FP8 1
#endif
#endif /* FPK_HIP */

/* ---- AMD operand types and instructions (the host emulators cut from here) ---------------- */
#if defined(FPK_AMD_MFMA) || defined(FPK_AMD_WMMA)
typedef unsigned int amd_u2 __attribute__((ext_vector_type(2)));
typedef unsigned int amd_u4 __attribute__((ext_vector_type(4)));
typedef unsigned int amd_u8 __attribute__((ext_vector_type(8)));
typedef unsigned short amd_us8 __attribute__((ext_vector_type(8)));
#endif

#if defined(FPK_AMD_MFMA)
typedef short amd_v4s __attribute__((ext_vector_type(4)));
typedef _Float16 amd_v4h __attribute__((ext_vector_type(4)));
typedef float amd_v4f __attribute__((ext_vector_type(4)));

/* D = A·B + C, 16x16x16, one wave of 64. Operand element v of lane L: A[L % 16][4 (L / 16) + v],
 * B[4 (L / 16) + v][L % 16]; D[4 (L / 16) + v][L % 16]. */
__device__ __forceinline__ amd_v4f amd_mfma16(amd_v4s a, amd_v4s b, amd_v4f c, bool bf16) {
    if (bf16) return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
    return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(amd_v4h, a), __builtin_bit_cast(amd_v4h, b), c, 0, 0,
                                                 0);
}
#endif

#if defined(FPK_AMD_MFMA_FP8)
/* D = A·B + C, 16x16x32, one wave of 64, 8 fp8 values a lane (a: e4m3 FNUZ; b: e4m3 FNUZ, or
 * e5m2 FNUZ when bbf8). Operand byte v of lane L: A[L % 16][8 (L / 16) + v], B[8 (L / 16) + v][L % 16];
 * D[4 (L / 16) + v][L % 16]. */
__device__ __forceinline__ amd_v4f amd_mfma_fp8(uint64_t a, uint64_t b, amd_v4f c, bool bbf8) {
    if (bbf8) return __builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8((long)a, (long)b, c, 0, 0, 0);
    return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8((long)a, (long)b, c, 0, 0, 0);
}
#endif

#if defined(FPK_AMD_WMMA)
typedef short amd_v16s __attribute__((ext_vector_type(16)));
typedef _Float16 amd_v16h __attribute__((ext_vector_type(16)));
typedef float amd_v8f __attribute__((ext_vector_type(8)));

/* D = A·B + C, 16x16x16, one wave of 32. Operand element v of lane L: A[L % 16][v], B[v][L % 16]
 * (lanes 16..31 must repeat lanes 0..15's operands); D[2v + L / 16][L % 16]. */
__device__ __forceinline__ amd_v8f amd_wmma16(amd_v16s a, amd_v16s b, amd_v8f c, bool bf16) {
    if (bf16) return __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c);
    return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(__builtin_bit_cast(amd_v16h, a), __builtin_bit_cast(amd_v16h, b), c);
}
#endif
/* ---- end of the AMD block ------------------------------------------------------------------- */

#endif /* FPK_GPU_MMA_H */
