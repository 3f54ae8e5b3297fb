package runtime

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func rng(t *testing.T) *rand.Rand {
	h := uint64(14695981039346656037)
	for _, c := range t.Name() {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(h, 7))
}

// ---- GEMM -----------------------------------------------------------------------------------

func refMatMul(a []float64, as []int, b []float64, bs []int, p GemmParams) ([]float64, []int) {
	M, K := as[len(as)-2], as[len(as)-1]
	if p.TransA {
		M, K = K, M
	}
	N := bs[len(bs)-1]
	if p.TransB {
		N = bs[len(bs)-2]
	}
	batch := numel(as[:len(as)-2])
	bBatch := numel(bs[:len(bs)-2])
	alpha := float64(p.Alpha)
	if alpha == 0 {
		alpha = 1
	}
	out := make([]float64, batch*M*N)
	for z := range batch {
		ao := z * M * K
		bo := 0
		if bBatch > 1 {
			bo = z * K * N
		}
		for i := range M {
			for j := range N {
				acc := 0.0
				for k := range K {
					av := a[ao+i*K+k]
					if p.TransA {
						av = a[ao+k*M+i]
					}
					bv := b[bo+k*N+j]
					if p.TransB {
						bv = b[bo+j*K+k]
					}
					acc += av * bv
				}
				out[z*M*N+i*N+j] = alpha * acc
			}
		}
	}
	return out, append(slices.Clone(as[:len(as)-2]), M, N)
}

func TestMatMul(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	cases := []struct {
		name   string
		as, bs []int
		p      GemmParams
	}{
		{"plain", []int{7, 13}, []int{13, 5}, GemmParams{}},
		{"size-1 dims", []int{1, 1}, []int{1, 1}, GemmParams{}},
		{"vector-like", []int{1, 17}, []int{17, 1}, GemmParams{}},
		{"transA", []int{9, 3}, []int{9, 11}, GemmParams{TransA: true}},
		{"transB", []int{5, 19}, []int{23, 19}, GemmParams{TransB: true}},
		{"both trans alpha", []int{6, 4}, []int{3, 6}, GemmParams{TransA: true, TransB: true, Alpha: 0.37}},
		{"batched", []int{3, 5, 7}, []int{3, 7, 2}, GemmParams{}},
		{"batched shared b", []int{2, 3, 5, 7}, []int{7, 9}, GemmParams{}},
		{"batched b of batch 1", []int{4, 5, 7}, []int{1, 7, 3}, GemmParams{}},
		{"odd block sizes", []int{67, 129}, []int{129, 33}, GemmParams{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, av := randTensor(t, rt, r, c.as...)
			b, bv := randTensor(t, rt, r, c.bs...)
			want, shape := refMatMul(av, c.as, bv, c.bs, c.p)
			y, err := rt.MatMul(a, b, c.p)
			check(t, c.name, y, err, shape, want)
		})
	}
}

func TestLinear(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		name    string
		xs      []int
		out     int
		hasBias bool
	}{
		{"rank1", []int{13}, 7, true},
		{"rank2 no bias", []int{5, 13}, 7, false},
		{"rank3", []int{2, 3, 17}, 1, true},
		{"rank4", []int{2, 1, 3, 9}, 11, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.xs[len(c.xs)-1]
			x, xv := randTensor(t, rt, r, c.xs...)
			w, wv := randTensor(t, rt, r, c.out, in)
			var b *Tensor
			var bv []float64
			if c.hasBias {
				b, bv = randTensor(t, rt, r, c.out)
			}
			rows := numel(c.xs) / in
			want := make([]float64, rows*c.out)
			for i := range rows {
				for o := range c.out {
					acc := 0.0
					if bv != nil {
						acc = bv[o]
					}
					for k := range in {
						acc += xv[i*in+k] * wv[o*in+k]
					}
					want[i*c.out+o] = acc
				}
			}
			shape := append(slices.Clone(c.xs[:len(c.xs)-1]), c.out)
			y, err := rt.Linear(x, w, b)
			check(t, c.name, y, err, shape, want)
		})
	}
}

// ---- conv -----------------------------------------------------------------------------------

