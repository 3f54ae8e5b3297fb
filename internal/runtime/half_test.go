package runtime

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// halfVals returns a random weight stored as dt (F16 or BF16) and its (exactly widened) values.
func halfVals(t *testing.T, rt *Runtime, r *rand.Rand, dt DType, shape ...int) (*Tensor, []float32) {
	t.Helper()
	v := toF32(randVals(r, numel(shape)))
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	h, err := rt.FromBytes(dt, F32, raw, shape...)
	if err != nil {
		t.Fatalf("half tensor %v: %v", shape, err)
	}
	t.Cleanup(h.Free)
	wide, err := h.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return h, wide
}

// halfTensor is halfVals plus an F32 tensor holding the same values, and the values as float64.
func halfTensor(t *testing.T, rt *Runtime, r *rand.Rand, dt DType, shape ...int) (*Tensor, *Tensor, []float64) {
	t.Helper()
	h, wide := halfVals(t, rt, r, dt, shape...)
	f, err := rt.FromFloat32(wide, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Free)
	return h, f, toF64(wide)
}

// sameAsF32 checks that got (from a half weight) equals want (the same op on the f32 copy of the
// weight): bit for bit, or within 1e-6 relative L2; it returns whether they were identical.
func sameAsF32(t *testing.T, name string, got, want *Tensor) bool {
	t.Helper()
	g, w := values(t, got), values(t, want)
	if len(g) != len(w) {
		t.Fatalf("%s: %d values, f32 path %d", name, len(g), len(w))
	}
	identical := true
	wv := make([]float64, len(w))
	for i := range g {
		if math.IsNaN(float64(g[i])) {
			t.Fatalf("%s: element %d not written (NaN poison left)", name, i)
		}
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			identical = false
		}
		wv[i] = float64(w[i])
	}
	if e := relL2(g, wv); e > 1e-6 {
		t.Fatalf("%s: rel L2 %.3g against the f32 path (> 1e-6)", name, e)
	}
	return identical
}

func TestMatMulHalfWeights(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	cases := []struct {
		name   string
		as, bs []int
		p      GemmParams
	}{
		{"plain", []int{7, 13}, []int{13, 5}, GemmParams{}},
		{"transB (linear)", []int{5, 19}, []int{23, 19}, GemmParams{TransB: true}},
		{"transA alpha", []int{9, 3}, []int{9, 11}, GemmParams{TransA: true, Alpha: 0.37}},
		{"both trans", []int{6, 4}, []int{3, 6}, GemmParams{TransA: true, TransB: true}},
		{"batched", []int{3, 5, 7}, []int{3, 7, 2}, GemmParams{}},
		{"batched transB", []int{2, 4, 6}, []int{2, 5, 6}, GemmParams{TransB: true}},
		{"batched shared b", []int{2, 3, 5, 7}, []int{7, 9}, GemmParams{}},
		{"size-1 dims", []int{1, 1}, []int{1, 1}, GemmParams{}},
		{"odd block sizes", []int{67, 129}, []int{33, 129}, GemmParams{TransB: true}},
	}
	identical := 0
	for _, dt := range []DType{F16, BF16} {
		for _, c := range cases {
			name := dt.String() + " " + c.name
			t.Run(name, func(t *testing.T) {
				a, av := randTensor(t, rt, r, c.as...)
				bh, bf, bv := halfTensor(t, rt, r, dt, c.bs...)
				want, shape := refMatMul(av, c.as, bv, c.bs, c.p)
				y, err := rt.MatMul(a, bh, c.p)
				if err != nil {
					t.Fatal(err)
				}
				defer y.Free()
				if y.DType() != F32 {
					t.Fatalf("out dtype %s, want f32", y.DType())
				}
				yf, err := rt.MatMul(a, bf, c.p)
				if err != nil {
					t.Fatal(err)
				}
				defer yf.Free()
				if sameAsF32(t, name, y, yf) {
					identical++
				}
				y2, err := rt.MatMul(a, bh, c.p)
				check(t, name, y2, err, shape, want)
			})
		}
	}
	t.Logf("%d of %d half-weight products bit-identical to the f32 path", identical, 2*len(cases))
}

