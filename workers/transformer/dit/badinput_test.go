package dit

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// firstForwardCase returns the transformer fixture's first transformer.forward case.
func firstForwardCase(t *testing.T, fx *parity.Fixture) parity.Case {
	t.Helper()
	for _, c := range fx.Cases {
		if c.Op == OpForward {
			return c
		}
	}
	t.Fatal("no transformer.forward case")
	return parity.Case{}
}

func cloneTensor(x conditioning.Tensor) conditioning.Tensor {
	return conditioning.Tensor{Shape: slices.Clone(x.Shape), Data: slices.Clone(x.Data)}
}

func cloneInts(x conditioning.IntTensor) conditioning.IntTensor {
	return conditioning.IntTensor{Shape: slices.Clone(x.Shape), Data: slices.Clone(x.Data)}
}

// TestBadInput feeds inconsistent or non-finite inputs and checks each is refused with
// ErrInvalidInput and a message naming the problem, before any compute.
func TestBadInput(t *testing.T) {
	fx := parity.Load(t, "transformer")
	rt := newTestRuntime(t)
	m := loadFixtureModel(t, rt, fx)
	fc := decodeForward(t, firstForwardCase(t, fx))
	shape := [5]int(fc.x.Shape)

	tests := []struct {
		name  string
		edit  func(c *Conditioning, shape *[5]int)
		x     func(x []float32) // edits the latents passed to Forward (after Prepare)
		want  string
		wantE error
	}{
		{name: "latent indices shorter than the latents", edit: func(c *Conditioning, _ *[5]int) {
			c.LatentIndices = conditioning.IntTensor{Shape: []int{1, 2}, Data: c.LatentIndices.Data[:2]}
		}, want: "latent_indices has shape [1 2]"},
		{name: "clean latents of another size", edit: func(c *Conditioning, _ *[5]int) {
			c.CleanLatents = conditioning.Tensor{Shape: []int{1, 16, 2, 8, 10}, Data: c.CleanLatents.Data[:16*2*8*10]}
		}, want: "clean_latents has shape [1 16 2 8 10]"},
		{name: "2x indices do not match the 2x latents", edit: func(c *Conditioning, _ *[5]int) {
			c.CleanLatent2xIndices = conditioning.IntTensor{Shape: []int{1, 3}, Data: []int64{1, 2, 3}}
		}, want: "clean_latents_2x indices has shape [1 3]"},
		{name: "4x latents without indices", edit: func(c *Conditioning, _ *[5]int) {
			c.CleanLatent4xIndices = conditioning.IntTensor{}
		}, want: "clean_latents_4x and its indices must be given together"},
		{name: "NaN in the clean latents", edit: func(c *Conditioning, _ *[5]int) {
			c.CleanLatents.Data[17] = float32(math.NaN())
		}, want: "clean_latents holds a non-finite value (NaN at element 17)"},
		{name: "Inf in the text states", edit: func(c *Conditioning, _ *[5]int) {
			c.EncoderHiddenStates.Data[3] = float32(math.Inf(1))
		}, want: "encoder_hidden_states holds a non-finite value"},
		{name: "NaN in the noisy latents", x: func(x []float32) { x[100] = float32(math.NaN()) },
			want: "hidden_states holds a non-finite value (NaN at element 100)"},
		{name: "batch 2", edit: func(_ *Conditioning, s *[5]int) { s[0] = 2 }, want: "batch size 2"},
		{name: "odd latent width", edit: func(_ *Conditioning, s *[5]int) { s[4] = 11 }, want: "multiples of patch_size 2"},
		{name: "mask selects nothing", edit: func(c *Conditioning, _ *[5]int) {
			clear(c.EncoderAttentionMask.Data)
		}, want: "selects no text token"},
		{name: "mask value 2", edit: func(c *Conditioning, _ *[5]int) {
			c.EncoderAttentionMask.Data[0] = 2
		}, want: "encoder_attention_mask holds 2 at 0"},
		{name: "pooled projection of the wrong width", edit: func(c *Conditioning, _ *[5]int) {
			c.PooledProjections = conditioning.Tensor{Shape: []int{1, 7}, Data: make([]float32, 7)}
		}, want: "pooled_projections has shape [1 7]"},
		{name: "no image embeddings for a model with image projection", edit: func(c *Conditioning, _ *[5]int) {
			c.ImageEmbeddings = conditioning.Tensor{}
		}, want: "image_embeddings has shape []"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fc.cond
			c.CleanLatents = cloneTensor(c.CleanLatents)
			c.EncoderHiddenStates = cloneTensor(c.EncoderHiddenStates)
			c.EncoderAttentionMask = cloneInts(c.EncoderAttentionMask)
			s := shape
			if tc.edit != nil {
				tc.edit(&c, &s)
			}
			var err error
			sec, perr := m.Prepare(c, s)
			if perr != nil {
				err = perr
			} else {
				defer sec.Close()
				x := slices.Clone(fc.x.Data)
				if tc.x != nil {
					tc.x(x)
				}
				_, err = m.Forward(context.Background(), sec, x, fc.timestep, fc.guidance, ForwardOptions{})
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidInput) {
				t.Errorf("error %v does not match ErrInvalidInput", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
	if live := rt.Memory().LiveTensors; live != uint64(m.NumTensors()) {
		t.Errorf("%d live tensors after refused inputs, want the %d weights", live, m.NumTensors())
	}
}

// TestMaskedRefinerMatchesCrop runs the fixture's forward with the refiner over every padded
// text token and the reference's mask (the path for masks that are not leading ones) and checks
// it still matches the reference, i.e. that running the real tokens alone is exact.
func TestMaskedRefinerMatchesCrop(t *testing.T) {
	fx := parity.Load(t, "transformer")
	rt := newTestRuntime(t)
	m := loadFixtureModel(t, rt, fx)
	c := firstForwardCase(t, fx)
	fc := decodeForward(t, c)
	forceMaskedRefiner = true
	defer func() { forceMaskedRefiner = false }()
	sec, err := m.Prepare(fc.cond, [5]int(fc.x.Shape))
	if err != nil {
		t.Fatal(err)
	}
	defer sec.Close()
	if sec.textMask == nil {
		t.Fatal("masked refiner path not taken")
	}
	out, err := m.Forward(context.Background(), sec, fc.x.Data, fc.timestep, fc.guidance, ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Check(t, "sample (masked refiner)", out, toInt64s(fc.x.Shape), c.Output(t, "sample"))
}

// TestBadConfig checks that configs this implementation cannot run are refused at load, naming
// the setting.
func TestBadConfig(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, key string
		value     any
		want      string
	}{
		{"temporal patches", "patch_size_t", 2, "patch_size_t 2 is not supported"},
		{"layer-norm qk", "qk_norm", "layer_norm", `qk_norm "layer_norm" is not supported`},
		{"rope dims not the head dim", "rope_axes_dim", []int{4, 6, 4}, "sums to 14, attention_head_dim is 16"},
		{"odd rope dim", "rope_axes_dim", []int{3, 7, 6}, "rope_axes_dim[0] (3) must be positive and even"},
		{"other class", "_class_name", "HunyuanVideoTransformer3DModel", "_class_name"},
		{"no heads", "num_attention_heads", 0, "num_attention_heads (0) must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cfg map[string]any
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			cfg[tc.key] = tc.value
			d := t.TempDir()
			b, _ := json.Marshal(cfg)
			if err := os.WriteFile(filepath.Join(d, "config.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			rt := newTestRuntime(t)
			_, err := Load(rt, d, LoadOptions{RandomWeights: true})
			if !errors.Is(err, ErrUnsupportedConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrUnsupportedConfig saying %q", err, tc.want)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

// TestBadCheckpoint checks load errors that name the tensor or the shard: a shard missing from
// a sharded checkpoint, a tensor missing, a tensor of the wrong shape; and that a complete
// sharded copy of the fixture checkpoint loads.
func TestBadCheckpoint(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	src, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cfgRaw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]safetensors.Tensor{}
	for _, n := range src.Names() {
		info, _ := src.Info(n)
		b, err := src.Bytes(n)
		if err != nil {
			t.Fatal(err)
		}
		all[n] = safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: b}
	}
	// writeSharded writes the tensors as two shards with an index; skip names a shard file not
	// to write.
	writeSharded := func(t *testing.T, ts map[string]safetensors.Tensor, skip string) string {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "config.json"), cfgRaw, 0o600); err != nil {
			t.Fatal(err)
		}
		shards := map[string][]safetensors.Tensor{}
		wm := map[string]string{}
		for n, x := range ts {
			f := "diffusion_pytorch_model-00001-of-00002.safetensors"
			if strings.HasPrefix(n, "single_transformer_blocks.") {
				f = "diffusion_pytorch_model-00002-of-00002.safetensors"
			}
			shards[f] = append(shards[f], x)
			wm[n] = f
		}
		for f, list := range shards {
			if f == skip {
				continue
			}
			if err := safetensors.WriteFile(filepath.Join(d, f), list, safetensors.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
		if err := os.WriteFile(filepath.Join(d, "diffusion_pytorch_model.safetensors.index.json"), idx, 0o600); err != nil {
			t.Fatal(err)
		}
		return d
	}
	without := func(name string) map[string]safetensors.Tensor {
		out := map[string]safetensors.Tensor{}
		for n, x := range all {
			if n != name {
				out[n] = x
			}
		}
		return out
	}
	reshaped := without("proj_out.weight")
	pw := all["proj_out.weight"]
	pw.Shape = []int64{pw.Shape[1], pw.Shape[0]}
	reshaped["proj_out.weight"] = pw
	extra := without("")
	extra["some_adapter.weight"] = safetensors.FromFloat32("some_adapter.weight", []int64{2}, []float32{1, 2})

	tests := []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"missing shard", func(t *testing.T) string {
			return writeSharded(t, all, "diffusion_pytorch_model-00002-of-00002.safetensors")
		}, "shard diffusion_pytorch_model-00002-of-00002.safetensors"},
		{"missing tensor", func(t *testing.T) string { return writeSharded(t, without("norm_out.linear.bias"), "") },
			"tensor norm_out.linear.bias: missing (expected shape [64])"},
		{"wrong shape", func(t *testing.T) string { return writeSharded(t, reshaped, "") },
			"tensor proj_out.weight: got shape [32 64], expected [64 32]"},
		{"complete sharded copy", func(t *testing.T) string { return writeSharded(t, extra, "") }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntime(t)
			m, err := Load(rt, tc.dir(t), LoadOptions{})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if !slices.Equal(m.Unexpected, []string{"some_adapter.weight"}) {
					t.Errorf("unexpected tensors %v, want [some_adapter.weight]", m.Unexpected)
				}
				if got, want := m.NumTensors(), len(all); got != want {
					t.Errorf("bound %d tensors, checkpoint has %d", got, want)
				}
				return
			}
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if live := rt.Memory().LiveTensors; live != 0 {
				t.Errorf("%d tensors left alive after the failed load", live)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}
