package runtime

import (
	"errors"
	"math"
	"testing"
)

// TestAttentionCausal: a causal + key-padding mask marked Causal (Llama's with padding, CLIP's
// without, a batch-broadcast one) gives the float64 reference through the chain, and on a device
// backend with cuDNN 9 the vendor tier serves it when forced; a mask marked Causal that is not
// one (random keys) is declined by the vendor tier (unavailable, never a wrong result) and the
// chain still gives the reference. On the cpu backend the flag changes nothing.
func TestAttentionCausal(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	const B, L, H, Hkv, D = 2, 77, 4, 2, 64
	host := rt.Backend().IsHost
	bound := 1e-2
	if host {
		bound = tol
	}
	var ts [3]*Tensor
	var vals [3][]float64
	for i, h := range []int{H, Hkv, Hkv} {
		x, _ := randTensor(t, rt, r, B, L, h, D)
		if !host {
			hx, err := rt.Cast(x, BF16)
			if err != nil {
				t.Fatal(err)
			}
			x.Free()
			x = hx
		}
		t.Cleanup(x.Free)
		ts[i] = x
		f, err := x.Float32()
		if err != nil {
			t.Fatal(err)
		}
		vals[i] = permuteBHLD(toF64(f), B, L, h, D)
	}
	causal := func(mb int, lens []int) []uint8 {
		m := make([]uint8, mb*L*L)
		for b := range mb {
			for i := range L {
				for j := 0; j <= i && j < lens[b]; j++ {
					m[(b*L+i)*L+j] = 1
				}
			}
		}
		return m
	}
	random := make([]uint8, L*L)
	for i := range random {
		random[i] = uint8(r.IntN(2))
	}
	for i := range L {
		random[i*L] = 1 // no empty row
	}
	cases := []struct {
		name   string
		mask   []uint8
		shape  []int
		isCaus bool
	}{
		{"clip: causal, no padding", causal(1, []int{L}), []int{1, 1, L, L}, true},
		{"llama: causal and padding", causal(B, []int{L, 50}), []int{B, 1, L, L}, true},
		{"llama: no padding per batch", causal(B, []int{L, L}), []int{B, 1, L, L}, true},
		{"not causal: random keys", random, []int{1, 1, L, L}, false},
	}
	scale := float64(float32(1 / math.Sqrt(D)))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mask := uploadMask(t, rt, c.mask, c.shape...)
			want := permuteBHLD(refAttention(vals[0], vals[1], vals[2], B, H, Hkv, L, L, D, D, c.mask, c.shape, scale), B, H, L, D)
			run := func(p AttentionParams) ([]float32, error) {
				p.Layout = AttentionBLHD
				y, err := rt.Attention(ts[0], ts[1], ts[2], mask, p)
				if err != nil {
					return nil, err
				}
				defer y.Free()
				return y.Float32()
			}
			for _, p := range []AttentionParams{{Causal: true}, {Causal: false}} {
				got, err := run(p)
				if err != nil {
					t.Fatalf("chain (causal %v): %v", p.Causal, err)
				}
				if e := relL2(got, want); e > bound || math.IsNaN(e) {
					t.Fatalf("chain (causal %v): rel L2 %.3g > %g", p.Causal, e, bound)
				}
			}
			if host {
				return
			}
			got, err := run(AttentionParams{Causal: true, Tier: AttentionVendor})
			switch {
			case !c.isCaus:
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("vendor tier on a mask that is not causal: got %v, want unavailable", err)
				}
			case errors.Is(err, ErrUnavailable) && !vendorAttentionRequired():
				t.Skipf("vendor tier unavailable: %v", err)
			case err != nil:
				t.Fatalf("vendor tier: %v", err)
			default:
				e := relL2(got, want)
				t.Logf("vendor (causal) vs float64: rel L2 %.3g", e)
				if e > bound || math.IsNaN(e) {
					t.Fatalf("vendor: rel L2 %.3g > %g", e, bound)
				}
			}
		})
	}
}
