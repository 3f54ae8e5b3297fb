package main

import (
	"cmp"
	"encoding/binary"
	"errors"
	"flag"
	"math"
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
	"github.com/framepackd/framepackd/workers/transformer/lora"
)

// fp8Compute is the compute mode TestParityFP8Weights loads with (scripts/gpu-check.sh phase fp8
// runs it per mode on a GPU); the activation modes are held to fp8ActivationsTol against the
// reference (fp8 weights, float64 activations).
var fp8Compute = flag.String("fp8.compute", "", "TestParityFP8Weights: LoadRequest.fp8_compute (weight_only, tensor, token)")

// opForwardWeights is the fp8 fixture's op: the forward with the weights of a single-file
// checkpoint (params.weights) and the config of params.config.
const opForwardWeights = "transformer.forward_weights"

// weightsCase is a transformer.forward_weights case's load: the model folder (the config's) and
// the checkpoint file.
func weightsCase(t *testing.T, fx *parity.Fixture, c parity.Case) (dir, checkpoint string) {
	t.Helper()
	var cfg, weights string
	if !c.Param(t, "config", &cfg) || !c.Param(t, "weights", &weights) {
		t.Fatalf("case %s: params.config and params.weights are required", c.Name)
	}
	return filepath.Dir(filepath.Join(fx.Root, cfg)), filepath.Join(fx.Root, weights)
}

// TestParityFP8Weights loads a transformer worker per case of the fp8 fixture with the case's
// single-file fp8 checkpoint (plain casts, ComfyUI's scaled_fp8, musubi-tuner's fp8_scaled: the
// loader tells them apart from the keys and dtypes) and checks its forward against the
// reference's, computed in float64 from the exactly dequantized weights, within the case's
// tolerance: with every block resident and with all but one streamed from host memory (the
// 8-bit weights and their scales in the host copies). The weights take about a quarter of
// their f32 size in 8 bits, and the load response names the format.
func TestParityFP8Weights(t *testing.T) {
	fx := parity.Load(t, "fp8")
	ran := 0
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Op != opForwardWeights {
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
			ran++
			dir, ck := weightsCase(t, fx, c)
			var format string
			c.Param(t, "format", &format)
			for _, streamed := range []bool{false, true} {
				req := &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ck, Backend: workertest.Backend(), FP8Compute: *fp8Compute}
				if streamed {
					req.MaxResidentBlocks = 1
				}
				p, _ := workertest.Start(t, "transformer")
				resp, err := p.Load(workertest.Ctx(t), req)
				if err != nil {
					t.Fatalf("load %s: %v", filepath.Base(ck), err)
				}
				if format != "" && !strings.HasPrefix(format, resp.WeightsFormat) || resp.WeightsFormat == "" {
					t.Errorf("weights format %q, the fixture's %q", resp.WeightsFormat, format)
				}
				if want := cmp.Or(*fp8Compute, "weight_only"); resp.FP8Compute != want {
					t.Errorf("fp8 compute %q, want %s", resp.FP8Compute, want)
				}
				if streamed && resp.StreamedBlocks == 0 {
					t.Fatalf("no block streamed: %+v", resp)
				}
				half := workertest.HalfActivations(t, resp)
				cc := c.ForActivations(half)
				tol := cc.Tolerance.RelL2
				if cmp.Or(*fp8Compute, "weight_only") != "weight_only" {
					tol = fp8ActivationsTol(t, c)
				}
				fc := writeForwardCase(t, shmtest.Arena(t, "job"), cc)
				res, _, err := runForward(t, p, fc.req)
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				what := "sample (fp8 weights, resident)"
				if streamed {
					what = "sample (fp8 weights, streamed)"
				}
				cc.CheckTol(t, what, readFloat(t, res.Outputs[0]), fc.shape, cc.Output(t, "sample"), tol)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no transformer.forward_weights cases")
	}
}

