package runtime

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestHalfActivations runs every compute op on F16 and BF16 activations and checks that the
// output comes back in the input's dtype and equals the same op on f32 copies of the inputs,
// rounded once to that dtype: bit for bit on the cpu backend (which computes on f32 stand-ins),
// within one 16-bit rounding elsewhere (a GPU accumulates in f32 in its own order).
func TestHalfActivations(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	host := rt.Backend().IsHost
	for _, dt := range []DType{BF16, F16} {
		t.Run(dt.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(dt)))
			// in makes a 16-bit tensor and an f32 tensor of the same values.
			in := func(shape ...int) (*Tensor, *Tensor) {
				h, f, _ := halfTensor(t, rt, r, dt, shape...)
				return h, f
			}
			w16, w32 := in(24, 40)
			b16, b32 := in(24)
			n16, n32 := in(40)
			gw16, gw32 := in(8)
			cw, _ := halfVals(t, rt, r, dt, 8, 4, 3, 3, 3) // a 16-bit conv weight, as Load keeps it
			cb16, cb32 := in(8)
			cs16, cs32 := in(1, 6, 16)
			cases := []struct {
				name string
				run  func(x *Tensor, wt, bias, norm, gnw, conv, cosT *Tensor) (*Tensor, error)
				xs   []int
			}{
				{"linear", func(x, wt, bias, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Linear(x, wt, bias) }, []int{3, 5, 40}},
				{"matmul", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) {
					return rt.MatMul(x, x, GemmParams{TransB: true})
				}, []int{2, 7, 40}},
				{"layer norm", func(x, _, bias, norm, _, _, _ *Tensor) (*Tensor, error) { return rt.LayerNorm(x, norm, nil, 1e-6) }, []int{6, 40}},
				{"rms norm", func(x, _, _, norm, _, _, _ *Tensor) (*Tensor, error) { return rt.RMSNorm(x, norm, 1e-6) }, []int{6, 40}},
				{"group norm", func(x, _, _, _, gnw, _, _ *Tensor) (*Tensor, error) { return rt.GroupNorm(x, gnw, gnw, 4, 1e-6) }, []int{2, 8, 3, 4, 5}},
				{"silu", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.SiLU(x) }, []int{5, 40}},
				{"gelu", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.GELU(x) }, []int{5, 40}},
				{"affine", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Affine(x, 1.5, -0.25) }, []int{5, 40}},
				{"mul broadcast", func(x, _, _, norm, _, _, _ *Tensor) (*Tensor, error) { return rt.Mul(x, norm) }, []int{5, 40}},
				{"add same shape", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Add(x, x) }, []int{5, 40}},
				{"sub odd length", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Sub(x, x) }, []int{3, 7}},
				{"softmax", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Softmax(x, 0.5) }, []int{5, 40}},
				{"mean", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) { return rt.Mean(x, -1) }, []int{5, 40}},
				{"avg pool", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) {
					return rt.AvgPool3d(x, [3]int{1, 2, 2}, [3]int{1, 2, 2})
				}, []int{2, 3, 4, 6}},
				{"rope", func(x, _, _, _, _, _, cosT *Tensor) (*Tensor, error) { return rt.RoPE(RoPEInterleaved, x, cosT, cosT) }, []int{2, 6, 16}},
				{"conv3d", func(x, _, bias, _, _, conv, _ *Tensor) (*Tensor, error) {
					return rt.Conv3d(x, conv, bias, Conv3dParams{Padding: [3]int{1, 1, 1}})
				}, []int{1, 4, 3, 5, 6}},
				{"modulate", func(x, _, bias, norm, _, _, _ *Tensor) (*Tensor, error) { return rt.Modulate(x, norm, norm) }, []int{2, 5, 40}},
				{"gate residual", func(x, _, _, norm, _, _, _ *Tensor) (*Tensor, error) { return rt.GateResidual(x, norm, x) }, []int{2, 5, 40}},
				{"attention", func(x, _, _, _, _, _, _ *Tensor) (*Tensor, error) {
					return rt.Attention(x, x, x, nil, AttentionParams{Layout: AttentionBLHD})
				}, []int{1, 9, 2, 16}},
			}
			for _, c := range cases {
				x16, x32 := in(c.xs...)
				wide := []*Tensor{x32, w32, b32, n32, gw32, cw, cs32}
				half := []*Tensor{x16, w16, b16, n16, gw16, cw, cs16}
				if c.name == "conv3d" {
					wide[2], half[2] = cb32, cb16
				}
				want, err := c.run(wide[0], wide[1], wide[2], wide[3], wide[4], wide[5], wide[6])
				if err != nil {
					t.Fatalf("%s f32: %v", c.name, err)
				}
				got, err := c.run(half[0], half[1], half[2], half[3], half[4], half[5], half[6])
				if err != nil {
					want.Free()
					t.Fatalf("%s %s: %v", c.name, dt, err)
				}
				if got.DType() != dt {
					t.Errorf("%s: output %s from %s activations, want %s", c.name, got.DType(), dt, dt)
				}
				compareRounded(t, c.name, got, want, dt, host)
				got.Free()
				want.Free()
			}
		})
	}
}

