package runtime

import (
	"math"
	"testing"
)

// TestGroupNormSiLU checks the fused op against GroupNorm then SiLU on awkward shapes (trailing
// sizes not a multiple of 8, one group, a group per channel, rows longer than the kernels'
// buffers, no affine): the same values in f32, and in f16/bf16 (output in the input's dtype)
// the f32 result of the rounded input within the storage type's rounding.
func TestGroupNormSiLU(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []groupNormCase{
		{"5d odd", []int{2, 6, 3, 5, 7}, 3, true},
		{"groups=C", []int{1, 5, 1, 3, 3}, 5, true},
		{"one group no affine", []int{1, 4, 2, 9, 11}, 1, false},
		{"2d", []int{3, 8}, 2, true},
		{"long rows", []int{1, 2, 3, 150, 161}, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			xv := randVals(r, numel(c.shape))
			for i := range xv { // an offset, so the mean matters
				xv[i] = float64(float32(xv[i]*2 + 1.5))
			}
			x := upload(t, rt, xv, c.shape...)
			var w, b *Tensor
			if c.affine {
				w, _ = randTensor(t, rt, r, c.shape[1])
				b, _ = randTensor(t, rt, r, c.shape[1])
			}
			const eps = 1e-6
			ref := func(x *Tensor) []float32 {
				n, err := rt.GroupNorm(x, w, b, c.groups, eps)
				if err != nil {
					t.Fatal(err)
				}
				defer n.Free()
				s, err := rt.SiLU(n)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Free()
				v, err := s.Float32()
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			for _, dt := range []DType{F32, F16, BF16} {
				in := castTo(t, rt, x, dt)
				y, err := rt.GroupNormSiLU(in, w, b, c.groups, eps)
				if err != nil {
					t.Fatalf("%s: %v", dt, err)
				}
				if y.DType() != dt || !equalInts(y.Shape(), c.shape) {
					t.Fatalf("%s: out %s %v", dt, y.DType(), y.Shape())
				}
				got, err := y.Float32()
				y.Free()
				if err != nil {
					t.Fatal(err)
				}
				// the reference: the f32 ops on the (rounded) input
				want := ref(x)
				tol := 1e-6
				if dt != F32 {
					rx, err := rt.Cast(in, F32)
					if err != nil {
						t.Fatal(err)
					}
					want = ref(rx)
					rx.Free()
					tol = map[DType]float64{F16: 1e-3, BF16: 8e-3}[dt]
				}
				var num, den, worst float64
				for i := range got {
					if math.IsNaN(float64(got[i])) {
						t.Fatalf("%s: element %d is NaN", dt, i)
					}
					d := float64(got[i]) - float64(want[i])
					num += d * d
					den += float64(want[i]) * float64(want[i])
					worst = max(worst, math.Abs(d))
				}
				e := math.Sqrt(num / den)
				t.Logf("%s: rel L2 %.3g, max abs %.3g", dt, e, worst)
				if e > tol {
					t.Errorf("%s: rel L2 %.3g over %g", dt, e, tol)
				}
			}
		})
	}
	// bad arguments fail in the core, naming the op
	x := upload(t, rt, randVals(r, 12), 1, 6, 2)
	if _, err := rt.GroupNormSiLU(x, nil, nil, 4, 1e-6); err == nil {
		t.Error("4 groups of 6 channels accepted")
	}
}

// TestUpsamplePad checks the fused op against UpsampleNearest3d then replicate Pad3d, bit for
// bit, on several ranks, scales, pads and dtypes (the VAE's causal upsampler uses it).
func TestUpsamplePad(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		name  string
		shape []int
		scale [3]int
		pad   Pad3d
	}{
		{"vae up", []int{1, 3, 3, 5, 7}, [3]int{2, 2, 2}, Pad3d{Before: [3]int{1, 1, 1}, After: [3]int{0, 1, 1}}},
		{"spatial only", []int{2, 2, 1, 4, 3}, [3]int{1, 2, 2}, Pad3d{Before: [3]int{2, 1, 1}, After: [3]int{0, 1, 1}}},
		{"odd scales, wide pads", []int{1, 1, 2, 3, 2}, [3]int{3, 1, 2}, Pad3d{Before: [3]int{4, 2, 5}, After: [3]int{3, 0, 4}}},
		{"rank 3", []int{2, 3, 5}, [3]int{2, 1, 3}, Pad3d{Before: [3]int{0, 1, 2}, After: [3]int{1, 1, 0}}},
		{"rows longer than a warp", []int{1, 2, 2, 3, 40}, [3]int{2, 2, 2}, Pad3d{Before: [3]int{1, 1, 1}, After: [3]int{0, 1, 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := upload(t, rt, randVals(r, numel(c.shape)), c.shape...)
			for _, dt := range []DType{F32, F16, BF16} {
				in := castTo(t, rt, x, dt)
				up, err := rt.UpsampleNearest3d(in, c.scale)
				if err != nil {
					t.Fatal(err)
				}
				want, err := rt.Pad3d(up, PadReplicate, c.pad)
				up.Free()
				if err != nil {
					t.Fatal(err)
				}
				got, err := rt.UpsamplePad(in, c.scale, c.pad)
				if err != nil {
					t.Fatalf("%s: %v", dt, err)
				}
				if !equalInts(got.Shape(), want.Shape()) || got.DType() != dt {
					t.Fatalf("%s: %s %v, want %v", dt, got.DType(), got.Shape(), want.Shape())
				}
				g, w := values(t, got), values(t, want)
				got.Free()
				want.Free()
				for i := range w {
					if g[i] != w[i] {
						t.Fatalf("%s: element %d is %g, want %g", dt, i, g[i], w[i])
					}
				}
			}
		})
	}
	x := upload(t, rt, randVals(r, 6), 1, 2, 3)
	if _, err := rt.UpsamplePad(x, [3]int{0, 1, 1}, Pad3d{}); err == nil {
		t.Error("scale 0 accepted")
	}
}
