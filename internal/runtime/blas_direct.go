package runtime

/*
#include <cblas.h>
*/
import "C"

import "unsafe"

// directSgemm calls OpenBLAS's SGEMM on Go slices without the runtime (c = a·b, n×n
// row-major). It exists as the baseline of BenchmarkSGEMM: the runtime's GEMM is measured
// against it.
func directSgemm(n int, a, b, c []float32) {
	C.cblas_sgemm(C.CblasRowMajor, C.CblasNoTrans, C.CblasNoTrans, C.blasint(n), C.blasint(n), C.blasint(n),
		1, (*C.float)(unsafe.Pointer(&a[0])), C.blasint(n), (*C.float)(unsafe.Pointer(&b[0])), C.blasint(n),
		0, (*C.float)(unsafe.Pointer(&c[0])), C.blasint(n))
}