func TestConv3d(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	cases := []struct {
		name    string
		xs, ws  []int
		p       Conv3dParams
		hasBias bool
	}{
		{"k3 pad1", []int{1, 3, 5, 7, 9}, []int{4, 3, 3, 3, 3}, Conv3dParams{Padding: [3]int{1, 1, 1}}, true},
		{"pointwise", []int{2, 5, 3, 4, 7}, []int{3, 5, 1, 1, 1}, Conv3dParams{}, true},
		{"pointwise groups", []int{1, 6, 2, 3, 5}, []int{4, 3, 1, 1, 1}, Conv3dParams{Groups: 2}, false},
		{"stride 2 odd", []int{1, 2, 7, 9, 11}, []int{3, 2, 3, 3, 3}, Conv3dParams{Stride: [3]int{2, 2, 2}, Padding: [3]int{1, 1, 1}}, true},
		{"mixed stride pad", []int{2, 4, 4, 6, 5}, []int{5, 4, 2, 3, 1}, Conv3dParams{Stride: [3]int{1, 2, 3}, Padding: [3]int{0, 2, 1}}, true},
		{"groups 3", []int{1, 6, 3, 5, 4}, []int{9, 2, 1, 3, 3}, Conv3dParams{Padding: [3]int{0, 1, 1}, Groups: 3}, true},
		{"depthwise", []int{1, 4, 3, 4, 4}, []int{4, 1, 3, 3, 3}, Conv3dParams{Padding: [3]int{1, 1, 1}, Groups: 4}, false},
		{"size-1 dims", []int{1, 1, 1, 1, 1}, []int{1, 1, 1, 1, 1}, Conv3dParams{}, true},
		{"kernel equals input", []int{1, 2, 3, 3, 3}, []int{2, 2, 3, 3, 3}, Conv3dParams{}, true},
		{"pad only wide", []int{1, 1, 1, 2, 3}, []int{2, 1, 1, 3, 3}, Conv3dParams{Padding: [3]int{0, 2, 2}}, true},
		{"stride beyond kernel", []int{1, 2, 2, 9, 10}, []int{2, 2, 1, 2, 2}, Conv3dParams{Stride: [3]int{1, 4, 3}}, false},
		{"patch embed 1x2x2", []int{1, 3, 3, 6, 8}, []int{5, 3, 1, 2, 2}, Conv3dParams{Stride: [3]int{1, 2, 2}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.xs...)
			w, wv := randTensor(t, rt, r, c.ws...)
			var b *Tensor
			var bv []float64
			if c.hasBias {
				b, bv = randTensor(t, rt, r, c.ws[0])
			}
			want, shape := refConv3d(xv, c.xs, wv, c.ws, bv, c.p)
			y, err := rt.Conv3d(x, w, b, c.p)
			check(t, c.name, y, err, shape, want)
		})
	}
}

// TestConv3dBanded forces several im2col row bands per time slice (wide input, many channels)
// so band edges are exercised.
func TestConv3dBanded(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	// K = 64·27 = 1728, Wo = 600: 32 MiB / (1728·600·4) = 8 rows per band, Ho = 19.
	xs, ws := []int{1, 64, 1, 19, 600}, []int{2, 64, 3, 3, 3}
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	x, xv := randTensor(t, rt, r, xs...)
	w, wv := randTensor(t, rt, r, ws...)
	want, shape := refConv3d(xv, xs, wv, ws, nil, p)
	y, err := rt.Conv3d(x, w, nil, p)
	check(t, "banded", y, err, shape, want)
}

func TestConv2d(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	x, xv := randTensor(t, rt, r, 2, 3, 9, 7)
	w, wv := randTensor(t, rt, r, 4, 3, 3, 2)
	b, bv := randTensor(t, rt, r, 4)
	p := Conv2dParams{Stride: [2]int{2, 1}, Padding: [2]int{1, 0}}
	want, shape := refConv3d(xv, []int{2, 3, 1, 9, 7}, wv, []int{4, 3, 1, 3, 2}, bv,
		Conv3dParams{Stride: [3]int{1, 2, 1}, Padding: [3]int{0, 1, 0}})
	y, err := rt.Conv2d(x, w, b, p)
	check(t, "conv2d", y, err, []int{shape[0], shape[1], shape[3], shape[4]}, want)
}

// ---- norms ----------------------------------------------------------------------------------

// groupNormCase is a GroupNorm test shape: the input's shape, the number of groups and whether
// the op has a weight and bias.
type groupNormCase struct {
	name   string
	shape  []int
	groups int
	affine bool
}

func TestGroupNorm(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []groupNormCase{
		{"5d", []int{2, 6, 3, 5, 7}, 3, true},
		{"4d no affine", []int{1, 8, 3, 5}, 4, false},
		{"2d groups=C", []int{3, 5}, 5, true},
		{"one group", []int{1, 7, 1, 1, 13}, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.shape...)
			for i := range xv { // offset so the mean matters
				xv[i] = float64(float32(xv[i]*3 + 2))
			}
			x.Free()
			x = upload(t, rt, xv, c.shape...)
			C := c.shape[1]
			var w, b *Tensor
			var wv, bv []float64
			if c.affine {
				w, wv = randTensor(t, rt, r, C)
				b, bv = randTensor(t, rt, r, C)
			}
			const eps = 1e-6
			N, inner := c.shape[0], numel(c.shape[2:])
			cpg := C / c.groups
			want := make([]float64, len(xv))
			for n := range N {
				for g := range c.groups {
					lo := (n*C + g*cpg) * inner
					hi := lo + cpg*inner
					mean, vr := 0.0, 0.0
					for i := lo; i < hi; i++ {
						mean += xv[i]
					}
					mean /= float64(hi - lo)
					for i := lo; i < hi; i++ {
						vr += (xv[i] - mean) * (xv[i] - mean)
					}
					vr /= float64(hi - lo)
					for i := lo; i < hi; i++ {
						ch := (i / inner) % C
						v := (xv[i] - mean) / math.Sqrt(vr+eps)
						if c.affine {
							v = v*wv[ch] + bv[ch]
						}
						want[i] = v
					}
				}
			}
			y, err := rt.GroupNorm(x, w, b, c.groups, eps)
			check(t, c.name, y, err, c.shape, want)
		})
	}
}

