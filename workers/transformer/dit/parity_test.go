package dit

import (
	"context"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// OpForward is the transformer fixture's op.
const OpForward = "transformer.forward"

func newTestRuntime(t testing.TB) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return rt
}

// loadFixtureModel loads the fixture's "transformer" model into rt.
func loadFixtureModel(t testing.TB, rt *runtime.Runtime, fx *parity.Fixture) *Model {
	return loadFixtureModelAs(t, rt, fx, 0)
}

// loadFixtureModelAs loads the fixture's transformer with activations in act (0: f32).
func loadFixtureModelAs(t testing.TB, rt *runtime.Runtime, fx *parity.Fixture, act runtime.DType) *Model {
	t.Helper()
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(rt, dir, LoadOptions{ActivationDType: act})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if len(m.Unexpected) > 0 {
		t.Logf("unexpected checkpoint tensors: %v", m.Unexpected)
	}
	return m
}

func toInts(s []int64) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

func toInt64s(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}

func floatIn(t testing.TB, c parity.Case, name string) conditioning.Tensor {
	if !c.HasInput(name) {
		return conditioning.Tensor{}
	}
	a := c.Input(t, name)
	return conditioning.Tensor{Shape: toInts(a.Shape), Data: a.F32}
}

func intIn(t testing.TB, c parity.Case, name string) conditioning.IntTensor {
	if !c.HasInput(name) {
		return conditioning.IntTensor{}
	}
	a := c.Input(t, name)
	if a.Ints == nil {
		t.Fatalf("case %s: input %s is %s, want integers", c.Name, name, a.DType)
	}
	return conditioning.IntTensor{Shape: toInts(a.Shape), Data: a.Ints}
}

// forwardCase is a transformer.forward case decoded.
type forwardCase struct {
	cond               Conditioning
	x                  conditioning.Tensor
	timestep, guidance float32
}

var forwardInputs = []string{"hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask",
	"pooled_projections", "guidance", "latent_indices", "clean_latents", "clean_latent_indices", "clean_latents_2x",
	"clean_latent_2x_indices", "clean_latents_4x", "clean_latent_4x_indices", "image_embeddings"}

func decodeForward(t testing.TB, c parity.Case) forwardCase {
	t.Helper()
	for name := range c.Inputs {
		known := false
		for _, k := range forwardInputs {
			known = known || k == name
		}
		if !known {
			t.Fatalf("case %s: unhandled input %q", c.Name, name)
		}
	}
	scalar := func(name string) float32 {
		a := c.Input(t, name)
		if len(a.F32) != 1 {
			t.Fatalf("case %s: %s has %d values, want 1 (batch 1)", c.Name, name, len(a.F32))
		}
		return a.F32[0]
	}
	return forwardCase{
		cond: Conditioning{
			EncoderHiddenStates:  floatIn(t, c, "encoder_hidden_states"),
			EncoderAttentionMask: intIn(t, c, "encoder_attention_mask"),
			PooledProjections:    floatIn(t, c, "pooled_projections"),
			ImageEmbeddings:      floatIn(t, c, "image_embeddings"),
			LatentIndices:        intIn(t, c, "latent_indices"),
			CleanLatents:         floatIn(t, c, "clean_latents"),
			CleanLatentIndices:   intIn(t, c, "clean_latent_indices"),
			CleanLatents2x:       floatIn(t, c, "clean_latents_2x"),
			CleanLatent2xIndices: intIn(t, c, "clean_latent_2x_indices"),
			CleanLatents4x:       floatIn(t, c, "clean_latents_4x"),
			CleanLatent4xIndices: intIn(t, c, "clean_latent_4x_indices"),
		},
		x:        floatIn(t, c, "hidden_states"),
		timestep: scalar("timestep"),
		guidance: scalar("guidance"),
	}
}

// TestParityTransformer checks every case of the transformer fixture by op against the
// reference's float64 forward; the intermediates the fixture has are logged to show where a
// mismatch starts.
func TestParityTransformer(t *testing.T) { parityTransformer(t, runtime.F32) }

