package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/torchrng"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
	"github.com/framepackd/framepackd/workers/transformer/sampler/samplertest"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// loadWorker starts a worker and loads the transformer folder dir into it, on
// workertest.Backend().
func loadWorker(t *testing.T, dir string) *workerkit.Process {
	p, _ := loadWorkerHalf(t, dir)
	return p
}

// loadWorkerHalf is loadWorker that also says whether the worker's activations are 16-bit.
func loadWorkerHalf(t *testing.T, dir string) (*workerkit.Process, bool) {
	t.Helper()
	p, _ := workertest.Start(t, "transformer")
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend()})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	half := workertest.HalfActivations(t, resp)
	if resp.Backend != workertest.Backend() || resp.WeightBytes == 0 {
		t.Fatalf("load response %+v", resp)
	}
	// The model's constants, as config.json states them, so the supervisor need not read it.
	cfg, err := dit.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := workerkit.TransformerInfo{InChannels: uint32(cfg.InChannels), OutChannels: uint32(cfg.OutChannelsOrIn()),
		PatchSize: uint32(cfg.PatchSize), PatchSizeT: uint32(cfg.PatchSizeT), TextEmbedDim: uint32(cfg.TextEmbedDim),
		PooledProjectionDim: uint32(cfg.PooledProjectionDim), NumLayers: uint32(cfg.NumLayers),
		NumSingleLayers: uint32(cfg.NumSingleLayers), HasCleanXEmbedder: cfg.HasCleanXEmbedder}
	if cfg.HasImageProj {
		want.ImageProjDim = uint32(cfg.ImageProjDim)
	}
	if resp.Transformer == nil || *resp.Transformer != want || want.InChannels == 0 || resp.VAE != nil || resp.TextEncoder != nil {
		t.Fatalf("load response model info %+v, want %+v", resp.Transformer, want)
	}
	return p, half
}

func i64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// sectionCase is a sample_hunyuan case as a worker request, its inputs written to shared memory.
type sectionCase struct {
	req   workerkit.TransformerSectionRequest
	d     samplertest.Case
	shape []int64
}

// writeCase writes a case's conditioning into arena segments and builds the stage request, with
// a preview per step.
func writeCase(t *testing.T, a *shm.Arena, c parity.Case) sectionCase {
	t.Helper()
	d := samplertest.Decode(t, c)
	if d.Request.DType != sampler.F64 && d.Request.DType != sampler.F32 {
		t.Fatalf("case %s: model dtype %v; the cpu worker computes in fp32 and rounds nothing", c.Name, d.Request.DType)
	}
	var w, h, frames int
	c.Param(t, "width", &w)
	c.Param(t, "height", &h)
	c.Param(t, "frames", &frames)
	f32 := func(name string, x conditioning.Tensor) safetensors.Tensor {
		return safetensors.FromFloat32(name, i64(x.Shape), x.Data)
	}
	u8 := func(name string, x conditioning.IntTensor) safetensors.Tensor {
		b := make([]byte, len(x.Data))
		for i, v := range x.Data {
			b[i] = byte(v)
		}
		return safetensors.FromUint8(name, i64(x.Shape), b)
	}
	pos := d.Request.Positive
	cond := workertest.Segment(t, a, "cond")
	ts := []safetensors.Tensor{
		f32("llama_vec", pos.EncoderHiddenStates), u8("llama_mask", pos.EncoderAttentionMask),
		f32("clip_pooler", pos.PooledProjections), f32("image_embeddings", pos.ImageEmbeddings),
		f32("clean_latents", pos.CleanLatents), f32("clean_latents_2x", pos.CleanLatents2x),
		f32("clean_latents_4x", pos.CleanLatents4x),
	}
	if n := d.Request.Negative; n != nil {
		ts = append(ts, f32("llama_vec_n", n.EncoderHiddenStates), u8("llama_mask_n", n.EncoderAttentionMask),
			f32("clip_pooler_n", n.PooledProjections))
	}
	if _, err := shm.WriteSegment(cond, ts); err != nil {
		t.Fatal(err)
	}
	ref := func(name string) workerkit.TensorRef { return workerkit.TensorRef{Path: cond, Name: name} }
	o := d.Request.Options
	req := workerkit.TransformerSectionRequest{
		TransformerConditioning: workerkit.TransformerConditioning{
			TransformerText: workerkit.TransformerText{LlamaVec: ref("llama_vec"), LlamaMask: ref("llama_mask"), ClipPooler: ref("clip_pooler")},
			ImageEmbeddings: ref("image_embeddings"),
			CleanLatents:    ref("clean_latents"), CleanLatentIndices: pos.CleanLatentIndices.Data,
			CleanLatents2x: ref("clean_latents_2x"), CleanLatent2xIndices: pos.CleanLatent2xIndices.Data,
			CleanLatents4x: ref("clean_latents_4x"), CleanLatent4xIndices: pos.CleanLatent4xIndices.Data,
			LatentIndices: pos.LatentIndices.Data,
		},
		Steps: uint32(o.Steps), CFG: float32(o.Guidance.CFG), GS: float32(o.Guidance.Distilled),
		RS: float32(o.Guidance.Rescale), UseTeaCache: o.TeaCache, Seed: d.Seed,
		Width: uint32(w), Height: uint32(h), Frames: uint32(frames),
		Latents: workerkit.TensorRef{Path: workertest.Segment(t, a, "latents"), Name: "latents"},
	}
	if d.Request.Negative != nil {
		req.Negative = workerkit.TransformerText{LlamaVec: ref("llama_vec_n"), LlamaMask: ref("llama_mask_n"), ClipPooler: ref("clip_pooler_n")}
	}
	if o.Shift > 0 {
		s := float32(o.Shift)
		req.Shift = &s
	}
	if o.Variant == sampler.BH2 {
		req.Sampler = workerkit.SamplerUniPCBH2
	}
	for i := range o.Steps {
		req.StepPreviews = append(req.StepPreviews, workerkit.TensorRef{Path: workertest.Segment(t, a, fmt.Sprintf("preview-%d", i+1)), Name: "denoised"})
	}
	return sectionCase{req: req, d: d, shape: i64(d.Request.Shape.Ints())}
}

