package siglip

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// synth is a randomly initialised SigLIP vision model kept on the host in float64, the reference
// the runtime model is checked against for configs the fixtures do not cover.
type synth struct {
	cfg Config
	w   map[string][]float64 // names without prefix
	sh  map[string][]int64
}

func newSynth(t *testing.T, cfg Config, seed uint64) *synth {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	s := &synth{cfg: cfg, w: map[string][]float64{}, sh: map[string][]int64{}}
	add := func(name string, scale, offset float64, shape ...int64) {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		v := make([]float64, n)
		for i := range v {
			// values exactly representable in float32, so the checkpoint holds the reference's weights
			v[i] = float64(float32(offset + scale*r.NormFloat64()))
		}
		s.w[name], s.sh[name] = v, shape
	}
	D, I, P, C := int64(cfg.HiddenSize), int64(cfg.IntermediateSize), int64(cfg.PatchSize), int64(cfg.NumChannels)
	add("embeddings.patch_embedding.weight", 1/math.Sqrt(float64(C*P*P)), 0, D, C, P, P)
	add("embeddings.patch_embedding.bias", 0.1, 0, D)
	add("embeddings.position_embedding.weight", 0.5, 0, int64(cfg.NumPatches()), D)
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		p := "encoder.layers." + strconv.Itoa(i) + "."
		for _, ln := range []string{"layer_norm1", "layer_norm2"} {
			add(p+ln+".weight", 0.2, 1, D)
			add(p+ln+".bias", 0.1, 0, D)
		}
		for _, pr := range []string{"q_proj", "k_proj", "v_proj", "out_proj"} {
			add(p+"self_attn."+pr+".weight", 1/math.Sqrt(float64(D)), 0, D, D)
			add(p+"self_attn."+pr+".bias", 0.1, 0, D)
		}
		add(p+"mlp.fc1.weight", 1/math.Sqrt(float64(D)), 0, I, D)
		add(p+"mlp.fc1.bias", 0.1, 0, I)
		add(p+"mlp.fc2.weight", 1/math.Sqrt(float64(I)), 0, D, I)
		add(p+"mlp.fc2.bias", 0.1, 0, D)
	}
	add("post_layernorm.weight", 0.2, 1, D)
	add("post_layernorm.bias", 0.1, 0, D)
	// the pooling head, which Load must skip
	add("head.probe", 1, 0, 1, 1, D)
	add("head.attention.in_proj_weight", 1, 0, 3*D, D)
	add("head.attention.in_proj_bias", 1, 0, 3*D)
	add("head.layernorm.weight", 1, 0, D)
	return s
}

