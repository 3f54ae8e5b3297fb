package runtime

import "testing"

// BenchmarkFusedDiT: the transformer's fused elementwise chains at 544×704, window 9 (17,955
// image tokens, 3072 wide, 24 heads × 128) on a device backend, each against the ops in turn, with
// f32 and bf16 activations: the feed-forward's first layer (bf16 weight [12288, 3072] + bias, then
// GELU(tanh)) as Linear then GELU and as LinearGELU, and q's norm + rope as RMSNorm then RoPE and
// as RMSNormRoPE. Skipped on the cpu backend.
func BenchmarkFusedDiT(b *testing.B) {
	const L, dim, mlp, H, D = 17955, 3072, 12288, 24, 128
	rt := benchRuntime(b)
	if rt.Backend().IsHost {
		b.Skip("device backends only")
	}
	w32 := benchTensor(b, rt, mlp, dim)
	w, err := rt.Cast(w32, BF16)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Free)
	w32.Free()
	bias := benchTensor(b, rt, mlp)
	nw := benchTensor(b, rt, D)
	cos, sin := benchTensor(b, rt, 1, L, 1, D), benchTensor(b, rt, 1, L, 1, D)
	x32 := benchTensor(b, rt, 1, L, dim)
	q32 := benchTensor(b, rt, 1, L, H, D)
	for _, dt := range []DType{F32, BF16} {
		x, q := x32, q32
		if dt != F32 {
			if x, err = rt.Cast(x32, dt); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(x.Free)
			if q, err = rt.Cast(q32, dt); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(q.Free)
		}
		cases := []struct {
			name string
			run  func() error
		}{
			{"ff unfused", func() error {
				y, err := rt.Linear(x, w, bias)
				if err != nil {
					return err
				}
				g, err := rt.GELU(y)
				y.Free()
				g.Free()
				return err
			}},
			{"ff fused", func() error {
				y, err := rt.LinearGELU(x, w, bias)
				y.Free()
				return err
			}},
			{"qk unfused", func() error {
				n, err := rt.RMSNorm(q, nw, 1e-6)
				if err != nil {
					return err
				}
				y, err := rt.RoPE(RoPEInterleaved, n, cos, sin)
				n.Free()
				y.Free()
				return err
			}},
			{"qk fused", func() error {
				y, err := rt.RMSNormRoPE(RoPEInterleaved, q, nw, cos, sin, 1e-6)
				y.Free()
				return err
			}},
		}
		for _, c := range cases {
			b.Run(dt.String()+" "+c.name, func(b *testing.B) {
				if err := c.run(); err != nil { // warm: handles, plans, the allocator's cache
					b.Fatal(err)
				}
				if err := rt.Synchronize(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					if err := c.run(); err != nil {
						b.Fatal(err)
					}
				}
				if err := rt.Synchronize(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
