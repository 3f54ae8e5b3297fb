package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// loadVAE loads dir into p on workertest.Backend(), with memCap.
// It reports whether the worker's activations are 16-bit.
func loadVAE(t *testing.T, p *workerkit.Process, dir string, memCap uint64) bool {
	t.Helper()
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), MemoryCapBytes: memCap})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if resp.Backend != workertest.Backend() || resp.WeightBytes == 0 {
		t.Fatalf("load response: %+v", resp)
	}
	// The model's constants, as config.json states them, so the supervisor need not read it.
	cfg, _, err := causalvae.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := workerkit.VAEInfo{ScalingFactor: cfg.ScalingFactor, LatentChannels: uint32(cfg.LatentChannels),
		SpatialCompressionRatio: uint32(cfg.SpatialCompressionRatio), TemporalCompressionRatio: uint32(cfg.TemporalCompressionRatio),
		InChannels: uint32(cfg.InChannels), OutChannels: uint32(cfg.OutChannels)}
	if resp.VAE == nil || *resp.VAE != want || want.ScalingFactor <= 0 || want.LatentChannels == 0 {
		t.Fatalf("load response model info %+v, want %+v", resp.VAE, want)
	}
	if resp.Transformer != nil || resp.TextEncoder != nil {
		t.Fatalf("vae worker reports other models' info: %+v", resp)
	}
	return workertest.HalfActivations(t, resp)
}

// requestTiling maps a fixture case's params to the stage request, as the supervisor would ask
// for diffusers' enable_tiling / framewise settings.
func requestTiling(t *testing.T, c parity.Case) *workerkit.VAETiling {
	var tl workerkit.VAETiling
	any := false
	for _, p := range []struct {
		name    string
		dst     *uint32
		spatial bool
	}{
		{"tile_sample_min_height", &tl.TileSampleMinHeight, true},
		{"tile_sample_min_width", &tl.TileSampleMinWidth, true},
		{"tile_sample_stride_height", &tl.TileSampleStrideHeight, true},
		{"tile_sample_stride_width", &tl.TileSampleStrideWidth, true},
		{"tile_sample_min_num_frames", &tl.TileSampleMinNumFrames, false},
		{"tile_sample_stride_num_frames", &tl.TileSampleStrideNumFrames, false},
	} {
		if c.Param(t, p.name, p.dst) {
			any = true
			if p.spatial {
				tl.EnableSpatialTiling = true
			}
		}
	}
	if !any {
		return nil
	}
	return &tl
}