// TestParityTransformerHalf is TestParityTransformer with bf16 activations (FramePack's
// transformer dtype, or the 16-bit one $FRAMEPACK_ACTIVATION_DTYPE names): within
// parity.HalfRelL2.
func TestParityTransformerHalf(t *testing.T) {
	act, err := runtime.ParseActivationDType(parity.HalfActivations("bf16"))
	if err != nil {
		t.Fatal(err)
	}
	parityTransformer(t, act)
}

func parityTransformer(t *testing.T, act runtime.DType) {
	fx := parity.Load(t, "transformer")
	if len(fx.Cases) == 0 {
		t.Fatal("transformer fixture has no cases")
	}
	rt := newTestRuntime(t)
	m := loadFixtureModelAs(t, rt, fx, act)
	for _, c := range fx.Cases {
		c = c.ForActivations(act != runtime.F32)
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case OpForward:
				checkForward(t, m, c)
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
}

func checkForward(t *testing.T, m *Model, c parity.Case) {
	var batch int
	if c.Param(t, "batch_size", &batch) && batch != 1 {
		t.Fatalf("case %s: batch_size %d (only 1 is supported)", c.Name, batch)
	}
	fc := decodeForward(t, c)
	if len(fc.x.Shape) != 5 {
		t.Fatalf("case %s: hidden_states shape %v", c.Name, fc.x.Shape)
	}
	shape := [5]int(fc.x.Shape)
	sec, err := m.Prepare(fc.cond, shape)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	defer sec.Close()
	mids := map[string]traced{}
	trace := func(name string, x *runtime.Tensor) {
		v, err := x.Float32()
		if err != nil {
			t.Errorf("trace %s: %v", name, err)
			return
		}
		mids[name] = traced{shape: x.Shape(), data: v}
	}
	out, err := m.Forward(context.Background(), sec, fc.x.Data, fc.timestep, fc.guidance, ForwardOptions{Trace: trace})
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	logIntermediates(t, c, mids)
	c.Check(t, "sample", out, toInt64s(fc.x.Shape), c.Output(t, "sample"))
}

type traced struct {
	shape []int
	data  []float32
}

// logIntermediates compares the traced intermediates with the fixture's, where both exist,
// laid out alike: x_embedder is [1, dim, T, h, w] in the fixture and tokens here; the
// fixture's context_embedder has every padded text token, ours only the kept ones.
func logIntermediates(t *testing.T, c parity.Case, mids map[string]traced) {
	names := make([]string, 0, len(c.Intermediates))
	for name := range c.Intermediates {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		got, ok := mids[name]
		if !ok {
			t.Logf("case %s %s: not traced", c.Name, name)
			continue
		}
		ref := c.Intermediate(t, name)
		want := ref.F32
		switch name {
		case "x_embedder":
			if len(ref.Shape) == 5 {
				want = tokensOf(ref.F32, toInts(ref.Shape))
			}
		case "context_embedder":
			if len(ref.Shape) == 3 && len(got.shape) == 3 && got.shape[1] <= int(ref.Shape[1]) {
				want = ref.F32[:got.shape[1]*got.shape[2]]
			}
		}
		if len(want) != len(got.data) {
			t.Logf("case %s %s: %d values, reference %d (shape %v vs %v)", c.Name, name, len(got.data), len(want), got.shape, ref.Shape)
			continue
		}
		t.Logf("case %s intermediate %s: rel_l2=%.3g", c.Name, name, parity.RelL2(got.data, want))
	}
}

// tokensOf turns [1, C, T, H, W] into [1, T·H·W, C].
func tokensOf(v []float32, s []int) []float32 {
	C, n := s[1], s[2]*s[3]*s[4]
	out := make([]float32, len(v))
	for c := range C {
		for i := range n {
			out[i*C+c] = v[c*n+i]
		}
	}
	return out
}
