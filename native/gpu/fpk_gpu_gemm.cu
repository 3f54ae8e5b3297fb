/*
 * fpk_gpu_gemm.cu — GEMM: the vendor BLAS (cuBLAS / rocBLAS, f32 accumulation, no TF32) when it
 * loaded, our own tiled kernel otherwise (any float dtypes, f32 accumulation). Operands of
 * different float types are brought to f32 first (the 16-bit one widened exactly, the f32
 * path's result, as the cpu backend does). The activation dtype is chosen at Load: 16-bit
 * activations meet 16-bit weights of the same type and go straight to the matrix units, the
 * output in that type, accumulation f32 (CUBLAS_COMPUTE_32F).
 * The bias and the GELU(tanh) epilogue run inside cuBLASLt's GEMM where it loaded (one matrix, one
 * operand type), else as kernels over the output after the GEMM.
 */
#include "fpk_gpu_internal.h"

#include <limits.h>
#include <string.h>

#define TM 64
#define TN 64
#define TK 16

/* C[b] = alpha A[b] B[b] + beta C[b], row-major, one 64×64 tile of C per block, 4×4 per thread. */
__global__ void __launch_bounds__(256) k_gemm(fpk_gemm_desc d) {
    __shared__ float As[TK][TM + 4];
    __shared__ float Bs[TK][TN + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t m0 = (int64_t)blockIdx.y * TM, n0 = (int64_t)blockIdx.x * TN;
    for (int64_t bz = blockIdx.z; bz < d.batch; bz += gridDim.z) {
        const int64_t ao = bz * d.stride_a, bo = bz * d.stride_b, co = bz * d.stride_c;
        float acc[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
        for (int64_t k0 = 0; k0 < d.K; k0 += TK) {
            for (int r = 0; r < 4; r++) {
                int e = tid + 256 * r, mm, kk;
                if (d.trans_a) {
                    mm = e % TM;
                    kk = e / TM;
                } else {
                    kk = e % TK;
                    mm = e / TK;
                }
                int64_t m = m0 + mm, k = k0 + kk;
                float v = 0.f;
                if (m < d.M && k < d.K) v = fpk_ld(d.a, d.adt, ao + (d.trans_a ? k * d.lda + m : m * d.lda + k));
                As[kk][mm] = v;
                int nn;
                if (d.trans_b) {
                    kk = e % TK;
                    nn = e / TK;
                } else {
                    nn = e % TN;
                    kk = e / TN;
                }
                int64_t n = n0 + nn;
                k = k0 + kk;
                v = 0.f;
                if (n < d.N && k < d.K) v = fpk_ld(d.b, d.bdt, bo + (d.trans_b ? n * d.ldb + k : k * d.ldb + n));
                Bs[kk][nn] = v;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < TK; kk++) {
                float ar[4], br[4];
                for (int i = 0; i < 4; i++) ar[i] = As[kk][ty * 4 + i];
                for (int j = 0; j < 4; j++) br[j] = Bs[kk][tx * 4 + j];
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) acc[i][j] += ar[i] * br[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; i++) {
            int64_t m = m0 + ty * 4 + i;
            if (m >= d.M) continue;
            for (int j = 0; j < 4; j++) {
                int64_t n = n0 + tx * 4 + j;
                if (n >= d.N) continue;
                int64_t ci = co + m * d.ldc + n;
                float v = d.alpha * acc[i][j];
                if (d.beta != 0.f) v += d.beta * fpk_ld(d.c, d.cdt, ci);
                fpk_st(d.c, d.cdt, ci, v);
            }
        }
    }
}

fpk_status fpk_gpu_gemm_own(cudaStream_t st, const fpk_gemm_desc *d) {
    if (d->M == 0 || d->N == 0 || d->batch == 0) return FPK_OK;
    int64_t gx = (d->N + TN - 1) / TN, gy = (d->M + TM - 1) / TM;
    if (gx > INT_MAX || gy > 65535)
        return fpk_gpu_set_error(FPK_ERR_UNSUPPORTED, "gemm: %lld x %lld tiles", (long long)gy, (long long)gx);
    unsigned gz = (unsigned)(d->batch < 65535 ? d->batch : 65535);
    k_gemm<<<dim3((unsigned)gx, (unsigned)gy, gz), 256, 0, st>>>(*d);
    return fpk_gpu_launched("gemm (own kernel)");
}

/* Converts n elements of *p (dtype *dt) to dtype to in scratch s; updates p and dt. */
static fpk_status to_dtype(cudaStream_t st, fpk_scratch &s, const void **p, int *dt, int to, int64_t n) {
    FPK_TRY(s.alloc((size_t)n * fpk_dt_size(to)));
    FPK_TRY(fpk_gpu_convert(st, s.ptr, to, *p, *dt, n));
    *p = s.ptr;
    *dt = to;
    return FPK_OK;
}

/* Element count an operand spans (its batch stride × batch, or one matrix when shared). */
static int64_t span(int64_t rows, int64_t ld, int64_t stride, int64_t batch) {
    return stride ? stride * batch : rows * ld;
}

fpk_status fpk_gpu_gemm_run(fpk_gpu_ctx *c, cudaStream_t st, const fpk_gpu_scratch_fn *sf, const fpk_gemm_desc *in) {
    fpk_gemm_desc d = *in;
    if (d.M == 0 || d.N == 0 || d.batch == 0) return FPK_OK;
    if (d.K == 0) { /* C = beta C */
        fpk_gemm_desc z = d;
        return fpk_gpu_gemm_own(st, &z);
    }
    fpk_scratch sa(sf), sb(sf), sc(sf);
    /* one operand type for the vendor BLAS */
    if (d.adt != d.bdt && !c->no_blas && c->blas.handle) {
        int to = FPK_F32; /* widen the 16-bit operand: exactly the f32 path's product */
        fpk_status cs = FPK_OK;
        if (d.adt != to) cs = to_dtype(st, sa, &d.a, &d.adt, to, span(d.trans_a ? d.K : d.M, d.lda, d.stride_a, d.batch));
        if (cs == FPK_OK && d.bdt != to)
            cs = to_dtype(st, sb, &d.b, &d.bdt, to, span(d.trans_b ? d.N : d.K, d.ldb, d.stride_b, d.batch));
        if (cs == FPK_ERR_OUT_OF_MEMORY) {
            /* no room to convert under the cap: our kernel reads mixed operands as they are */
            fpk_gemm_desc o = *in;
            return fpk_gpu_gemm_own(st, &o);
        }
        if (cs != FPK_OK) return cs;
    }
    if (!c->no_blas && c->blas.handle) {
        /* the vendor BLAS writes f32 or the operands' own type; anything else goes through f32 */
        fpk_gemm_desc v = d;
        int direct = d.cdt == FPK_F32 || d.cdt == d.adt;
        if (!direct) {
            FPK_TRY(sc.alloc((size_t)(d.stride_c ? d.stride_c * d.batch : d.M * d.ldc) * 4));
            v.c = sc.ptr;
            v.cdt = FPK_F32;
            if (d.beta != 0.f) FPK_TRY(fpk_gpu_convert(st, sc.ptr, FPK_F32, d.c, d.cdt, d.stride_c ? d.stride_c * d.batch : d.M * d.ldc));
        }
        if ((v.bias || v.gelu) && v.fused && direct) { /* the epilogue inside the vendor's GEMM */
            fpk_status ls = fpk_vendor_gemm_lt(c, st, sf, &v);
            if (ls == FPK_OK) {
                *v.fused = 1;
                return FPK_OK;
            }
            if (ls != FPK_ERR_UNAVAILABLE) return ls;
        }
        fpk_status vs = fpk_vendor_gemm(c, st, &v);
        if (vs == FPK_OK) {
            if (!direct)
                return fpk_gpu_convert(st, d.c, d.cdt, sc.ptr, FPK_F32, d.stride_c ? d.stride_c * d.batch : d.M * d.ldc);
            return FPK_OK;
        }
        if (vs != FPK_ERR_UNAVAILABLE) return vs;
    }
    return fpk_gpu_gemm_own(st, &d);
}

extern "C" fpk_status fpk_gpu_gemm(fpk_gpu_ctx *c, void *s, const fpk_gpu_scratch_fn *sf, const fpk_gemm_params *p,
                                   const fpk_gt *a, const fpk_gt *b, const fpk_gt *bias, const fpk_gt *out) {
    cudaStream_t st = fpk_stream(c, s);
    if (out->numel == 0) return FPK_OK;
    fpk_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.trans_a = p->trans_a;
    d.trans_b = p->trans_b;
    d.M = out->shape[out->ndim - 2];
    d.N = out->shape[out->ndim - 1];
    d.K = p->trans_a ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    d.batch = out->numel / (d.M * d.N);
    int64_t bbatch = 1;
    for (int i = 0; i < b->ndim - 2; i++) bbatch *= b->shape[i];
    d.alpha = p->alpha != 0 ? p->alpha : 1.0f;
    d.beta = 0.f;
    d.a = a->data;
    d.adt = a->dtype;
    d.lda = p->trans_a ? d.M : d.K;
    d.stride_a = d.M * d.K;
    d.b = b->data;
    d.bdt = b->dtype;
    d.ldb = p->trans_b ? d.K : d.N;
    d.stride_b = bbatch == 1 ? 0 : d.K * d.N;
    d.c = out->data;
    d.cdt = out->dtype;
    d.ldc = d.N;
    d.stride_c = d.M * d.N;
    if (d.stride_b == 0 && !d.trans_a && d.batch > 1) { /* a shared b: one tall GEMM */
        d.M *= d.batch;
        d.batch = 1;
        d.stride_a = d.stride_c = 0;
    }
    int fused = 0;
    d.gelu = p->epilogue == FPK_GEMM_EPILOGUE_GELU_TANH;
    if (bias) {
        d.bias = bias->data;
        d.bias_dt = bias->dtype;
    }
    d.fused = &fused;
    FPK_TRY(fpk_gpu_gemm_run(c, st, sf, &d));
    if (fused) return FPK_OK;
    if (bias) FPK_TRY(fpk_gpu_add_bias(st, out->data, out->dtype, bias->data, bias->dtype, out->numel, d.N, 0));
    if (d.gelu) return fpk_gpu_unary(c, s, FPK_UNARY_GELU_TANH, 0, 0, out, out);
    return FPK_OK;
}
