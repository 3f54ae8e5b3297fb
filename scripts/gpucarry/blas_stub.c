/*
 * blas_stub.c — a stand-in libopenblas.so.0 for test runs on a GPU machine that has no OpenBLAS
 * and cannot install one: the cgo test binaries link cblas_sgemm and openblas_set_num_threads,
 * which only the cpu backend calls. A plain (slow, exact-enough) SGEMM; the GPU paths never use
 * it. Build: cc -O2 -shared -fPIC -o libopenblas.so.0 blas_stub.c
 */
#include <stddef.h>

enum { RowMajor = 101, ColMajor = 102, NoTrans = 111, Trans = 112 };

void openblas_set_num_threads(int n) { (void)n; }

void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    if (order == ColMajor) { /* C^T = B^T A^T in row-major terms */
        cblas_sgemm(RowMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                float a = ta == NoTrans ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i];
                float b = tb == NoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k];
                acc += (double)a * b;
            }
            float *c = C + (size_t)i * ldc + j;
            *c = (float)(alpha * acc + (beta == 0 ? 0.0 : (double)beta * *c));
        }
}
