package main

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// opForward is the transformer fixture's op.
const opForward = "transformer.forward"

// forwardCase is a transformer.forward case as a worker request, its inputs written to shared
// memory.
type forwardCase struct {
	req   workerkit.TransformerForwardRequest
	shape []int64 // hidden_states'
}

// writeForwardCase writes a transformer.forward case's tensors into one arena segment and builds
// the stage request (fixture input names are the reference's forward arguments).
func writeForwardCase(t *testing.T, a *shm.Arena, c parity.Case) forwardCase {
	t.Helper()
	var batch int
	if c.Param(t, "batch_size", &batch) && batch != 1 {
		t.Fatalf("case %s: batch_size %d (only 1 is supported)", c.Name, batch)
	}
	path := workertest.Segment(t, a, "forward-in")
	var fc forwardCase
	r := &fc.req
	floats := map[string]*workerkit.TensorRef{
		"hidden_states": &r.HiddenStates, "encoder_hidden_states": &r.LlamaVec, "pooled_projections": &r.ClipPooler,
		"image_embeddings": &r.ImageEmbeddings, "clean_latents": &r.CleanLatents, "clean_latents_2x": &r.CleanLatents2x,
		"clean_latents_4x": &r.CleanLatents4x,
	}
	masks := map[string]*workerkit.TensorRef{"encoder_attention_mask": &r.LlamaMask}
	indices := map[string]*[]int64{"latent_indices": &r.LatentIndices, "clean_latent_indices": &r.CleanLatentIndices,
		"clean_latent_2x_indices": &r.CleanLatent2xIndices, "clean_latent_4x_indices": &r.CleanLatent4xIndices}
	scalars := map[string]*float32{"timestep": &r.Timestep, "guidance": &r.Guidance}
	var ts []safetensors.Tensor
	for name := range c.Inputs {
		in := c.Input(t, name)
		switch {
		case floats[name] != nil:
			ts = append(ts, safetensors.FromFloat32(name, in.Shape, in.F32))
			*floats[name] = workerkit.TensorRef{Path: path, Name: name}
			if name == "hidden_states" {
				fc.shape = in.Shape
			}
		case masks[name] != nil:
			if in.Ints == nil {
				t.Fatalf("case %s: %s is %s, want integers", c.Name, name, in.DType)
			}
			ts = append(ts, safetensors.FromInt64(name, in.Shape, in.Ints))
			*masks[name] = workerkit.TensorRef{Path: path, Name: name}
		case indices[name] != nil:
			if in.Ints == nil || len(in.Shape) != 2 || in.Shape[0] != 1 {
				t.Fatalf("case %s: %s is %s%v, want [1 n] integers", c.Name, name, in.DType, in.Shape)
			}
			*indices[name] = in.Ints
		case scalars[name] != nil:
			if len(in.F32) != 1 {
				t.Fatalf("case %s: %s has %d values, want 1 (batch 1)", c.Name, name, len(in.F32))
			}
			*scalars[name] = in.F32[0]
		default:
			t.Fatalf("case %s: unhandled input %q", c.Name, name)
		}
	}
	if fc.shape == nil {
		t.Fatalf("case %s: no hidden_states", c.Name)
	}
	if _, err := shm.WriteSegment(path, ts); err != nil {
		t.Fatal(err)
	}
	r.Velocity = workerkit.TensorRef{Path: workertest.Segment(t, a, "velocity"), Name: "velocity"}
	return fc
}

func runForward(t *testing.T, p *workerkit.Process, req workerkit.TransformerForwardRequest) (*workerkit.Result, []workerkit.Event, error) {
	var events []workerkit.Event
	res, err := p.Run(workertest.Ctx(t), &workerkit.RunRequest{JobID: "test", Stage: &req}, func(e workerkit.Event) error {
		events = append(events, e)
		return nil
	})
	return res, events, err
}