// TestParityVAE runs every case of the vae fixture through the real worker process, with
// inputs and outputs in shared memory (the preview map, a plain function the supervisor calls,
// runs in process). A fixture without a model case fails it.
func TestParityVAE(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	p, hook := workertest.Start(t, "vae")
	half := loadVAE(t, p, dir, 0)
	a := shmtest.Arena(t, "parity")
	ran := 0 // model cases run
	for i, c := range fx.Cases {
		c = c.ForActivations(half)
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case "vae.encode":
				ran++
				x := c.Input(t, "x")
				in := workertest.WriteF32(t, a, fmt.Sprintf("x%d", i), "x", x.Shape, x.F32)
				out := workertest.OutputRef(t, a, fmt.Sprintf("latents%d", i), "latents")
				var events int
				res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "parity", Stage: &workerkit.VAEEncodeRequest{
					Pixels: in, Tiling: requestTiling(t, c), Latents: out}}, func(workerkit.Event) error { events++; return nil })
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Outputs) != 2 || res.Outputs[1].Name != "latents"+LogvarSuffix || events == 0 {
					t.Fatalf("outputs %+v, %d events", res.Outputs, events)
				}
				mean, ms := workertest.ReadF32(t, res.Outputs[0])
				c.Check(t, "mean", mean, ms, c.Output(t, "mean"))
				if c.HasOutput("logvar") {
					lv, ls := workertest.ReadF32(t, res.Outputs[1])
					c.Check(t, "logvar", lv, ls, c.Output(t, "logvar"))

					// logvar set: written where it says, in its own file.
					lref := workertest.OutputRef(t, a, fmt.Sprintf("logvar%d", i), "lv")
					res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "parity", Stage: &workerkit.VAEEncodeRequest{
						Pixels: in, Tiling: requestTiling(t, c), Latents: workertest.OutputRef(t, a, fmt.Sprintf("mean%d", i), "mean"), Logvar: lref}}, nil)
					if err != nil {
						t.Fatal(err)
					}
					if len(res.Outputs) != 2 || res.Outputs[1].Path != lref.Path || res.Outputs[1].Name != "lv" || res.Outputs[1].DType != safetensors.F32 {
						t.Fatalf("outputs with a logvar ref: %+v", res.Outputs)
					}
					lv, ls = workertest.ReadF32(t, res.Outputs[1])
					c.Check(t, "logvar (own ref)", lv, ls, c.Output(t, "logvar"))
					mean, ms = workertest.ReadF32(t, res.Outputs[0])
					c.Check(t, "mean (with a logvar ref)", mean, ms, c.Output(t, "mean"))
				}
			case "vae.decode":
				ran++
				z := c.Input(t, "z")
				in := workertest.WriteF32(t, a, fmt.Sprintf("z%d", i), "z", z.Shape, z.F32)
				out := workertest.OutputRef(t, a, fmt.Sprintf("pixels%d", i), "pixels")
				res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "parity", Stage: &workerkit.VAEDecodeRequest{
					Latents: in, Tiling: requestTiling(t, c), Pixels: out}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				got, shape := workertest.ReadF32(t, res.Outputs[0])
				c.Check(t, "sample", got, shape, c.Output(t, "sample"))
				if res.Stats == nil || len(res.Stats.ConvTiers) == 0 || res.Stats.ConvTiers[0].Successes == 0 {
					t.Fatalf("result stats without conv tiers: %+v", res.Stats)
				}
			case "vae.decode_fake":
				z := c.Input(t, "z")
				v, err := causalvae.WrapVolume([5]int{int(z.Shape[0]), int(z.Shape[1]), int(z.Shape[2]), int(z.Shape[3]), int(z.Shape[4])}, z.F32)
				if err != nil {
					t.Fatal(err)
				}
				out, err := causalvae.DecodeFake(v)
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "sample", out.Data, out.ShapeInt64(), c.Output(t, "sample"))
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no vae.encode or vae.decode case ran")
	}
	st, err := p.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.ConvTiers) == 0 || st.ConvTiers[0].Successes == 0 || st.AllocatorPeakBytes == 0 || st.OpCounts["conv3d"] == 0 {
		t.Fatalf("stats: %+v", st)
	}
	// per conv shape: the serving tier, its calls and its synchronised first run
	var shapeCalls uint64
	for _, sh := range st.ConvShapes {
		if sh.ShapeKey == "" || sh.Calls == 0 || sh.First <= 0 || sh.First > sh.Time {
			t.Fatalf("conv shape stats %+v", sh)
		}
		if workertest.Backend() == "cpu" && sh.Tier != workerkit.ConvTierCPU {
			t.Fatalf("shape %s served by %v on cpu", sh.ShapeKey, sh.Tier)
		}
		shapeCalls += sh.Calls
	}
	if len(st.ConvShapes) < 2 || shapeCalls != st.ConvTiers[0].Successes {
		t.Fatalf("%d conv shapes with %d calls, the tier served %d", len(st.ConvShapes), shapeCalls, st.ConvTiers[0].Successes)
	}
	// the cpu backend's one conv tier is cpu; a GPU backend's first tier is its vendor library's
	if workertest.Backend() == "cpu" && st.ConvTiers[0].Tier != workerkit.ConvTierCPU {
		t.Fatalf("stats on cpu, convs not served by the cpu tier: %+v", st)
	}
	t.Logf("worker stats: peak %d bytes, %d conv attempts at %v, %v computing", st.AllocatorPeakBytes,
		st.ConvTiers[0].Attempts, st.ConvTiers[0].Tier, st.ComputeTime)
	// The conv statistics block is logged after every stage.
	var convLog bool
	for _, e := range hook.AllEntries() {
		convLog = convLog || strings.Contains(e.Message, "conv fallback statistics")
	}
	if !convLog {
		t.Error("logs: no conv statistics")
	}
}