// TestLinearHalfWeights: Linear with an f16/bf16 weight and f32 activations and bias, on any
// backend (FRAMEPACK_BACKEND).
func TestLinearHalfWeights(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, dt := range []DType{F16, BF16} {
		x, xv := randTensor(t, rt, r, 2, 3, 17)
		wh, _, wv := halfTensor(t, rt, r, dt, 11, 17)
		b, bv := randTensor(t, rt, r, 11)
		want := make([]float64, 6*11)
		for i := range 6 {
			for o := range 11 {
				acc := bv[o]
				for k := range 17 {
					acc += xv[i*17+k] * wv[o*17+k]
				}
				want[i*11+o] = acc
			}
		}
		y, err := rt.Linear(x, wh, b)
		check(t, dt.String()+" linear", y, err, []int{2, 3, 11}, want)

		x1, x1v := randTensor(t, rt, r, 17)
		want1 := make([]float64, 11)
		for o := range 11 {
			for k := range 17 {
				want1[o] += x1v[k] * wv[o*17+k]
			}
		}
		y, err = rt.Linear(x1, wh, nil)
		check(t, dt.String()+" linear rank1", y, err, []int{11}, want1)
	}
}

// TestHalfOperandsOnCPU: on the cpu backend a 16-bit bias meets f32 activations exactly (the
// output stays f32, the activations' dtype), and 16-bit activations times an f32 matrix give a
// 16-bit output: the f32 product rounded once.
func TestHalfOperandsOnCPU(t *testing.T) {
	rt := newTestRuntime(t, Options{Backend: "cpu"})
	r := rng(t)
	for _, dt := range []DType{F16, BF16} {
		x, xv := randTensor(t, rt, r, 2, 3, 17)
		wh, _, wv := halfTensor(t, rt, r, dt, 11, 17)
		bh, _, bv := halfTensor(t, rt, r, dt, 11)
		want := make([]float64, 2*3*11)
		for i := range 6 {
			for o := range 11 {
				want[i*11+o] = bv[o]
				for k := range 17 {
					want[i*11+o] += xv[i*17+k] * wv[o*17+k]
				}
			}
		}
		y, err := rt.Linear(x, wh, bh)
		if err == nil && y.DType() != F32 {
			t.Errorf("%s bias: output %s, want f32 (the activations')", dt, y.DType())
		}
		check(t, dt.String()+" bias", y, err, []int{2, 3, 11}, want)

		xh, x32, _ := halfTensor(t, rt, r, dt, 3, 11)
		b, _ := randTensor(t, rt, r, 11, 5)
		got, err := rt.MatMul(xh, b, GemmParams{})
		if err != nil {
			t.Fatalf("%s a operand: %v", dt, err)
		}
		ref, err := rt.MatMul(x32, b, GemmParams{})
		if err != nil {
			got.Free()
			t.Fatal(err)
		}
		if got.DType() != dt {
			t.Errorf("%s a operand: output %s", dt, got.DType())
		}
		compareRounded(t, dt.String()+" a operand", got, ref, dt, true)
		got.Free()
		ref.Free()
	}
}