// compareRounded checks got (a 16-bit result) against want (f32) rounded to dt: bit for bit
// when exact, else within one rounding of dt in relative L2.
func compareRounded(t *testing.T, name string, got, want *Tensor, dt DType, exact bool) {
	t.Helper()
	g, w := values(t, got), values(t, want)
	if len(g) != len(w) {
		t.Fatalf("%s: %d values, want %d", name, len(g), len(w))
	}
	rw := make([]float64, len(w))
	mismatch := -1
	for i := range w {
		rw[i] = float64(roundTo(w[i], dt))
		if math.IsNaN(float64(g[i])) {
			t.Fatalf("%s: element %d not written", name, i)
		}
		if float64(g[i]) != rw[i] && mismatch < 0 {
			mismatch = i
		}
	}
	if exact && mismatch >= 0 {
		t.Errorf("%s %s: element %d is %g, the f32 result rounded is %g", name, dt, mismatch, g[mismatch], rw[mismatch])
	}
	if e := relL2(g, rw); e > 4e-3 {
		t.Errorf("%s %s: rel L2 %.3g against the rounded f32 result", name, dt, e)
	}
}

// roundTo rounds v to dt (round to nearest even) and back, as the runtime's conversions do.
func roundTo(v float32, dt DType) float32 {
	switch dt {
	case BF16:
		b := math.Float32bits(v)
		if v != v {
			return v
		}
		b += 0x7fff + (b>>16)&1
		return math.Float32frombits(b &^ 0xffff)
	case F16:
		return f16Round(v)
	}
	panic(fmt.Sprintf("roundTo %s", dt))
}

// f16Round rounds v to the nearest half-precision value (ties to even), in float64 arithmetic.
func f16Round(v float32) float32 {
	x := float64(v)
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return v
	}
	a := math.Abs(x)
	if a >= 65520 {
		return float32(math.Copysign(math.Inf(1), x))
	}
	_, exp := math.Frexp(a) // a = f·2^exp, f in [0.5, 1)
	e := max(exp-1, -14)    // subnormals share the smallest exponent
	ulp := math.Ldexp(1, e-10)
	return float32(math.RoundToEven(x/ulp) * ulp)
}

