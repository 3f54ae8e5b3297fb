package fp8

import (
	"errors"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// memSource is a Source of tensors held in memory.
type memSource map[string]safetensors.Tensor

func (m memSource) Names() []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (m memSource) Info(name string) (safetensors.TensorInfo, bool) {
	t, ok := m[name]
	return safetensors.TensorInfo{Name: name, DType: t.DType, Shape: t.Shape, End: int64(len(t.Data))}, ok
}

func (m memSource) Bytes(name string) ([]byte, error) { return m[name].Data, nil }

func f32(name string, shape []int64, v ...float32) safetensors.Tensor {
	return safetensors.FromFloat32(name, shape, v)
}

func q8(name string, dt safetensors.DType, shape []int64, v ...byte) safetensors.Tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	data := make([]byte, n)
	copy(data, v)
	return safetensors.Tensor{Name: name, DType: dt, Shape: shape, Data: data}
}

func bf16(name string, shape []int64) safetensors.Tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Data: make([]byte, 2*n)}
}

func src(ts ...safetensors.Tensor) memSource {
	m := memSource{}
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

// TestDetectFormats checks each format is told from its keys and dtypes, with the scale shape
// of every weight.
func TestDetectFormats(t *testing.T) {
	e4, e5 := safetensors.F8E4M3, safetensors.F8E5M2
	cases := []struct {
		name         string
		src          memSource
		format       Format
		weight       string
		rows, blocks int
	}{
		{"none", src(bf16("a.weight", []int64{4, 8})), None, "", 0, 0},
		{"plain e4m3", src(q8("a.weight", e4, []int64{4, 8}), bf16("a.bias", []int64{4})), Plain, "a.weight", 1, 1},
		{"plain e5m2", src(q8("a.weight", e5, []int64{4, 8})), Plain, "a.weight", 1, 1},
		{"comfy", src(q8(Marker, e4, []int64{0}), q8("a.weight", e4, []int64{4, 8}), f32("a.scale_weight", nil, 0.5),
			f32("a.scale_input", nil, 2)), Comfy, "a.weight", 1, 1},
		{"comfy without a marker (scale_input)", src(q8("a.weight", e4, []int64{4, 8}), f32("a.scale_weight", []int64{1}, 0.5),
			f32("a.scale_input", []int64{1}, 2)), Comfy, "a.weight", 1, 1},
		{"comfy unscaled weight", src(q8(Marker, e4, []int64{0}), q8("a.weight", e4, []int64{4, 8})), Comfy, "a.weight", 1, 1},
		{"musubi per tensor", src(q8("a.weight", e4, []int64{4, 8}), f32("a.scale_weight", nil, 0.5)), Musubi, "a.weight", 1, 1},
		{"musubi per channel", src(q8("a.weight", e4, []int64{4, 8}), f32("a.scale_weight", []int64{4, 1}, 1, 2, 3, 4)), Musubi, "a.weight", 4, 1},
		{"musubi block", src(q8("a.weight", e5, []int64{2, 8}), f32("a.scale_weight", []int64{2, 4, 1}, 1, 2, 3, 4, 5, 6, 7, 8),
			f32("a.scale_weight_tensor", nil, 0.25)), Musubi, "a.weight", 2, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Detect(c.src)
			if err != nil {
				t.Fatal(err)
			}
			if c.format == None {
				if l != nil {
					t.Fatalf("layout %+v, want none", l)
				}
				return
			}
			if l.Format != c.format {
				t.Errorf("format %q, want %q", l.Format, c.format)
			}
			w := l.Weight(c.weight)
			if w == nil || w.Rows != c.rows || w.Blocks != c.blocks {
				t.Fatalf("weight %+v, want rows %d blocks %d", w, c.rows, c.blocks)
			}
		})
	}
}

// TestScalesAndDequantize checks the block-wise rule w = q·s[o][i/bs]·t and the per-channel one.
func TestScalesAndDequantize(t *testing.T) {
	// e4m3 0x38 = 1, 0x40 = 2, 0xb8 = -1
	m := src(q8("a.weight", safetensors.F8E4M3, []int64{2, 4}, 0x38, 0x40, 0xb8, 0x38, 0x40, 0x40, 0x38, 0xb8),
		f32("a.scale_weight", []int64{2, 2, 1}, 1, 2, 3, 4), f32("a.scale_weight_tensor", nil, 0.5),
		q8("b.weight", safetensors.F8E4M3, []int64{2, 2}, 0x38, 0x40, 0x38, 0xb8), f32("b.scale_weight", []int64{2, 1}, 3, 5))
	l, err := Detect(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.Weight("a.weight").Dequantize(m)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.5, 1, -1, 1, 3, 3, 2, -2}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("block-wise dequant %v, want %v", got, want)
		}
	}
	got, err = l.Weight("b.weight").Dequantize(m)
	if err != nil {
		t.Fatal(err)
	}
	want = []float32{3, 6, 5, -5}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("per-channel dequant %v, want %v", got, want)
		}
	}
	bad := src(q8("a.weight", safetensors.F8E4M3, []int64{2, 2}), f32("a.scale_weight", nil, float32(math.Inf(1))))
	lb, err := Detect(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lb.Weight("a.weight").Scales(bad); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "a.scale_weight") {
		t.Errorf("infinite scale: %v", err)
	}
}

// TestDetectErrors checks unknown and inconsistent layouts fail naming the tensor.
func TestDetectErrors(t *testing.T) {
	e4 := safetensors.F8E4M3
	w := q8("a.weight", e4, []int64{4, 8})
	cases := []struct {
		name, tensor string
		src          memSource
	}{
		{"scale without weight", "b.scale_weight", src(w, f32("b.scale_weight", nil, 1))},
		{"scale for a bf16 weight", "c.scale_weight", src(w, bf16("c.weight", []int64{4, 8}), f32("c.scale_weight", nil, 1))},
		{"musubi channel shape", "a.scale_weight", src(w, f32("a.scale_weight", []int64{3, 1}, 1, 1, 1))},
		{"musubi block does not divide", "a.scale_weight", src(w, f32("a.scale_weight", []int64{4, 3, 1}, make([]float32, 12)...))},
		{"comfy non-scalar scale", "a.scale_weight", src(q8(Marker, e4, []int64{0}), w, f32("a.scale_weight", []int64{4, 1}, 1, 1, 1, 1))},
		{"tensor scale without blocks", "a.scale_weight_tensor", src(w, f32("a.scale_weight", []int64{4, 1}, 1, 1, 1, 1), f32("a.scale_weight_tensor", nil, 1))},
		{"integer scale", "a.scale_weight", src(w, safetensors.FromInt64("a.scale_weight", nil, []int64{1}))},
		{"comfy_quant layout", "a.comfy_quant", src(w, q8("a.comfy_quant", safetensors.U8, []int64{4}))},
		{"weight_scale layout", "a.weight_scale", src(w, f32("a.weight_scale", nil, 1))},
		{"bad marker", Marker, src(w, bf16(Marker, []int64{4}))},
		{"input scale shape", "a.scale_input", src(w, f32("a.scale_weight", nil, 1), f32("a.scale_input", []int64{2}, 1, 1))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Detect(c.src)
			if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "tensor "+c.tensor+":") {
				t.Fatalf("err %v, want ErrLayout naming %s", err, c.tensor)
			}
		})
	}
}
