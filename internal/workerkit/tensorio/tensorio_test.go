package tensorio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if left, err := shmtest.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "shared-memory leftovers: %v %v\n", left, err)
		code = 1
	}
	os.Exit(code)
}

func segment(t *testing.T, a *shm.Arena, name string) string {
	t.Helper()
	p, err := a.NewSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWriteRead writes outputs in each float dtype, two sharing a file, and reads them back
// through Open and ReadFloat.
func TestWriteRead(t *testing.T) {
	a := shmtest.Arena(t, "io")
	v := []float32{1, -2.5, 3.25, 1e-3, 65504, -0.0}
	shape := []int64{2, 3}
	shared := segment(t, a, "shared")
	outs := []Output{
		{Field: "a", Ref: workerkit.TensorRef{Path: shared, Name: "a"}, Shape: shape},
		{Field: "b", Ref: workerkit.TensorRef{Path: shared, Name: "b", DType: safetensors.BF16}, Shape: shape},
		{Field: "c", Ref: workerkit.TensorRef{Path: segment(t, a, "c"), Name: "c", DType: safetensors.F16, Shape: shape}, Shape: shape},
	}
	o, err := Create(outs)
	if err != nil {
		t.Fatal(err)
	}
	dst, direct, err := o.Target(0)
	if err != nil || !direct || len(dst) != len(v) {
		t.Fatalf("target of the F32 output: %d values, direct %v, %v", len(dst), direct, err)
	}
	copy(dst, v)
	if _, direct, err := o.Target(1); direct || err != nil {
		t.Fatalf("target of the BF16 output: direct %v, %v", direct, err)
	}
	for i := 1; i < 3; i++ {
		if err := o.PutFloat(i, v); err != nil {
			t.Fatal(err)
		}
	}
	refs, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	for i, dt := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		r := refs[i]
		if r.Path != outs[i].Ref.Path || r.Name != outs[i].Ref.Name || r.DType != dt || !slices.Equal(r.Shape, shape) {
			t.Fatalf("ref %d: %+v", i, r)
		}
		got, gotShape, err := ReadFloat(outs[i].Field, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		wv := v
		if dt != safetensors.F32 {
			wv = roundTrip(t, dt, v)
		}
		if !slices.Equal(gotShape, shape) || !slices.Equal(got, wv) {
			t.Errorf("%s: read %v %v, want %v", dt, got, gotShape, wv)
		}
	}
	if _, err := os.Stat(shared + shm.PartialExt); !os.IsNotExist(err) {
		t.Errorf("partial file left: %v", err)
	}
}

// roundTrip checks EncodeFloat's dt bits against safetensors' conversions and returns the
// values they stand for.
func roundTrip(t *testing.T, dt safetensors.DType, v []float32) []float32 {
	t.Helper()
	b, err := EncodeFloat(dt, v)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(v))
	for i, x := range v {
		h, back := safetensors.F32ToF16(x), safetensors.F16ToF32
		if dt == safetensors.BF16 {
			h, back = safetensors.F32ToBF16(x), safetensors.BF16ToF32
		}
		if got := uint16(b[2*i]) | uint16(b[2*i+1])<<8; got != h {
			t.Fatalf("%s of %v: %#04x, want %#04x", dt, x, got, h)
		}
		out[i] = back(h)
	}
	return out
}

// TestRequestErrors checks that references the request got wrong are refused as invalid
// arguments naming the field, before anything is written.
func TestRequestErrors(t *testing.T) {
	a := shmtest.Arena(t, "bad")
	in := segment(t, a, "in")
	if _, err := shm.WriteSegment(in, []safetensors.Tensor{safetensors.FromFloat32("x", []int64{2, 3}, make([]float32, 6))}); err != nil {
		t.Fatal(err)
	}
	out := segment(t, a, "out")
	outputs := []struct {
		name string
		outs []Output
		want string
	}{
		{"no name", []Output{{Field: "o", Ref: workerkit.TensorRef{Path: out}, Shape: []int64{1}}}, "o: path and name are required"},
		{"relative path", []Output{{Field: "o", Ref: workerkit.TensorRef{Path: "o.safetensors", Name: "o"}, Shape: []int64{1}}}, "is not absolute"},
		{"partial path", []Output{{Field: "o", Ref: workerkit.TensorRef{Path: out + shm.PartialExt, Name: "o"}, Shape: []int64{1}}}, "names a partial file"},
		{"integer dtype", []Output{{Field: "o", Ref: workerkit.TensorRef{Path: out, Name: "o", DType: safetensors.I64}, Shape: []int64{1}}}, "o: dtype I64, want F32, F16 or BF16"},
		{"other shape", []Output{{Field: "o", Ref: workerkit.TensorRef{Path: out, Name: "o", Shape: []int64{2}}, Shape: []int64{1}}}, "o: shape [2] asked, the model gives [1]"},
		{"named twice", []Output{{Field: "o1", Ref: workerkit.TensorRef{Path: out, Name: "o"}, Shape: []int64{1}},
			{Field: "o2", Ref: workerkit.TensorRef{Path: out, Name: "o"}, Shape: []int64{1}}}, "o1 and o2 both name tensor \"o\""},
	}
	for _, tc := range outputs {
		t.Run("output "+tc.name, func(t *testing.T) {
			_, err := Create(tc.outs)
			if !errors.Is(err, workerkit.ErrInvalidArgument) || workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want an invalid argument saying %q", err, tc.want)
			}
			if _, err := os.Stat(out + shm.PartialExt); !os.IsNotExist(err) {
				t.Errorf("partial file created for a bad request: %v", err)
			}
		})
	}
	inputs := []struct {
		name string
		ref  workerkit.TensorRef
		rank int
		want string
	}{
		{"no such file", workerkit.TensorRef{Path: filepath.Join(a.Dir(), "none.safetensors"), Name: "x"}, 2, "no such file"},
		{"no such tensor", workerkit.TensorRef{Path: in, Name: "y"}, 2, `i: no tensor "y"`},
		{"other dtype", workerkit.TensorRef{Path: in, Name: "x", DType: safetensors.BF16}, 2, "i: tensor is F32, the request says BF16"},
		{"other shape", workerkit.TensorRef{Path: in, Name: "x", Shape: []int64{3, 2}}, 2, "the request says shape [3 2]"},
		{"other rank", workerkit.TensorRef{Path: in, Name: "x"}, 3, "i: F32[2 3], want a rank-3 float tensor"},
	}
	for _, tc := range inputs {
		t.Run("input "+tc.name, func(t *testing.T) {
			_, _, err := ReadFloat("i", tc.ref, tc.rank)
			if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want an invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// TestAbort checks that a stage that fails leaves no partial file.
func TestAbort(t *testing.T) {
	a := shmtest.Arena(t, "abort")
	p := segment(t, a, "o")
	o, err := Create([]Output{{Field: "o", Ref: workerkit.TensorRef{Path: p, Name: "o"}, Shape: []int64{4}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + shm.PartialExt); err != nil {
		t.Fatalf("no partial file while writing: %v", err)
	}
	if err := o.PutFloat(0, make([]float32, 3)); err == nil {
		t.Fatal("3 values written into a 4-value tensor")
	}
	o.Abort()
	for _, f := range []string{p, p + shm.PartialExt} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s after Abort: %v", filepath.Base(f), err)
		}
	}
}