// fp8ActivationsTol is the tolerance of a forward with the activations quantized to e4m3 (the
// tensor and token compute modes) against the case's reference, which has the fp8 weights but
// float64 activations: quantizing the activations to the 8-bit format moves the output no further
// than quantizing the weights did. The fixture's sample_bf16_weights (the same forward with the
// bf16 weights the checkpoint was quantized from) measures the latter: the tolerance is the
// largest of the case's, parity.HalfRelL2 and relL2(sample, sample_bf16_weights). Measured on an
// H200: plain e4m3 0.0244 (tensor) and 0.0253 (token), ComfyUI-scaled 0.0247 and 0.0252, against
// the fixture's weight-quantization distances 0.0271 and 0.0275 (musubi per-channel: 0.0036, so
// HalfRelL2 holds it). A case without sample_bf16_weights gets HalfRelL2.
func fp8ActivationsTol(t *testing.T, c parity.Case) float64 {
	t.Helper()
	tol := max(c.Tolerance.RelL2, parity.HalfRelL2)
	if c.HasOutput("sample_bf16_weights") {
		tol = max(tol, parity.RelL2(c.Output(t, "sample").F32, c.Output(t, "sample_bf16_weights").F32))
	}
	return tol
}

// quantRow quantizes one weight row w (float32) to fmt's 8-bit type with scale s, as the rules
// say: q = cast(clamp(w/s, ±max)) by the runtime's conversion (checked byte for byte against
// PyTorch's in internal/runtime), returned as the dequantized float64 values q·s.
func quantRow(t *testing.T, rt *runtime.Runtime, dt runtime.DType, w []float32, s []float64, block int) ([]byte, []float64) {
	t.Helper()
	limit := float32(448)
	decode := safetensors.E4M3ToF32
	if dt == runtime.F8E5M2 {
		limit, decode = 57344, safetensors.E5M2ToF32
	}
	v := make([]float32, len(w))
	for i, x := range w {
		q := x / float32(s[i/block])
		v[i] = max(-limit, min(limit, q))
	}
	qt, err := rt.FromFloat32As(dt, v, len(v))
	if err != nil {
		t.Fatal(err)
	}
	defer qt.Free()
	raw, err := qt.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float64, len(raw))
	for i, b := range raw {
		deq[i] = float64(decode(b)) * s[i/block]
	}
	return raw, deq
}

// quantizedTwin is the Linear weight info (raw bytes) quantized by the quantize-at-load rule, per
// output channel s = max(max|w|/448, 1e-8) in float32, and dequantized: q·s as float32.
func quantizedTwin(t *testing.T, rt *runtime.Runtime, info safetensors.TensorInfo, raw []byte) safetensors.Tensor {
	t.Helper()
	w := floatsOf(t, info, raw)
	out, in := int(info.Shape[0]), int(info.Shape[1])
	deq := make([]float64, 0, len(w))
	for o := range out {
		row := w[o*in : (o+1)*in]
		m := float32(0)
		for _, x := range row {
			m = max(m, float32(math.Abs(float64(x))))
		}
		_, d := quantRow(t, rt, runtime.F8E4M3, row, []float64{float64(max(m/448, 1e-8))}, in)
		deq = append(deq, d...)
	}
	return safetensors.FromFloat32(info.Name, info.Shape, f64to32(deq))
}

// rewrite writes a copy of src to a new file in dir with edit applied to every tensor (edit
// returns the tensors to write instead; nil keeps it), and returns the path.
func rewrite(t *testing.T, dir, name string, src interface {
	Names() []string
	Info(string) (safetensors.TensorInfo, bool)
	Bytes(string) ([]byte, error)
}, edit func(info safetensors.TensorInfo, raw []byte) []safetensors.Tensor) string {
	t.Helper()
	var ts []safetensors.Tensor
	for _, n := range src.Names() {
		info, _ := src.Info(n)
		raw, err := src.Bytes(n)
		if err != nil {
			t.Fatal(err)
		}
		if out := edit(info, raw); out != nil {
			ts = append(ts, out...)
			continue
		}
		ts = append(ts, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: raw})
	}
	path := filepath.Join(dir, name)
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

func floatsOf(t *testing.T, info safetensors.TensorInfo, raw []byte) []float32 {
	t.Helper()
	v := make([]float32, info.NumElements())
	for i := range v {
		switch info.DType {
		case safetensors.BF16:
			v[i] = safetensors.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		case safetensors.F32:
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		default:
			t.Fatalf("%s: dtype %s", info.Name, info.DType)
		}
	}
	return v
}

