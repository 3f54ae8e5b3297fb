package lora

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// memSource is an in-memory checkpoint of F32 tensors.
type memSource struct {
	infos map[string]safetensors.TensorInfo
	data  map[string][]float32
	names []string
}

func newMemSource() *memSource {
	return &memSource{infos: map[string]safetensors.TensorInfo{}, data: map[string][]float32{}}
}

func (m *memSource) add(name string, v []float32, shape ...int64) {
	m.infos[name] = safetensors.TensorInfo{Name: name, DType: safetensors.F32, Shape: shape, End: int64(4 * len(v))}
	m.data[name] = v
	m.names = append(m.names, name)
}

func (m *memSource) Info(name string) (safetensors.TensorInfo, bool) {
	i, ok := m.infos[name]
	return i, ok
}

func (m *memSource) Bytes(name string) ([]byte, error) {
	v, ok := m.data[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return encode(v, safetensors.F32)
}

func (m *memSource) Names() []string { return m.names }

func seq(n int, r *rand.Rand) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// writeLora writes tensors (name → values, shape) as a LoRA file.
func writeLora(t *testing.T, name string, ts []safetensors.Tensor) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// want computes base + Σ coeff · up[rows] @ down for one weight [out, in] in float64.
func want(base []float32, out, in int, updates ...func(o, j int) float64) []float32 {
	w := make([]float32, len(base))
	for o := range out {
		for j := range in {
			v := float64(base[o*in+j])
			for _, u := range updates {
				v += u(o, j)
			}
			w[o*in+j] = float32(v)
		}
	}
	return w
}

func lowRank(coeff float64, up, down []float32, rank, in, rowOffset int) func(o, j int) float64 {
	return func(o, j int) float64 {
		o -= rowOffset
		var s float64
		for k := range rank {
			s += float64(up[o*rank+k]) * float64(down[k*in+j])
		}
		return coeff * s
	}
}

func merged(t *testing.T, m *Merged, name string) []float32 {
	t.Helper()
	info, ok := m.Info(name)
	if !ok || info.DType != safetensors.F32 {
		t.Fatalf("info %s: %+v %v", name, info, ok)
	}
	raw, err := m.Bytes(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := decode(raw, safetensors.F32)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func closeTo(t *testing.T, label string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", label, len(got), len(want))
	}
	for i := range got {
		if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", label, i, got[i], want[i])
		}
	}
}

// TestMergeFormats merges one file of each format into a small model and checks the merged
// weights against W + strength·scale·(up @ down) computed here: kohya alpha/rank scaling, the
// original names' fused qkv and linear1 split by rows with a shared down, kohya keys with
// original names, final_layer.adaLN_modulation.1's shift/scale halves swapped, stacking, and
// that untouched weights read back unchanged.
func TestMergeFormats(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const dim, mlp, rank = 8, 16, 2
	src := newMemSource()
	base := map[string][]float32{}
	add := func(name string, out, in int) {
		v := seq(out*in, r)
		base[name] = v
		src.add(name, v, int64(out), int64(in))
	}
	for _, n := range []string{"attn.to_q", "attn.to_k", "attn.to_v"} {
		add("single_transformer_blocks.0."+n+".weight", dim, dim)
		add("transformer_blocks.0."+n+".weight", dim, dim)
	}
	add("single_transformer_blocks.0.proj_mlp.weight", mlp, dim)
	add("norm_out.linear.weight", 2*dim, dim)
	add("proj_out.weight", dim, dim)
	src.add("proj_out.bias", seq(dim, r), dim)

	down := seq(rank*dim, r)
	upQKV := seq(3*dim*rank, r)
	upLinear1 := seq((3*dim+mlp)*rank, r)
	upNorm := seq(2*dim*rank, r)
	upQ := seq(dim*rank, r)
	t16 := func(name string, v []float32, shape ...int64) safetensors.Tensor {
		return safetensors.FromFloat32(name, shape, v)
	}
	original := writeLora(t, "orig.safetensors", []safetensors.Tensor{
		t16("diffusion_model.double_blocks.0.img_attn_qkv.lora_A.weight", down, rank, dim),
		t16("diffusion_model.double_blocks.0.img_attn_qkv.lora_B.weight", upQKV, 3*dim, rank),
		t16("diffusion_model.single_blocks.0.linear1.lora_A.weight", down, rank, dim),
		t16("diffusion_model.single_blocks.0.linear1.lora_B.weight", upLinear1, 3*dim+mlp, rank),
		t16("diffusion_model.final_layer.adaLN_modulation.1.lora_A.weight", down, rank, dim),
		t16("diffusion_model.final_layer.adaLN_modulation.1.lora_B.weight", upNorm, 2*dim, rank),
	})
	kohya := writeLora(t, "kohya.safetensors", []safetensors.Tensor{
		t16("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", down, rank, dim),
		t16("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", upQKV, 3*dim, rank),
		t16("lora_unet_double_blocks_0_img_attn_qkv.alpha", []float32{1}),
		t16("lora_unet_proj_out.lora_down.weight", down, rank, dim),
		t16("lora_unet_proj_out.lora_up.weight", upQ, dim, rank),
		t16("lora_unet_proj_out.alpha", []float32{4}),
	})
	peft := writeLora(t, "peft.safetensors", []safetensors.Tensor{
		t16("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", down, rank, dim),
		t16("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", upQ, dim, rank),
	})

	m, applied, err := Merge(src, []Spec{{original, 0.5}, {kohya, 2}, {peft, 1}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantApplied := []Applied{{original, 0.5, FormatOriginal, 3 + 4 + 1}, {kohya, 2, FormatMusubi, 4}, {peft, 1, FormatPEFT, 1}}
	if fmt.Sprint(applied) != fmt.Sprint(wantApplied) {
		t.Fatalf("applied %+v, want %+v", applied, wantApplied)
	}
	for i, n := range []string{"attn.to_q", "attn.to_k", "attn.to_v"} {
		name := "transformer_blocks.0." + n + ".weight"
		ups := []func(o, j int) float64{
			lowRank(0.5, upQKV[i*dim*rank:(i+1)*dim*rank], down, rank, dim, 0),
			lowRank(2*0.5, upQKV[i*dim*rank:(i+1)*dim*rank], down, rank, dim, 0), // alpha 1 / rank 2
		}
		if n == "attn.to_q" {
			ups = append(ups, lowRank(1, upQ, down, rank, dim, 0))
		}
		closeTo(t, name, merged(t, m, name), want(base[name], dim, dim, ups...))
	}
	for i, n := range []string{"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"} {
		name := "single_transformer_blocks.0." + n + ".weight"
		rows := dim
		if n == "proj_mlp" {
			rows = mlp
		}
		up := upLinear1[i*dim*rank : i*dim*rank+rows*rank]
		closeTo(t, name, merged(t, m, name), want(base[name], rows, dim, lowRank(0.5, up, down, rank, dim, 0)))
	}
	// adaLN_modulation.1 is shift, scale; norm_out.linear is scale, shift.
	shift, scale := upNorm[:dim*rank], upNorm[dim*rank:]
	swapped := append(append([]float32{}, scale...), shift...)
	closeTo(t, "norm_out.linear.weight", merged(t, m, "norm_out.linear.weight"),
		want(base["norm_out.linear.weight"], 2*dim, dim, lowRank(0.5, swapped, down, rank, dim, 0)))
	closeTo(t, "proj_out.weight", merged(t, m, "proj_out.weight"),
		want(base["proj_out.weight"], dim, dim, lowRank(2*4.0/rank, upQ, down, rank, dim, 0)))
	raw, err := m.Bytes("proj_out.bias")
	if err != nil {
		t.Fatal(err)
	}
	if bias, _ := decode(raw, safetensors.F32); fmt.Sprint(bias) != fmt.Sprint(src.data["proj_out.bias"]) {
		t.Errorf("untouched bias changed")
	}
	if got := len(m.Changed()); got != 3+4+1+1 {
		t.Errorf("changed %d weights: %v", got, m.Changed())
	}

	// KeepDType stores merged weights in the checkpoint's dtype (F32 here, so unchanged values).
	k, _, err := Merge(src, []Spec{{peft, 1}}, Options{KeepDType: true})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := k.Info("transformer_blocks.0.attn.to_q.weight"); info.DType != safetensors.F32 {
		t.Errorf("kept dtype %s", info.DType)
	}
}

// TestMergeErrors checks the errors a user can act on name the file and the key.
func TestMergeErrors(t *testing.T) {
	src := newMemSource()
	src.add("proj_out.weight", make([]float32, 64), 8, 8)
	src.add("single_transformer_blocks.0.attn.to_q.weight", make([]float32, 64), 8, 8)
	src.add("single_transformer_blocks.0.attn.to_k.weight", make([]float32, 64), 8, 8)
	src.add("single_transformer_blocks.0.attn.to_v.weight", make([]float32, 64), 8, 8)
	src.add("single_transformer_blocks.0.proj_mlp.weight", make([]float32, 128), 16, 8)
	f := func(name string, n int, shape ...int64) safetensors.Tensor {
		return safetensors.FromFloat32(name, shape, make([]float32, n))
	}
	tests := []struct {
		name  string
		ts    []safetensors.Tensor
		spec  float64
		wants []string
	}{
		{"up without down", []safetensors.Tensor{f("transformer.proj_out.lora_B.weight", 16, 8, 2)}, 1,
			[]string{"transformer.proj_out", "no down"}},
		{"linear1 rows", []safetensors.Tensor{f("diffusion_model.single_blocks.0.linear1.lora_A.weight", 16, 2, 8),
			f("diffusion_model.single_blocks.0.linear1.lora_B.weight", 96, 48, 2)}, 1,
			[]string{"diffusion_model.single_blocks.0.linear1.lora_B.weight", "shape mismatch", "48 rows"}},
		{"unknown original module", []safetensors.Tensor{f("diffusion_model.double_blocks.0.img_attn_norm.lora_A.weight", 16, 2, 8),
			f("diffusion_model.double_blocks.0.img_attn_norm.lora_B.weight", 16, 8, 2)}, 1,
			[]string{"diffusion_model.double_blocks.0.img_attn_norm", "matches no weight"}},
		{"kohya unknown", []safetensors.Tensor{f("lora_unet_proj_in.lora_down.weight", 16, 2, 8),
			f("lora_unet_proj_in.lora_up.weight", 16, 8, 2)}, 1, []string{"lora_unet_proj_in", "matches no weight"}},
		{"alpha not scalar", []safetensors.Tensor{f("lora_unet_proj_out.alpha", 2, 2)}, 1, []string{"lora_unet_proj_out.alpha", "scalar"}},
		{"NaN strength", []safetensors.Tensor{f("transformer.proj_out.lora_A.weight", 16, 2, 8),
			f("transformer.proj_out.lora_B.weight", 16, 8, 2)}, math.NaN(), []string{"strength NaN"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeLora(t, "bad.safetensors", tc.ts)
			_, _, err := Merge(src, []Spec{{path, tc.spec}}, Options{})
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v, want ErrInvalid", err)
			}
			for _, w := range append(tc.wants, "bad.safetensors") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// BenchmarkMerge merges a rank-32 LoRA into one full-size single block's linear1 split
// (q, k, v: 3072×3072; proj_mlp: 12288×3072) from bf16, as the transformer worker does for
// each weight a LoRA changes at load.
func BenchmarkMerge(b *testing.B) {
	const dim, mlp, rank = 3072, 12288, 32
	r := rand.New(rand.NewPCG(3, 4))
	src := newMemSource()
	for _, n := range []string{"attn.to_q", "attn.to_k", "attn.to_v"} {
		src.add("single_transformer_blocks.0."+n+".weight", seq(dim*dim, r), dim, dim)
	}
	src.add("single_transformer_blocks.0.proj_mlp.weight", seq(mlp*dim, r), mlp, dim)
	path := filepath.Join(b.TempDir(), "linear1.safetensors")
	if err := safetensors.WriteFile(path, []safetensors.Tensor{
		safetensors.FromFloat32("diffusion_model.single_blocks.0.linear1.lora_A.weight", []int64{rank, dim}, seq(rank*dim, r)),
		safetensors.FromFloat32("diffusion_model.single_blocks.0.linear1.lora_B.weight", []int64{3*dim + mlp, rank}, seq((3*dim+mlp)*rank, r)),
	}, safetensors.WriteOptions{}); err != nil {
		b.Fatal(err)
	}
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	gemm := func(up []float32, rows, rank int, down []float32, in int) ([]float32, error) {
		a, err := rt.FromFloat32(up, rows, rank)
		if err != nil {
			return nil, err
		}
		defer a.Free()
		d, err := rt.FromFloat32(down, rank, in)
		if err != nil {
			return nil, err
		}
		defer d.Free()
		c, err := rt.MatMul(a, d, runtime.GemmParams{})
		if err != nil {
			return nil, err
		}
		defer c.Free()
		return c.Float32()
	}
	for _, bc := range []struct {
		name string
		opts Options
	}{{"go", Options{}}, {"runtime_cpu", Options{MatMul: gemm}}} {
		b.Run(bc.name, func(b *testing.B) {
			m, _, err := Merge(src, []Spec{{path, 1}}, bc.opts)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(4 * (3*dim + mlp) * dim))
			for b.Loop() {
				for _, n := range m.Changed() {
					if _, err := m.Bytes(n); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
