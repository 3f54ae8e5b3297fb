package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// startWorker starts the real clipvision binary and loads modelDir on workertest.Backend() with
// the SiglipImageProcessor processor ("" the default).
func startWorker(t *testing.T, modelDir, processor string) (*workerkit.Process, *workerkit.LoadResponse, *test.Hook) {
	t.Helper()
	return startWorkerDType(t, modelDir, "", processor)
}

// startWorkerDType is startWorker with the LoadRequest's dtype.
func startWorkerDType(t *testing.T, modelDir, dtype, processor string) (*workerkit.Process, *workerkit.LoadResponse, *test.Hook) {
	t.Helper()
	p, hook := workertest.Start(t, "clipvision")
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: modelDir, Backend: workertest.Backend(), SiglipProcessor: processor,
		MemoryCapBytes: 1 << 30, DType: dtype})
	if err != nil {
		t.Fatalf("load %s: %v", modelDir, err)
	}
	return p, resp, hook
}

// writeImage writes a uint8 image tensor into a new segment of a and returns its ref.
func writeImage(t *testing.T, a *shm.Arena, name string, shape []int64, pix []uint8) workerkit.TensorRef {
	t.Helper()
	return workertest.Write(t, a, name, safetensors.FromUint8("image", shape, pix))
}

// outputRef reserves segment name of a for the last_hidden_state output.
func outputRef(t *testing.T, a *shm.Arena, name string) workerkit.TensorRef {
	t.Helper()
	return workertest.OutputRef(t, a, name, "last_hidden_state")
}

// runEncode runs one image_encode stage and returns the result and the events.
func runEncode(t *testing.T, p *workerkit.Process, img, out workerkit.TensorRef) (*workerkit.Result, []workerkit.Event, error) {
	t.Helper()
	var events []workerkit.Event
	res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "test", Stage: &workerkit.ImageEncodeRequest{Image: img, LastHiddenState: out}},
		func(e workerkit.Event) error { events = append(events, e); return nil })
	return res, events, err
}

// TestParitySiglip runs every siglip.encode case through the real worker process: the uint8
// image in shared memory, last_hidden_state back within 1e-3 (the end-to-end bound) —
// and, since the processor reproduces the fixture's pixel values exactly, within the case's own
// tolerance too.
func TestParitySiglip(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	p, resp, hook := startWorker(t, encDir, "")
	half := workertest.HalfActivations(t, resp)
	if resp.Backend != workertest.Backend() || resp.WeightBytes == 0 || resp.DeviceAllocatedBytes < resp.WeightBytes {
		t.Errorf("load response %+v", resp)
	}
	a := shmtest.Arena(t, "parity")
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "siglip.encode" {
			continue
		}
		n++
		c = c.ForActivations(half)
		t.Run(c.Name, func(t *testing.T) {
			in := c.Input(t, "image_hwc_u8")
			pix := make([]uint8, len(in.Ints))
			for i, v := range in.Ints {
				pix[i] = uint8(v)
			}
			img := writeImage(t, a, c.Name+"-image", in.Shape, pix)
			out := outputRef(t, a, c.Name+"-out")
			res, events, err := runEncode(t, p, img, out)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outputs) != 1 || res.Outputs[0].Path != out.Path || res.Outputs[0].DType != safetensors.F32 {
				t.Fatalf("outputs %+v", res.Outputs)
			}
			got, shape := workertest.ReadF32(t, out)
			want := c.Output(t, "last_hidden_state")
			if !parity.SameShape(res.Outputs[0].Shape, want.Shape) {
				t.Errorf("reported shape %v, want %v", res.Outputs[0].Shape, want.Shape)
			}
			c.CheckTol(t, "last_hidden_state (worker, from uint8)", got, shape, want, max(1e-3, c.Tolerance.RelL2))
			c.Check(t, "last_hidden_state (worker, case tolerance)", got, shape, want)
			steps := 0
			for _, e := range events {
				if pr, ok := e.(*workerkit.Progress); ok && pr.Phase == "encode" {
					steps++
				}
			}
			if steps == 0 || res.Stats == nil || res.Stats.AllocatorPeakBytes == 0 {
				t.Errorf("%d encode progress events, stats %+v", steps, res.Stats)
			}
		})
	}
	if n == 0 {
		t.Fatal("no siglip.encode case")
	}
	skipped := false
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "pooling head tensors skipped") {
			skipped = true
		}
	}
	if !skipped {
		t.Error("the worker did not log that it skipped the pooling head")
	}
}