func f64to32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// isLinear says whether a tensor of the tiny transformer is a Linear weight (2-D .weight).
func isLinear(info safetensors.TensorInfo) bool {
	return len(info.Shape) == 2 && strings.HasSuffix(info.Name, ".weight")
}

// forwardOf loads a worker with req and runs case c through it.
func forwardOf(t *testing.T, req *workerkit.LoadRequest, c parity.Case) ([]float32, *workerkit.LoadResponse) {
	t.Helper()
	p, _ := workertest.Start(t, "transformer")
	req.Backend = workertest.Backend()
	resp, err := p.Load(workertest.Ctx(t), req)
	if err != nil {
		t.Fatalf("load %+v: %v", req, err)
	}
	fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
	res, _, err := runForward(t, p, fc.req)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return readFloat(t, res.Outputs[0]), resp
}

// sameForward checks two forwards agree within tol (what f32 products in another order give), or
// within parity.HalfRelL2 when the worker ran 16-bit activations (a GPU's default).
func sameForward(t *testing.T, what string, resp *workerkit.LoadResponse, got, want []float32, tol float64) {
	t.Helper()
	if workertest.HalfActivations(t, resp) {
		tol = parity.HalfRelL2
	}
	d := parity.RelL2(got, want)
	t.Logf("%s: rel_l2 %.3g", what, d)
	if d > tol || math.IsNaN(d) {
		t.Errorf("%s: rel_l2 %.3g > %g", what, d, tol)
	}
}

// TestWorkerQuantizeAtLoad loads the fixture's bf16 transformer with weights "fp8" (every Linear
// quantized to e4m3 per output channel at load) and checks its forward against a worker that
// loads a float32 checkpoint of the dequantized weights computed here by the rule (s =
// max(max|w|/448, 1e-8) per row in float32, q = e4m3(clamp(w/s, ±448)), w = q·s in float64):
// the same weights, so the same output up to f32 summation order. Until the reference generator
// (testdata/reference/gen_fp8.py) has run on a GPU machine this is the check of the rule's
// effect on a whole forward; TestParityFP8Reference checks against its float64 reference.
func TestWorkerQuantizeAtLoad(t *testing.T) {
	fx := parity.Load(t, "fp8")
	c := fx.Cases[0]
	dir, _ := weightsCase(t, fx, c)
	base, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	twin := rewrite(t, t.TempDir(), "dequantized.safetensors", base, func(info safetensors.TensorInfo, raw []byte) []safetensors.Tensor {
		if !isLinear(info) {
			return nil
		}
		return []safetensors.Tensor{quantizedTwin(t, rt, info, raw)}
	})
	got, resp := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Weights: "fp8"}, c)
	if resp.WeightsFormat != "quantized" {
		t.Errorf("weights format %q, want quantized", resp.WeightsFormat)
	}
	want, _ := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: twin}, c)
	sameForward(t, "quantized at load vs its dequantized weights", resp, got, want, 1e-5)
	// And how far quantization moves the output from the bf16 weights' (reported, bounded loosely).
	d := parity.RelL2(got, c.Output(t, "sample_bf16_weights").F32)
	t.Logf("quantized at load vs the bf16 weights' reference: rel_l2 %.3g", d)
	if d > 0.2 {
		t.Errorf("quantized at load is %.3g from the bf16 weights' output", d)
	}
}