// TestParityVAEHalfWeights runs every vae case through a worker that keeps the conv and linear
// weights in the checkpoint's own dtype (Load dtype "auto": the fixture's fp16): encode and
// decode within the case's tolerance, as in fp32 (fp16 widens to f32 exactly), with about half
// the weight bytes.
func TestParityVAEHalfWeights(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	resp := map[string]*workerkit.LoadResponse{}
	var p *workerkit.Process
	for _, dtype := range []string{"", "auto"} {
		p, _ = workertest.Start(t, "vae")
		if resp[dtype], err = p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), DType: dtype}); err != nil {
			t.Fatalf("load dtype %q: %v", dtype, err)
		}
	}
	half, full := resp["auto"].WeightBytes, resp[""].WeightBytes
	t.Logf("weights: %d bytes as stored, %d in f32", half, full)
	if half == 0 || float64(half) > 0.6*float64(full) {
		t.Errorf("weights as stored take %d bytes, f32 %d: want about half", half, full)
	}
	a := shmtest.Arena(t, "parity-half")
	for i, c := range fx.Cases {
		switch c.Op {
		case "vae.encode":
			x := c.Input(t, "x")
			in := workertest.WriteF32(t, a, fmt.Sprintf("x%d", i), "x", x.Shape, x.F32)
			res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "parity", Stage: &workerkit.VAEEncodeRequest{
				Pixels: in, Tiling: requestTiling(t, c), Latents: workertest.OutputRef(t, a, fmt.Sprintf("latents%d", i), "latents")}}, nil)
			if err != nil {
				t.Fatalf("case %s: %v", c.Name, err)
			}
			mean, ms := workertest.ReadF32(t, res.Outputs[0])
			c.Check(t, "mean (weights as stored)", mean, ms, c.Output(t, "mean"))
			if c.HasOutput("logvar") {
				lv, ls := workertest.ReadF32(t, res.Outputs[1])
				c.Check(t, "logvar (weights as stored)", lv, ls, c.Output(t, "logvar"))
			}
		case "vae.decode":
			z := c.Input(t, "z")
			in := workertest.WriteF32(t, a, fmt.Sprintf("z%d", i), "z", z.Shape, z.F32)
			res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "parity", Stage: &workerkit.VAEDecodeRequest{
				Latents: in, Tiling: requestTiling(t, c), Pixels: workertest.OutputRef(t, a, fmt.Sprintf("pixels%d", i), "pixels")}}, nil)
			if err != nil {
				t.Fatalf("case %s: %v", c.Name, err)
			}
			got, shape := workertest.ReadF32(t, res.Outputs[0])
			c.Check(t, "sample (weights as stored)", got, shape, c.Output(t, "sample"))
		case "vae.decode_fake":
			t.Logf("case %s: the preview map reads no weights (TestParityVAE checks it)", c.Name)
		default:
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
		}
	}
}

