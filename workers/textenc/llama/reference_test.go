package llama

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// refLlama is a float64 LlamaModel written straight from transformers' modeling_llama.py
// (rotate_half RoPE, repeat_kv GQA, additive mask), to check configs the fixture does not cover.
type refLlama struct {
	cfg Config
	w   map[string][]float64
}

func (r *refLlama) linear(x []float64, n int, name string, in, out int, bias bool) []float64 {
	w := r.w[name+".weight"]
	y := make([]float64, n*out)
	for t := range n {
		for o := range out {
			acc := 0.0
			if bias {
				acc = r.w[name+".bias"][o]
			}
			for i := range in {
				acc += x[t*in+i] * w[o*in+i]
			}
			y[t*out+o] = acc
		}
	}
	return y
}

func (r *refLlama) rms(x []float64, n int, name string) []float64 {
	H := r.cfg.HiddenSize
	y := make([]float64, len(x))
	for t := range n {
		ss := 0.0
		for i := range H {
			ss += x[t*H+i] * x[t*H+i]
		}
		inv := 1 / math.Sqrt(ss/float64(H)+r.cfg.RMSNormEps)
		for i := range H {
			y[t*H+i] = x[t*H+i] * inv * r.w[name][i]
		}
	}
	return y
}

// hidden returns hidden_states[index] for ids with mask.
func (r *refLlama) hidden(ids []int, mask []bool, index int) []float64 {
	c := r.cfg
	H, D, nh, nkv, n := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, len(ids)
	theta, _ := c.Rope()
	states := [][]float64{}
	h := make([]float64, n*H)
	for t, id := range ids {
		copy(h[t*H:], r.w["embed_tokens.weight"][id*H:(id+1)*H])
	}
	states = append(states, h)
	rope := func(x []float64, heads int) {
		for t := range n {
			for hh := range heads {
				v := x[(t*heads+hh)*D : (t*heads+hh+1)*D]
				out := make([]float64, D)
				for i := range D {
					f := float64(t) / math.Pow(theta, float64(2*(i%(D/2)))/float64(D))
					var rot float64 // rotate_half: cat(-x2, x1)
					if i < D/2 {
						rot = -v[i+D/2]
					} else {
						rot = v[i-D/2]
					}
					out[i] = v[i]*math.Cos(f) + rot*math.Sin(f)
				}
				copy(v, out)
			}
		}
	}
	for l := range c.NumHiddenLayers {
		p := fmt.Sprintf("layers.%d.", l)
		x := r.rms(h, n, p+"input_layernorm.weight")
		q := r.linear(x, n, p+"self_attn.q_proj", H, nh*D, c.AttentionBias)
		k := r.linear(x, n, p+"self_attn.k_proj", H, nkv*D, c.AttentionBias)
		v := r.linear(x, n, p+"self_attn.v_proj", H, nkv*D, c.AttentionBias)
		rope(q, nh)
		rope(k, nkv)
		att := make([]float64, n*nh*D)
		for hh := range nh {
			kh := hh / (nh / nkv)
			for i := range n {
				scores := make([]float64, n)
				mx := math.Inf(-1)
				for j := range n {
					s := math.Inf(-1)
					if j <= i && mask[j] {
						s = 0
						for d := range D {
							s += q[(i*nh+hh)*D+d] * k[(j*nkv+kh)*D+d]
						}
						s /= math.Sqrt(float64(D))
					}
					scores[j] = s
					mx = math.Max(mx, s)
				}
				sum := 0.0
				for j := range n {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range n {
					for d := range D {
						att[(i*nh+hh)*D+d] += scores[j] / sum * v[(j*nkv+kh)*D+d]
					}
				}
			}
		}
		o := r.linear(att, n, p+"self_attn.o_proj", nh*D, H, c.AttentionBias)
		for i := range h {
			o[i] += h[i]
		}
		h = o
		x = r.rms(h, n, p+"post_attention_layernorm.weight")
		g := r.linear(x, n, p+"mlp.gate_proj", H, c.IntermediateSize, c.MLPBias)
		u := r.linear(x, n, p+"mlp.up_proj", H, c.IntermediateSize, c.MLPBias)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := r.linear(g, n, p+"mlp.down_proj", c.IntermediateSize, H, c.MLPBias)
		for i := range h {
			d[i] += h[i]
		}
		h = d
		if l == c.NumHiddenLayers-1 {
			h = r.rms(h, n, "norm.weight")
		}
		states = append(states, h)
	}
	if index < 0 {
		index += len(states)
	}
	return states[index]
}

// writeRandomModel writes config.json and a checkpoint of random weights (keys under prefix,
// plus extra tensors) and returns the folder and the reference model.
func writeRandomModel(t *testing.T, cfgJSON map[string]any, prefix string, extra []string) (string, *refLlama) {
	t.Helper()
	dir := t.TempDir()
	raw, err := json.Marshal(cfgJSON)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	ref := &refLlama{cfg: cfg, w: map[string][]float64{}}
	var ts []safetensors.Tensor
	add := func(name string, scale float64, shape ...int64) {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		f := make([]float64, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
			f[i] = float64(v[i])
		}
		ref.w[name] = f
		ts = append(ts, safetensors.FromFloat32(prefix+name, shape, v))
	}
	H, D, I := int64(cfg.HiddenSize), int64(cfg.HeadDim), int64(cfg.IntermediateSize)
	nh, nkv := int64(cfg.NumAttentionHeads), int64(cfg.NumKeyValueHeads)
	add("embed_tokens.weight", 1, int64(cfg.VocabSize), H)
	for l := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("layers.%d.", l)
		add(p+"input_layernorm.weight", 0.3, H)
		add(p+"post_attention_layernorm.weight", 0.3, H)
		for _, pr := range []struct {
			name    string
			in, out int64
			bias    bool
		}{{"self_attn.q_proj", H, nh * D, cfg.AttentionBias}, {"self_attn.k_proj", H, nkv * D, cfg.AttentionBias},
			{"self_attn.v_proj", H, nkv * D, cfg.AttentionBias}, {"self_attn.o_proj", nh * D, H, cfg.AttentionBias},
			{"mlp.gate_proj", H, I, cfg.MLPBias}, {"mlp.up_proj", H, I, cfg.MLPBias}, {"mlp.down_proj", I, H, cfg.MLPBias}} {
			add(p+pr.name+".weight", 1/math.Sqrt(float64(pr.in)), pr.out, pr.in)
			if pr.bias {
				add(p+pr.name+".bias", 0.1, pr.out)
			}
		}
	}
	add("norm.weight", 0.3, H)
	for _, e := range extra {
		ts = append(ts, safetensors.FromFloat32(e, []int64{2}, []float32{1, 2}))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir, ref
}

// TestOtherConfigs checks configs the fixture does not cover against the float64 reference:
// biases, head_dim ≠ hidden/heads, 3:1 GQA, the transformers 4 rope_theta spelling, a
// LlamaForCausalLM checkpoint ("model." prefix, lm_head), a non-prefix mask.
func TestOtherConfigs(t *testing.T) {
	base := map[string]any{"model_type": "llama", "vocab_size": 40, "hidden_size": 12, "intermediate_size": 20,
		"num_hidden_layers": 3, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 6,
		"rms_norm_eps": 1e-6, "hidden_act": "silu"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name   string
		cfg    map[string]any
		prefix string
		extra  []string
		mask   []bool
	}{
		{"biases and legacy rope_theta", with("attention_bias", true, "mlp_bias", true, "rope_theta", 1000.0, "rope_scaling", nil), "", nil,
			[]bool{true, true, true, true, true, true, false, false}},
		{"causal lm checkpoint", with("rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 500000.0}), "model.",
			[]string{"lm_head.weight"}, []bool{true, true, true, true, true, true, true, true}},
		{"mha with hole in mask", with("num_key_value_heads", 3, "head_dim", 4), "", []string{"stray.weight"},
			[]bool{true, true, false, true, true, true, false, false}},
	}
	ids := []int{1, 7, 39, 0, 12, 5, 3, 3}
	rt := newRuntime(t, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, ref := writeRandomModel(t, tc.cfg, tc.prefix, tc.extra)
			last := 0
			for i, k := range tc.mask {
				if k {
					last = i + 1
				}
			}
			ids32 := make([]int32, len(ids))
			for i, v := range ids {
				ids32[i] = int32(v)
			}
			for _, index := range []int{-1, -2, 1} {
				m := loadModel(t, rt, dir, index)
				if want := unexpectedOf(tc.extra); !slices.Equal(m.Report.Unexpected, want) {
					t.Errorf("unexpected tensors %v, want %v", m.Report.Unexpected, want)
				}
				h, err := m.HiddenState(ids32, tc.mask)
				if err != nil {
					t.Fatal(err)
				}
				got, err := h.Float32()
				h.Free()
				if err != nil {
					t.Fatal(err)
				}
				want := ref.hidden(ids, tc.mask, index)[:last*ref.cfg.HiddenSize]
				wf := make([]float32, len(want))
				for i, v := range want {
					wf[i] = float32(v)
				}
				e := parity.RelL2(got, wf)
				t.Logf("%s index %d: rel_l2=%.3g tol=1e-5", tc.name, index, e)
				if !(e <= 1e-5) {
					t.Errorf("index %d: rel_l2 %g", index, e)
				}
			}
		})
	}
}

// unexpectedOf returns the extra tensors a load should report as unexpected (not lm_head).
func unexpectedOf(extra []string) []string {
	var out []string
	for _, e := range extra {
		if !strings.HasPrefix(e, "lm_head.") {
			out = append(out, e)
		}
	}
	return out
}
