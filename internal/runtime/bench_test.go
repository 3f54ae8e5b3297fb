package runtime

import (
	"math/rand/v2"
	"testing"
	"time"
)

func benchRuntime(b *testing.B) *Runtime {
	b.Helper()
	rt, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := rt.Close(); err != nil {
			b.Errorf("close: %v", err)
		}
	})
	return rt
}

func benchTensor(b *testing.B, rt *Runtime, shape ...int) *Tensor {
	b.Helper()
	r := rand.New(rand.NewPCG(1, uint64(len(shape))))
	v := make([]float32, numel(shape))
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	t, err := rt.FromFloat32(v, shape...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.Free)
	return t
}

func reportGFLOPS(b *testing.B, flopsPerOp float64) {
	b.ReportMetric(flopsPerOp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkSGEMM: 2048³ through the runtime (allocating its output every call, as ops do)
// against OpenBLAS called directly on preallocated buffers.
func BenchmarkSGEMM(b *testing.B) {
	const n = 2048
	flops := 2.0 * n * n * n
	b.Run("runtime", func(b *testing.B) {
		rt := benchRuntime(b)
		x := benchTensor(b, rt, n, n)
		y := benchTensor(b, rt, n, n)
		b.ResetTimer()
		for range b.N {
			z, err := rt.MatMul(x, y, GemmParams{})
			if err != nil {
				b.Fatal(err)
			}
			z.Free()
		}
		reportGFLOPS(b, flops)
	})
	// both in turn, each iteration timed apart, so load from other processes hits both alike
	b.Run("interleaved", func(b *testing.B) {
		rt := benchRuntime(b)
		x := benchTensor(b, rt, n, n)
		y := benchTensor(b, rt, n, n)
		hx, err := x.Float32()
		if err != nil {
			b.Fatal(err)
		}
		hy, err := y.Float32()
		if err != nil {
			b.Fatal(err)
		}
		hz := make([]float32, n*n)
		var tr, td time.Duration
		b.ResetTimer()
		runtimeOnce := func() time.Duration {
			start := time.Now()
			z, err := rt.MatMul(x, y, GemmParams{})
			if err != nil {
				b.Fatal(err)
			}
			z.Free()
			return time.Since(start)
		}
		directOnce := func() time.Duration {
			start := time.Now()
			directSgemm(n, hx, hy, hz)
			return time.Since(start)
		}
		for i := range b.N {
			if i%2 == 0 { // alternate which goes first
				tr += runtimeOnce()
				td += directOnce()
			} else {
				td += directOnce()
				tr += runtimeOnce()
			}
		}
		b.ReportMetric(flops*float64(b.N)/tr.Seconds()/1e9, "runtime-GFLOP/s")
		b.ReportMetric(flops*float64(b.N)/td.Seconds()/1e9, "openblas-GFLOP/s")
		b.ReportMetric(100*td.Seconds()/tr.Seconds(), "runtime-%")
	})
	b.Run("openblas", func(b *testing.B) {
		x := make([]float32, n*n)
		y := make([]float32, n*n)
		z := make([]float32, n*n)
		r := rand.New(rand.NewPCG(1, 2))
		for i := range x {
			x[i], y[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		b.ResetTimer()
		for range b.N {
			directSgemm(n, x, y, z)
		}
		reportGFLOPS(b, flops)
	})
}

// BenchmarkConv3d: 64→64 channels, 3×3×3 kernel, padding 1, on 8×64×64 (a VAE block's shape).
func BenchmarkConv3d(b *testing.B) {
	rt := benchRuntime(b)
	x := benchTensor(b, rt, 1, 64, 8, 64, 64)
	w := benchTensor(b, rt, 64, 64, 3, 3, 3)
	bias := benchTensor(b, rt, 64)
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	b.ResetTimer()
	for range b.N {
		y, err := rt.Conv3d(x, w, bias, p)
		if err != nil {
			b.Fatal(err)
		}
		y.Free()
	}
	reportGFLOPS(b, 2.0*64*64*27*8*64*64)
}

// BenchmarkAttention: one head, 4096 tokens, 64 dims (QKᵀ and PV: 4·L²·D flops).
func BenchmarkAttention(b *testing.B) {
	const L, D = 4096, 64
	rt := benchRuntime(b)
	q := benchTensor(b, rt, 1, 1, L, D)
	k := benchTensor(b, rt, 1, 1, L, D)
	v := benchTensor(b, rt, 1, 1, L, D)
	b.ResetTimer()
	for range b.N {
		y, err := rt.Attention(q, k, v, nil, AttentionParams{})
		if err != nil {
			b.Fatal(err)
		}
		y.Free()
	}
	reportGFLOPS(b, 4.0*L*L*D)
}

// BenchmarkUploadBF16: converting bf16 checkpoint bytes to an f32 tensor on upload (weight
// loading), 32 M elements; the metric is source bytes per second.
func BenchmarkUploadBF16(b *testing.B) {
	const n = 32 << 20
	rt := benchRuntime(b)
	raw := make([]byte, 2*n)
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(raw)))
	b.ResetTimer()
	for range b.N {
		t, err := rt.FromBytes(F32, BF16, raw, n)
		if err != nil {
			b.Fatal(err)
		}
		t.Free()
	}
}

// BenchmarkGELU: GELU(tanh) over 16 M elements (a transformer MLP's activation); the metric is
// elements per second.
func BenchmarkGELU(b *testing.B) {
	const n = 16 << 20
	rt := benchRuntime(b)
	x := benchTensor(b, rt, n)
	b.ResetTimer()
	for range b.N {
		y, err := rt.GELU(x)
		if err != nil {
			b.Fatal(err)
		}
		y.Free()
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
}