// TestOddAndBadInputs checks odd but valid images (1×1, gray with and without a channel dim,
// gray + alpha, RGBA) and bad requests (InvalidArgument, and the worker keeps serving).
func TestOddAndBadInputs(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	// the FLUX Redux layout: image_encoder/ and feature_extractor/ under one folder
	p, _, _ := startWorker(t, filepath.Dir(encDir), "")
	a := shmtest.Arena(t, "odd")
	good := func(name string, shape []int64, pix []uint8) []float32 {
		t.Helper()
		out := outputRef(t, a, name+"-out")
		res, _, err := runEncode(t, p, writeImage(t, a, name, shape, pix), out)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, s := workertest.ReadF32(t, out)
		if len(s) != 3 || s[0] != 1 || !parity.SameShape(s, res.Outputs[0].Shape) {
			t.Fatalf("%s: shape %v, reported %v", name, s, res.Outputs[0].Shape)
		}
		for _, v := range got {
			if v != v {
				t.Fatalf("%s: NaN in output", name)
			}
		}
		return got
	}
	good("one-pixel", []int64{1, 1, 3}, []uint8{200, 30, 90})
	gray := make([]uint8, 20*15)
	rgb := make([]uint8, 0, 3*len(gray))
	rgba := make([]uint8, 0, 4*len(gray))
	la := make([]uint8, 0, 2*len(gray))
	for i := range gray {
		gray[i] = uint8(i * 7)
		rgb = append(rgb, gray[i], gray[i], gray[i])
		rgba = append(rgba, gray[i], gray[i], gray[i], uint8(i))
		la = append(la, gray[i], uint8(255-i))
	}
	ref := good("rgb", []int64{20, 15, 3}, rgb)
	for _, tc := range []struct {
		name  string
		shape []int64
		pix   []uint8
	}{
		{"gray-hw1", []int64{20, 15, 1}, gray},
		{"gray-hw", []int64{20, 15}, gray},
		{"gray-alpha", []int64{20, 15, 2}, la},
		{"rgba", []int64{20, 15, 4}, rgba},
	} {
		got := good(tc.name, tc.shape, tc.pix)
		if e := parity.RelL2(got, ref); e != 0 {
			t.Errorf("%s: differs from the same image as RGB (rel_l2 %g): alpha must be dropped, gray replicated", tc.name, e)
		}
	}

	// bad requests
	f32Path, err := a.NewSegment("float-image")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shm.WriteSegment(f32Path, []safetensors.Tensor{safetensors.FromFloat32("image", []int64{2, 2, 3}, make([]float32, 12))}); err != nil {
		t.Fatal(err)
	}
	rgbRef := writeImage(t, a, "ok-image", []int64{20, 15, 3}, rgb)
	bad := []struct {
		name    string
		img     workerkit.TensorRef
		out     workerkit.TensorRef
		wantMsg string
	}{
		{"rank 4", writeImage(t, a, "rank4", []int64{1, 2, 2, 3}, make([]uint8, 12)), outputRef(t, a, "o1"), "want [H, W, C]"},
		{"rank 1", writeImage(t, a, "rank1", []int64{12}, make([]uint8, 12)), outputRef(t, a, "o2"), "want [H, W, C]"},
		{"5 channels", writeImage(t, a, "c5", []int64{2, 2, 5}, make([]uint8, 20)), outputRef(t, a, "o3"), "5 channels"},
		{"0 channels", writeImage(t, a, "c0", []int64{2, 2, 0}, nil), outputRef(t, a, "o4"), "0 channels"},
		{"empty", writeImage(t, a, "empty", []int64{0, 5, 3}, nil), outputRef(t, a, "o5"), "is empty"},
		{"float image", workerkit.TensorRef{Path: f32Path, Name: "image"}, outputRef(t, a, "o6"), "want U8"},
		{"no such tensor", workerkit.TensorRef{Path: rgbRef.Path, Name: "pixels"}, outputRef(t, a, "o7"), `no tensor "pixels"`},
		{"no such file", workerkit.TensorRef{Path: filepath.Join(a.Dir(), "missing.safetensors"), Name: "image"}, outputRef(t, a, "o8"), "no such file"},
		{"no image ref", workerkit.TensorRef{}, outputRef(t, a, "o9"), "path and name are required"},
		{"no output ref", rgbRef, workerkit.TensorRef{}, "path and name are required"},
		{"shape mismatch", workerkit.TensorRef{Path: rgbRef.Path, Name: "image", Shape: []int64{15, 20, 3}}, outputRef(t, a, "o10"), "request says shape"},
		{"output dtype", rgbRef, workerkit.TensorRef{Path: filepath.Join(a.Dir(), "o11.safetensors"), Name: "x", DType: "I64"}, "want F32, F16 or BF16"},
		{"output shape", rgbRef, workerkit.TensorRef{Path: filepath.Join(a.Dir(), "o12.safetensors"), Name: "x", Shape: []int64{1, 729, 1152}}, "the model gives"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runEncode(t, p, tc.img, tc.out)
			var we *workerkit.Error
			if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument || !strings.Contains(we.Message, tc.wantMsg) {
				t.Fatalf("err %v, want InvalidArgument with %q", err, tc.wantMsg)
			}
			if _, err := os.Stat(tc.out.Path); tc.out.Path != "" && err == nil {
				t.Errorf("output %s written for a bad request", tc.out.Path)
			}
		})
	}
	// a wrong stage is refused too, and the worker is still alive and correct afterwards
	_, err = p.Run(workertest.Ctx(t), &workerkit.RunRequest{Stage: &workerkit.VAEDecodeRequest{}}, func(workerkit.Event) error { return nil })
	if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Errorf("vae_decode on clipvision: %v", err)
	}
	if _, ok := p.Exited(); ok {
		t.Fatal("worker died on bad input")
	}
	if e := parity.RelL2(good("rgb-again", []int64{20, 15, 3}, rgb), ref); e != 0 {
		t.Errorf("same image after bad requests: rel_l2 %g", e)
	}
}

