package runtime

import (
	"math"
	"math/rand/v2"
	"testing"
)

// tol is the acceptance bound on relative L2 error for f32 ops against float64 references.
const tol = 1e-5

// newTestRuntime opens a poisoning cpu runtime and checks at cleanup that every byte and
// tensor handle was given back.
func newTestRuntime(t *testing.T, opts Options) *Runtime {
	t.Helper()
	opts.Poison = true
	rt, err := New(opts)
	if err != nil {
		t.Fatalf("new runtime: %v", err)
	}
	t.Cleanup(func() {
		m := rt.Memory()
		if m.Allocated != 0 || m.LiveTensors != 0 {
			t.Errorf("leak: %d bytes and %d tensors still held", m.Allocated, m.LiveTensors)
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return rt
}

func randVals(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64()
	}
	return v
}

func toF32(v []float64) []float32 {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	return f
}

// castTo returns x when it is already dt, else a copy of x cast to dt that is freed when the
// test ends.
func castTo(t *testing.T, rt *Runtime, x *Tensor, dt DType) *Tensor {
	t.Helper()
	if x.DType() == dt {
		return x
	}
	h, err := rt.Cast(x, dt)
	if err != nil {
		t.Fatalf("cast to %s: %v", dt, err)
	}
	t.Cleanup(h.Free)
	return h
}

// values downloads x's values as float32.
func values(t *testing.T, x *Tensor) []float32 {
	t.Helper()
	v, err := x.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// toF64 widens float32 values to float64.
func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// f32Round returns v rounded through float32, so references see the inputs the op saw.
func f32Round(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(float32(x))
	}
	return out
}

// upload makes an f32 tensor from float64 values (rounded to f32).
func upload(t *testing.T, rt *Runtime, v []float64, shape ...int) *Tensor {
	t.Helper()
	x, err := rt.FromFloat32(toF32(v), shape...)
	if err != nil {
		t.Fatalf("upload %v: %v", shape, err)
	}
	t.Cleanup(x.Free)
	return x
}

// uploadMask uploads an attention mask (nil for no mask).
func uploadMask(t *testing.T, rt *Runtime, mv []uint8, shape ...int) *Tensor {
	t.Helper()
	if mv == nil {
		return nil
	}
	mask, err := rt.FromUint8(mv, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mask.Free)
	return mask
}

// randTensor returns a random f32 tensor and its values (as float64 of the f32 values).
func randTensor(t *testing.T, rt *Runtime, r *rand.Rand, shape ...int) (*Tensor, []float64) {
	t.Helper()
	v := f32Round(randVals(r, numel(shape)))
	return upload(t, rt, v, shape...), v
}

func relL2(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// check downloads y, verifies its shape, that no element is NaN (poison) and the relative L2
// error against want, then frees y.
func check(t *testing.T, name string, y *Tensor, err error, shape []int, want []float64) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer y.Free()
	if !equalInts(y.Shape(), shape) {
		t.Fatalf("%s: shape %v, want %v", name, y.Shape(), shape)
	}
	got, err := y.Float32()
	if err != nil {
		t.Fatalf("%s: download: %v", name, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i, g := range got {
		if math.IsNaN(float64(g)) && !math.IsNaN(want[i]) {
			t.Fatalf("%s: element %d not written (NaN poison left)", name, i)
		}
	}
	if e := relL2(got, want); e > tol || math.IsNaN(e) {
		t.Fatalf("%s: rel L2 %.3g > %g", name, e, tol)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// strides returns row-major strides of shape.
func strides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// unravel returns the coordinates of flat index i in shape.
func unravel(i int, shape []int) []int {
	c := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		c[d] = i % shape[d]
		i /= shape[d]
	}
	return c
}

// bcastIndex maps coordinates of the broadcast output to a flat index of an input of shape s.
func bcastIndex(c []int, s []int) int {
	st := strides(s)
	idx := 0
	for i := range s {
		ci := c[len(c)-len(s)+i]
		if s[i] == 1 {
			ci = 0
		}
		idx += ci * st[i]
	}
	return idx
}