// TestFusedTernary: Modulate and GateResidual equal the unfused ops they replace in f32 (bit for
// bit on the cpu: the same f32 steps in the same order), broadcast scale, shift and gate over
// the leading dims, and refuse operands that do not broadcast to x.
func TestFusedTernary(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	x, _ := randTensor(t, rt, r, 2, 7, 48)
	y, _ := randTensor(t, rt, r, 2, 7, 48)
	scale, _ := randTensor(t, rt, r, 1, 48)
	shift, _ := randTensor(t, rt, r, 2, 1, 48)
	unfusedModulate := func() (*Tensor, error) {
		s1, err := rt.Affine(scale, 1, 1)
		if err != nil {
			return nil, err
		}
		defer s1.Free()
		h, err := rt.Mul(x, s1)
		if err != nil {
			return nil, err
		}
		defer h.Free()
		return rt.Add(h, shift)
	}
	unfusedGate := func() (*Tensor, error) {
		g, err := rt.Mul(y, scale)
		if err != nil {
			return nil, err
		}
		defer g.Free()
		return rt.Add(x, g)
	}
	for _, c := range []struct {
		name           string
		fused, unfused func() (*Tensor, error)
	}{
		{"modulate", func() (*Tensor, error) { return rt.Modulate(x, scale, shift) }, unfusedModulate},
		{"gate residual", func() (*Tensor, error) { return rt.GateResidual(x, scale, y) }, unfusedGate},
	} {
		got, err := c.fused()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want, err := c.unfused()
		if err != nil {
			got.Free()
			t.Fatal(err)
		}
		if !equalInts(got.Shape(), x.Shape()) || got.DType() != F32 {
			t.Errorf("%s: %s, want x's shape and dtype", c.name, got)
		}
		if identical := sameAsF32(t, c.name, got, want); !identical && rt.Backend().IsHost {
			t.Errorf("%s: not bit-identical to the unfused ops on the cpu", c.name)
		}
		got.Free()
		want.Free()
	}
	bad, _ := randTensor(t, rt, r, 3, 48)
	if z, err := rt.Modulate(x, bad, shift); !errors.Is(err, ErrInvalidArgument) {
		if err == nil {
			z.Free()
		}
		t.Errorf("modulate with scale [3, 48] over x [2, 7, 48]: %v, want invalid argument", err)
	}
	if z, err := rt.GateResidual(x, scale, scale); !errors.Is(err, ErrInvalidArgument) {
		if err == nil {
			z.Free()
		}
		t.Errorf("gate residual with y [1, 48] over x [2, 7, 48]: %v, want invalid argument", err)
	}
}

// TestConv3dHalfSlabs: 16-bit convs large enough that the cuda backend runs them channels-last
// in several slabs of output frames (FRAMEPACK_CUDNN_SLAB_MB=16 against 21 MB of input and
// output), with temporal strides and a bias, equal the same conv on f32 copies within one 16-bit
// rounding (bit for bit on the cpu backend). Temporal padding keeps one slab on the vendor
// tiers. On a GPU each of its own tiers runs forced alone (the own kernel's matrix path reads
// the same slabs, with the zero padding gathered in).
func TestConv3dHalfSlabs(t *testing.T) {
	t.Setenv("FRAMEPACK_CUDNN_SLAB_MB", "16")
	matrixConvStrict(t)
	base := newTestRuntime(t, Options{})
	for _, tier := range base.Backend().ConvTiers {
		if tier == TierCPU && !base.Backend().IsHost {
			continue // the host round trip: TestConvHostBounce
		}
		t.Run(tier.String(), func(t *testing.T) {
			convHalfSlabs(t, newTestRuntime(t, Options{ConvPolicy: ConvPolicy{FirstTier: tier, Only: true}}))
		})
	}
}

// matrixConvStrict makes the gpu backend's matrix-unit conv (the own tier's kernel) fail a
// call when its self-check has turned it off, rather than fall to the FMA kernel, so a test
// forcing the own tier runs the kernel it names (no effect on the cpu backend).
func matrixConvStrict(t *testing.T) {
	t.Setenv("FRAMEPACK_GPU_CONV_SELFCHECK", "strict")
	t.Setenv("FRAMEPACK_GPU_CONV_FMA", "0")
}