// TestOutputDTypes checks that F16 and BF16 outputs are the F32 output rounded.
func TestOutputDTypes(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	p, _, _ := startWorker(t, encDir, "pil")
	a := shmtest.Arena(t, "dtypes")
	pix := make([]uint8, 30*40*3)
	for i := range pix {
		pix[i] = uint8(i * 13)
	}
	img := writeImage(t, a, "img", []int64{30, 40, 3}, pix)
	var ref []float32
	for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
		out := outputRef(t, a, "out-"+string(dt))
		out.DType = dt
		res, _, err := runEncode(t, p, img, out)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outputs[0].DType != dt {
			t.Errorf("wrote %s, asked %s", res.Outputs[0].DType, dt)
		}
		got, _ := workertest.ReadF32(t, out)
		if dt == safetensors.F32 {
			ref = got
			continue
		}
		tol := 1e-3
		if dt == safetensors.BF16 {
			tol = 8e-3
		}
		if e := parity.RelL2(got, ref); !(e > 0 && e < tol) {
			t.Errorf("%s output vs f32: rel_l2 %g (want in (0, %g))", dt, e, tol)
		}
	}
}

// TestLoadErrors checks that a bad model folder or option fails Load with InvalidArgument.
// TestParitySiglipHalfWeights runs every siglip.encode case through a worker that keeps the
// weight matrices in the checkpoint's own dtype (Load dtype "auto": the fixture's fp16): within
// the case's tolerance, as in fp32 (fp16 widens to f32 exactly), with about half the weight bytes.
func TestParitySiglipHalfWeights(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	_, full, _ := startWorker(t, encDir, "")
	p, resp, _ := startWorkerDType(t, encDir, "auto", "")
	t.Logf("weights: %d bytes as stored, %d in f32", resp.WeightBytes, full.WeightBytes)
	if resp.WeightBytes == 0 || float64(resp.WeightBytes) > 0.6*float64(full.WeightBytes) {
		t.Errorf("weights as stored take %d bytes, f32 %d: want about half", resp.WeightBytes, full.WeightBytes)
	}
	a := shmtest.Arena(t, "parity-half")
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "siglip.encode" {
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		n++
		in := c.Input(t, "image_hwc_u8")
		pix := make([]uint8, len(in.Ints))
		for i, v := range in.Ints {
			pix[i] = uint8(v)
		}
		out := outputRef(t, a, c.Name+"-out")
		if _, _, err := runEncode(t, p, writeImage(t, a, c.Name+"-image", in.Shape, pix), out); err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		got, shape := workertest.ReadF32(t, out)
		c.Check(t, "last_hidden_state (worker, weights as stored)", got, shape, c.Output(t, "last_hidden_state"))
	}
	if n == 0 {
		t.Fatal("no siglip.encode case")
	}
}

// startWorkerWith starts the clipvision binary and sends req as its Load.
func startWorkerWith(t *testing.T, req *workerkit.LoadRequest) (*workerkit.Process, error) {
	t.Helper()
	p, _ := workertest.Start(t, "clipvision")
	_, err := p.Load(workertest.Ctx(t), req)
	return p, err
}