// copyModel copies the fixture VAE folder to a temporary one, letting edit change the tensors
// (nil removes one) and the config.
func copyModel(t *testing.T, src string, edit func(ts []safetensors.Tensor) []safetensors.Tensor, config func(string) string) string {
	t.Helper()
	dst := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(raw)
	if config != nil {
		cfg = config(cfg)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(src, "diffusion_pytorch_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []safetensors.Tensor
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		b, err := f.Bytes(n)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), b...)})
	}
	if edit != nil {
		ts = edit(ts)
	}
	if err := safetensors.WriteFile(filepath.Join(dst, "diffusion_pytorch_model.safetensors"), ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestBadModelAndInput checks that a checkpoint missing a tensor fails Load with
// InvalidArgument naming it, that bad latents fail the stage with InvalidArgument, and that the
// worker survives both and then serves a good request.
func TestBadModelAndInput(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	const missing = "decoder.up_blocks.1.resnets.0.conv2.conv.weight"
	bad := copyModel(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
		out := ts[:0]
		for _, x := range ts {
			if x.Name != missing {
				out = append(out, x)
			}
		}
		return out
	}, nil)
	p, _ := workertest.Start(t, "vae")
	_, err = p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: bad, Backend: "cpu"})
	if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), missing) {
		t.Fatalf("load without %s: %v", missing, err)
	}
	if _, err := p.Stats(workertest.Ctx(t)); err != nil {
		t.Fatalf("stats after a failed load: %v", err)
	}
	if _, exited := p.Exited(); exited {
		t.Fatal("worker exited after a failed load")
	}
	// A worker serves one Load, failed or not: the supervisor starts another.
	p.Close()
	p, _ = workertest.Start(t, "vae")
	loadVAE(t, p, dir, 0)

	a := shmtest.Arena(t, "bad")
	out := workertest.OutputRef(t, a, "pixels", "pixels")
	for _, tc := range []struct {
		name  string
		shape []int64
	}{
		{"wrong channels", []int64{1, 8, 1, 4, 4}},
		{"rank 4", []int64{1, 16, 4, 4}},
		{"rank 6", []int64{1, 16, 1, 1, 4, 4}},
	} {
		n := int64(1)
		for _, d := range tc.shape {
			n *= d
		}
		in := workertest.WriteF32(t, a, strings.ReplaceAll(tc.name, " ", "_"), "z", tc.shape, make([]float32, n))
		_, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out}}, nil)
		if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
			t.Errorf("%s: %v", tc.name, err)
		}
		if _, err := os.Stat(out.Path + shm.PartialExt); !os.IsNotExist(err) {
			t.Errorf("%s: partial output left behind (%v)", tc.name, err)
		}
	}
	// Bad tiling is the request's fault too.
	z := workertest.WriteF32(t, a, "z", "z", []int64{1, 16, 1, 4, 4}, make([]float32, 256))
	_, err = p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z, Pixels: out,
		Tiling: &workerkit.VAETiling{EnableSpatialTiling: true, TileSampleMinHeight: 64, TileSampleStrideHeight: 128}}}, nil)
	if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Errorf("stride over tile: %v", err)
	}
	if _, exited := p.Exited(); exited {
		t.Fatal("worker exited after bad input")
	}
	res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z, Pixels: out}}, nil)
	if err != nil {
		t.Fatalf("good decode after bad ones: %v", err)
	}
	if got := res.Outputs[0].Shape; fmt.Sprint(got) != "[1 3 1 32 32]" {
		t.Fatalf("decoded shape %v", got)
	}
}

// TestOOMThenSmallerTiles is the watchdog's retry: under a memory cap an untiled decode fails
// with OutOfMemory (the worker survives), and the same decode with smaller tiles fits.
func TestOOMThenSmallerTiles(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	var z parity.Array
	for _, c := range fx.Cases {
		if c.Op == "vae.decode" {
			z = c.Input(t, "z")
			break
		}
	}
	if z.Key == "" || len(z.Shape) != 5 || z.Shape[3] < 4 || z.Shape[4] < 4 {
		t.Skip("fixture set has no decode case of at least 4×4 latents")
	}
	// The cap: weights plus a third of what an untiled decode of these latents peaks at.
	probe, _ := workertest.Start(t, "vae")
	loadVAE(t, probe, dir, 0)
	a := shmtest.Arena(t, "oom")
	in := workertest.WriteF32(t, a, "z", "z", z.Shape, z.F32)
	out := workertest.OutputRef(t, a, "pixels", "pixels")
	before, err := probe.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	// untiled: the request states diffusers' defaults (unset would let the worker choose tiles)
	untiled := &workerkit.VAETiling{}
	if _, err := probe.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out, Tiling: untiled}}, nil); err != nil {
		t.Fatal(err)
	}
	after, err := probe.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	weights, peak := before.AllocatorCurrentBytes, after.AllocatorPeakBytes
	memCap := weights + (peak-weights)/3
	probe.Close()

	p, _ := workertest.Start(t, "vae")
	loadVAE(t, p, dir, memCap)
	_, err = p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out, Tiling: untiled}}, nil)
	var we *workerkit.Error
	if workerkit.CodeOf(err) != workerkit.CodeOutOfMemory || !errors.As(err, &we) || we.RequestedBytes == 0 {
		t.Fatalf("decode under a cap of %d bytes: %v", memCap, err)
	}
	cfg, _, err := causalvae.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	tile := uint32(z.Shape[3]) * uint32(cfg.SpatialCompressionRatio) / 2 // half the height in pixels
	tiled := &workerkit.VAETiling{EnableSpatialTiling: true, TileSampleMinHeight: tile, TileSampleMinWidth: tile,
		TileSampleStrideHeight: tile * 3 / 4, TileSampleStrideWidth: tile * 3 / 4}
	res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out, Tiling: tiled}}, nil)
	if err != nil {
		t.Fatalf("tiled decode (%d px) under the cap: %v", tile, err)
	}
	t.Logf("cap %d bytes (weights %d, untiled peak %d): untiled refused, %d px tiles peak %d", memCap, weights, peak, tile,
		res.Stats.AllocatorPeakBytes)
}