func refRowNorm(xv []float64, D int, wv, bv []float64, eps float64, rms bool) []float64 {
	want := make([]float64, len(xv))
	for r0 := 0; r0 < len(xv); r0 += D {
		row := xv[r0 : r0+D]
		mean := 0.0
		if !rms {
			for _, v := range row {
				mean += v
			}
			mean /= float64(D)
		}
		vr := 0.0
		for _, v := range row {
			vr += (v - mean) * (v - mean)
		}
		vr /= float64(D)
		for i, v := range row {
			o := (v - mean) / math.Sqrt(vr+eps)
			if wv != nil {
				o *= wv[i]
			}
			if bv != nil {
				o += bv[i]
			}
			want[r0+i] = o
		}
	}
	return want
}

func TestLayerNorm(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		name   string
		shape  []int
		affine bool
	}{
		{"affine", []int{3, 5, 17}, true},
		{"no affine", []int{7, 33}, false},
		{"D=1", []int{4, 1}, true},
		{"rank1", []int{129}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.shape...)
			D := c.shape[len(c.shape)-1]
			var w, b *Tensor
			var wv, bv []float64
			if c.affine {
				w, wv = randTensor(t, rt, r, D)
				b, bv = randTensor(t, rt, r, D)
			}
			want := refRowNorm(xv, D, wv, bv, 1e-5, false)
			y, err := rt.LayerNorm(x, w, b, 1e-5)
			check(t, c.name, y, err, c.shape, want)
		})
	}
}

func TestRMSNorm(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		name   string
		shape  []int
		weight bool
	}{
		{"weight", []int{2, 3, 19}, true},
		{"no weight", []int{5, 128}, false},
		{"D=1", []int{3, 1}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.shape...)
			D := c.shape[len(c.shape)-1]
			var w *Tensor
			var wv []float64
			if c.weight {
				w, wv = randTensor(t, rt, r, D)
			}
			want := refRowNorm(xv, D, wv, nil, 1e-6, true)
			y, err := rt.RMSNorm(x, w, 1e-6)
			check(t, c.name, y, err, c.shape, want)
		})
	}
}

// ---- elementwise ----------------------------------------------------------------------------

func TestUnary(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	cases := []struct {
		op  UnaryOp
		ref func(float64) float64
		pos bool // needs positive input
	}{
		{OpSiLU, func(v float64) float64 { return v * sig(v) }, false},
		{OpGELUTanh, func(v float64) float64 {
			return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
		}, false},
		{OpQuickGELU, func(v float64) float64 { return v * sig(1.702*v) }, false},
		{OpGELUErf, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }, false},
		{OpSigmoid, sig, false},
		{OpTanh, math.Tanh, false},
		{OpExp, math.Exp, false},
		{OpNeg, func(v float64) float64 { return -v }, false},
		{OpSqrt, math.Sqrt, true},
		{OpRsqrt, func(v float64) float64 { return 1 / math.Sqrt(v) }, true},
	}
	for _, c := range cases {
		t.Run(c.op.String(), func(t *testing.T) {
			shape := []int{3, 1, 37001} // over one parallel grain, odd
			v := randVals(r, numel(shape))
			for i := range v {
				v[i] *= 3
				if c.pos {
					v[i] = math.Abs(v[i]) + 1e-3
				}
			}
			v = f32Round(v)
			x := upload(t, rt, v, shape...)
			want := make([]float64, len(v))
			for i := range v {
				want[i] = c.ref(v[i])
			}
			y, err := rt.Unary(c.op, x)
			check(t, c.op.String(), y, err, shape, want)
		})
	}
	t.Run("affine", func(t *testing.T) {
		x, xv := randTensor(t, rt, r, 5, 7)
		want := make([]float64, len(xv))
		for i := range xv {
			want[i] = xv[i]*float64(float32(0.476986)) + float64(float32(-0.25))
		}
		y, err := rt.Affine(x, 0.476986, -0.25)
		check(t, "affine", y, err, []int{5, 7}, want)
	})
}

