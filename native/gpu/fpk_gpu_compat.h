/*
 * fpk_gpu_compat.h — one kernel source for CUDA and HIP (the way ggml does it): the device code
 * is written in CUDA spelling; built by hipcc (FPK_HIP defined), these names map to HIP's.
 * Only the runtime API is mapped here; vendor libraries (BLAS, DNN, NVML) are dlopened with our
 * own prototypes in fpk_gpu_vendor.cu, so no vendor header but the runtime's is needed.
 */
#ifndef FPK_GPU_COMPAT_H
#define FPK_GPU_COMPAT_H

#if defined(FPK_HIP) || defined(__HIP__)
#ifndef FPK_HIP
#define FPK_HIP 1
#endif
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorIllegalAddress hipErrorIllegalAddress
#define cudaErrorLaunchFailure hipErrorLaunchFailure
#define cudaErrorHostMemoryAlreadyRegistered hipErrorHostMemoryAlreadyRegistered
#define cudaErrorHostMemoryNotRegistered hipErrorHostMemoryNotRegistered
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInvalidDevice hipErrorInvalidDevice
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaSetDevice hipSetDevice
#define cudaDeviceGetByPCIBusId hipDeviceGetByPCIBusId
#define cudaGetDevice hipGetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemGetInfo hipMemGetInfo
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostRegisterDefault hipHostRegisterDefault
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventSynchronize hipEventSynchronize
#define cudaFuncSetAttribute hipFuncSetAttribute
#define FPK_GPU_NAME "hip"
/* Lane exchange within segments of `width` lanes (a power of two up to the warp size). */
#define FPK_SHFL_XOR(v, mask, width) __shfl_xor((v), (mask), (width))
#define FPK_SHFL(v, src, width) __shfl((v), (src), (width))
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define FPK_GPU_NAME "cuda"
#define FPK_SHFL_XOR(v, mask, width) __shfl_xor_sync(0xffffffffu, (v), (mask), (width))
#define FPK_SHFL(v, src, width) __shfl_sync(0xffffffffu, (v), (src), (width))
#endif

#include <stdint.h>

/* Threads per block of the elementwise kernels and of the row reductions. */
#define FPK_BLOCK 256

/* Storage types as device code loads them: every value becomes a float. The conversions are
 * the core's (src/fpk_dtype.h, host and device functions); f16 goes through the hardware's
 * conversion instructions, which give the same results. */
#include "fpk_dtype.h"

__device__ __forceinline__ float fpk_bf16_f32(uint16_t h) { return fpk_bf16_to_f32(h); }
__device__ __forceinline__ uint16_t fpk_f32_bf16(float f) { return fpk_f32_to_bf16(f); }
__device__ __forceinline__ float fpk_f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t fpk_f32_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

/* Element i of p (dtype dt) as a float. dt is the same for every thread, so the branch is free. */
__device__ __forceinline__ float fpk_ld(const void *p, int dt, int64_t i) {
    if (dt == FPK_F16) return fpk_f16_f32(((const uint16_t *)p)[i]);
    return fpk_dtype_load(p, dt, i);
}

/* Stores v into element i of p (dtype dt), rounding as the core's host conversion does. */
__device__ __forceinline__ void fpk_st(void *p, int dt, int64_t i, float v) {
    if (dt == FPK_F16) {
        ((uint16_t *)p)[i] = fpk_f32_f16(v);
        return;
    }
    fpk_dtype_store(p, dt, i, v);
}

#endif /* FPK_GPU_COMPAT_H */