// TestParityTransformerWorker runs every transformer.forward case of the transformer fixture
// through a real worker process, inputs and output in shared memory: the velocity within the
// case's tolerance of the reference's float64 forward, progress events, stats.
func TestParityTransformerWorker(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	p, half := loadWorkerHalf(t, dir)
	ran := 0
	for _, c := range fx.Cases {
		c = c.ForActivations(half)
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case opForward:
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
			ran++
			fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
			res, events, err := runForward(t, p, fc.req)
			if err != nil {
				t.Fatalf("case %s: run: %v", c.Name, err)
			}
			if len(res.Outputs) != 1 || res.Outputs[0].DType != safetensors.F32 {
				t.Fatalf("case %s: outputs %+v", c.Name, res.Outputs)
			}
			c.Check(t, "sample (worker velocity)", readFloat(t, res.Outputs[0]), fc.shape, c.Output(t, "sample"))
			var phases []string
			for _, e := range events {
				if pr, ok := e.(*workerkit.Progress); ok {
					phases = append(phases, pr.Phase)
				}
			}
			if strings.Join(phases, ",") != "prepare,forward,write" {
				t.Errorf("case %s: progress phases %v", c.Name, phases)
			}
			if res.Stats == nil || res.Stats.OpCounts["attention"] == 0 || res.Stats.AllocatorPeakBytes == 0 {
				t.Errorf("case %s: stats %+v", c.Name, res.Stats)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no transformer.forward cases")
	}
}

// TestParityTransformerWorkerHalfWeights runs every transformer.forward case through a worker
// that keeps the weight matrices in the checkpoint's own dtype (Load dtype "auto": the
// fixture's bf16): the velocity within the case's tolerance, as in fp32 (bf16 widens to f32
// exactly), with about half the weight bytes.
func TestParityTransformerWorkerHalfWeights(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	resp := make(map[string]*workerkit.LoadResponse)
	var p *workerkit.Process
	for _, dtype := range []string{"", "auto"} {
		p, _ = workertest.Start(t, "transformer")
		if resp[dtype], err = p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), DType: dtype}); err != nil {
			t.Fatalf("load dtype %q: %v", dtype, err)
		}
	}
	half, full := resp["auto"].WeightBytes, resp[""].WeightBytes
	t.Logf("weights: %d bytes as stored, %d in f32", half, full)
	if half == 0 || float64(half) > 0.6*float64(full) {
		t.Errorf("weights as stored take %d bytes, f32 %d: want about half", half, full)
	}
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != opForward {
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		ran++
		fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
		res, _, err := runForward(t, p, fc.req)
		if err != nil {
			t.Fatalf("case %s: run: %v", c.Name, err)
		}
		c.Check(t, "sample (worker velocity, weights as stored)", readFloat(t, res.Outputs[0]), fc.shape, c.Output(t, "sample"))
	}
	if ran == 0 {
		t.Fatal("no transformer.forward cases")
	}
}

// TestWorkerForwardBadInput checks that bad transformer_forward requests fail with
// InvalidArgument saying what is wrong, and that the worker keeps serving after them.
func TestWorkerForwardBadInput(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, _ := fx.ModelPath("transformer")
	var c parity.Case
	for _, x := range fx.Cases {
		if x.Op == opForward {
			c = x
			break
		}
	}
	if c.Op == "" {
		t.Fatal("no transformer.forward case")
	}
	p := loadWorker(t, dir)
	tests := []struct {
		name string
		edit func(r *workerkit.TransformerForwardRequest)
		want string
	}{
		{"no image embeddings", func(r *workerkit.TransformerForwardRequest) { r.ImageEmbeddings = workerkit.TensorRef{} },
			"image_embeddings is required"},
		{"clean latents without indices", func(r *workerkit.TransformerForwardRequest) { r.CleanLatentIndices = nil },
			"clean_latents and its indices must be given together"},
		{"latent indices of another length", func(r *workerkit.TransformerForwardRequest) { r.LatentIndices = append(r.LatentIndices, 99) },
			"latent_indices has shape"},
		{"velocity of another shape", func(r *workerkit.TransformerForwardRequest) { r.Velocity.Shape = []int64{1, 2, 3} },
			"velocity: shape [1 2 3] asked"},
		{"velocity in an integer dtype", func(r *workerkit.TransformerForwardRequest) { r.Velocity.DType = safetensors.I64 },
			"velocity: dtype I64"},
		{"no velocity", func(r *workerkit.TransformerForwardRequest) { r.Velocity = workerkit.TensorRef{} },
			"velocity: path and name are required"},
		{"NaN timestep", func(r *workerkit.TransformerForwardRequest) { r.Timestep = float32(math.NaN()) }, "timestep is NaN"},
		{"hidden states of rank 3", func(r *workerkit.TransformerForwardRequest) { r.HiddenStates = r.LlamaVec },
			"hidden_states: F32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
			tc.edit(&fc.req)
			_, _, err := runForward(t, p, fc.req)
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
	// Still serving, and a dtype the request asks for is written.
	fc := writeForwardCase(t, shmtest.Arena(t, "job"), c)
	fc.req.Velocity.DType = safetensors.BF16
	res, _, err := runForward(t, p, fc.req)
	if err != nil {
		t.Fatalf("good request after bad ones: %v", err)
	}
	if o := res.Outputs[0]; o.DType != safetensors.BF16 || fmt.Sprint(o.Shape) != fmt.Sprint(fc.shape) {
		t.Errorf("output %+v, want BF16 %v", o, fc.shape)
	}
}
