package clip

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// refPooled is CLIPTextTransformer in float64, from transformers' modeling_clip.py: every
// position computed with the causal mask, then the pooled row by the config's rule.
func refPooled(cfg Config, w map[string][]float64, ids []int) []float64 {
	H, I, nh := cfg.HiddenSize, cfg.IntermediateSize, cfg.NumAttentionHeads
	D, n := H/nh, len(ids)
	eps := cfg.LayerNormEps
	ln := func(x []float64, name string) []float64 {
		y := make([]float64, len(x))
		for t := range len(x) / H {
			r := x[t*H : (t+1)*H]
			mean, vr := 0.0, 0.0
			for _, v := range r {
				mean += v
			}
			mean /= float64(H)
			for _, v := range r {
				vr += (v - mean) * (v - mean)
			}
			vr /= float64(H)
			for i, v := range r {
				y[t*H+i] = (v-mean)/math.Sqrt(vr+eps)*w[name+".weight"][i] + w[name+".bias"][i]
			}
		}
		return y
	}
	lin := func(x []float64, name string, in, out int) []float64 {
		y := make([]float64, len(x)/in*out)
		for t := range len(x) / in {
			for o := range out {
				acc := w[name+".bias"][o]
				for i := range in {
					acc += x[t*in+i] * w[name+".weight"][o*in+i]
				}
				y[t*out+o] = acc
			}
		}
		return y
	}
	act := func(x float64) float64 {
		switch cfg.HiddenAct {
		case "gelu":
			return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
		case "quick_gelu":
			return x / (1 + math.Exp(-1.702*x))
		}
		panic(cfg.HiddenAct)
	}
	h := make([]float64, n*H)
	for t, id := range ids {
		for i := range H {
			h[t*H+i] = w["embeddings.token_embedding.weight"][id*H+i] + w["embeddings.position_embedding.weight"][t*H+i]
		}
	}
	for l := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("encoder.layers.%d.", l)
		x := ln(h, p+"layer_norm1")
		q := lin(x, p+"self_attn.q_proj", H, H)
		k := lin(x, p+"self_attn.k_proj", H, H)
		v := lin(x, p+"self_attn.v_proj", H, H)
		att := make([]float64, n*H)
		for hh := range nh {
			for i := range n {
				s := make([]float64, i+1)
				mx, sum := math.Inf(-1), 0.0
				for j := 0; j <= i; j++ {
					for d := range D {
						s[j] += q[i*H+hh*D+d] * k[j*H+hh*D+d]
					}
					s[j] /= math.Sqrt(float64(D))
					mx = math.Max(mx, s[j])
				}
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for j := range s {
					for d := range D {
						att[i*H+hh*D+d] += s[j] / sum * v[j*H+hh*D+d]
					}
				}
			}
		}
		o := lin(att, p+"self_attn.out_proj", H, H)
		for i := range h {
			h[i] += o[i]
		}
		x = ln(h, p+"layer_norm2")
		f := lin(x, p+"mlp.fc1", H, I)
		for i := range f {
			f[i] = act(f[i])
		}
		f = lin(f, p+"mlp.fc2", I, H)
		for i := range h {
			h[i] += f[i]
		}
	}
	h = ln(h, "final_layer_norm")
	ids32 := make([]int32, n)
	for i, v := range ids {
		ids32[i] = int32(v)
	}
	idx := cfg.PoolIndex(ids32)
	return h[idx*H : (idx+1)*H]
}

// TestOtherConfigs checks configs the fixture does not cover against the float64 reference:
// exact GELU, an explicit eos_token_id (first-eos rule), a checkpoint saved with the
// "text_model." wrapper and a position_ids buffer, and a full CLIPConfig's text_config.
func TestOtherConfigs(t *testing.T) {
	text := map[string]any{"model_type": "clip_text_model", "vocab_size": 30, "hidden_size": 12, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 3, "max_position_embeddings": 10, "hidden_act": "gelu",
		"layer_norm_eps": 1e-5, "eos_token_id": 29}
	tests := []struct {
		name   string
		cfg    map[string]any
		prefix string
		ids    []int
	}{
		{"gelu, first eos", text, "", []int{28, 3, 17, 29, 4, 29, 29}},
		{"wrapped checkpoint, full clip config", map[string]any{"model_type": "clip", "text_config": text}, "text_model.",
			[]int{28, 3, 17, 5, 29, 1}},
	}
	rt := newRuntime(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			raw, _ := json.Marshal(tc.cfg)
			if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 5))
			w := map[string][]float64{}
			var ts []safetensors.Tensor
			add := func(name string, scale, offset float64, shape ...int64) {
				n := int64(1)
				for _, d := range shape {
					n *= d
				}
				v := make([]float32, n)
				f := make([]float64, n)
				for i := range v {
					v[i] = float32(offset + rng.NormFloat64()*scale)
					f[i] = float64(v[i])
				}
				w[name] = f
				ts = append(ts, safetensors.FromFloat32(tc.prefix+name, shape, v))
			}
			H, I := int64(cfg.HiddenSize), int64(cfg.IntermediateSize)
			add("embeddings.token_embedding.weight", 1, 0, int64(cfg.VocabSize), H)
			add("embeddings.position_embedding.weight", 0.5, 0, int64(cfg.MaxPositionEmbeddings), H)
			for l := range cfg.NumHiddenLayers {
				p := fmt.Sprintf("encoder.layers.%d.", l)
				for _, n := range []string{"layer_norm1", "layer_norm2"} {
					add(p+n+".weight", 0.2, 1, H)
					add(p+n+".bias", 0.1, 0, H)
				}
				for _, n := range []string{"q_proj", "k_proj", "v_proj", "out_proj"} {
					add(p+"self_attn."+n+".weight", 1/math.Sqrt(float64(H)), 0, H, H)
					add(p+"self_attn."+n+".bias", 0.1, 0, H)
				}
				add(p+"mlp.fc1.weight", 1/math.Sqrt(float64(H)), 0, I, H)
				add(p+"mlp.fc1.bias", 0.1, 0, I)
				add(p+"mlp.fc2.weight", 1/math.Sqrt(float64(I)), 0, H, I)
				add(p+"mlp.fc2.bias", 0.1, 0, H)
			}
			add("final_layer_norm.weight", 0.2, 1, H)
			add("final_layer_norm.bias", 0.1, 0, H)
			ts = append(ts, safetensors.FromInt64(tc.prefix+"embeddings.position_ids", []int64{1, int64(cfg.MaxPositionEmbeddings)},
				make([]int64, cfg.MaxPositionEmbeddings)))
			if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, safetensors.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			m, err := Load(rt, dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if len(m.Report.Unexpected) != 0 || !slices.Contains(m.Report.Skipped, tc.prefix+"embeddings.position_ids") {
				t.Errorf("report %+v", m.Report)
			}
			ids := make([]int32, len(tc.ids))
			for i, v := range tc.ids {
				ids[i] = int32(v)
			}
			p, err := m.Pooled(ids)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Float32()
			p.Free()
			if err != nil {
				t.Fatal(err)
			}
			want := refPooled(cfg, w, tc.ids)
			wf := make([]float32, len(want))
			for i, v := range want {
				wf[i] = float32(v)
			}
			e := parity.RelL2(got, wf)
			t.Logf("%s: pooled at %d, rel_l2=%.3g tol=1e-5", tc.name, cfg.PoolIndex(ids), e)
			if !(e <= 1e-5) {
				t.Errorf("rel_l2 %g", e)
			}
		})
	}
}