// TestConvTierOverrides: LoadRequest.conv_policy.tier_overrides reach the conv chain. With
// every conv shape of a decode sent to the cpu tier, a fault that hangs any conv at vendor_tuned
// never fires: the decode finishes and vendor_tuned saw no attempt. Without them, the same
// fault hangs the first conv (TestConvHangSeenInBeacon).
func TestConvTierOverrides(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "overrides")
	z := workertest.WriteF32(t, a, "z", "z", []int64{1, 16, 1, 2, 2}, make([]float32, 64))
	decode := func(p *workerkit.Process, out string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a hang fails, not stalls, the test
		defer cancel()
		_, err := p.Run(ctx, &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z,
			Pixels: workertest.OutputRef(t, a, out, "pixels")}}, nil)
		return err
	}
	// the decode's conv shape keys, from the decision cache a clean run fills
	cachePath := filepath.Join(t.TempDir(), "conv-decisions.json")
	p1, _ := workertest.Start(t, "vae")
	if _, err := p1.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu",
		ConvPolicy: &workerkit.ConvPolicy{DecisionCachePath: cachePath}}); err != nil {
		t.Fatal(err)
	}
	if err := decode(p1, "clean"); err != nil {
		t.Fatal(err)
	}
	cache, err := convcache.Open(cachePath)
	if err != nil {
		t.Fatal(err)
	}
	keys := cache.Keys()
	if len(keys) == 0 {
		t.Fatal("the clean decode recorded no conv shape")
	}
	pol := &workerkit.ConvPolicy{}
	for _, k := range keys {
		pol.TierOverrides = append(pol.TierOverrides, workerkit.ConvTierOverride{ShapeKey: k, Tier: workerkit.ConvTierVendorDefault},
			workerkit.ConvTierOverride{ShapeKey: k, Tier: workerkit.ConvTierCPU}) // the later entry wins
	}
	p2, _ := workertest.Start(t, "vae")
	if _, err := p2.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu", ConvPolicy: pol,
		Fault: &workerkit.Fault{HangConvTier: workerkit.ConvTierVendorTuned}}); err != nil {
		t.Fatal(err)
	}
	if err := decode(p2, "overridden"); err != nil {
		t.Fatalf("decode with every shape overridden to cpu: %v", err)
	}
	st, err := p2.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.ConvTiers {
		if ts.Tier != workerkit.ConvTierCPU && ts.Attempts != 0 {
			t.Errorf("tier %v tried %d times despite the overrides", ts.Tier, ts.Attempts)
		}
		if ts.Tier == workerkit.ConvTierCPU && ts.Successes == 0 {
			t.Errorf("cpu tier served nothing: %+v", ts)
		}
	}
	t.Logf("%d shapes overridden to cpu; conv tiers %+v", len(keys), st.ConvTiers)

	bad, _ := workertest.Start(t, "vae")
	_, err = bad.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu",
		ConvPolicy: &workerkit.ConvPolicy{TierOverrides: []workerkit.ConvTierOverride{{Tier: workerkit.ConvTierCPU}}}})
	if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("override without a shape key: got %v, want invalid argument", err)
	}
}

