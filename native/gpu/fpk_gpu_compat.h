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

/* Storage types as device code loads them: every value becomes a float. */
__device__ __forceinline__ float fpk_bf16_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t fpk_f32_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float fpk_f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t fpk_f32_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

/* Element i of p (dtype dt) as a float. dt is the same for every thread, so the branch is free. */
__device__ __forceinline__ float fpk_ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case 0: return ((const float *)p)[i];
    case 1: return fpk_f16_f32(((const uint16_t *)p)[i]);
    case 2: return fpk_bf16_f32(((const uint16_t *)p)[i]);
    case 3: return (float)((const uint8_t *)p)[i];
    default: return (float)((const int32_t *)p)[i];
    }
}

/* Stores v into element i of p (dtype dt), rounding as the core's host conversion does. */
__device__ __forceinline__ void fpk_st(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case 0: ((float *)p)[i] = v; break;
    case 1: ((uint16_t *)p)[i] = fpk_f32_f16(v); break;
    case 2: ((uint16_t *)p)[i] = fpk_f32_bf16(v); break;
    case 3: ((uint8_t *)p)[i] = v != v ? 0 : v <= 0.f ? 0 : v >= 255.f ? 255 : (uint8_t)v; break;
    default:
        ((int32_t *)p)[i] = v != v ? 0 : v <= -2147483648.f ? INT32_MIN : v >= 2147483647.f ? INT32_MAX : (int32_t)v;
        break;
    }
}

#endif /* FPK_GPU_COMPAT_H */