// TestConvTierOverrides: LoadRequest.conv_policy.tier_overrides reach the conv chain. With the
// patch embedding's shape sent to the cpu tier, a fault that hangs it at vendor_tuned never
// fires: the encode finishes and vendor_tuned saw no attempt.
func TestConvTierOverrides(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	var c parity.Case
	for _, x := range fx.Cases {
		if x.Op == "siglip.encode" {
			c = x
			break
		}
	}
	in := c.Input(t, "image_hwc_u8")
	pix := make([]uint8, len(in.Ints))
	for i, v := range in.Ints {
		pix[i] = uint8(v)
	}
	a := shmtest.Arena(t, "overrides")
	img := writeImage(t, a, "image", in.Shape, pix)
	encode := func(p *workerkit.Process, name string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a hang fails, not stalls, the test
		defer cancel()
		_, err := p.Run(ctx, &workerkit.RunRequest{JobID: "test", Stage: &workerkit.ImageEncodeRequest{Image: img,
			LastHiddenState: outputRef(t, a, name)}}, nil)
		return err
	}
	// the shape key, from the decision cache a clean run fills
	cachePath := filepath.Join(t.TempDir(), "conv-decisions.json")
	p1, err := startWorkerWith(t, &workerkit.LoadRequest{ModelDir: encDir, Backend: "cpu",
		ConvPolicy: &workerkit.ConvPolicy{DecisionCachePath: cachePath}})
	if err != nil {
		t.Fatal(err)
	}
	if err := encode(p1, "clean"); err != nil {
		t.Fatal(err)
	}
	cache, err := convcache.Open(cachePath)
	if err != nil {
		t.Fatal(err)
	}
	keys := cache.Keys()
	if len(keys) != 1 {
		t.Fatalf("the clean encode recorded %d conv shapes, want 1 (the patch embedding)", len(keys))
	}
	p2, err := startWorkerWith(t, &workerkit.LoadRequest{ModelDir: encDir, Backend: "cpu",
		ConvPolicy: &workerkit.ConvPolicy{TierOverrides: []workerkit.ConvTierOverride{{ShapeKey: keys[0], Tier: workerkit.ConvTierCPU}}},
		Fault:      &workerkit.Fault{HangConvShapeKey: keys[0], HangConvTier: workerkit.ConvTierVendorTuned}})
	if err != nil {
		t.Fatal(err)
	}
	if err := encode(p2, "overridden"); err != nil {
		t.Fatalf("encode with the shape overridden to cpu: %v", err)
	}
	st, err := p2.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.ConvTiers) != 1 || st.ConvTiers[0].Tier != workerkit.ConvTierCPU || st.ConvTiers[0].Successes != 1 {
		t.Fatalf("conv tiers %+v, want the cpu tier alone", st.ConvTiers)
	}
	if _, err := startWorkerWith(t, &workerkit.LoadRequest{ModelDir: encDir, Backend: "cpu",
		ConvPolicy: &workerkit.ConvPolicy{TierOverrides: []workerkit.ConvTierOverride{{ShapeKey: keys[0]}}}}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("override without a tier: got %v, want invalid argument", err)
	}
}

func TestLoadErrors(t *testing.T) {
	empty := t.TempDir()
	tests := []struct {
		name string
		req  workerkit.LoadRequest
		want string
	}{
		{"no model dir", workerkit.LoadRequest{}, "model_dir is required"},
		{"empty dir", workerkit.LoadRequest{ModelDir: empty}, "holds neither"},
		{"bad dtype", workerkit.LoadRequest{ModelDir: empty, DType: "int8"}, `dtype "int8"`},
		{"bad processor", workerkit.LoadRequest{ModelDir: empty, SiglipProcessor: "opencv"}, "opencv"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := workertest.Start(t, "clipvision")
			_, err := p.Load(workertest.Ctx(t), &tc.req)
			if workerkit.CodeOf(err) != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
}

// TestFaultExitAtOp checks the injected crash: the worker kills itself with the asked signal
// (SIGKILL by default) when the op numbered exit_at_op starts, and the supervisor sees how it died.
func TestFaultExitAtOp(t *testing.T) {
	fx := parity.Load(t, "siglip")
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := workertest.Start(t, "clipvision")
	if _, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: encDir,
		Fault: &workerkit.Fault{ExitAtOp: 5}}); err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "fault")
	_, _, err = runEncode(t, p, writeImage(t, a, "img", []int64{4, 4, 3}, make([]uint8, 48)), outputRef(t, a, "out"))
	var ee *workerkit.ExitError
	if !errors.As(err, &ee) || ee.Status.Signal != syscall.SIGKILL {
		t.Fatalf("err %v, want the worker dead of SIGKILL (the default exit_signal)", err)
	}
	snap, err := p.Beacon()
	if err != nil || snap.OpSeq != 5 {
		t.Errorf("beacon %+v (%v): want op 5 as the last op", snap, err)
	}
}
