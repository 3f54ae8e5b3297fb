package runtime

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestRMSNormRoPE checks the fused op against RMSNorm then RoPE (the two ops in turn) and a
// float64 reference, on awkward shapes, both pair layouts, with and without a weight, and on
// device backends in 16 bits against the f32 result.
func TestRMSNormRoPE(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rand.New(rand.NewPCG(16, 2))
	cases := []struct {
		name     string
		x, table []int
		weight   bool
	}{
		{"dit [1,7,3,8] table [1,7,1,8]", []int{1, 7, 3, 8}, []int{1, 7, 1, 8}, true},
		{"batch [2,5,4,6] table [5,1,6]", []int{2, 5, 4, 6}, []int{5, 1, 6}, true},
		{"no weight [3,10] table [3,10]", []int{3, 10}, []int{3, 10}, false},
		{"pairs of one [4,1,2] table [4,1,2]", []int{4, 1, 2}, []int{4, 1, 2}, true},
		{"head dim 128 [1,33,2,128] table [33,1,128]", []int{1, 33, 2, 128}, []int{33, 1, 128}, true},
	}
	const eps = 1e-6
	for _, c := range cases {
		for _, mode := range []RoPEMode{RoPEInterleaved, RoPEHalves} {
			t.Run(fmt.Sprintf("%s mode %d", c.name, mode), func(t *testing.T) {
				D := c.x[len(c.x)-1]
				x, xv := randTensor(t, rt, r, c.x...)
				var w *Tensor
				var wv []float64
				if c.weight {
					wv = f32Round(randVals(r, D))
					w = upload(t, rt, wv, D)
				}
				ang := randVals(r, numel(c.table))
				cv, sv := make([]float64, len(ang)), make([]float64, len(ang))
				for i, a := range ang {
					cv[i], sv[i] = float64(float32(math.Cos(a))), float64(float32(math.Sin(a)))
				}
				cos, sin := upload(t, rt, cv, c.table...), upload(t, rt, sv, c.table...)

				// float64 reference
				want := make([]float64, len(xv))
				half := 1
				if mode == RoPEHalves {
					half = D / 2
				}
				rows := len(xv) / D
				for row := range rows {
					var ss float64
					for i := range D {
						ss += xv[row*D+i] * xv[row*D+i]
					}
					inv := 1 / math.Sqrt(ss/float64(D)+eps)
					n := make([]float64, D)
					for i := range D {
						n[i] = xv[row*D+i] * inv
						if wv != nil {
							n[i] *= wv[i]
						}
					}
					coord := unravel(row*D, c.x)
					for p := range D / 2 {
						i0 := 2 * p
						if mode == RoPEHalves {
							i0 = p
						}
						i1 := i0 + half
						coord[len(coord)-1] = i0
						ci0 := bcastIndex(coord, c.table)
						coord[len(coord)-1] = i1
						ci1 := bcastIndex(coord, c.table)
						want[row*D+i0] = n[i0]*cv[ci0] - n[i1]*sv[ci0]
						want[row*D+i1] = n[i1]*cv[ci1] + n[i0]*sv[ci1]
					}
				}
				y, err := rt.RMSNormRoPE(mode, x, w, cos, sin, eps)
				if err != nil {
					t.Fatal(err)
				}
				defer y.Free()
				got, err := y.Float32()
				if err != nil {
					t.Fatal(err)
				}
				if e := relL2(got, want); e > tol || math.IsNaN(e) {
					t.Fatalf("fused against float64: rel L2 %.3g > %g", e, tol)
				}
				// the two ops in turn
				n, err := rt.RMSNorm(x, w, eps)
				if err != nil {
					t.Fatal(err)
				}
				two, err := rt.RoPE(mode, n, cos, sin)
				n.Free()
				if err != nil {
					t.Fatal(err)
				}
				tv, err := two.Float32()
				two.Free()
				if err != nil {
					t.Fatal(err)
				}
				if e := relL2(got, toF64(tv)); e > tol {
					t.Fatalf("fused against RMSNorm then RoPE: rel L2 %.3g > %g", e, tol)
				}
				if rt.Backend().IsHost {
					return
				}
				for _, dt := range []DType{BF16, F16} {
					xh, err := rt.Cast(x, dt)
					if err != nil {
						t.Fatal(err)
					}
					yh, err := rt.RMSNormRoPE(mode, xh, w, cos, sin, eps)
					xh.Free()
					if err != nil {
						t.Fatalf("%s: %v", dt, err)
					}
					if yh.DType() != dt {
						t.Errorf("%s in: out dtype %s", dt, yh.DType())
					}
					hv, err := yh.Float32()
					yh.Free()
					if err != nil {
						t.Fatal(err)
					}
					if e := relL2(hv, want); e > 1e-2 || math.IsNaN(e) {
						t.Fatalf("%s: rel L2 %.3g > 1e-2", dt, e)
					}
				}
			})
		}
	}
}

func TestRMSNormRoPERejectsBadShapes(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rand.New(rand.NewPCG(16, 3))
	x, _ := randTensor(t, rt, r, 2, 3, 4)
	odd, _ := randTensor(t, rt, r, 2, 3, 5)
	tab, _ := randTensor(t, rt, r, 3, 4)
	short, _ := randTensor(t, rt, r, 3, 2)
	w3, _ := randTensor(t, rt, r, 3)
	for _, c := range []struct {
		name       string
		x, w, c, s *Tensor
	}{
		{"odd head dim", odd, nil, tab, tab},
		{"table without the full last dim", x, nil, short, short},
		{"weight of another length", x, w3, tab, tab},
		{"table that does not broadcast", x, nil, w3, w3},
	} {
		y, err := rt.RMSNormRoPE(RoPEInterleaved, c.x, c.w, c.c, c.s, 1e-6)
		if err == nil {
			y.Free()
			t.Errorf("%s: no error", c.name)
		}
	}
}

// TestLinearGELU checks the fused feed-forward layer against Linear then GELU: ranks 1 to 3,
// with and without bias, f32 and 16-bit weights.
func TestLinearGELU(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rand.New(rand.NewPCG(16, 4))
	cases := []struct {
		name string
		x    []int
		out  int
		bias bool
		wdt  DType
	}{
		{"rank 3 with bias", []int{2, 3, 5}, 7, true, F32},
		{"rank 1", []int{5}, 3, true, F32},
		{"no bias", []int{4, 9}, 6, false, F32},
		{"bf16 weight", []int{1, 33, 64}, 130, true, BF16},
		{"f16 weight", []int{17, 40}, 24, true, F16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.x[len(c.x)-1]
			x, _ := randTensor(t, rt, r, c.x...)
			w32, _ := randTensor(t, rt, r, c.out, in)
			w := castTo(t, rt, w32, c.wdt)
			var b *Tensor
			if c.bias {
				b, _ = randTensor(t, rt, r, c.out)
			}
			lin, err := rt.Linear(x, w, b)
			if err != nil {
				t.Fatal(err)
			}
			g, err := rt.GELU(lin)
			lin.Free()
			if err != nil {
				t.Fatal(err)
			}
			want, err := g.Float32()
			g.Free()
			if err != nil {
				t.Fatal(err)
			}
			shape := append(append([]int(nil), c.x[:len(c.x)-1]...), c.out)
			y, err := rt.LinearGELU(x, w, b)
			check(t, "linear gelu", y, err, shape, toF64(want))
		})
	}
}
