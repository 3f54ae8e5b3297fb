package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	"github.com/framepackd/framepackd/workers/transformer/dit"
)

// opForwardLora is the lora fixture's op.
const opForwardLora = "transformer.forward_lora"

// fixtureLora is one entry of a lora case's params.loras.
type fixtureLora struct {
	Path           string  `json:"path"`
	Strength       float64 `json:"strength"`
	Format         string  `json:"format"`
	WeightsChanged uint32  `json:"weights_changed"`
}

// loraSpecs reads a case's params.loras as load request entries (paths under the fixture root).
func loraSpecs(t *testing.T, fx *parity.Fixture, c parity.Case) ([]workerkit.LoraSpec, []fixtureLora) {
	t.Helper()
	var ls []fixtureLora
	if !c.Param(t, "loras", &ls) || len(ls) == 0 {
		t.Fatalf("case %s: no params.loras", c.Name)
	}
	specs := make([]workerkit.LoraSpec, len(ls))
	for i, l := range ls {
		specs[i] = workerkit.LoraSpec{Path: filepath.Join(fx.Root, l.Path), Strength: l.Strength}
	}
	return specs, ls
}

// TestParityLora loads a transformer worker per case of the lora fixture with the case's LoRAs
// merged (PEFT, musubi, original names with fused qkv/linear1, two stacked) and checks its
// forward against the reference's within the case's tolerance, that the output differs from
// the forward without LoRAs by more than that tolerance (the merge did something), and that
// the load response names each LoRA with its format and the weights it changed.
func TestParityLora(t *testing.T) {
	fx := parity.Load(t, "lora")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case opForwardLora:
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
			ran++
			specs, want := loraSpecs(t, fx, c)
			for _, dtype := range []string{"", "auto"} {
				p, _ := workertest.Start(t, "transformer")
				resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), DType: dtype, Loras: specs})
				if err != nil {
					t.Fatalf("load with %d loras (dtype %q): %v", len(specs), dtype, err)
				}
				if len(resp.Loras) != len(want) {
					t.Fatalf("load response loras %+v, want %d", resp.Loras, len(want))
				}
				for i, a := range resp.Loras {
					if a.Path != specs[i].Path || a.Strength != want[i].Strength || a.Format != want[i].Format || a.WeightsChanged != want[i].WeightsChanged {
						t.Errorf("lora %d applied %+v, want %s %v %s changing %d weights", i, a, specs[i].Path, want[i].Strength, want[i].Format, want[i].WeightsChanged)
					}
				}
				fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
				res, _, err := runForward(t, p, fc.req)
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				got := readFloat(t, res.Outputs[0])
				if dtype == "" {
					c.Check(t, "sample (lora merged, f32 weights)", got, fc.shape, c.Output(t, "sample"))
				} else {
					// Merged weights rounded to the checkpoint's bf16, as every weight is held.
					c.Check(t, "sample (lora merged, weights as stored)", got, fc.shape, c.Output(t, "sample"))
				}
				without := c.Output(t, "sample_without_lora")
				if d := parity.RelL2(got, without.F32); d <= c.Tolerance.RelL2 {
					t.Errorf("dtype %q: output within %.2g of the forward without loras (tolerance %g): the merge changed nothing", dtype, d, c.Tolerance.RelL2)
				}
			}
		})
	}
	if ran == 0 {
		t.Fatal("no transformer.forward_lora cases")
	}
}