// TestVectorUnaryAccuracy checks the 8-lane tanh and GELU(erf) element by element over a dense
// grid and special values: absolute and relative error against float64, NaN and infinities,
// signed zeros, and the same result for an element in the padded last vector as in a full one.
func TestVectorUnaryAccuracy(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	const n = 200003 // not a multiple of 8
	grid := make([]float32, n)
	for i := range grid {
		grid[i] = float32(-12 + 24*float64(i)/n)
	}
	specials := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-20, 1e-5, float32(math.Inf(1)), float32(math.NaN())}
	copy(grid, specials)
	gelu := func(v float64) float64 { return 0.5 * v * math.Erfc(-v/math.Sqrt2) }
	for _, c := range []struct {
		op       UnaryOp
		ref      func(float64) float64
		abs, rel float64 // bounds; rel applies where |x| ≥ relFrom (GELU: x ≥ −4)
		relFrom  float64
	}{
		{OpTanh, math.Tanh, 2e-7, 3e-7, 0},
		{OpGELUErf, gelu, 5e-7, 3e-6, -4},
	} {
		x, err := rt.FromFloat32(grid, n)
		if err != nil {
			t.Fatal(err)
		}
		y, err := rt.Unary(c.op, x)
		x.Free()
		if err != nil {
			t.Fatal(err)
		}
		got, err := y.Float32()
		y.Free()
		if err != nil {
			t.Fatal(err)
		}
		var maxAbs, maxRel float64
		for i, g := range got {
			v := float64(grid[i])
			w := c.ref(v)
			switch {
			case math.IsNaN(v):
				if !math.IsNaN(float64(g)) {
					t.Fatalf("%s(NaN) = %g", c.op, g)
				}
				continue
			case math.IsInf(v, 0):
				if float64(g) != w {
					t.Fatalf("%s(%g) = %g, want %g", c.op, v, g, w)
				}
				continue
			case v == 0:
				if g != 0 || math.Signbit(float64(g)) != math.Signbit(v) {
					t.Fatalf("%s(%g) = %g: signed zero lost", c.op, v, g)
				}
				continue
			}
			d := math.Abs(float64(g) - w)
			maxAbs = max(maxAbs, d)
			if w != 0 && v >= c.relFrom && math.Abs(w) > 1e-30 {
				maxRel = max(maxRel, d/math.Abs(w))
			}
		}
		t.Logf("%s: max abs error %.3g, max rel error %.3g", c.op, maxAbs, maxRel)
		if maxAbs > c.abs || maxRel > c.rel {
			t.Errorf("%s: max abs %.3g (bound %g), max rel %.3g (bound %g)", c.op, maxAbs, c.abs, maxRel, c.rel)
		}
		// the padded last vector computes what a full one does
		x13, err := rt.FromFloat32(append(append([]float32{}, grid[100:108]...), grid[100:105]...), 13)
		if err != nil {
			t.Fatal(err)
		}
		y13, err := rt.Unary(c.op, x13)
		x13.Free()
		if err != nil {
			t.Fatal(err)
		}
		g13, _ := y13.Float32()
		y13.Free()
		for i := range 5 {
			if math.Float32bits(g13[8+i]) != math.Float32bits(g13[i]) {
				t.Fatalf("%s: element %d of the tail %g, of a full vector %g", c.op, i, g13[8+i], g13[i])
			}
		}
	}
}

func TestBinaryBroadcast(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	shapes := []struct{ a, b []int }{
		{[]int{3, 4, 5}, []int{3, 4, 5}},
		{[]int{3, 4, 5}, []int{5}},
		{[]int{3, 4, 5}, []int{4, 1}},
		{[]int{1, 4, 1}, []int{3, 1, 5}},
		{[]int{2, 3, 1, 1, 1}, []int{2, 3, 4, 5, 6}}, // per-channel scale of a video
		{[]int{7}, []int{2, 3, 7}},
		{[]int{1}, []int{4, 3}},
		{[]int{}, []int{2, 2}},
		{[]int{2, 1, 3, 1}, []int{1, 5, 1, 4}},
	}
	ops := []struct {
		op  BinaryOp
		ref func(a, b float64) float64
	}{
		{OpAdd, func(a, b float64) float64 { return a + b }},
		{OpSub, func(a, b float64) float64 { return a - b }},
		{OpMul, func(a, b float64) float64 { return a * b }},
		{OpDiv, func(a, b float64) float64 { return a / b }},
		{OpMax, math.Max},
		{OpMin, math.Min},
	}
	for _, s := range shapes {
		for _, o := range ops {
			t.Run(fmt.Sprintf("%s %v %v", o.op, s.a, s.b), func(t *testing.T) {
				a, av := randTensor(t, rt, r, s.a...)
				b, bv := randTensor(t, rt, r, s.b...)
				if o.op == OpDiv {
					for i := range bv {
						bv[i] = float64(float32(math.Abs(bv[i]) + 0.5))
					}
					b.Free()
					b = upload(t, rt, bv, s.b...)
				}
				shape, ok := BroadcastShape(s.a, s.b)
				if !ok {
					t.Fatal("shapes do not broadcast")
				}
				want := make([]float64, numel(shape))
				for i := range want {
					c := unravel(i, shape)
					want[i] = o.ref(av[bcastIndex(c, s.a)], bv[bcastIndex(c, s.b)])
				}
				y, err := rt.Binary(o.op, a, b)
				check(t, "binary", y, err, shape, want)
			})
		}
	}
	t.Run("mismatch", func(t *testing.T) {
		a, _ := randTensor(t, rt, r, 3, 4)
		b, _ := randTensor(t, rt, r, 5)
		if _, err := rt.Add(a, b); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("add [3 4] + [5]: got %v, want ErrInvalidArgument", err)
		}
	})
}