func convHalfSlabs(t *testing.T, rt *Runtime) {
	host := rt.Backend().IsHost
	r := rand.New(rand.NewPCG(11, 3))
	for _, c := range []struct {
		name   string
		xs, ws []int
		p      Conv3dParams
	}{
		{"k3 spatial pad", []int{1, 32, 9, 128, 160}, []int{32, 32, 3, 3, 3}, Conv3dParams{Padding: [3]int{0, 1, 1}}},
		{"stride 2", []int{1, 32, 11, 128, 160}, []int{24, 32, 3, 3, 3}, Conv3dParams{Stride: [3]int{2, 2, 2}}},
		{"temporal pad", []int{1, 16, 5, 64, 64}, []int{16, 16, 3, 3, 3}, Conv3dParams{Padding: [3]int{1, 1, 1}}},
		// several slabs on the own tier (it gathers the zero padding; cuDNN keeps one slab)
		{"temporal pad, slabs", []int{1, 32, 9, 128, 160}, []int{32, 32, 3, 3, 3}, Conv3dParams{Padding: [3]int{1, 1, 1}}},
		{"pointwise", []int{1, 48, 9, 128, 128}, []int{16, 48, 1, 1, 1}, Conv3dParams{}},
	} {
		for _, dt := range []DType{F16, BF16} {
			name := dt.String() + " " + c.name
			x16, x32, _ := halfTensor(t, rt, r, dt, c.xs...)
			w16, w32, _ := halfTensor(t, rt, r, dt, c.ws...)
			b16, b32, _ := halfTensor(t, rt, r, dt, c.ws[0])
			want, err := rt.Conv3d(x32, w32, b32, c.p)
			if err != nil {
				t.Fatalf("%s f32: %v", name, err)
			}
			got, err := rt.Conv3d(x16, w16, b16, c.p)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !equalInts(got.Shape(), want.Shape()) {
				t.Fatalf("%s: shape %v, want %v", name, got.Shape(), want.Shape())
			}
			compareRounded(t, name, got, want, dt, host)
			got.Free()
			want.Free()
		}
	}
}

// TestConv3dInputView: a conv that reads its input through upsampling and replicate padding
// (Conv3dParams.Input: the VAE's causal convs, downsamplers and upsamplers) equals the conv of
// the tensor UpsamplePad makes, with every tier the backend has forced alone, in f32, f16 and
// bf16: bit for bit on the cpu backend (the core makes the tensor there), within a 16-bit
// rounding on a GPU (the cuda backend gathers the view into its channels-last slabs, the own
// kernel reads it in place, other paths get the tensor from the core). On a GPU the larger
// cases run in several slabs (FRAMEPACK_CUDNN_SLAB_MB=16). One case adds zero padding around
// the view (the own tier's slabs gather it too).
func TestConv3dInputView(t *testing.T) {
	t.Setenv("FRAMEPACK_CUDNN_SLAB_MB", "16")
	matrixConvStrict(t)
	base := newTestRuntime(t, Options{})
	host := base.Backend().IsHost
	causal := Pad3d{Before: [3]int{2, 1, 1}, After: [3]int{0, 1, 1}}
	upPad := Pad3d{Before: [3]int{1, 1, 1}, After: [3]int{0, 1, 1}}
	cases := []viewCase{
		{"causal k3", []int{1, 8, 5, 12, 20}, []int{8, 8, 3, 3, 3}, Conv3dParams{Input: ConvInput{Replicate: causal}}, false},
		{"causal k3 stride 2", []int{1, 8, 7, 13, 18}, []int{16, 8, 3, 3, 3},
			Conv3dParams{Stride: [3]int{2, 2, 2}, Input: ConvInput{Replicate: causal}}, false},
		{"upsample 2x2x2", []int{1, 8, 3, 6, 10}, []int{8, 8, 3, 3, 3},
			Conv3dParams{Input: ConvInput{Upsample: [3]int{2, 2, 2}, Replicate: upPad}}, false},
		{"upsample 1x2x2", []int{1, 8, 3, 6, 10}, []int{8, 8, 3, 3, 3},
			Conv3dParams{Input: ConvInput{Upsample: [3]int{1, 2, 2}, Replicate: causal}}, false},
		{"view and zero padding", []int{1, 16, 4, 9, 11}, []int{16, 16, 3, 3, 3},
			Conv3dParams{Padding: [3]int{1, 1, 2}, Input: ConvInput{Upsample: [3]int{1, 2, 1}, Replicate: causal}}, false},
		{"causal k3 slabs", []int{1, 32, 9, 150, 200}, []int{32, 32, 3, 3, 3}, Conv3dParams{Input: ConvInput{Replicate: causal}}, true},
		{"upsample slabs", []int{1, 32, 5, 75, 100}, []int{32, 32, 3, 3, 3},
			Conv3dParams{Input: ConvInput{Upsample: [3]int{2, 2, 2}, Replicate: upPad}}, true},
	}
	for _, tier := range base.Backend().ConvTiers {
		t.Run(tier.String(), func(t *testing.T) {
			rt := newTestRuntime(t, Options{ConvPolicy: ConvPolicy{FirstTier: tier, Only: true}})
			r := rand.New(rand.NewPCG(5, uint64(tier)))
			for _, c := range cases {
				if c.device && (host || tier == TierCPU) {
					continue
				}
				for _, dt := range []DType{F32, F16, BF16} {
					c.check(t, rt, r, dt, host)
				}
			}
		})
	}
	x, _ := randTensor(t, base, rand.New(rand.NewPCG(1, 1)), 1, 4, 0, 5, 5)
	w, _ := randTensor(t, base, rand.New(rand.NewPCG(1, 2)), 4, 4, 1, 3, 3)
	if y, err := base.Conv3d(x, w, nil, Conv3dParams{Input: ConvInput{Replicate: Pad3d{Before: [3]int{1, 1, 1}}}}); !errors.Is(err, ErrInvalidArgument) {
		if err == nil {
			y.Free()
		}
		t.Errorf("replicate padding of an empty dim: %v, want invalid argument", err)
	}
}