func readFloat(t *testing.T, r workerkit.TensorRef) []float32 {
	t.Helper()
	m, err := shm.Open(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v, shape, err := m.Float32(r.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !parity.SameShape(shape, r.Shape) {
		t.Errorf("%s: file shape %v, result says %v", r.Path, shape, r.Shape)
	}
	return v
}

func run(t *testing.T, p *workerkit.Process, req workerkit.TransformerSectionRequest) (*workerkit.Result, []workerkit.Event, error) {
	var events []workerkit.Event
	res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "test", Stage: &req}, func(e workerkit.Event) error {
		events = append(events, e)
		return nil
	})
	return res, events, err
}

// TestWorkerParitySampler runs every sample_hunyuan case of the sampler fixture through a real
// worker process (one per case, as the supervisor runs stages), inputs and outputs in shared
// memory: the result and every step's denoised preview within the case's tolerance, one progress
// event per step, TeaCache skipping exactly the reference's calls, and the generator state after
// the section's noise.
func TestWorkerParitySampler(t *testing.T) {
	fx := parity.Load(t, "sampler")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case samplertest.OpSampleHunyuan:
			case "sampler.sigmas":
				t.Skipf("case %s: schedule only (no transformer)", c.Name)
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
			ran++
			a := shmtest.Arena(t, "job")
			sc := writeCase(t, a, c)
			p := loadWorker(t, dir)
			res, events, err := run(t, p, sc.req)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			checkSectionResult(t, c, sc, res, events)
		})
	}
	if ran == 0 {
		t.Fatal("no sample_hunyuan cases")
	}
}

func checkSectionResult(t *testing.T, c parity.Case, sc sectionCase, res *workerkit.Result, events []workerkit.Event) {
	t.Helper()
	steps := int(sc.req.Steps)
	if len(res.Outputs) != 1 {
		t.Fatalf("%d outputs, want 1", len(res.Outputs))
	}
	c.Check(t, "result (worker)", readFloat(t, res.Outputs[0]), sc.shape, c.Output(t, "result"))

	progress, previews := 0, 0
	var teacache []string
	for _, e := range events {
		switch e := e.(type) {
		case *workerkit.Progress:
			if e.Phase != "sample" {
				continue
			}
			progress++
			if int(e.Step) != progress || int(e.TotalSteps) != steps {
				t.Errorf("progress event %d says step %d/%d", progress, e.Step, e.TotalSteps)
			}
		case *workerkit.StepPreview:
			previews++
			if int(e.Step) != previews {
				t.Fatalf("preview %d says step %d", previews, e.Step)
			}
			name := fmt.Sprintf("step%d_denoised", e.Step-1)
			c.Check(t, name+" (worker preview)", readFloat(t, e.Denoised), sc.shape, c.Output(t, name))
		case *workerkit.LogLine:
			if s, ok := e.Fields["teacache"]; ok {
				teacache = append(teacache, s)
			}
		}
	}
	if progress != steps || previews != steps {
		t.Errorf("%d progress events and %d previews, want %d of each", progress, previews, steps)
	}
	if ref := sc.d.TeaCacheRelL1; sc.req.UseTeaCache {
		if len(teacache) != len(ref) {
			t.Fatalf("TeaCache reported for %d steps, reference has %d calls", len(teacache), len(ref))
		}
		for i, r := range ref {
			want := "computed"
			if r != 0 {
				want = "skipped"
			}
			if teacache[i] != want {
				t.Errorf("step %d: TeaCache %s, reference %s (accumulated %v)", i+1, teacache[i], want, r)
			}
		}
		t.Logf("case %s: TeaCache per step %v (reference accumulated %v)", c.Name, teacache, ref)
	}
	g := torchrng.New(torchrng.SeedFromInt(sc.d.Seed))
	if _, err := g.Randn(sc.d.Request.Shape.Ints()); err != nil {
		t.Fatal(err)
	}
	want, _ := g.MarshalBinary()
	if string(res.GeneratorState) != string(want) {
		t.Errorf("generator state after the section differs from torchrng's after one randn of %v", sc.d.Request.Shape)
	}
	if res.Stats == nil || res.Stats.AllocatorPeakBytes == 0 || res.Stats.OpCounts["attention"] == 0 {
		t.Errorf("stats %+v", res.Stats)
	}
}