func refSoftmax(xv []float64, n int, scale float64) []float64 {
	out := make([]float64, len(xv))
	for r0 := 0; r0 < len(xv); r0 += n {
		mx := math.Inf(-1)
		for i := range n {
			mx = math.Max(mx, xv[r0+i]*scale)
		}
		if math.IsInf(mx, -1) {
			continue
		}
		sum := 0.0
		for i := range n {
			out[r0+i] = math.Exp(xv[r0+i]*scale - mx)
			sum += out[r0+i]
		}
		for i := range n {
			out[r0+i] /= sum
		}
	}
	return out
}

func TestSoftmax(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		shape []int
		scale float32
	}{
		{[]int{3, 7}, 0}, {[]int{2, 2, 1}, 1}, {[]int{5, 4099}, 0.125}, {[]int{4, 9}, -2},
	} {
		t.Run(fmt.Sprint(c.shape, c.scale), func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.shape...)
			s := float64(c.scale)
			if s == 0 {
				s = 1
			}
			want := refSoftmax(xv, c.shape[len(c.shape)-1], s)
			y, err := rt.Softmax(x, c.scale)
			check(t, "softmax", y, err, c.shape, want)
		})
	}
}

// ---- attention and rope -------------------------------------------------------------------

func refAttention(q, k, v []float64, B, H, Hkv, Lq, Lk, D, Dv int, mask []uint8, ms []int, scale float64) []float64 {
	out := make([]float64, B*H*Lq*Dv)
	full := []int{B, H, Lq, Lk}
	for b := range B {
		for h := range H {
			hk := h / (H / Hkv)
			for i := range Lq {
				s := make([]float64, Lk)
				for j := range Lk {
					if mask != nil && mask[bcastIndex([]int{b, h, i, j}, ms)] == 0 {
						s[j] = math.Inf(-1)
						continue
					}
					acc := 0.0
					for d := range D {
						acc += q[((b*H+h)*Lq+i)*D+d] * k[((b*Hkv+hk)*Lk+j)*D+d]
					}
					s[j] = acc * scale
				}
				_ = full
				p := refSoftmax(s, Lk, 1)
				for e := range Dv {
					acc := 0.0
					for j := range Lk {
						acc += p[j] * v[((b*Hkv+hk)*Lk+j)*Dv+e]
					}
					out[((b*H+h)*Lq+i)*Dv+e] = acc
				}
			}
		}
	}
	return out
}