// TestWorkerFP8MusubiBlockE5M2 writes the fixture's transformer as a musubi-tuner block-wise
// e5m2 checkpoint with two-level scales (block 16, scale_weight [out, in/16, 1] and
// scale_weight_tensor; a variant the fp8 fixture does not have) and checks the worker's forward
// against a float32 checkpoint of its dequantized weights w = q·s·t.
func TestWorkerFP8MusubiBlockE5M2(t *testing.T) {
	fx := parity.Load(t, "fp8")
	c := fx.Cases[0]
	dir, _ := weightsCase(t, fx, c)
	base, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	const block = 16
	tmp := t.TempDir()
	deqs := map[string][]float64{}
	target := func(info safetensors.TensorInfo) bool {
		return isLinear(info) && strings.Contains(info.Name, "transformer_blocks.") && !strings.Contains(info.Name, "norm") &&
			info.Shape[1]%block == 0
	}
	ck := rewrite(t, tmp, "musubi_block_e5m2.safetensors", base, func(info safetensors.TensorInfo, raw []byte) []safetensors.Tensor {
		if !target(info) {
			return nil
		}
		w := floatsOf(t, info, raw)
		out, in := int(info.Shape[0]), int(info.Shape[1])
		nb := in / block
		s := make([]float64, out*nb)
		tensor := 0.0
		for i := range s {
			m := 0.0
			for _, x := range w[i*block : (i+1)*block] {
				m = math.Max(m, math.Abs(float64(x)))
			}
			s[i] = float64(float32(math.Max(m/57344, 1e-8)))
			tensor = math.Max(tensor, s[i])
		}
		s32 := make([]float32, len(s))
		for i := range s {
			s32[i] = float32(s[i] / tensor)
			s[i] = float64(s32[i]) * float64(float32(tensor))
		}
		q, deq := quantRow(t, rt, runtime.F8E5M2, w, s, block)
		deqs[info.Name] = deq
		mod := strings.TrimSuffix(info.Name, ".weight")
		return []safetensors.Tensor{{Name: info.Name, DType: safetensors.F8E5M2, Shape: info.Shape, Data: q},
			safetensors.FromFloat32(mod+".scale_weight", []int64{int64(out), int64(nb), 1}, s32),
			safetensors.FromFloat32(mod+".scale_weight_tensor", nil, []float32{float32(tensor)})}
	})
	if len(deqs) == 0 {
		t.Fatal("no block weight quantized")
	}
	twin := rewrite(t, tmp, "dequantized.safetensors", base, func(info safetensors.TensorInfo, raw []byte) []safetensors.Tensor {
		if d, ok := deqs[info.Name]; ok {
			return []safetensors.Tensor{safetensors.FromFloat32(info.Name, info.Shape, f64to32(d))}
		}
		return nil
	})
	got, resp := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ck}, c)
	if resp.WeightsFormat != "musubi" {
		t.Errorf("weights format %q, want musubi", resp.WeightsFormat)
	}
	want, _ := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: twin}, c)
	sameForward(t, "musubi block-wise e5m2 vs its dequantized weights", resp, got, want, 1e-5)
}

// TestWorkerFP8Lora merges a LoRA into each fp8 fixture checkpoint and checks the forward
// against a worker loading, without LoRAs, the float32 checkpoint of the same rule applied here
// step by step: the fp8 weights dequantized exactly, the LoRA merged (lora.Merge, float64 per
// row), the merged weights requantized to e4m3 per output channel, dequantized. That the merge
// moved the output is checked against the forward without the LoRA.
func TestWorkerFP8Lora(t *testing.T) {
	fx := parity.Load(t, "fp8")
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	spec := lora.Spec{Path: filepath.Join(fx.Root, "models", "loras", "style_peft.safetensors"), Strength: 1}
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			dir, ckPath := weightsCase(t, fx, c)
			ck, err := safetensors.OpenCheckpoint(ckPath)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			merged, _, err := lora.Merge(ck, []lora.Spec{spec}, lora.Options{})
			if err != nil {
				t.Fatal(err)
			}
			twin := rewrite(t, t.TempDir(), "merged.safetensors", merged, func(info safetensors.TensorInfo, raw []byte) []safetensors.Tensor {
				switch {
				case merged.Requantize(info.Name):
					return []safetensors.Tensor{quantizedTwin(t, rt, info, raw)}
				case info.DType.IsFP8():
					return nil // an 8-bit weight the LoRA does not touch stays as it is
				}
				return nil
			})
			got, resp := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ckPath,
				Loras: []workerkit.LoraSpec{{Path: spec.Path, Strength: spec.Strength}}}, c)
			if len(resp.Loras) != 1 || resp.Loras[0].WeightsChanged == 0 || resp.WeightsFormat == "" {
				t.Errorf("load response %+v", resp)
			}
			want, _ := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: twin}, c)
			sameForward(t, "fp8 + lora vs dequantize, merge, requantize", resp, got, want, 1e-5)
			without, _ := forwardOf(t, &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ckPath}, c)
			if d := parity.RelL2(got, without); d < 1e-3 {
				t.Errorf("the lora moved the output by %.3g only", d)
			}
		})
	}
}