// TestLoraBadFiles loads the transformer with broken copies of the fixture's LoRA files and
// checks each fails with InvalidArgument naming the problem and the key, and that a LoRA is
// refused by a worker that does not take them.
func TestLoraBadFiles(t *testing.T) {
	fx := parity.Load(t, "lora")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	loras := filepath.Join(fx.Root, "models", "loras")
	peft := filepath.Join(loras, "style_peft.safetensors")
	musubi := filepath.Join(loras, "motion_musubi.safetensors")
	tmp := t.TempDir()

	truncated := filepath.Join(tmp, "truncated.safetensors")
	raw, err := os.ReadFile(peft)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truncated, raw[:len(raw)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	rewrite := func(name, src string, edit func(name string, shape []int64, v []float32) (string, []int64, []float32)) string {
		f, err := safetensors.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var ts []safetensors.Tensor
		for _, n := range f.Names() {
			v, shape, err := f.Float32(n)
			if err != nil {
				t.Fatal(err)
			}
			n, shape, v = edit(n, shape, v)
			ts = append(ts, safetensors.FromFloat32(n, shape, v))
		}
		path := filepath.Join(tmp, name)
		if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const toQ = "transformer.transformer_blocks.0.attn.to_q"
	unknown := rewrite("unknown.safetensors", peft, func(n string, s []int64, v []float32) (string, []int64, []float32) {
		if rest, ok := strings.CutPrefix(n, "transformer.transformer_blocks.1.attn.to_k."); ok {
			return "transformer.transformer_blocks.7.attn.to_k." + rest, s, v
		}
		return n, s, v
	})
	wrongShape := rewrite("shape.safetensors", peft, func(n string, s []int64, v []float32) (string, []int64, []float32) {
		if n == toQ+".lora_B.weight" { // [32, 4] → [16, 4]
			return n, []int64{s[0] / 2, s[1]}, v[:len(v)/2]
		}
		return n, s, v
	})
	wrongIn := rewrite("in.safetensors", musubi, func(n string, s []int64, v []float32) (string, []int64, []float32) {
		if n == "lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight" { // [4, 32] → [4, 16]
			out := make([]float32, 0, len(v)/2)
			for r := range s[0] {
				out = append(out, v[int(r)*int(s[1]):int(r)*int(s[1])+int(s[1])/2]...)
			}
			return n, []int64{s[0], s[1] / 2}, out
		}
		return n, s, v
	})
	wrongRank := rewrite("rank.safetensors", peft, func(n string, s []int64, v []float32) (string, []int64, []float32) {
		if n == toQ+".lora_A.weight" { // rank 4 → 2
			return n, []int64{2, s[1]}, v[:2*s[1]]
		}
		return n, s, v
	})
	notLora := rewrite("notlora.safetensors", peft, func(n string, s []int64, v []float32) (string, []int64, []float32) {
		if n == toQ+".lora_A.weight" {
			return toQ + ".weight", s, v
		}
		return n, s, v
	})
	nothing := filepath.Join(tmp, "empty.safetensors")
	if err := safetensors.WriteFile(nothing, nil, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		path  string
		wants []string
	}{
		{"truncated", truncated, []string{"truncated.safetensors"}},
		{"missing file", filepath.Join(tmp, "nope.safetensors"), []string{"nope.safetensors", "no such file"}},
		{"unknown key", unknown, []string{"transformer.transformer_blocks.7.attn.to_k", "matches no weight"}},
		{"up of the wrong shape", wrongShape, []string{toQ + ".lora_B.weight", "shape mismatch"}},
		{"down of the wrong width", wrongIn, []string{"lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight", "shape mismatch"}},
		{"rank mismatch", wrongRank, []string{toQ, "rank mismatch"}},
		{"not a lora tensor", notLora, []string{toQ + ".weight", "not a LoRA tensor"}},
		{"no tensors", nothing, []string{"no LoRA tensors"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := workertest.Start(t, "transformer")
			_, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(),
				Loras: []workerkit.LoraSpec{{Path: musubi, Strength: 1}, {Path: tc.path, Strength: 1}}})
			if err == nil {
				t.Fatal("loaded")
			}
			if code := workerkit.CodeOf(err); code != workerkit.CodeInvalidArgument {
				t.Errorf("code %v, want invalid argument (%v)", code, err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

// TestLoraHeaderTruncated checks that a LoRA file cut inside its header is refused by name.
func TestLoraHeaderTruncated(t *testing.T) {
	fx := parity.Load(t, "lora")
	dir, _ := fx.ModelPath("transformer")
	raw, err := os.ReadFile(filepath.Join(fx.Root, "models", "loras", "subject_original.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	path := filepath.Join(t.TempDir(), "cut.safetensors")
	if err := os.WriteFile(path, raw[:8+n/2], 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ := workertest.Start(t, "transformer")
	_, err = p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(),
		Loras: []workerkit.LoraSpec{{Path: path, Strength: 1}}})
	if err == nil || workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), "cut.safetensors") {
		t.Fatalf("load with a cut header: %v, want invalid argument naming the file", err)
	}
}

// BenchmarkLoadLoras loads the fixture's transformer in-process on the cpu backend without
// LoRAs and with the lora fixture's two-file stack merged: the cost a LoRA stack adds to the
// transformer worker's load (the other stages do not change).
func BenchmarkLoadLoras(b *testing.B) {
	root, err := parity.Root()
	if err != nil {
		b.Fatal(err)
	}
	fx, err := parity.Open(root, "lora")
	if err != nil {
		b.Fatal(err)
	}
	defer fx.Close()
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		b.Fatal(err)
	}
	loras := filepath.Join(root, "models", "loras")
	stack := []workerkit.LoraSpec{{Path: filepath.Join(loras, "style_peft.safetensors"), Strength: 0.5},
		{Path: filepath.Join(loras, "motion_musubi.safetensors"), Strength: 1.2}}
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	for _, bc := range []struct {
		name  string
		loras []workerkit.LoraSpec
	}{{"none", nil}, {"stack", stack}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				m, applied, err := loadModel(rt, &workerkit.LoadRequest{ModelDir: dir, Loras: bc.loras}, dit.LoadOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if len(applied) != len(bc.loras) {
					b.Fatalf("applied %+v", applied)
				}
				m.Close()
			}
		})
	}
}
