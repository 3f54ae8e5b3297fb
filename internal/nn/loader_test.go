package nn

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

func newRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// checkpoint writes tensors under the wrapper prefix "model." and opens them.
func checkpoint(t *testing.T, ts ...safetensors.Tensor) *safetensors.Checkpoint {
	t.Helper()
	for i := range ts {
		ts[i].Name = "model." + ts[i].Name
	}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

func testCheckpoint(t *testing.T) *safetensors.Checkpoint {
	return checkpoint(t,
		safetensors.FromFloat32("fc.weight", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6}),
		safetensors.FromFloat32("fc.bias", []int64{3}, []float32{0, 0, 1}),
		safetensors.FromFloat32("norm.weight", []int64{3}, []float32{1, 1, 1}),
		safetensors.FromFloat32("norm.bias", []int64{3}, []float32{0, 0, 0}),
		safetensors.FromInt64("ids", []int64{2}, []int64{0, 1}),
		safetensors.FromFloat32("head.weight", []int64{1}, []float32{1}),
		safetensors.FromFloat32("adapter.weight", []int64{1}, []float32{1}),
	)
}

// TestLoader binds a small Linear and LayerNorm from a wrapped checkpoint, checks the dtype
// rules and the report, and that Finish hands the tensors over.
func TestLoader(t *testing.T) {
	rt := newRuntime(t)
	ck := testCheckpoint(t)
	prefix, err := DetectPrefix(ck, "fc.weight", "", "model.")
	if err != nil || prefix != "model." {
		t.Fatalf("prefix %q, %v", prefix, err)
	}
	if _, err := DetectPrefix(ck, "nothing", "", "model."); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), `tensor nothing: missing (also looked under "model.")`) {
		t.Fatalf("no prefix: %v", err)
	}
	l := NewLoader(rt, ck, Options{DType: runtime.F32, WeightDType: runtime.F16}, prefix)
	fc := NewLinear(l, "fc", 2, 3, true)
	NewLayerNorm(l, "norm", 3, 1e-5)
	l.Skip("head.")
	ws, rep, err := l.Finish()
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Free()
	if fc.Weight.DType() != runtime.F16 || fc.Bias.DType() != runtime.F32 {
		t.Errorf("dtypes: weight %s, bias %s", fc.Weight.DType(), fc.Bias.DType())
	}
	if rep.Prefix != "model." || rep.Loaded != 4 || rep.Bytes != 3*2*2+3*4*3 || !slices.Equal(rep.Skipped, []string{"model.head.weight"}) ||
		!slices.Equal(rep.Unexpected, []string{"model.adapter.weight", "model.ids"}) {
		t.Fatalf("report %+v", rep)
	}
	if ws.NumParams() != 6+3+3+3 || ws.WeightBytes() != rep.Bytes {
		t.Fatalf("weights: %d params, %d bytes", ws.NumParams(), ws.WeightBytes())
	}
	p := NewPass(t.Context(), rt)
	defer p.Free()
	x := p.Do(rt.FromFloat32([]float32{1, 1}, 1, 2))
	y := fc.Forward(p, x)
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := y.Float32(); !slices.Equal(got, []float32{3, 7, 12}) {
		t.Errorf("linear: %v, want [3 7 12]", got)
	}
}

// TestLoaderCollectsErrors asks for several broken tensors and checks that the error names every
// one of them, and that nothing stays allocated.
func TestLoaderCollectsErrors(t *testing.T) {
	rt := newRuntime(t)
	l := NewLoader(rt, testCheckpoint(t), Options{}, "model.")
	NewLayerNorm(l, "norm", 3, 1e-5) // fine, uploaded before the first problem
	l.Tensor("absent", 1)
	l.Weight("fc.weight", 2, 3)
	l.Tensor("ids", 2)
	NewLinear(l, "fc", 2, 3, true) // fine, but nothing is uploaded after a problem
	_, _, err := l.Finish()
	if !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("err %v, want ErrCheckpoint", err)
	}
	for _, want := range []string{
		"tensor model.absent: missing (expected shape [1])",
		"tensor model.fc.weight: got shape [3 2], expected [2 3]",
		"tensor model.ids: dtype I64 is not a float type",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var te *TensorError
	if !errors.As(err, &te) || te.Name != "model.absent" {
		t.Errorf("first tensor error %+v", te)
	}
	if mem := rt.Memory(); mem.LiveTensors != 0 {
		t.Fatalf("%d tensors alive after a failed load", mem.LiveTensors)
	}
}

// TestRandomAndShapeLoaders checks the benchmarks' modes: seeded random weights of the asked
// shapes and dtypes (reproducible), and shape-only recording.
func TestRandomAndShapeLoaders(t *testing.T) {
	rt := newRuntime(t)
	values := func(seed uint64) []float32 {
		l := NewRandomLoader(rt, seed, Options{WeightDType: runtime.BF16})
		fc := NewLinear(l, "fc", 4, 8, true)
		n := NewLayerNorm(l, "norm", 8, 1e-5)
		ws, _, err := l.Finish()
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Free()
		if fc.Weight.DType() != runtime.BF16 || !slices.Equal(fc.Weight.Shape(), []int{8, 4}) || fc.Bias.DType() != runtime.F32 {
			t.Fatalf("random linear: %s %v, bias %s", fc.Weight.DType(), fc.Weight.Shape(), fc.Bias.DType())
		}
		w, err := fc.Weight.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range w {
			if v < -0.51 || v > 0.51 { // ±1/√fan_in = ±0.5
				t.Fatalf("weight %v outside ±1/√4", v)
			}
		}
		nw, _ := n.Weight.Float32()
		for _, v := range nw {
			if v < 0.89 || v > 1.11 {
				t.Fatalf("norm weight %v, want about 1", v)
			}
		}
		return w
	}
	if a, b, c := values(1), values(1), values(2); !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Errorf("random weights: same seed differs or other seed equal")
	}

	s := NewShapeLoader()
	NewConv3d(s, "proj", 16, 32, [3]int{1, 2, 2}, [3]int{1, 2, 2})
	NewRMSNorm(s, "q", 8, 1e-6)
	if got := s.Shapes(); len(got) != 3 || !slices.Equal(got["proj.weight"], []int{32, 16, 1, 2, 2}) || !slices.Equal(got["q.weight"], []int{8}) {
		t.Errorf("shapes %v", got)
	}
	if err := s.Err(); err != nil {
		t.Error(err)
	}
}