// write saves the model as dir/config.json + dir/model.safetensors with names under prefix;
// drop leaves a tensor out, reshape changes one tensor's shape (both for error tests).
func (s *synth) write(t *testing.T, dir, prefix, drop string, reshape map[string][]int64) {
	t.Helper()
	cfg := map[string]any{
		"model_type": "siglip_vision_model", "hidden_size": s.cfg.HiddenSize,
		"intermediate_size": s.cfg.IntermediateSize, "num_hidden_layers": s.cfg.NumHiddenLayers,
		"num_attention_heads": s.cfg.NumAttentionHeads, "image_size": s.cfg.ImageSize,
		"patch_size": s.cfg.PatchSize, "hidden_act": s.cfg.HiddenAct, "layer_norm_eps": s.cfg.LayerNormEps,
	}
	raw, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for name, v := range s.w {
		if name == drop {
			continue
		}
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		shape := s.sh[name]
		if r, ok := reshape[name]; ok {
			shape = r
		}
		ts = append(ts, safetensors.FromFloat32(prefix+name, shape, f))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func layerNorm64(x []float64, w, b []float64, eps float64) []float64 {
	D := len(w)
	out := make([]float64, len(x))
	for r := 0; r < len(x)/D; r++ {
		row := x[r*D : (r+1)*D]
		var mean, v float64
		for _, a := range row {
			mean += a
		}
		mean /= float64(D)
		for _, a := range row {
			v += (a - mean) * (a - mean)
		}
		v /= float64(D)
		inv := 1 / math.Sqrt(v+eps)
		for i, a := range row {
			out[r*D+i] = (a-mean)*inv*w[i] + b[i]
		}
	}
	return out
}

func linear64(x, w, b []float64, in, out int) []float64 {
	rows := len(x) / in
	y := make([]float64, rows*out)
	for r := 0; r < rows; r++ {
		for o := 0; o < out; o++ {
			acc := b[o]
			for i := 0; i < in; i++ {
				acc += x[r*in+i] * w[o*in+i]
			}
			y[r*out+o] = acc
		}
	}
	return y
}

func geluTanh64(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// forward is the reference SiglipVisionModel forward for one image [C, H, W] → [N, D].
func (s *synth) forward(px []float64, H, W int) []float64 {
	c := s.cfg
	D, P, C, I := c.HiddenSize, c.PatchSize, c.NumChannels, c.IntermediateSize
	gh, gw := H/P, W/P
	N := gh * gw
	x := make([]float64, N*D)
	pw, pb, pos := s.w["embeddings.patch_embedding.weight"], s.w["embeddings.patch_embedding.bias"], s.w["embeddings.position_embedding.weight"]
	for gy := 0; gy < gh; gy++ {
		for gx := 0; gx < gw; gx++ {
			n := gy*gw + gx
			for d := 0; d < D; d++ {
				acc := pb[d]
				for ch := 0; ch < C; ch++ {
					for ky := 0; ky < P; ky++ {
						for kx := 0; kx < P; kx++ {
							acc += pw[((d*C+ch)*P+ky)*P+kx] * px[(ch*H+gy*P+ky)*W+gx*P+kx]
						}
					}
				}
				x[n*D+d] = acc + pos[n*D+d]
			}
		}
	}
	Hh, hd := c.NumAttentionHeads, c.HeadDim()
	for l := 0; l < c.NumHiddenLayers; l++ {
		p := "encoder.layers." + strconv.Itoa(l) + "."
		h := layerNorm64(x, s.w[p+"layer_norm1.weight"], s.w[p+"layer_norm1.bias"], c.LayerNormEps)
		q := linear64(h, s.w[p+"self_attn.q_proj.weight"], s.w[p+"self_attn.q_proj.bias"], D, D)
		k := linear64(h, s.w[p+"self_attn.k_proj.weight"], s.w[p+"self_attn.k_proj.bias"], D, D)
		v := linear64(h, s.w[p+"self_attn.v_proj.weight"], s.w[p+"self_attn.v_proj.bias"], D, D)
		o := make([]float64, N*D)
		sc := make([]float64, N)
		for hh := 0; hh < Hh; hh++ {
			for i := 0; i < N; i++ {
				mx := math.Inf(-1)
				for j := 0; j < N; j++ {
					var dot float64
					for e := 0; e < hd; e++ {
						dot += q[i*D+hh*hd+e] * k[j*D+hh*hd+e]
					}
					sc[j] = dot / math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for e := 0; e < hd; e++ {
					var acc float64
					for j := 0; j < N; j++ {
						acc += sc[j] / sum * v[j*D+hh*hd+e]
					}
					o[i*D+hh*hd+e] = acc
				}
			}
		}
		a := linear64(o, s.w[p+"self_attn.out_proj.weight"], s.w[p+"self_attn.out_proj.bias"], D, D)
		for i := range x {
			x[i] += a[i]
		}
		h = layerNorm64(x, s.w[p+"layer_norm2.weight"], s.w[p+"layer_norm2.bias"], c.LayerNormEps)
		f := linear64(h, s.w[p+"mlp.fc1.weight"], s.w[p+"mlp.fc1.bias"], D, I)
		for i := range f {
			f[i] = geluTanh64(f[i])
		}
		f = linear64(f, s.w[p+"mlp.fc2.weight"], s.w[p+"mlp.fc2.bias"], I, D)
		for i := range x {
			x[i] += f[i]
		}
	}
	return layerNorm64(x, s.w["post_layernorm.weight"], s.w["post_layernorm.bias"], c.LayerNormEps)
}

// TestModelOtherConfigs checks the model against a float64 reference for configs unlike the
// fixture's (image and patch sizes, layers, heads, eps, checkpoint prefix), and that the
// pooling head is skipped, not reported as unexpected.
func TestModelOtherConfigs(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		prefix string
		H, W   int // pixel size (may exceed image_size by less than a patch: "valid" conv floors)
	}{
		{"grid6 patch5 3 layers bare", Config{HiddenSize: 12, IntermediateSize: 20, NumHiddenLayers: 3, NumAttentionHeads: 3,
			ImageSize: 30, PatchSize: 5, HiddenAct: "gelu_pytorch_tanh", LayerNormEps: 1e-5}, "", 30, 30},
		{"grid2 patch14 1 layer vision_model prefix", Config{HiddenSize: 16, IntermediateSize: 8, NumHiddenLayers: 1, NumAttentionHeads: 1,
			ImageSize: 28, PatchSize: 14, HiddenAct: "gelu_pytorch_tanh", LayerNormEps: 1e-6}, "vision_model.", 28, 28},
		{"grid3 patch4 image 13 (floor) 2 layers", Config{HiddenSize: 8, IntermediateSize: 24, NumHiddenLayers: 2, NumAttentionHeads: 4,
			ImageSize: 13, PatchSize: 4, HiddenAct: "gelu_pytorch_tanh", LayerNormEps: 1e-6}, "vision_model.", 13, 14},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := newSynth(t, tc.cfg, uint64(i+1))
			dir := t.TempDir()
			s.write(t, dir, tc.prefix, "", nil)
			rt := newRuntime(t)
			m, err := Load(rt, dir, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			rep := m.Report()
			if rep.Prefix != tc.prefix || len(rep.Unexpected) != 0 || len(rep.Skipped) != 4 {
				t.Errorf("report: prefix %q, unexpected %v, skipped %v", rep.Prefix, rep.Unexpected, rep.Skipped)
			}
			for _, n := range rep.Skipped {
				if !strings.HasPrefix(n, tc.prefix+"head.") {
					t.Errorf("skipped %q, not a head tensor", n)
				}
			}
			r := rand.New(rand.NewPCG(7, uint64(i)))
			px := make([]float32, 3*tc.H*tc.W)
			px64 := make([]float64, len(px))
			for j := range px {
				px[j] = float32(2*r.Float64() - 1)
				px64[j] = float64(px[j])
			}
			got, shape, err := m.ForwardHost(px, []int{1, 3, tc.H, tc.W}, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := s.forward(px64, tc.H, tc.W)
			if len(shape) != 3 || shape[0] != 1 || shape[1] != tc.cfg.NumPatches() || shape[2] != tc.cfg.HiddenSize {
				t.Fatalf("shape %v, want [1 %d %d]", shape, tc.cfg.NumPatches(), tc.cfg.HiddenSize)
			}
			w32 := make([]float32, len(want))
			for j, v := range want {
				w32[j] = float32(v)
			}
			e := parity.RelL2(got, w32)
			t.Logf("rel_l2 vs float64 reference %.3g (tolerance 1e-5)", e)
			if !(e <= 1e-5) {
				t.Errorf("rel_l2 %g", e)
			}
		})
	}
}

// TestLoadErrors checks that checkpoint problems are errors naming the tensor, and that nothing
// stays allocated after a failed load.
func TestLoadErrors(t *testing.T) {
	cfg := Config{HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 2, NumAttentionHeads: 2, ImageSize: 8, PatchSize: 4,
		HiddenAct: "gelu_pytorch_tanh", LayerNormEps: 1e-6}
	s := newSynth(t, cfg, 3)
	tests := []struct {
		name    string
		drop    string
		reshape map[string][]int64
		want    string
	}{
		{"missing", "encoder.layers.1.mlp.fc2.bias", nil, `tensor vision_model.encoder.layers.1.mlp.fc2.bias: missing`},
		{"wrong shape", "", map[string][]int64{"encoder.layers.0.self_attn.k_proj.weight": {4, 16}},
			`tensor vision_model.encoder.layers.0.self_attn.k_proj.weight: got shape [4 16], expected [8 8]`},
		{"no patch embedding", "embeddings.patch_embedding.weight", nil, `tensor embeddings.patch_embedding.weight: missing`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s.write(t, dir, "vision_model.", tc.drop, tc.reshape)
			rt := newRuntime(t)
			_, err := Load(rt, dir, LoadOptions{})
			if err == nil || !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrCheckpoint with %s", err, tc.want)
			}
			if n := rt.Memory().LiveTensors; n != 0 {
				t.Errorf("%d tensors alive after a failed load", n)
			}
		})
	}
}

// TestForwardBadInput checks that pixel values the model cannot take are ErrBadInput.
func TestForwardBadInput(t *testing.T) {
	cfg := Config{HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 1, NumAttentionHeads: 2, ImageSize: 8, PatchSize: 4,
		HiddenAct: "gelu_pytorch_tanh", LayerNormEps: 1e-6}
	dir := t.TempDir()
	newSynth(t, cfg, 5).write(t, dir, "", "", nil)
	rt := newRuntime(t)
	m, err := Load(rt, dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	tests := []struct {
		name  string
		n     int
		shape []int
	}{
		{"rank 3", 3 * 8 * 8, []int{3, 8, 8}},
		{"4 channels", 4 * 8 * 8, []int{1, 4, 8, 8}},
		{"grid too small", 3 * 4 * 8, []int{1, 3, 4, 8}},
		{"grid too large", 3 * 12 * 8, []int{1, 3, 12, 8}},
		{"length mismatch", 10, []int{1, 3, 8, 8}},
		{"zero dim", 0, []int{0, 3, 8, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := m.ForwardHost(make([]float32, tc.n), tc.shape, nil)
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("err %v, want ErrBadInput", err)
			}
		})
	}
	if n := rt.Memory().LiveTensors; n != uint64(m.NumTensors()) {
		t.Errorf("%d live tensors, want %d weights", n, m.NumTensors())
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 1, NumAttentionHeads: 2, ImageSize: 8, PatchSize: 4}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"ok defaults", func(*Config) {}, ""},
		{"heads", func(c *Config) { c.NumAttentionHeads = 3 }, "hidden_size (8) must be divisible by num_attention_heads (3)"},
		{"zero layers", func(c *Config) { c.NumHiddenLayers = 0 }, "num_hidden_layers (0) must be positive"},
		{"patch larger than image", func(c *Config) { c.PatchSize = 9 }, "patch_size (9) must not exceed image_size (8)"},
		{"act", func(c *Config) { c.HiddenAct = "relu6" }, `hidden_act "relu6" is not supported`},
		{"model type", func(c *Config) { c.ModelType = "clip_vision_model" }, "is not siglip_vision_model"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil || c.HiddenAct != "gelu_pytorch_tanh" || c.LayerNormEps != 1e-6 || c.NumChannels != 3 {
					t.Fatalf("err %v, config %+v", err, c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestLoadConfigFullSiglip reads the vision part of a full SiglipConfig.
func TestLoadConfigFullSiglip(t *testing.T) {
	dir := t.TempDir()
	raw := `{"model_type": "siglip", "text_config": {"hidden_size": 4}, "vision_config": {"model_type": "siglip_vision_model",
	  "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
	  "image_size": 384, "patch_size": 14}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.HiddenSize != 1152 || c.GridSize() != 27 || c.NumPatches() != 729 || c.HeadDim() != 72 {
		t.Fatalf("config %+v", c)
	}
}

// TestLoadEncoderSizeMismatch refuses a processor size that does not make the model's grid.
func TestLoadEncoderSizeMismatch(t *testing.T) {
	cfg := Config{HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 1, NumAttentionHeads: 2, ImageSize: 8, PatchSize: 4}
	dir := t.TempDir()
	newSynth(t, cfg, 9).write(t, dir, "", "", nil)
	for _, tc := range []struct {
		size string
		ok   bool
	}{{`{"height": 8, "width": 8}`, true}, {`{"height": 11, "width": 10}`, true}, {`{"height": 12, "width": 8}`, false}} {
		if err := os.WriteFile(filepath.Join(dir, "preprocessor_config.json"), []byte(`{"size": `+tc.size+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
		rt := newRuntime(t)
		enc, err := LoadEncoder(rt, dir, dir, "", LoadOptions{})
		if tc.ok {
			if err != nil {
				t.Fatalf("size %s: %v", tc.size, err)
			}
			enc.Free()
			continue
		}
		if !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "patch grid") {
			t.Fatalf("size %s: err %v", tc.size, err)
		}
		if n := rt.Memory().LiveTensors; n != 0 {
			t.Errorf("%d tensors alive after a refused load", n)
		}
	}
}
