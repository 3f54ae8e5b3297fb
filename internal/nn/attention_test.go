package nn

import (
	"math"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/runtime"
)

// refAttention is softmax(q·kᵀ·scale, masked)·v on token-major host arrays: q [L, H, D],
// k and v [Lk, Hkv, D], mask [L, Lk] (nil: all) → [L, H·D].
func refAttention(q, k, v []float32, L, Lk, H, Hkv, D int, mask []uint8) []float32 {
	out := make([]float32, L*H*D)
	scale := 1 / math.Sqrt(float64(D))
	for h := range H {
		kh := h / (H / Hkv)
		for i := range L {
			w := make([]float64, Lk)
			mx := math.Inf(-1)
			for j := range Lk {
				if mask != nil && mask[i*Lk+j] == 0 {
					w[j] = math.Inf(-1)
					continue
				}
				var s float64
				for d := range D {
					s += float64(q[(i*H+h)*D+d]) * float64(k[(j*Hkv+kh)*D+d])
				}
				w[j] = s * scale
				mx = math.Max(mx, w[j])
			}
			var sum float64
			for j := range w {
				w[j] = math.Exp(w[j] - mx)
				sum += w[j]
			}
			for d := range D {
				var acc float64
				for j := range Lk {
					acc += w[j] / sum * float64(v[(j*Hkv+kh)*D+d])
				}
				out[(i*H+h)*D+d] = float32(acc)
			}
		}
	}
	return out
}

// TestAttention checks the one attention layer against a host reference: several heads,
// grouped-query heads, a mask, rank-3 and rank-4 inputs, one head (the VAE's view path).
func TestAttention(t *testing.T) {
	rt := newRuntime(t)
	seq := func(n int, f float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.Sin(float64(i)*f + 0.3))
		}
		return v
	}
	tests := []struct {
		name          string
		L, Lk, H, Hkv int
		D             int
		rank4, masked bool
	}{
		{"heads", 5, 5, 3, 3, 4, false, false},
		{"grouped query, causal", 4, 4, 4, 2, 2, true, true},
		{"one head", 6, 3, 1, 1, 8, false, false},
		{"one query", 1, 4, 2, 2, 4, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, k, v := seq(tc.L*tc.H*tc.D, 0.7), seq(tc.Lk*tc.Hkv*tc.D, 1.3), seq(tc.Lk*tc.Hkv*tc.D, 0.4)
			var mask []uint8
			p := NewPass(t.Context(), rt)
			defer p.Free()
			var mt *runtime.Tensor
			if tc.masked {
				mask = make([]uint8, tc.L*tc.Lk)
				for i := range tc.L {
					for j := range tc.Lk {
						if j <= i || j == 0 {
							mask[i*tc.Lk+j] = 1
						}
					}
				}
				mt = p.Do(rt.FromUint8(mask, 1, 1, tc.L, tc.Lk))
			}
			shape := func(l, h int) []int {
				if tc.rank4 {
					return []int{1, l, h, tc.D}
				}
				return []int{1, l, h * tc.D}
			}
			qt := p.Do(rt.FromFloat32(q, shape(tc.L, tc.H)...))
			kt := p.Do(rt.FromFloat32(k, shape(tc.Lk, tc.Hkv)...))
			vt := p.Do(rt.FromFloat32(v, shape(tc.Lk, tc.Hkv)...))
			a := Attention{Heads: tc.H, KVHeads: tc.Hkv, HeadDim: tc.D}
			o := a.Forward(p, qt, kt, vt, mt)
			if err := p.Err(); err != nil {
				t.Fatal(err)
			}
			if s := o.Shape(); len(s) != 3 || s[0] != 1 || s[1] != tc.L || s[2] != tc.H*tc.D {
				t.Fatalf("shape %v, want [1 %d %d]", s, tc.L, tc.H*tc.D)
			}
			got, err := o.Float32()
			if err != nil {
				t.Fatal(err)
			}
			want := refAttention(q, k, v, tc.L, tc.Lk, tc.H, tc.Hkv, tc.D, mask)
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-5 {
					t.Fatalf("element %d: %v, want %v", i, got[i], want[i])
				}
			}
			if !p.OK() || qt.NumElements() != len(q) {
				t.Fatal("attention consumed its inputs")
			}
		})
	}
}

// TestPass checks the sticky error: ops after a failure are skipped, Sub prefixes its error,
// Keep hands a result out of Free.
func TestPass(t *testing.T) {
	rt := newRuntime(t)
	p := NewPass(t.Context(), rt)
	x := p.Do(rt.FromFloat32([]float32{1, 2, 3, 4}, 2, 2))
	y := p.Sub("block", func(q *Pass) *runtime.Tensor {
		h := q.Do(rt.SiLU(x))
		return q.Do(rt.Add(h, x))
	})
	kept := p.Keep(y)
	bad := p.Sub("layers.3", func(q *Pass) *runtime.Tensor { return q.Do(rt.Add(x, q.Do(rt.FromFloat32([]float32{1, 2, 3}, 3)))) })
	if bad != nil || p.Err() == nil || !strings.HasPrefix(p.Err().Error(), "layers.3: ") {
		t.Fatalf("failed sub: %v, %v", bad, p.Err())
	}
	if z := p.Do(rt.SiLU(x)); z != nil {
		t.Fatal("an op ran after the pass failed")
	}
	p.Free()
	if n := rt.Memory().LiveTensors; n != 1 {
		t.Fatalf("%d tensors alive after Free, want the kept one", n)
	}
	kept.Free()
}