func TestAttention(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	cases := []struct {
		name                     string
		B, H, Hkv, Lq, Lk, D, Dv int
		maskShape                []int
		chunk                    int
		scale                    float32
		maskAllRow               bool
	}{
		{name: "plain", B: 1, H: 2, Hkv: 2, Lq: 7, Lk: 9, D: 5, Dv: 5},
		{name: "gqa", B: 2, H: 4, Hkv: 2, Lq: 5, Lk: 6, D: 3, Dv: 4},
		{name: "chunked odd", B: 1, H: 3, Hkv: 1, Lq: 17, Lk: 11, D: 8, Dv: 8, chunk: 4},
		{name: "key padding mask", B: 2, H: 2, Hkv: 2, Lq: 6, Lk: 10, D: 4, Dv: 4, maskShape: []int{2, 1, 1, 10}},
		{name: "full mask chunked", B: 1, H: 2, Hkv: 2, Lq: 9, Lk: 7, D: 4, Dv: 3, maskShape: []int{1, 2, 9, 7}, chunk: 2},
		{name: "2d mask", B: 2, H: 1, Hkv: 1, Lq: 5, Lk: 5, D: 2, Dv: 2, maskShape: []int{5, 5}, scale: 0.3},
		{name: "fully masked row", B: 1, H: 1, Hkv: 1, Lq: 4, Lk: 3, D: 2, Dv: 2, maskShape: []int{4, 3}, maskAllRow: true},
		{name: "query mask broadcast over keys", B: 1, H: 2, Hkv: 2, Lq: 6, Lk: 5, D: 3, Dv: 3, maskShape: []int{1, 1, 6, 1}},
		{name: "long keys default chunk", B: 1, H: 1, Hkv: 1, Lq: 3, Lk: 1031, D: 4, Dv: 2, maskShape: []int{1, 1031}},
		{name: "size-1", B: 1, H: 1, Hkv: 1, Lq: 1, Lk: 1, D: 1, Dv: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, qv := randTensor(t, rt, r, c.B, c.H, c.Lq, c.D)
			k, kv := randTensor(t, rt, r, c.B, c.Hkv, c.Lk, c.D)
			v, vv := randTensor(t, rt, r, c.B, c.Hkv, c.Lk, c.Dv)
			var mask *Tensor
			var mv []uint8
			if c.maskShape != nil {
				mv = make([]uint8, numel(c.maskShape))
				for i := range mv {
					if r.IntN(3) > 0 {
						mv[i] = 1
					}
				}
				if c.maskAllRow {
					last := c.maskShape[len(c.maskShape)-1]
					for j := range last {
						mv[j] = 0 // query row 0 sees nothing
					}
				}
				mask = uploadMask(t, rt, mv, c.maskShape...)
			}
			scale := float64(c.scale)
			if scale == 0 {
				scale = 1 / math.Sqrt(float64(c.D))
			}
			scale = float64(float32(scale))
			want := refAttention(qv, kv, vv, c.B, c.H, c.Hkv, c.Lq, c.Lk, c.D, c.Dv, mv, c.maskShape, scale)
			y, err := rt.Attention(q, k, v, mask, AttentionParams{Scale: c.scale, QueryChunk: c.chunk})
			check(t, c.name, y, err, []int{c.B, c.H, c.Lq, c.Dv}, want)
		})
	}
}

func TestRoPE(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, c := range []struct {
		name   string
		xs, cs []int
	}{
		{"per token [B,H,L,D] x [L,D]", []int{2, 3, 5, 8}, []int{5, 8}},
		{"[B,L,H,D] x [L,1,D]", []int{1, 7, 2, 6}, []int{7, 1, 6}},
		{"same shape", []int{3, 4}, []int{3, 4}},
		{"D=2", []int{5, 2}, []int{1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, xv := randTensor(t, rt, r, c.xs...)
			cs, cv := randTensor(t, rt, r, c.cs...)
			sn, sv := randTensor(t, rt, r, c.cs...)
			want := make([]float64, len(xv))
			for i := range xv {
				co := unravel(i, c.xs)
				ci := bcastIndex(co, c.cs)
				if i%2 == 0 {
					want[i] = xv[i]*cv[ci] - xv[i+1]*sv[ci]
				} else {
					want[i] = xv[i]*cv[ci] + xv[i-1]*sv[ci]
				}
			}
			y, err := rt.RoPE(RoPEInterleaved, x, cs, sn)
			check(t, c.name, y, err, c.xs, want)

			// rotate_half: pairs (i, i + D/2) of each row
			D := c.xs[len(c.xs)-1]
			for i := range xv {
				co := unravel(i, c.xs)
				ci := bcastIndex(co, c.cs)
				if d := co[len(co)-1]; d < D/2 {
					want[i] = xv[i]*cv[ci] - xv[i+D/2]*sv[ci]
				} else {
					want[i] = xv[i]*cv[ci] + xv[i-D/2]*sv[ci]
				}
			}
			y, err = rt.RoPE(RoPEHalves, x, cs, sn)
			check(t, c.name+" halves", y, err, c.xs, want)
		})
	}
	x, _ := randTensor(t, rt, r, 2, 4)
	if _, err := rt.RoPE(RoPEMode(7), x, x, x); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown mode: got %v, want ErrInvalidArgument", err)
	}
}