// TestHalfWidenExhaustive: every f16 and bf16 bit pattern through a K = 1 product with 1 gives
// the exact conversion the upload path makes (NaNs stay NaN; −0 sums to +0 as with an f32 b).
func TestHalfWidenExhaustive(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	one, err := rt.FromFloat32([]float32{1}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Free()
	raw := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(raw[2*i:], uint16(i))
	}
	for _, dt := range []DType{F16, BF16} {
		h, err := rt.FromBytes(dt, dt, raw, 1, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := h.Float32()
		if err != nil {
			t.Fatal(err)
		}
		y, err := rt.MatMul(one, h, GemmParams{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := y.Float32()
		y.Free()
		h.Free()
		if err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			g, w := got[i], ref[i]
			if math.IsNaN(float64(w)) {
				if !math.IsNaN(float64(g)) {
					t.Fatalf("%s %#04x: got %g, want NaN", dt, i, g)
				}
				continue
			}
			if w == 0 && g == 0 { // the product's sum starts at +0, so −0 comes out +0 as with f32 b
				continue
			}
			if math.Float32bits(g) != math.Float32bits(w) {
				t.Fatalf("%s %#04x: got %g (%#08x), want %g (%#08x)", dt, i, g, math.Float32bits(g), w, math.Float32bits(w))
			}
		}
	}
}

func TestConv3dHalfWeights(t *testing.T) {
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
		{"groups 3 batch 2", []int{2, 6, 3, 5, 4}, []int{9, 2, 1, 3, 3}, Conv3dParams{Padding: [3]int{0, 1, 1}, Groups: 3}, true},
		{"stride 2", []int{1, 2, 7, 9, 11}, []int{3, 2, 3, 3, 3}, Conv3dParams{Stride: [3]int{2, 2, 2}, Padding: [3]int{1, 1, 1}}, true},
		{"patch embed", []int{1, 3, 3, 6, 8}, []int{5, 3, 1, 2, 2}, Conv3dParams{Stride: [3]int{1, 2, 2}}, true},
	}
	for _, dt := range []DType{F16, BF16} {
		for _, c := range cases {
			name := dt.String() + " " + c.name
			t.Run(name, func(t *testing.T) {
				x, xv := randTensor(t, rt, r, c.xs...)
				wh, wf, wv := halfTensor(t, rt, r, dt, c.ws...)
				var b *Tensor
				var bv []float64
				if c.hasBias {
					b, bv = randTensor(t, rt, r, c.ws[0])
				}
				want, shape := refConv3d(xv, c.xs, wv, c.ws, bv, c.p)
				yf, err := rt.Conv3d(x, wf, b, c.p)
				if err != nil {
					t.Fatal(err)
				}
				defer yf.Free()
				y, err := rt.Conv3d(x, wh, b, c.p)
				if err != nil {
					t.Fatal(err)
				}
				sameAsF32(t, name, y, yf)
				check(t, name, y, err, shape, want)
			})
		}
	}
}

// TestHalfWeightsUnderPressure: with a cap too small for one whole f32 copy of the weight, the
// panels shrink (gemm: output columns, in both weight layouts and for a weight shared by
// batches; conv: output channels) and the results stay exact; the scratch is given back.
func TestHalfWeightsUnderPressure(t *testing.T) {
	const cap = 96 << 10
	rt := newTestRuntime(t, Options{MemoryCap: cap})
	full := newTestRuntime(t, Options{}) // the f32 path, without the cap
	r := rng(t)
	// each weight is 40×512 bf16 = 40 KiB; its f32 copy (80 KiB) does not fit beside it
	for _, c := range []struct {
		name   string
		as, bs []int
		p      GemmParams
	}{
		{"linear (transB)", []int{2, 512}, []int{40, 512}, GemmParams{TransB: true}},
		{"weight [K, N]", []int{2, 512}, []int{512, 40}, GemmParams{}},
		{"weight shared by 3 batches", []int{3, 2, 512}, []int{512, 40}, GemmParams{}},
	} {
		a, av := randTensor(t, rt, r, c.as...)
		wh, wv := halfVals(t, rt, r, BF16, c.bs...)
		want, shape := refMatMul(av, c.as, toF64(wv), c.bs, c.p)
		y, err := rt.MatMul(a, wh, c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		yf, err := full.MatMul(upload(t, full, av, c.as...), upload(t, full, toF64(wv), c.bs...), c.p)
		if err != nil {
			t.Fatal(err)
		}
		if !sameAsF32(t, c.name, y, yf) {
			t.Logf("%s: within 1e-6 of the f32 path, not bit-identical", c.name)
		}
		yf.Free()
		check(t, c.name+" in narrow panels", y, err, shape, want)
		a.Free()
		wh.Free()
	}

	// conv weight 24×16×27 f16 = 20 KiB, f32 41 KiB; x 16×2×6×6 f32 = 4.5 KiB; im2col 432·36·4·rows
	cx, cxv := randTensor(t, rt, r, 1, 16, 2, 6, 6)
	cwh, cwv := halfVals(t, rt, r, F16, 24, 16, 3, 3, 3)
	filler, err := rt.NewTensor(U8, 40<<10) // leaves less than the f32 weight copy
	if err != nil {
		t.Fatal(err)
	}
	p := Conv3dParams{Padding: [3]int{1, 1, 1}}
	cwant, cshape := refConv3d(cxv, []int{1, 16, 2, 6, 6}, toF64(cwv), []int{24, 16, 3, 3, 3}, nil, p)
	cy, err := rt.Conv3d(cx, cwh, nil, p)
	check(t, "conv in weight panels", cy, err, cshape, cwant)
	filler.Free()
}

func TestEmbeddingHalfTable(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	for _, dt := range []DType{F16, BF16} {
		table, _, tv := halfTensor(t, rt, r, dt, 11, 6)
		ids := []int32{3, 0, 10, 3, 7}
		idt, err := rt.FromInt32(ids, 5)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float64, 0, 30)
		for _, id := range ids {
			want = append(want, tv[int(id)*6:int(id)*6+6]...)
		}
		y, err := rt.EmbeddingAs(table, idt, F32)
		if err == nil && y.DType() != F32 {
			t.Fatalf("dtype %s, want f32", y.DType())
		}
		check(t, dt.String()+" embedding", y, err, []int{5, 6}, want)
		y, err = rt.Embedding(table, idt)
		if err != nil || y.DType() != dt {
			t.Fatalf("embedding keeps the table's dtype: %v %v", y, err)
		}
		y.Free()
		if _, err := rt.EmbeddingAs(table, idt, I32); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("rows as i32: got %v, want ErrInvalidArgument", err)
		}
		idt.Free()
	}
}