// TestOOMAtOpFailsThatOp: Fault.oom_at_op fails the op it names, through the runtime's fault
// hook: the stage ends with a typed out of memory that asks for that op's output (not the
// placeholder size), and no op ran after it.
func TestOOMAtOpFailsThatOp(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	const at = 7
	p, _ := workertest.Start(t, "vae")
	if _, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu", MemoryCapBytes: 1 << 30,
		Fault: &workerkit.Fault{OOMAtOp: at}}); err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "oom")
	z := workertest.WriteF32(t, a, "z", "z", []int64{1, 16, 1, 2, 2}, make([]float32, 64))
	_, err = p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z,
		Pixels: workertest.OutputRef(t, a, "pixels", "pixels")}}, nil)
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeOutOfMemory || we.RequestedBytes == 0 ||
		we.RequestedBytes == faults.InjectedOOMBytes || we.AvailableBytes == 0 || we.AvailableBytes > 1<<30 {
		t.Fatalf("got %v (%+v), want the op's typed out of memory with its sizes", err, we)
	}
	st, err := p.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ops uint64
	for _, n := range st.OpCounts {
		ops += n
	}
	if ops != at {
		t.Fatalf("%d ops ran (%v), want the stage to stop at op %d", ops, st.OpCounts, at)
	}
	t.Logf("op %d failed: %v", at, we)
}

