package runtime

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
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

// BenchmarkAttention: 4 heads, 4096 tokens, 64 dims (QKᵀ and PV: 4·L²·D flops a head), per
// tier.
func BenchmarkAttention(b *testing.B) {
	const H, L, D = 4, 4096, 64
	rt := benchRuntime(b)
	q := benchTensor(b, rt, 1, H, L, D)
	k := benchTensor(b, rt, 1, H, L, D)
	v := benchTensor(b, rt, 1, H, L, D)
	for _, tier := range []AttentionTier{AttentionFlash, AttentionChunked} {
		b.Run(tier.String(), func(b *testing.B) {
			for range b.N {
				y, err := rt.Attention(q, k, v, nil, AttentionParams{Tier: tier})
				if err != nil {
					b.Fatal(err)
				}
				y.Free()
			}
			reportGFLOPS(b, 4.0*H*L*L*D)
		})
	}
}

// BenchmarkAttentionDiT: the transformer's joint attention at 544×704, window 9 (18,083 tokens,
// 24 heads × 128, [B, L, H, D]) in bf16 on a device backend: vendor (cuDNN's fused SDPA, skipped
// where unavailable), flash and chunked tiers
// (4·L²·D·H flops). Skipped on the cpu backend (minutes a call).
func BenchmarkAttentionDiT(b *testing.B) {
	const L, H, D = 18083, 24, 128
	rt := benchRuntime(b)
	if rt.Backend().IsHost {
		b.Skip("device backends only")
	}
	var ts [3]*Tensor
	for i := range ts {
		x := benchTensor(b, rt, 1, L, H, D)
		h, err := rt.Cast(x, BF16)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(h.Free)
		ts[i] = h
	}
	for _, tier := range []AttentionTier{AttentionVendor, AttentionFlash, AttentionChunked} {
		b.Run(tier.String(), func(b *testing.B) {
			// the first call builds the vendor tier's plan (cuDNN compiles its kernel): outside
			// the timing, as the other tiers' module loads are
			y, err := rt.Attention(ts[0], ts[1], ts[2], nil, AttentionParams{Layout: AttentionBLHD, Tier: tier})
			if errors.Is(err, ErrUnavailable) {
				b.Skipf("tier %s: %v", tier, err)
			}
			if err != nil {
				b.Fatal(err)
			}
			y.Free()
			if err := rt.Synchronize(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				y, err := rt.Attention(ts[0], ts[1], ts[2], nil, AttentionParams{Layout: AttentionBLHD, Tier: tier})
				if err != nil {
					b.Fatal(err)
				}
				y.Free()
			}
			if err := rt.Synchronize(); err != nil {
				b.Fatal(err)
			}
			reportGFLOPS(b, 4.0*L*L*D*H)
		})
	}
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

// BenchmarkUnary: the 8-lane activations over 16 M elements, one sub-benchmark each; the metric
// is elements per second.
func BenchmarkUnary(b *testing.B) {
	const n = 16 << 20
	rt := benchRuntime(b)
	x := benchTensor(b, rt, n)
	for _, op := range []UnaryOp{OpGELUTanh, OpGELUErf, OpTanh, OpSiLU} {
		b.Run(strings.ReplaceAll(op.String(), " ", "_"), func(b *testing.B) {
			for range b.N {
				y, err := rt.Unary(op, x)
				if err != nil {
					b.Fatal(err)
				}
				y.Free()
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
		})
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

// interleave runs the fs in turn b.N times (rotating which goes first, so load from other
// processes hits all alike) and returns each one's total time.
func interleave(b *testing.B, fs ...func()) []time.Duration {
	b.Helper()
	total := make([]time.Duration, len(fs))
	b.ResetTimer()
	for i := range b.N {
		for k := range fs {
			j := (i + k) % len(fs)
			start := time.Now()
			fs[j]()
			total[j] += time.Since(start)
		}
	}
	return total
}

// BenchmarkLinearHalf: a 4096×4096 Linear (Llama's q/o projections) for 351 tokens (FramePack's
// prompt) and 4096 tokens, with the weight in f32, bf16 and f16 in turn. The 16-bit weights are
// widened a panel at a time; the metric to read is each one's rate against f32 (…-%).
func BenchmarkLinearHalf(b *testing.B) {
	const D = 4096
	for _, tokens := range []int{351, 4096} {
		b.Run("tokens="+strconv.Itoa(tokens), func(b *testing.B) {
			rt := benchRuntime(b)
			x := benchTensor(b, rt, 1, tokens, D)
			w := benchTensor(b, rt, D, D)
			bias := benchTensor(b, rt, D)
			ws := []*Tensor{w}
			for _, dt := range []DType{BF16, F16} {
				h, err := rt.Cast(w, dt)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(h.Free)
				ws = append(ws, h)
			}
			fs := make([]func(), len(ws))
			for i, wt := range ws {
				fs[i] = func() {
					y, err := rt.Linear(x, wt, bias)
					if err != nil {
						b.Fatal(err)
					}
					y.Free()
				}
			}
			total := interleave(b, fs...)
			flops := 2.0 * float64(tokens) * D * D * float64(b.N)
			for i, name := range []string{"f32", "bf16", "f16"} {
				b.ReportMetric(flops/total[i].Seconds()/1e9, name+"-GFLOP/s")
				if i > 0 {
					b.ReportMetric(100*total[0].Seconds()/total[i].Seconds(), name+"-%")
				}
			}
		})
	}
}

// BenchmarkConv3dHalf: BenchmarkConv3d's shape with 512 channels' worth of weight per output
// row band (512→512, 3×3×3 on 2×32×32, the VAE's deepest blocks), f32 against bf16 weights.
func BenchmarkConv3dHalf(b *testing.B) {
	rt := benchRuntime(b)
	x := benchTensor(b, rt, 1, 512, 2, 32, 32)
	w := benchTensor(b, rt, 512, 512, 3, 3, 3)
	wh, err := rt.Cast(w, BF16)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(wh.Free)
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	run := func(w *Tensor) func() {
		return func() {
			y, err := rt.Conv3d(x, w, nil, p)
			if err != nil {
				b.Fatal(err)
			}
			y.Free()
		}
	}
	total := interleave(b, run(w), run(wh))
	flops := 2.0 * 512 * 512 * 27 * 2 * 32 * 32 * float64(b.N)
	b.ReportMetric(flops/total[0].Seconds()/1e9, "f32-GFLOP/s")
	b.ReportMetric(flops/total[1].Seconds()/1e9, "bf16-GFLOP/s")
	b.ReportMetric(100*total[0].Seconds()/total[1].Seconds(), "bf16-%")
}