// firstSampleCase returns the sampler fixture's first sample_hunyuan case with cfg 1.
func firstSampleCase(t *testing.T, fx *parity.Fixture) parity.Case {
	for _, c := range fx.Cases {
		var cfg float64 = 1
		if c.Op == samplertest.OpSampleHunyuan && (!c.Param(t, "cfg", &cfg) || cfg == 1) {
			return c
		}
	}
	t.Fatal("no sample_hunyuan case with cfg 1")
	return parity.Case{}
}

// TestWorkerCarriesGenerator runs two sections in a row, the second from the first's generator
// state (a new process each, as the supervisor does): the second's state is torchrng's after two
// draws, and its noise is not the first's.
func TestWorkerCarriesGenerator(t *testing.T) {
	fx := parity.Load(t, "sampler")
	dir, _ := fx.ModelPath("transformer")
	c := firstSampleCase(t, fx)
	a := shmtest.Arena(t, "job")
	sc := writeCase(t, a, c)
	sc.req.StepPreviews = nil
	res1, _, err := run(t, loadWorker(t, dir), sc.req)
	if err != nil {
		t.Fatal(err)
	}
	first := readFloat(t, res1.Outputs[0])
	sc.req.GeneratorState = res1.GeneratorState
	sc.req.Seed = 12345 // ignored when a state is given
	res2, _, err := run(t, loadWorker(t, dir), sc.req)
	if err != nil {
		t.Fatal(err)
	}
	g := torchrng.New(torchrng.SeedFromInt(sc.d.Seed))
	for range 2 {
		if _, err := g.Randn(sc.d.Request.Shape.Ints()); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := g.MarshalBinary()
	if string(res2.GeneratorState) != string(want) {
		t.Error("second section's generator state is not torchrng's after two draws")
	}
	if d := parity.RelL2(readFloat(t, res2.Outputs[0]), first); d < 1e-3 {
		t.Errorf("second section equals the first (rel_l2 %.3g): the noise was not advanced", d)
	}
}

// TestWorkerBadInput checks that bad stage requests fail with InvalidArgument and say what is
// wrong, and that the worker keeps serving after them.
func TestWorkerBadInput(t *testing.T) {
	fx := parity.Load(t, "sampler")
	dir, _ := fx.ModelPath("transformer")
	c := firstSampleCase(t, fx)
	p := loadWorker(t, dir)
	tests := []struct {
		name string
		edit func(t *testing.T, a *shm.Arena, r *workerkit.TransformerSectionRequest)
		want string
	}{
		{"latent indices do not match the window", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.LatentIndices = r.LatentIndices[:len(r.LatentIndices)-1]
		}, "latent_indices has shape"},
		{"clean latent indices do not match the clean latents", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.CleanLatent4xIndices = r.CleanLatent4xIndices[:3]
		}, "clean_latents_4x indices has shape [1 3]"},
		{"NaN in the clean latents", func(t *testing.T, a *shm.Arena, r *workerkit.TransformerSectionRequest) {
			m, err := shm.Open(r.CleanLatents.Path)
			if err != nil {
				t.Fatal(err)
			}
			v, shape, err := m.Float32(r.CleanLatents.Name)
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
			v[5] = float32(math.NaN())
			path := workertest.Segment(t, a, "nan")
			if _, err := shm.WriteSegment(path, []safetensors.Tensor{safetensors.FromFloat32("x", shape, v)}); err != nil {
				t.Fatal(err)
			}
			r.CleanLatents = workerkit.TensorRef{Path: path, Name: "x"}
		}, "clean_latents holds a non-finite value (NaN at element 5)"},
		{"real CFG without a negative prompt", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.CFG = 2
		}, "llama_vec_n: path and name are required"},
		{"corrupt generator state", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.GeneratorState = []byte("not a generator")
		}, "generator_state"},
		{"width not a multiple of 16", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.Width = 100
		}, "width and height must be positive multiples of 16"},
		{"latent size not the clean latents'", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.Width += 16
		}, "clean_latents_4x has shape"},
		{"previews for some steps only", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.StepPreviews = r.StepPreviews[:1]
		}, "step_previews has 1 entries"},
		{"input tensor of another dtype than asked", func(_ *testing.T, _ *shm.Arena, r *workerkit.TransformerSectionRequest) {
			r.LlamaVec.DType = safetensors.BF16
		}, "llama_vec: tensor is F32, the request says BF16"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := shmtest.Arena(t, "job")
			sc := writeCase(t, a, c)
			tc.edit(t, a, &sc.req)
			_, _, err := run(t, p, sc.req)
			if err == nil {
				t.Fatal("accepted")
			}
			if code := workerkit.CodeOf(err); code != workerkit.CodeInvalidArgument {
				t.Errorf("code %v, want invalid argument (%v)", code, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
	// Still serving: a good request after the bad ones.
	a := shmtest.Arena(t, "job")
	sc := writeCase(t, a, c)
	res, events, err := run(t, p, sc.req)
	if err != nil {
		t.Fatalf("good request after bad ones: %v", err)
	}
	checkSectionResult(t, c, sc, res, events)
}

// TestWorkerBadModel checks Load errors: a config the code does not support, a sharded
// checkpoint with a shard missing, an unknown dtype and a memory cap too small for even one
// streamed block (refused by the residency plan before anything loads), all InvalidArgument
// naming the thing.
func TestWorkerBadModel(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	cfgRaw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	badConfig := func(t *testing.T) string {
		var cfg map[string]any
		json.Unmarshal(cfgRaw, &cfg)
		cfg["patch_size_t"] = 2
		d := t.TempDir()
		b, _ := json.Marshal(cfg)
		os.WriteFile(filepath.Join(d, "config.json"), b, 0o600)
		if err := os.Symlink(filepath.Join(dir, "diffusion_pytorch_model.safetensors"), filepath.Join(d, "diffusion_pytorch_model.safetensors")); err != nil {
			t.Fatal(err)
		}
		return d
	}
	missingShard := func(t *testing.T) string {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "config.json"), cfgRaw, 0o600)
		src, err := safetensors.Open(filepath.Join(dir, "diffusion_pytorch_model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		wm := map[string]string{}
		var first []safetensors.Tensor
		for i, n := range src.Names() {
			shard := "diffusion_pytorch_model-00001-of-00002.safetensors"
			if i%2 == 1 {
				shard = "diffusion_pytorch_model-00002-of-00002.safetensors"
			} else {
				info, _ := src.Info(n)
				b, _ := src.Bytes(n)
				first = append(first, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: b})
			}
			wm[n] = shard
		}
		if err := safetensors.WriteFile(filepath.Join(d, "diffusion_pytorch_model-00001-of-00002.safetensors"), first, safetensors.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		idx, _ := json.Marshal(map[string]any{"weight_map": wm})
		os.WriteFile(filepath.Join(d, "diffusion_pytorch_model.safetensors.index.json"), idx, 0o600)
		return d
	}
	for _, tc := range []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"patch_size_t 2", badConfig, "patch_size_t 2 is not supported"},
		{"missing shard", missingShard, "shard diffusion_pytorch_model-00002-of-00002.safetensors"},
		{"unknown dtype", func(*testing.T) string { return dir }, "dtype \"int8\""},
		{"cap below one block", func(*testing.T) string { return dir }, "memory cap too small for the transformer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := workertest.Start(t, "transformer")
			req := &workerkit.LoadRequest{ModelDir: tc.dir(t), Backend: "cpu"}
			switch tc.name {
			case "unknown dtype":
				req.DType = "int8"
			case "cap below one block": // refused by the residency plan, before any weight is read
				req.MemoryCapBytes = 1 << 10
			}
			_, err := p.Load(workertest.Ctx(t), req)
			if err == nil {
				t.Fatal("loaded")
			}
			var we *workerkit.Error
			if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument {
				t.Errorf("error %v, want an invalid-argument worker error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}