// TestRoPEHalvesIsPermutedInterleaved: rotate_half on x equals the interleaved rotation of x
// with each head's halves interleaved (the permutation a model without the mode applies to its
// q/k weight rows), with tables laid out to match.
func TestRoPEHalvesIsPermutedInterleaved(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	const L, D = 5, 8
	xv := f32Round(randVals(r, L*D))
	freq := f32Round(randVals(r, L*D/2))
	perm := func(v []float64) []float64 { // [.., h0 h1 .. | g0 g1 ..] → [h0 g0 h1 g1 ..]
		out := make([]float64, len(v))
		for row := 0; row < len(v)/D; row++ {
			for i := range D / 2 {
				out[row*D+2*i], out[row*D+2*i+1] = v[row*D+i], v[row*D+i+D/2]
			}
		}
		return out
	}
	cosH, sinH := make([]float64, L*D), make([]float64, L*D) // cat(freqs, freqs)
	for p := range L {
		for i := range D / 2 {
			c, s := math.Cos(freq[p*D/2+i]), math.Sin(freq[p*D/2+i])
			cosH[p*D+i], cosH[p*D+i+D/2], sinH[p*D+i], sinH[p*D+i+D/2] = c, c, s, s
		}
	}
	yh, err := rt.RoPE(RoPEHalves, upload(t, rt, xv, L, D), upload(t, rt, cosH, L, D), upload(t, rt, sinH, L, D))
	if err != nil {
		t.Fatal(err)
	}
	defer yh.Free()
	yi, err := rt.RoPE(RoPEInterleaved, upload(t, rt, perm(xv), L, D), upload(t, rt, perm(cosH), L, D), upload(t, rt, perm(sinH), L, D))
	if err != nil {
		t.Fatal(err)
	}
	defer yi.Free()
	gh, _ := yh.Float32()
	gi, _ := yi.Float32()
	want := perm(toF64(gh))
	for i := range gi {
		if float64(gi[i]) != want[i] {
			t.Fatalf("element %d: interleaved %g, permuted halves %g", i, gi[i], want[i])
		}
	}
}

// ---- data movement --------------------------------------------------------------------------