// viewCase is one conv of TestConv3dInputView: x and w shapes, the conv's params (with an
// input view), and whether it runs only on a GPU backend (large: slabs).
type viewCase struct {
	name   string
	xs, ws []int
	p      Conv3dParams
	device bool
}

// check runs the case in dt on rt and compares with the conv of the tensor UpsamplePad makes.
func (c viewCase) check(t *testing.T, rt *Runtime, r *rand.Rand, dt DType, host bool) {
	t.Helper()
	name := fmt.Sprintf("%s %s", c.name, dt)
	var x, w, b *Tensor
	if dt == F32 {
		x, _ = randTensor(t, rt, r, c.xs...)
		w, _ = randTensor(t, rt, r, c.ws...)
		b, _ = randTensor(t, rt, r, c.ws[0])
	} else {
		x, _, _ = halfTensor(t, rt, r, dt, c.xs...)
		w, _, _ = halfTensor(t, rt, r, dt, c.ws...)
		b, _, _ = halfTensor(t, rt, r, dt, c.ws[0])
	}
	defer x.Free()
	defer w.Free()
	defer b.Free()
	got, err := rt.Conv3d(x, w, b, c.p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer got.Free()
	up := c.p.Input.Upsample
	if up == [3]int{} {
		up = [3]int{1, 1, 1}
	}
	made, err := rt.UpsamplePad(x, up, c.p.Input.Replicate)
	if err != nil {
		t.Fatalf("%s: upsample pad: %v", name, err)
	}
	plain := c.p
	plain.Input = ConvInput{}
	want, err := rt.Conv3d(made, w, b, plain)
	made.Free()
	if err != nil {
		t.Fatalf("%s: conv of the made input: %v", name, err)
	}
	defer want.Free()
	if !equalInts(got.Shape(), want.Shape()) {
		t.Fatalf("%s: shape %v, want %v", name, got.Shape(), want.Shape())
	}
	g, wv := values(t, got), values(t, want)
	ref := make([]float64, len(wv))
	same := true
	for i := range wv {
		ref[i] = float64(wv[i])
		if math.IsNaN(float64(g[i])) {
			t.Fatalf("%s: element %d not written", name, i)
		}
		same = same && math.Float32bits(g[i]) == math.Float32bits(wv[i])
	}
	tol := 1e-5
	if dt != F32 {
		tol = 4e-3
	}
	if e := relL2(g, ref); e > tol || (host && !same) {
		t.Errorf("%s: rel L2 %.3g against the conv of the made input (tolerance %g; bit for bit on the cpu: %v)",
			name, e, tol, same)
	}
}
