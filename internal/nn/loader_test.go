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

// TestLoader binds a small Linear and LayerNorm from a wrapped checkpoint and checks the
// report, then the errors that name a tensor, and that Free leaves nothing allocated.
func TestLoader(t *testing.T) {
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ck := checkpoint(t,
		safetensors.FromFloat32("fc.weight", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6}),
		safetensors.FromFloat32("fc.bias", []int64{3}, []float32{0, 0, 1}),
		safetensors.FromFloat32("norm.weight", []int64{3}, []float32{1, 1, 1}),
		safetensors.FromFloat32("norm.bias", []int64{3}, []float32{0, 0, 0}),
		safetensors.FromInt64("ids", []int64{2}, []int64{0, 1}),
		safetensors.FromFloat32("head.weight", []int64{1}, []float32{1}),
		safetensors.FromFloat32("adapter.weight", []int64{1}, []float32{1}),
	)
	prefix, err := DetectPrefix(ck, "fc.weight", "", "model.")
	if err != nil || prefix != "model." {
		t.Fatalf("prefix %q, %v", prefix, err)
	}
	if _, err := DetectPrefix(ck, "nothing", "", "model."); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), `tensor "nothing" is missing (also looked under "model.")`) {
		t.Fatalf("no prefix: %v", err)
	}
	l := NewLoader(rt, ck, runtime.F32, prefix)
	l.SetWeightDType(runtime.F16)
	fc, err := LoadLinear(l, "fc", 2, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	if fc.Weight.DType() != runtime.F16 || fc.Bias.DType() != runtime.F32 {
		t.Errorf("dtypes: weight %s, bias %s", fc.Weight.DType(), fc.Bias.DType())
	}
	if _, err := LoadLayerNorm(l, "norm", 3, 1e-5); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		shape []int
		want  string
	}{
		{"absent", []int{1}, `tensor "model.absent" is missing`},
		{"fc.weight", []int{2, 3}, `tensor "model.fc.weight": got [3 2], expected [2 3]`},
		{"ids", []int{2}, `tensor "model.ids": dtype I64 is not a float type`},
	} {
		if _, err := l.Load(tc.name, tc.shape...); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("load %s: %v, want ErrCheckpoint saying %q", tc.name, err, tc.want)
		}
	}
	l.Skip("head.")
	rep := l.Report()
	if rep.Prefix != "model." || rep.Loaded != 4 || rep.Bytes == 0 || !slices.Equal(rep.Skipped, []string{"model.head.weight"}) ||
		!slices.Equal(rep.Unexpected, []string{"model.adapter.weight", "model.ids"}) {
		t.Fatalf("report %+v", rep)
	}
	if n := len(l.Tensors()); n != 4 {
		t.Fatalf("%d tensors, want 4", n)
	}
	l.Free()
	if mem := rt.Memory(); mem.LiveTensors != 0 {
		t.Fatalf("%d tensors alive after Free", mem.LiveTensors)
	}
}