func TestConcatSlicePermute(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	t.Run("concat", func(t *testing.T) {
		for _, dim := range []int{0, 1, 2, -1} {
			shapes := [][]int{{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}
			d := (dim + 3) % 3
			shapes[0][d], shapes[1][d], shapes[2][d] = 1, 5, 2
			var ts []*Tensor
			var vs [][]float64
			for _, s := range shapes {
				x, v := randTensor(t, rt, r, s...)
				ts, vs = append(ts, x), append(vs, v)
			}
			out := slices.Clone(shapes[0])
			out[d] = 8
			want := make([]float64, numel(out))
			for i := range want {
				c := unravel(i, out)
				j := 0
				for c[d] >= shapes[j][d] {
					c[d] -= shapes[j][d]
					j++
				}
				want[i] = vs[j][bcastIndex(c, shapes[j])]
			}
			y, err := rt.Concat(dim, ts...)
			check(t, fmt.Sprint("concat dim ", dim), y, err, out, want)
		}
	})
	t.Run("slice", func(t *testing.T) {
		shape := []int{3, 7, 5}
		x, xv := randTensor(t, rt, r, shape...)
		for _, c := range []struct{ dim, start, end, step int }{
			{0, 1, 3, 1}, {1, 2, 7, 2}, {2, 0, 5, 3}, {-1, 4, 5, 1}, {1, 0, 7, 1}, {1, 3, 3, 1},
		} {
			d := (c.dim + 3) % 3
			out := slices.Clone(shape)
			out[d] = (c.end - c.start + c.step - 1) / c.step
			want := make([]float64, numel(out))
			for i := range want {
				co := unravel(i, out)
				co[d] = c.start + co[d]*c.step
				want[i] = xv[bcastIndex(co, shape)]
			}
			y, err := rt.SliceStep(x, c.dim, c.start, c.end, c.step)
			check(t, fmt.Sprint("slice ", c), y, err, out, want)
		}
		if _, err := rt.Slice(x, 1, 5, 8); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("slice past the end: got %v, want ErrInvalidArgument", err)
		}
	})
	t.Run("permute", func(t *testing.T) {
		shape := []int{2, 3, 1, 5}
		x, xv := randTensor(t, rt, r, shape...)
		for _, perm := range [][]int{{0, 1, 2, 3}, {0, 2, 1, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {0, 1, 3, 2}} {
			out := make([]int, 4)
			for i, p := range perm {
				out[i] = shape[p]
			}
			want := make([]float64, numel(out))
			for i := range want {
				co := unravel(i, out)
				src := make([]int, 4)
				for j, p := range perm {
					src[p] = co[j]
				}
				want[i] = xv[bcastIndex(src, shape)]
			}
			y, err := rt.Permute(x, perm...)
			check(t, fmt.Sprint("permute ", perm), y, err, out, want)
		}
	})
}

func TestPad(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	// the second shape's rows are longer than a warp (the gpu kernels copy a row per warp)
	for _, shape := range [][]int{{2, 3, 2, 4, 5}, {1, 2, 2, 3, 70}} {
		testPad(t, rt, r, shape)
	}
}

func testPad(t *testing.T, rt *Runtime, r *rand.Rand, shape []int) {
	x, xv := randTensor(t, rt, r, shape...)
	for _, c := range []struct {
		mode          PadMode
		before, after [3]int
	}{
		{PadReplicate, [3]int{2, 1, 1}, [3]int{0, 1, 1}}, // causal conv k=3
		{PadReplicate, [3]int{0, 0, 3}, [3]int{1, 2, 0}},
		{PadZero, [3]int{1, 2, 0}, [3]int{2, 0, 1}},
		{PadZero, [3]int{0, 0, 0}, [3]int{0, 0, 0}},
	} {
		y, err := rt.Pad3d(x, c.mode, Pad3d{Before: c.before, After: c.after})
		out := slices.Clone(shape)
		for i := range 3 {
			out[2+i] += c.before[i] + c.after[i]
		}
		want := make([]float64, numel(out))
		for i := range want {
			co := unravel(i, out)
			zero := false
			for j := range 3 {
				v := co[2+j] - c.before[j]
				if v < 0 || v >= shape[2+j] {
					zero = true
					v = min(max(v, 0), shape[2+j]-1)
				}
				co[2+j] = v
			}
			if zero && c.mode == PadZero {
				continue
			}
			want[i] = xv[bcastIndex(co, shape)]
		}
		check(t, fmt.Sprint("pad ", c), y, err, out, want)
	}
}

func TestUpsampleAvgPool(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	shape := []int{1, 2, 3, 5, 7}
	x, xv := randTensor(t, rt, r, shape...)
	for _, s := range [][3]int{{1, 2, 2}, {2, 2, 2}, {1, 1, 1}, {3, 1, 2}} {
		out := slices.Clone(shape)
		for i := range 3 {
			out[2+i] *= s[i]
		}
		want := make([]float64, numel(out))
		for i := range want {
			co := unravel(i, out)
			for j := range 3 {
				co[2+j] /= s[j]
			}
			want[i] = xv[bcastIndex(co, shape)]
		}
		y, err := rt.UpsampleNearest3d(x, s)
		check(t, fmt.Sprint("upsample ", s), y, err, out, want)
	}
	pshape := []int{2, 3, 5, 8, 9}
	px, pv := randTensor(t, rt, r, pshape...)
	for _, c := range []struct{ k, s [3]int }{
		{[3]int{2, 2, 2}, [3]int{2, 2, 2}}, // FramePack's 2x clean latents
		{[3]int{4, 4, 4}, [3]int{4, 4, 4}}, // odd remainders dropped
		{[3]int{1, 3, 2}, [3]int{1, 2, 3}},
		{[3]int{5, 8, 9}, [3]int{1, 1, 1}},
	} {
		out := slices.Clone(pshape)
		for i := range 3 {
			out[2+i] = (pshape[2+i]-c.k[i])/c.s[i] + 1
		}
		want := make([]float64, numel(out))
		for i := range want {
			co := unravel(i, out)
			acc := 0.0
			for a := range c.k[0] {
				for b := range c.k[1] {
					for d := range c.k[2] {
						src := []int{co[0], co[1], co[2]*c.s[0] + a, co[3]*c.s[1] + b, co[4]*c.s[2] + d}
						acc += pv[bcastIndex(src, pshape)]
					}
				}
			}
			want[i] = acc / float64(c.k[0]*c.k[1]*c.k[2])
		}
		y, err := rt.AvgPool3d(px, c.k, c.s)
		check(t, fmt.Sprint("avgpool ", c), y, err, out, want)
	}
}

func TestEmbeddingCopy(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	table, tv := randTensor(t, rt, r, 11, 6)
	ids := []int32{3, 0, 10, 3, 7}
	idt, err := rt.FromInt32(ids, 1, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer idt.Free()
	want := make([]float64, 0, 30)
	for _, id := range ids {
		want = append(want, tv[int(id)*6:int(id)*6+6]...)
	}
	y, err := rt.Embedding(table, idt)
	check(t, "embedding", y, err, []int{1, 5, 6}, want)

	bad, err := rt.FromInt32([]int32{11}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Free()
	if _, err := rt.Embedding(table, bad); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("embedding of id 11 of 11: got %v, want ErrInvalidArgument", err)
	}

	y, err = rt.Copy(table)
	check(t, "copy", y, err, []int{11, 6}, tv)
}

func TestReduce(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	shape := []int{3, 5, 1, 7}
	x, xv := randTensor(t, rt, r, shape...)
	for _, dim := range []int{0, 1, 2, 3, -1} {
		d := (dim + 4) % 4
		out := slices.Clone(shape)
		out[d] = 1
		for _, op := range []ReduceOp{ReduceSum, ReduceMean, ReduceMax} {
			want := make([]float64, numel(out))
			for i := range want {
				co := unravel(i, out)
				acc := 0.0
				if op == ReduceMax {
					acc = math.Inf(-1)
				}
				for k := range shape[d] {
					co[d] = k
					v := xv[bcastIndex(co, shape)]
					if op == ReduceMax {
						acc = math.Max(acc, v)
					} else {
						acc += v
					}
				}
				if op == ReduceMean {
					acc /= float64(shape[d])
				}
				want[i] = acc
			}
			y, err := rt.Reduce(op, x, dim)
			check(t, fmt.Sprint("reduce ", op, " dim ", dim), y, err, out, want)
		}
	}
}