// TestBeaconBytesPerOp: the beacon's byte count follows the allocator op by op (the runtime's
// op events carry it), so a worker stuck in an op shows what it holds there, not what it held
// at the last tile boundary: hung at the fifth op of the first tile, it shows the weights plus
// that tile's intermediates.
func TestBeaconBytesPerOp(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := workertest.Start(t, "vae")
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu", Fault: &workerkit.Fault{HangAtOp: 5}})
	if err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "bytes")
	z := workertest.WriteF32(t, a, "z", "z", []int64{1, 16, 1, 2, 2}, make([]float32, 64))
	out := workertest.OutputRef(t, a, "pixels", "pixels")
	done := make(chan error, 1)
	go func() {
		_, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z, Pixels: out}}, nil)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := p.Beacon()
		if err == nil && snap.InOp && snap.OpSeq == 5 {
			t.Logf("hung at op %d (%s): beacon %d bytes, %d after load", snap.OpSeq, snap.Op, snap.Bytes, resp.DeviceAllocatedBytes)
			if snap.Bytes <= int64(resp.DeviceAllocatedBytes) {
				t.Fatalf("beacon shows %d bytes at op 5, no more than after load (%d)", snap.Bytes, resp.DeviceAllocatedBytes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never hung at op 5: %+v %v", snap, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("the hung stage returned a result")
	}
}

// TestConvHangSeenInBeacon injects a hang at the first conv tier: the stage stops advancing,
// the beacon shows the conv in progress, and the supervisor's kill ends the worker.
func TestConvHangSeenInBeacon(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := workertest.Start(t, "vae")
	if _, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: "cpu",
		Fault: &workerkit.Fault{HangConvTier: workerkit.ConvTierVendorTuned}}); err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "hang")
	z := workertest.WriteF32(t, a, "z", "z", []int64{1, 16, 1, 2, 2}, make([]float32, 64))
	out := workertest.OutputRef(t, a, "pixels", "pixels")
	done := make(chan error, 1)
	go func() {
		_, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: z, Pixels: out}}, nil)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := p.Beacon()
		if err == nil && snap.InOp && snap.Op == "conv3d" && snap.OpAge(time.Now()) > 300*time.Millisecond {
			t.Logf("beacon: op %s #%d (%s at %s) running for %v", snap.Op, snap.OpSeq, snap.ConvKey, snap.ConvTier,
				snap.OpAge(time.Now()).Round(time.Millisecond))
			if snap.ConvTier != "vendor_tuned" || !strings.HasPrefix(snap.ConvKey, "conv3d ") {
				t.Fatalf("beacon does not name the hung conv: key %q tier %q", snap.ConvKey, snap.ConvTier)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("beacon never showed a stuck conv: %+v %v", snap, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("hung stage returned a result")
	}
	if st, ok := p.Exited(); !ok || !st.Killed {
		t.Fatalf("exit %+v %v", st, ok)
	}
}

// TestAutoTilingUnderCap runs the fixture's spatially tiled decode case with the tiling left to
// the worker: under a cap that leaves room for the case's tiles but not for an untiled decode,
// the worker chooses the case's tiling, reports it, stays under the cap and matches the case;
// under a cap too small for the smallest tile it fails with InvalidArgument before any conv runs.
func TestAutoTilingUnderCap(t *testing.T) {
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	var c parity.Case
	for _, k := range fx.Cases {
		if k.Op == "vae.decode" && requestTiling(t, k) != nil && requestTiling(t, k).EnableSpatialTiling {
			c = k
		}
	}
	if c.Name == "" {
		t.Fatal("no spatially tiled decode case in the vae fixture")
	}
	want := requestTiling(t, c)
	z := c.Input(t, "z")
	a := shmtest.Arena(t, "auto")
	in := workertest.WriteF32(t, a, "z", "z", z.Shape, z.F32)
	out := workertest.OutputRef(t, a, "pixels", "pixels")

	// The case's tiling, stated: its estimate and the weights give the cap.
	probe, _ := workertest.Start(t, "vae")
	loadVAE(t, probe, dir, 0)
	res, err := probe.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out, Tiling: want}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := res.VAETiling
	if used == nil || used.Chosen || used.PeakEstimateBytes == 0 || !used.Tiling.EnableSpatialTiling {
		t.Fatalf("stated tiling reported as %+v", used)
	}
	weights := res.Stats.AllocatorCurrentBytes
	probe.Close()
	memCap := weights + used.PeakEstimateBytes + used.PeakEstimateBytes/20

	p, _ := workertest.Start(t, "vae")
	loadVAE(t, p, dir, memCap)
	res, err = p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out}}, nil)
	if err != nil {
		t.Fatalf("decode with the tiling left to the worker under a cap of %d bytes: %v", memCap, err)
	}
	used = res.VAETiling
	if used == nil || !used.Chosen || used.Tiling.TileSampleMinHeight != want.TileSampleMinHeight ||
		used.Tiling.TileSampleStrideWidth != want.TileSampleStrideWidth || used.BudgetBytes == 0 || used.Runs < 2 {
		t.Fatalf("chose %+v, the case states %+v", used, want)
	}
	got, shape := workertest.ReadF32(t, res.Outputs[0])
	c.Check(t, "sample", got, shape, c.Output(t, "sample"))
	if res.Stats.AllocatorPeakBytes > memCap {
		t.Fatalf("peak %d bytes over the cap %d", res.Stats.AllocatorPeakBytes, memCap)
	}
	t.Logf("cap %d bytes (weights %d): chose %d px tiles, %d runs, estimate %d, peak %d", memCap, weights,
		used.Tiling.TileSampleMinHeight, used.Runs, used.PeakEstimateBytes, res.Stats.AllocatorPeakBytes)
	p.Close()

	// A cap that leaves 64 KiB beside the weights: refused before any conv.
	small, _ := workertest.Start(t, "vae")
	loadVAE(t, small, dir, weights+64<<10)
	_, err = small.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{Latents: in, Pixels: out}}, nil)
	if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("decode under a cap too small for any tile: %v", err)
	}
	t.Logf("too small: %v", err)
	st, err := small.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.OpCounts["conv3d"] != 0 {
		t.Fatalf("%d convs ran before the budget error", st.OpCounts["conv3d"])
	}
}