// TestParityFP8Reference runs the cases of the project's own fp8 reference
// (testdata/reference/cases/fp8_reference, made by testdata/reference/gen_fp8.py in float64 with
// PyTorch: quantize at load, with a LoRA, a LoRA on ComfyUI's scaled fp8, fp8 activations per
// tensor and per token) through a worker loaded as each case's params say, within its tolerance.
// It skips until the generator has run (it needs PyTorch); TestWorkerQuantizeAtLoad and
// TestWorkerFP8Lora check the same rules against weights computed here meanwhile.
func TestParityFP8Reference(t *testing.T) {
	root, err := parity.ReferenceRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cases", "fp8_reference.json")); errors.Is(err, os.ErrNotExist) {
		t.Skip("testdata/reference/cases/fp8_reference.json does not exist yet: run testdata/reference/gen_fp8.py on a machine with PyTorch")
	}
	fx := parity.LoadReference(t, "fp8_reference")
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Op != opForwardWeights {
				t.Fatalf("unknown op %q", c.Op)
			}
			dir, ck := weightsCase(t, fx, c)
			req := &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ck}
			c.Param(t, "quantize", &req.Weights)
			c.Param(t, "fp8_compute", &req.FP8Compute)
			var ls []fixtureLora
			c.Param(t, "loras", &ls)
			for _, l := range ls {
				req.Loras = append(req.Loras, workerkit.LoraSpec{Path: filepath.Join(fx.Root, l.Path), Strength: l.Strength})
			}
			got, resp := forwardOf(t, req, c)
			cc := c.ForActivations(workertest.HalfActivations(t, resp))
			cc.Check(t, "sample", got, c.Input(t, "hidden_states").Shape, cc.Output(t, "sample"))
		})
	}
}

// TestEstimateFP8 asks the worker's pre-spawn estimate for the bf16 folder, the plain fp8 file
// and the folder quantized at load: the 8-bit ones need fewer weight bytes, by exactly as many as
// a load of the same request saves (the estimate and a load differ by the same few kilobytes in
// every case, which is not about 8 bits).
func TestEstimateFP8(t *testing.T) {
	fx := parity.Load(t, "fp8")
	dir, _ := weightsCase(t, fx, fx.Cases[0])
	plain := filepath.Join(fx.Root, "models", "fp8", "fp8_plain_e4m3fn.safetensors")
	reqs := map[string]workerkit.LoadRequest{
		"bf16":      {ModelDir: dir, DType: "auto"},
		"plain fp8": {ModelDir: dir, DType: "auto", Checkpoint: plain},
		"quantized": {ModelDir: dir, DType: "auto", Weights: "fp8"},
	}
	est, held := map[string]uint64{}, map[string]uint64{}
	for name, lr := range reqs {
		p, _ := workertest.Start(t, "transformer")
		resp, err := p.Estimate(workertest.Ctx(t), &workerkit.EstimateRequest{Load: lr})
		if err != nil {
			t.Fatalf("%s: estimate: %v", name, err)
		}
		est[name] = resp.WeightBytes
		lr.Backend = "cpu"
		lr.ActivationDType = "bf16" // as the estimate assumes for a GPU
		p2, _ := workertest.Start(t, "transformer")
		loaded, err := p2.Load(workertest.Ctx(t), &lr)
		if err != nil {
			t.Fatalf("%s: load: %v", name, err)
		}
		held[name] = loaded.WeightBytes
	}
	t.Logf("weight bytes estimated %v, held %v", est, held)
	for _, name := range []string{"plain fp8", "quantized"} {
		if est["bf16"]-est[name] != held["bf16"]-held[name] {
			t.Errorf("%s: the estimate saves %d bytes against bf16, a load %d", name, est["bf16"]-est[name], held["bf16"]-held[name])
		}
	}
	if est["plain fp8"] >= est["bf16"] || est["quantized"] >= est["bf16"] {
		t.Errorf("8-bit estimates %v not below bf16's", est)
	}
}
