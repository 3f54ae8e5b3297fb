package runtime

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkLinearFP8 times one Linear at the transformer's sizes (17,226 image + text tokens,
// 3072 → 3072 and 3072 → 12288, bf16 activations on a GPU, f32 on the cpu) with a bf16 weight and
// with an e4m3 weight per compute mode (weight-only, fp8 activations per tensor and per token):
// scripts/gpu-check.sh phase fp8 reports it. FP8Stats in the log say which path served.
func BenchmarkLinearFP8(b *testing.B) {
	rt, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	act := BF16
	if rt.Backend().IsHost {
		act = F32
	}
	M := 17226
	if rt.Backend().IsHost {
		M = 512 // the cpu: a shorter sequence, the same shapes otherwise
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, shape := range [][2]int{{3072, 3072}, {3072, 12288}} {
		K, N := shape[0], shape[1]
		xv := make([]float32, M*K)
		for i := range xv {
			xv[i] = float32(r.NormFloat64())
		}
		wv := make([]float32, N*K)
		for i := range wv {
			wv[i] = float32(r.NormFloat64() * 0.02)
		}
		x, err := rt.FromFloat32As(act, xv, M, K)
		if err != nil {
			b.Fatal(err)
		}
		w16, err := rt.FromFloat32As(BF16, wv, N, K)
		if err != nil {
			b.Fatal(err)
		}
		w32, err := rt.FromFloat32(wv, N, K)
		if err != nil {
			b.Fatal(err)
		}
		q, s, err := rt.QuantizeRows(w32)
		w32.Free()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dx%dx%d/bf16", M, K, N), func(b *testing.B) {
			for range b.N {
				y, err := rt.Linear(x, w16, nil)
				if err != nil {
					b.Fatal(err)
				}
				y.Free()
			}
			_ = rt.Synchronize()
		})
		for _, mode := range []FP8Compute{FP8WeightOnly, FP8ActPerTensor, FP8ActPerToken} {
			b.Run(fmt.Sprintf("%dx%dx%d/fp8-%s", M, K, N, mode), func(b *testing.B) {
				rt.SetFP8Compute(mode)
				before := rt.FP8Stats()
				for range b.N {
					y, err := rt.LinearQ(x, q, s, nil, EpilogueNone)
					if err != nil {
						b.Fatal(err)
					}
					y.Free()
				}
				_ = rt.Synchronize()
				after := rt.FP8Stats()
				b.Logf("fp8 stats: %+v (fell back %d)", after, after.FellBack-before.FellBack)
			})
		}
		x.Free()
		w16.Free()
		q.Free()
		s.Free()
	}
}
